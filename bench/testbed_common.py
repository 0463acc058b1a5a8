"""Shared plumbing of the testbed benchmarks: model files, child processes, gates, link counters.

Owns nothing but helpers; each benchmark script owns its table. Children run inside the
testbed's namespaces through ``Host.popen``; the testbed's exit kills whatever is left.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ringseed.testbed import netns

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
MiB = 1 << 20


def write_model(root: Path, *, size: int, files: int = 4) -> Path:
    """``files`` files of random bytes summing to ``size`` (reused when already there)."""
    root.mkdir(parents=True, exist_ok=True)
    sizes = [size // files] * files
    sizes[-1] += size - sum(sizes)
    for index, length in enumerate(sizes):
        path = root / f"model-{index:05d}.safetensors"
        if not path.exists() or path.stat().st_size != length:
            with path.open("wb") as out:
                left = length
                while left:
                    out.write(os.urandom(min(left, 8 * MiB)))
                    left -= min(left, 8 * MiB)
    return root


def spawn(
    host: netns.Host | None, args: list[str], *, log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[Any]:
    """Start ``args`` in ``host`` (None: here, on loopback) from the repository root, stdout to a
    pipe, stderr to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    popen: Any = host.popen if host is not None else subprocess.Popen
    return popen(  # type: ignore[no-any-return]
        args,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=log.open("ab"),
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def read_line(proc: subprocess.Popen[Any], *, timeout: float, what: str) -> str:
    """The child's next stdout line (blocking, with a deadline checked between lines)."""
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line:
            return str(line).strip()
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before answering")
    raise TimeoutError(f"{what} did not answer within {timeout:.0f}s")


def sent_bytes(host: netns.Host) -> int:
    """Bytes the host's eth0 has sent (layer 2, from the tbf qdisc counters)."""
    out = host.run(["tc", "-s", "qdisc", "show", "dev", "eth0"])
    found = re.search(r"Sent (\d+) bytes", out)
    return int(found.group(1)) if found else 0


def curl_json(host: netns.Host, url: str, *, token: str | None = None) -> Any:
    """GET ``url`` from inside ``host`` (the benchmark itself runs outside the namespaces)."""
    args = ["curl", "-sf", "--max-time", "5", url]
    if token:
        args += ["-H", f"Authorization: Bearer {token}"]
    out = host.run(args, check=False)
    try:
        return json.loads(out) if out else None
    except ValueError:
        return None


def gate(path: Path) -> float:
    """Open a gate file: every waiting child starts now; returns the wall-clock time."""
    now = time.time()
    path.write_text(str(now))
    return now


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds the live process ``pid`` has used so far, all its threads (from
    /proc; (0, 0) once it is gone)."""
    ticks = os.sysconf("SC_CLK_TCK")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    return int(fields[11]) / ticks, int(fields[12]) / ticks  # utime, stime


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the live processes ``pids`` have used so far (from /proc)."""
    return sum(sum(cpu_times(pid)) for pid in pids)
