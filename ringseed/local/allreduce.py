"""``ringseed local allreduce``: a coordinator and N peer processes on 127.0.0.1, checked.

Owns the local run: it starts ``ringseed master --role coordinator`` and N peer processes
(``ringseed.local.allreduce_worker``), lets every peer all-reduce its seeded data, and checks
each peer's result against a reference computed independently (numpy over every member's
regenerated data, float64 accumulation). It prints algbw (bytes / seconds) and busbw
(algbw * 2(N-1)/N) for the slowest peer of each timed iteration (median over iterations); with
``--kill-peer-at`` the timed iterations run on the survivors after the recovery.

``--kill-peer-at S``: S seconds after the warm-up, the last peer is killed with SIGKILL while
the peers all-reduce in a loop. Every survivor must see its call abort, find its buffer equal to
its value before the call bit for bit, and retry with the survivors; the result must equal the
reduction over the survivors. ``recovery_seconds`` is the time from the SIGKILL to the
completed retry on the slowest survivor. On a loaded machine a timer can land between two
operations (then nothing is aborted: the next vote leaves the dead peer out, and
``abort_seconds`` is null). ``--kill-peer-mid-op`` removes that chance: the last peer SIGKILLs
itself when it combines the first segment it received in the first all-reduce after the warm-up,
so the kill lands inside an operation every time (``--size`` must be above the small-message
threshold, ``collective.small.SMALL_BYTES``: only the ring path combines segments).

Every process started here runs in its own process group and is killed on exit, error and
Ctrl-C. Exit status 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8}
DTYPES = tuple(ITEMSIZE)
OPS = ("sum", "avg", "min", "max", "prod")


def configure(parser: argparse.ArgumentParser) -> None:
    from ringseed import cmdline

    parser.add_argument("--peers", type=cmdline.positive_int, default=2, help="number of peer processes")
    parser.add_argument("--size", type=cmdline.positive_size, default="16Mi", help="bytes per peer buffer, e.g. 64Mi")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="element type of the buffers")
    parser.add_argument("--op", choices=OPS, default="sum", help="reduction")
    parser.add_argument(
        "--quantize",
        choices=("int8", "fp16", "bf16"),
        default=None,
        help="compress on the wire, floating dtypes only (default: off)",
    )
    parser.add_argument("--iters", type=cmdline.positive_int, default=3, help="timed all-reduces")
    parser.add_argument(
        "--kill-peer-at",
        type=cmdline.positive_seconds,
        default=None,
        metavar="SECONDS",
        help="SIGKILL the last peer this long after the warm-up and check the recovery (default: no kill)",
    )
    parser.add_argument(
        "--kill-peer-mid-op",
        action="store_true",
        help="SIGKILL the last peer inside the first all-reduce after the warm-up (provably mid-operation) "
        "and check the recovery",
    )
    parser.add_argument(
        "--heartbeat-interval", type=cmdline.positive_seconds, default=0.25, help="seconds between peer heartbeats"
    )
    parser.add_argument(
        "--heartbeat-timeout", type=cmdline.positive_seconds, default=2.0, help="seconds of silence that lose a peer"
    )
    parser.add_argument(
        "--timeout", type=cmdline.positive_seconds, default=300.0, help="give up after this many seconds"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    size = int(args.size)
    itemsize = ITEMSIZE[args.dtype]
    problem = _check(args, size=size, itemsize=itemsize)
    if problem:
        print(f"ringseed local allreduce: {problem}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ringseed-allreduce-") as tmp, _Processes(Path(tmp)) as procs:
        summary = _execute(args, procs=procs, count=size // itemsize, tmp=Path(tmp))
    _print(summary, as_json=args.json)
    return 0 if summary["ok"] else 1


def _check(args: argparse.Namespace, *, size: int, itemsize: int) -> str:
    from ringseed.collective.small import SMALL_BYTES

    if args.kill_peer_at is not None and args.kill_peer_mid_op:
        return "--kill-peer-at and --kill-peer-mid-op exclude each other"
    if args.peers < 1 or (_kills(args) and args.peers < 2):
        return "--peers must be at least 1 (2 with --kill-peer-at or --kill-peer-mid-op)"
    if args.kill_peer_mid_op and size <= SMALL_BYTES:
        return f"--kill-peer-mid-op needs --size above {SMALL_BYTES} bytes (smaller buffers combine no segments)"
    if size < itemsize or size % itemsize:
        return f"--size must be a positive multiple of the {args.dtype} item size ({itemsize} bytes)"
    if args.quantize and args.dtype.startswith("int"):
        return "--quantize needs a floating --dtype"
    if args.op == "avg" and args.dtype.startswith("int"):
        return "--op avg needs a floating --dtype"
    return ""


def _kills(args: argparse.Namespace) -> bool:
    return args.kill_peer_at is not None or bool(args.kill_peer_mid_op)


class _Processes:
    """Children in their own process groups, killed (group-wide) on exit."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.children: list[subprocess.Popen[str]] = []

    def __enter__(self) -> _Processes:
        self._old = signal.signal(signal.SIGTERM, _interrupt)
        return self

    def spawn(self, argv: list[str], *, name: str, stdout: int | None = None) -> subprocess.Popen[str]:
        log = open(self.tmp / f"{name}.log", "w", encoding="utf-8")  # noqa: SIM115 - closed with the child
        proc = subprocess.Popen(argv, stdout=stdout, stderr=log, text=True, start_new_session=True)
        log.close()
        self.children.append(proc)
        return proc

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.tmp / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def __exit__(self, *exc: object) -> None:
        for proc in self.children:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
        signal.signal(signal.SIGTERM, self._old)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _signal_group(proc: subprocess.Popen[str], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start_coordinator(args: argparse.Namespace, procs: _Processes, token_file: Path) -> str:
    port = _free_port()
    procs.spawn(
        [
            sys.executable,
            "-m",
            "ringseed.cli",
            "master",
            "--role",
            "coordinator",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--token-file",
            str(token_file),
            "--min-peers",
            str(args.peers),
            "--heartbeat-interval",
            str(args.heartbeat_interval),
            "--heartbeat-timeout",
            str(args.heartbeat_timeout),
        ],
        name="coordinator",
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2):
                return url
        except OSError as exc:
            if time.monotonic() > deadline or procs.children[0].poll() is not None:
                raise RuntimeError(f"coordinator did not start: {exc}\n{procs.log_tail('coordinator')}") from exc
            time.sleep(0.05)


def _execute(args: argparse.Namespace, *, procs: _Processes, count: int, tmp: Path) -> dict[str, Any]:
    token_file = tmp / "token"
    token_file.write_text(secrets.token_hex(16))
    url = _start_coordinator(args, procs, token_file)
    lines: queue.Queue[tuple[int, str]] = queue.Queue()
    workers = []
    for i in range(args.peers):
        argv = [
            sys.executable,
            "-m",
            "ringseed.local.allreduce_worker",
            "--coordinator",
            url,
            "--token-file",
            str(token_file),
            "--index",
            str(i),
            "--count",
            str(count),
            "--dtype",
            args.dtype,
            "--op",
            args.op,
            "--iters",
            str(args.iters),
            "--max-seconds",
            str(args.timeout),
        ]
        argv += ["--quantize", args.quantize] if args.quantize else []
        argv += ["--until-shrunk", str(args.peers)] if _kills(args) else []
        argv += ["--die-mid-op"] if args.kill_peer_mid_op and i == args.peers - 1 else []
        proc = procs.spawn(argv, name=f"peer-{i}", stdout=subprocess.PIPE)
        workers.append(proc)
        assert proc.stdout is not None
        threading.Thread(target=_pump, args=(i, proc.stdout, lines), daemon=True).start()
    deadline = time.monotonic() + args.timeout
    _collect(lines, "READY", expected=set(range(args.peers)), deadline=deadline, procs=procs)
    killed_at = None
    victim = args.peers - 1
    if args.kill_peer_at is not None:
        time.sleep(args.kill_peer_at)
        killed_at = time.time()
        _signal_group(workers[victim], signal.SIGKILL)
    elif args.kill_peer_mid_op:
        line = _collect(lines, "KILLED", expected={victim}, deadline=deadline, procs=procs)[victim]
        killed_at = float(line.split()[1])
        status = workers[victim].wait(max(1.0, deadline - time.monotonic()))
        if status != -signal.SIGKILL:
            raise RuntimeError(f"peer-{victim} was to die by SIGKILL mid-operation, but exited with {status}")
    survivors = set(range(args.peers)) - ({victim} if killed_at else set())
    reports = _collect(lines, "{", expected=survivors, deadline=deadline, procs=procs)
    return _summarise(
        args, reports=[json.loads(r) for _, r in sorted(reports.items())], count=count, killed_at=killed_at
    )


def _pump(index: int, stream: IO[str], lines: queue.Queue[tuple[int, str]]) -> None:
    for line in stream:
        lines.put((index, line.strip()))


def _collect(
    lines: queue.Queue[tuple[int, str]], prefix: str, *, expected: set[int], deadline: float, procs: _Processes
) -> dict[int, str]:
    found: dict[int, str] = {}
    while set(found) < expected:
        try:
            index, line = lines.get(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
        except queue.Empty:
            if time.monotonic() > deadline:
                missing = sorted(expected - set(found))
                tails = "\n".join(f"--- peer-{i}\n{procs.log_tail(f'peer-{i}')}" for i in missing)
                raise TimeoutError(f"no {prefix!r} line from peers {missing}\n{tails}") from None
            continue
        if line.startswith(prefix) and index in expected:
            found[index] = line
    return found


def _summarise(
    args: argparse.Namespace, *, reports: list[dict[str, Any]], count: int, killed_at: float | None
) -> dict[str, Any]:
    nbytes = count * ITEMSIZE[args.dtype]
    world = min(int(r["world_size"]) for r in reports)
    per_iter = [max(times) for times in zip(*(r["times"] for r in reports), strict=False)]
    seconds = statistics.median(per_iter)
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    error = max(float(r["max_abs_error"]) for r in reports)
    ok = all(float(r["max_abs_error"]) <= float(r["tolerance"]) for r in reports)
    ok = ok and len({tuple(r["members"]) for r in reports}) == 1
    summary: dict[str, Any] = {
        "ok": ok,
        "peers": args.peers,
        "world_size": world,
        "bytes": nbytes,
        "dtype": args.dtype,
        "op": args.op,
        "quantize": args.quantize,
        "seconds": seconds,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * 2 * (world - 1) / world if world > 1 else 0.0,
        "max_abs_error": error,
        "tolerance": max(float(r["tolerance"]) for r in reports),
    }
    if killed_at is not None:
        aborts = [t - killed_at for r in reports for t in r["abort_times"] if t >= killed_at]
        restored = all(all(r["restored"]) for r in reports)
        summary.update(
            killed_peer=f"peer-{args.peers - 1}",
            survivors=[r["peer_id"] for r in reports],
            recovery_seconds=max(float(r["done_at"]) for r in reports) - killed_at,
            abort_seconds=max(aborts) if aborts else None,
            restored_bit_for_bit=restored,
            heartbeat_timeout=args.heartbeat_timeout,
        )
        retry_error = max(float(r["retry_max_abs_error"]) for r in reports)
        summary["retry_max_abs_error"] = retry_error
        summary["ok"] = ok and restored and world == args.peers - 1 and retry_error <= summary["tolerance"]
    return summary


def _print(summary: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary))
        return
    print(
        f"all-reduce {summary['bytes']} bytes {summary['dtype']} {summary['op']} on {summary['world_size']} peers"
        f"{' (quantize ' + summary['quantize'] + ')' if summary['quantize'] else ''}"
    )
    print(
        f"  time {summary['seconds'] * 1e3:.2f} ms   algbw {summary['algbw_gbps']:.3f} GB/s   "
        f"busbw {summary['busbw_gbps']:.3f} GB/s"
    )
    print(f"  max abs error {summary['max_abs_error']:.3g} (tolerance {summary['tolerance']:.3g})")
    if "recovery_seconds" in summary:
        print(
            f"  killed {summary['killed_peer']}: aborts seen after {summary['abort_seconds']}, "
            f"recovered in {summary['recovery_seconds']:.3f} s, buffers restored bit for bit: "
            f"{summary['restored_bit_for_bit']}"
        )
    print("  OK" if summary["ok"] else "  FAILED")
