"""A cluster-free swarm on 127.0.0.1: a master (tracker, or two replicas) and N agents as separate OS processes.

Owns the processes of ``ringseed local distribute`` and the hooks the process tests use: start,
SIGKILL and restart single agents or the master, read ``/v1/status``, wait for completion and
check every node's final copy against the manifest.

Rules:
- With ``masters=2`` two tracker replicas share a lock directory (one leads, one follows) and
  every agent gets both URLs; status is read from whichever answers as leader.
- Every child runs ``python -m ringseed.cli ...`` in its own process group with its log in
  ``<workdir>/logs/<name>.log``; :meth:`LocalSwarm.close` (also on error and Ctrl-C, through the
  context manager) terminates every group, then kills what is left. Nothing outlives the swarm.
- A child that ends without being asked to (:meth:`LocalSwarm.kill`, :meth:`LocalSwarm.close`),
  whatever the signal, raises :class:`ChildDied` from :meth:`LocalSwarm.check_alive`, naming
  the child, how it ended and the first error line of its log.
- Node ``node-<i>`` keeps its data and cache under ``<workdir>/nodes/node-<i>/``, so a restarted
  agent finds its staging and journal again. The model name is ``local/model``.
- Only loopback; the token is random per swarm and passed through ``RINGSEED_TOKEN``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ringseed.protocol import manifest

MODEL = ("local", "model")
_ERROR_LEVELS = (" ERROR ", " CRITICAL ")


class ChildDied(RuntimeError):
    """A child process ended on its own; names it, how it ended and its first logged error."""

    def __init__(self, name: str, *, how: str, error: str | None, log: Path) -> None:
        detail = f": {error}" if error else ""
        super().__init__(f"{name} {how}{detail} (log: {log})")
        self.name = name
        self.how = how
        self.error = error
        self.log = log


def first_error(text: str) -> str | None:
    """The first error a ``ringseed`` process logged: an ERROR/CRITICAL line or a traceback's exception.

    A logged error keeps its message only (no time, level, logger); a traceback gives its
    exception line without the module path (``OriginError: file:///x: no such file``).
    """
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):"):
            for follow in lines[i + 1 :]:
                if follow.strip() and not follow.startswith((" ", "\t", "Traceback", "The above", "During handling")):
                    kind, sep, message = follow.partition(": ")
                    return f"{kind.rsplit('.', 1)[-1]}{sep}{message}"
            return None
        for level in _ERROR_LEVELS:
            if level in line:
                message = line.split(level, 1)[1]
                return message.split(": ", 1)[1] if ": " in message else message
    return None


def _how(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LocalSwarm:
    """Master + agents as child processes; use as a context manager."""

    def __init__(
        self,
        *,
        source: str,
        nodes: int,
        workdir: Path,
        chunk_size: int = 4 << 20,
        origin_rate_limit: int | None = None,
        memory_bytes: int = 64 << 20,
        heartbeat_interval: float = 0.25,
        offline_after: float = 5.0,
        seeders: int = 1,
        manifest_uri: str | None = None,
        agent_args: Sequence[str] = (),
        masters: int = 1,
        master_args: Sequence[str] = (),
    ) -> None:
        self.source = source
        self.agent_args = list(agent_args)  # more ``ringseed agent`` options for every agent
        self.master_args = list(master_args)  # more ``ringseed master`` options for every master
        self.names = [f"node-{i}" for i in range(nodes)]
        self.workdir = workdir
        self.chunk_size = chunk_size
        self.origin_rate_limit = origin_rate_limit
        self.memory_bytes = memory_bytes
        self.heartbeat_interval = heartbeat_interval
        self.offline_after = offline_after
        self.seeders = seeders
        self.manifest_uri = manifest_uri
        self.token = secrets.token_hex(16)
        self.master_ports = [free_port() for _ in range(masters)]  # two: a leader and a follower
        self.master_urls = [f"http://127.0.0.1:{p}" for p in self.master_ports]
        self.master_port, self.master_url = self.master_ports[0], self.master_urls[0]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.stopped: set[str] = set()  # children ended on purpose (kill, close)
        self.agent_ports: dict[str, int] = {}
        (workdir / "logs").mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> LocalSwarm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- processes -----------------------------------------------------------------------

    def _spawn(
        self, name: str, argv: list[str], env: Mapping[str, str] | None = None, *, module: str = "ringseed.cli"
    ) -> None:
        full_env = dict(os.environ, RINGSEED_TOKEN=self.token, **(env or {}))
        self.stopped.discard(name)
        with open(self.workdir / "logs" / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", module, *argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
            )

    def start(self) -> None:
        for index in range(len(self.master_ports)):
            self.start_master(index)
        for name in self.names:
            self.start_agent(name)

    @staticmethod
    def master_name(index: int) -> str:
        return "master" if index == 0 else f"master-{index}"

    def start_master(self, index: int = 0) -> None:
        argv = ["master", "--role", "tracker", "--host", "127.0.0.1", "--port", str(self.master_ports[index])]
        argv += ["--offline-after", str(self.offline_after), "--heartbeat-interval", str(self.heartbeat_interval)]
        argv += ["--seeders", str(self.seeders), *self.master_args]
        if len(self.master_ports) > 1:  # replicas: a lock both reach picks the leader
            argv += ["--advertise-url", self.master_urls[index], "--lock-dir", str(self.workdir / "lock")]
        self._spawn(self.master_name(index), argv)

    def node_dir(self, name: str) -> Path:
        return self.workdir / "nodes" / name

    def model_dir(self, name: str) -> Path:
        return self.node_dir(name) / "data" / MODEL[0] / MODEL[1]

    def journal(self, name: str) -> Path:
        return self.node_dir(name) / "cache" / MODEL[0] / MODEL[1] / "verified.journal"

    def start_agent(self, name: str, *, env: Mapping[str, str] | None = None, module: str = "ringseed.cli") -> None:
        """Start agent ``name``; ``module`` is what ``python -m`` runs (a test's wrapper of ``ringseed.cli``);
        ``agent_args`` (changeable between starts) are appended to its options."""
        argv = ["agent", "--master-url", ",".join(self.master_urls), "--node-name", name]
        argv += ["--advertise-host", "127.0.0.1"]
        self.agent_ports[name] = free_port()
        argv += ["--host", "127.0.0.1", "--port", str(self.agent_ports[name]), "--source", self.source]
        argv += ["--chunk-size", str(self.chunk_size), "--model-name", "/".join(MODEL)]
        argv += ["--data-dir", str(self.node_dir(name) / "data"), "--cache-dir", str(self.node_dir(name) / "cache")]
        argv += ["--memory-bytes", str(self.memory_bytes)]
        if self.origin_rate_limit:
            argv += ["--origin-rate-limit", str(self.origin_rate_limit)]
        if self.manifest_uri:
            argv += ["--manifest-uri", self.manifest_uri]
        self._spawn(name, [*argv, *self.agent_args], env, module=module)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (SIGKILL by default) to a child's process group and reap it."""
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        self.stopped.add(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def close(self) -> None:
        self.stopped.update(self.procs)
        for name in list(self.procs):
            proc = self.procs[name]
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for name in list(self.procs):
            self.kill(name)

    # -- observation -----------------------------------------------------------------------

    def _fetch(self, url: str, *, timeout: float) -> bytes | None:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                body: bytes = response.read()
                return body
        except (OSError, urllib.error.URLError):
            return None

    def get(self, path: str, *, timeout: float = 5.0) -> Any:
        """GET a master path as JSON from the leading master; None while none answers."""
        for url in [self.master_url, *[u for u in self.master_urls if u != self.master_url]]:
            body = self._fetch(url + path, timeout=timeout)  # a follower's 503 is None
            if body is not None:
                self.master_url = url
                try:
                    return json.loads(body)
                except ValueError:
                    return None
        return None

    def agent_metrics(self, name: str, *, timeout: float = 5.0) -> dict[str, float] | None:
        """An agent's ``/metrics`` as ``{"ringseed_agent_x": value}`` (unlabelled series); None if unreachable."""
        body = self._fetch(f"http://127.0.0.1:{self.agent_ports[name]}/metrics", timeout=timeout)
        if body is None:
            return None
        values: dict[str, float] = {}
        for line in body.decode("utf-8", "replace").splitlines():
            key, _, value = line.rpartition(" ")
            if key and not key.startswith("#") and "{" not in key:
                values[key] = float(value)
        return values

    def status(self) -> dict[str, Any] | None:
        status: dict[str, Any] | None = self.get("/v1/status")
        return status

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], *, timeout: float, what: str) -> dict[str, Any]:
        """Poll the status until ``predicate`` holds; TimeoutError naming ``what`` otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status()
            if status is not None and predicate(status):
                return status
            self.check_alive()
            time.sleep(0.2)
        status = self.status()
        raise TimeoutError(
            f"timed out after {timeout:.0f}s waiting for {what}; last status: {status}{self._stuck_logs(status)}"
        )

    def _stuck_logs(self, status: dict[str, Any] | None, *, lines: int = 20) -> str:
        """The last lines of the log of each agent that is not verified, for a timeout's message."""
        nodes = (status or {}).get("nodes") or {}
        names = [name for name in self.agent_ports if not (nodes.get(name) or {}).get("verified")]
        parts = []
        for name in names:
            try:
                tail = self.log_path(name).read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            parts.append(f"\n--- last {len(tail)} lines of {self.log_path(name)} ---\n" + "\n".join(tail))
        return "".join(parts)

    def log_path(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    def first_error(self, name: str) -> str | None:
        """The first error in a child's log (see :func:`first_error`), None if none."""
        try:
            return first_error(self.log_path(name).read_text(errors="replace"))
        except OSError:
            return None

    def check_alive(self) -> None:
        """:class:`ChildDied` for the first child that ended without being asked to."""
        for name, proc in self.procs.items():
            code = proc.poll()
            if code is not None and name not in self.stopped:
                raise ChildDied(name, how=_how(code), error=self.first_error(name), log=self.log_path(name))

    def all_verified(self, status: dict[str, Any], names: list[str] | None = None) -> bool:
        nodes = status.get("nodes", {})
        return all(nodes.get(n, {}).get("verified") for n in (names or self.names))

    def manifest(self) -> manifest.Manifest | None:
        published = self.get("/v1/manifest")
        if not published or not published.get("layout") or None in published.get("chunk_hashes", [None]):
            return None
        layout = manifest.Layout.from_dict(published["layout"])
        return manifest.Manifest(layout=layout, chunk_hashes=tuple(published["chunk_hashes"]))


def verify_copy(model_dir: Path, expected: manifest.Manifest) -> dict[str, bool]:
    """``complete``: the marker names the manifest; ``verified``: every chunk of the files hashes right."""
    try:
        marker = json.loads((model_dir / ".ringseed-complete").read_text())
    except (OSError, ValueError):
        return {"complete": False, "verified": False}
    complete = isinstance(marker, dict) and marker.get("manifest_digest") == expected.digest
    hasher = manifest.ChunkHasher(expected.layout.chunk_size)
    try:
        for entry in expected.layout.files:
            path = model_dir / entry.path
            if path.stat().st_size != entry.size:
                return {"complete": complete, "verified": False}
            with open(path, "rb") as f:
                while block := f.read(4 << 20):
                    hasher.update(block)
    except OSError:
        return {"complete": complete, "verified": False}
    return {"complete": complete, "verified": complete and tuple(hasher.finish()) == expected.chunk_hashes}
