"""Benchmark: 50 ModelDistributions created at once against KMock; how fast the operator reacts.

Runs the real operator (kopf + ringseed's handlers, ``ringseed.operator.command.operate``) in its
own thread and event loop, as the component tests do, against KMock (the component tests'
emulator without the bookkeeping that only assertions use: ``bench/kmock_lean.py``) over HTTP on loopback; creates N
ModelDistributions at once, and prints p50/p95/max of the time from each create to (a) all its
children present (every object its builders make: token Secret, master Deployment and Service,
agent DaemonSet, and the namespace's master identity, made once) and (b) the first status
patch. Masters are unreachable here (a closed loopback port), as right after a real create.
Also printed: the CPU time the process (operator and KMock together) spent from the first create
until every resource had its children and status (robust where wall time is not: on a shared
machine), and whether the run ended cleanly: no record at ERROR or above was logged from start to
stop (a failed status patch at shutdown, say).
``--own-process`` runs the operator in a process of its own instead, as in a cluster (on a
machine with a core to spare for it; on two busy cores it measured slower than the thread).

Target: p50 <= 0.5 s, p95 <= 2 s for both.

    .venv/bin/python bench/operator.py [--count 50] [--timeout 60] [--own-process]
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is named operator.py: keep its folder off sys.path so the standard library's
# ``operator`` module is never shadowed; import from the repository root instead.
ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import logging  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import AsyncIterator  # noqa: E402
from typing import Any  # noqa: E402

import kmock  # noqa: E402
import kopf  # noqa: E402

from bench import kmock_lean  # noqa: E402
from ringseed.api import constants, validation  # noqa: E402
from ringseed.operator import builders, builders_common, command, masters  # noqa: E402
from ringseed.operator import config as config_module  # noqa: E402
from tests.component.operator import conftest as harness  # noqa: E402


def children_of(body: dict[str, Any]) -> set[tuple[str, str]]:
    """(plural, name) of every object the operator makes for ``body``: the token Secret and what
    its builders return (so the list stays true when a child is added, such as the masters' Lease
    identity)."""
    config = config_module.OperatorConfig()
    name = body["metadata"]["name"]
    spec = validation.parse_model_distribution(body["spec"], name=name, data_root=config.data_root)
    built = builders.md_children(body=body, spec=spec, config=config)
    if any(builders_common.uses_master_identity(c) for c in built):  # made once for the namespace
        built += builders_common.master_identity(namespace=body["metadata"]["namespace"])
    return {("secrets", f"{name}-token")} | {(PLURALS[c["kind"]], c["metadata"]["name"]) for c in built}


PLURALS = {
    "Secret": "secrets",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "Deployment": "deployments",
    "Service": "services",
    "DaemonSet": "daemonsets",
}


def operate(server: str, *, ready: threading.Event) -> Any:
    """The operator as ``ringseed operator`` runs it, pointed at KMock; masters unreachable."""
    return command.operate(
        config=config_module.OperatorConfig(),
        login=lambda: kopf.ConnectionInfo(server=server),
        locator=masters.Locator(template="http://127.0.0.1:9"),  # nobody listens: masters unreachable
        ready_flag=ready,
    )


def serve_operator(server: str) -> None:
    """``--operator-for URL``: run the operator; say "ready" on stdout; stop when stdin closes."""
    logging.basicConfig(level=logging.ERROR)

    async def main() -> None:
        ready = threading.Event()
        task = asyncio.create_task(operate(server, ready=ready))
        await asyncio.to_thread(ready.wait)
        print("ready", flush=True)
        since = time.process_time()
        await asyncio.to_thread(sys.stdin.read)  # the benchmark closed our stdin: it is done
        print(f"cpu {time.process_time() - since:.3f}", flush=True)  # the operator's own, from ready on
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


@contextlib.asynccontextmanager
async def operator_process(server: str) -> AsyncIterator[None]:
    """The operator in a process of its own, as in a cluster (no interpreter lock shared with KMock)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--operator-for", server, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        if line.strip() != b"ready":
            raise SystemExit("the operator did not get ready")
        yield
    finally:
        proc.stdin.close()
        with contextlib.suppress(TimeoutError, ValueError):
            line = await asyncio.wait_for(proc.stdout.readline(), 20)
            if line.startswith(b"cpu "):
                CPU["operator"] = float(line.split()[1])
        try:
            await asyncio.wait_for(proc.wait(), 20)
        except TimeoutError:
            proc.kill()
            await proc.wait()


@contextlib.asynccontextmanager
async def operator_thread(server: str) -> AsyncIterator[None]:
    thread, loop, task = start_operator(server)
    try:
        yield
    finally:
        loop.call_soon_threadsafe(task.cancel)
        await asyncio.to_thread(thread.join, 20)


def start_operator(server: str) -> tuple[threading.Thread, asyncio.AbstractEventLoop, Any]:
    """The operator in its own thread and loop (as in the component tests)."""
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def run() -> None:
        loop = asyncio.new_event_loop()
        holder["loop"] = loop
        holder["task"] = loop.create_task(operate(server, ready=ready))
        try:
            loop.run_until_complete(holder["task"])
        except BaseException:  # cancelled at the end
            pass
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="operator", daemon=True)
    thread.start()
    if not ready.wait(30):
        raise SystemExit("the operator did not get ready in 30 s")
    return thread, holder["loop"], holder["task"]


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, round(0.95 * len(ordered)) - 1)]


def percentiles(values: list[float]) -> str:
    return f"p50 {statistics.median(values):6.3f} s   p95 {p95(values):6.3f} s   max {max(values):6.3f} s"


class ErrorCount(logging.Handler):
    """Counts records at ERROR or above (kopf logs a failed handler's traceback at ERROR)."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


CPU: dict[str, float] = {}


async def measure(*, count: int, within: float, own_process: bool = False) -> tuple[list[float], list[float]]:
    async with kmock_lean.LeanEmulator() as api, kmock.Server(api):
        harness.declare(api)
        running = operator_process if own_process else operator_thread
        async with running(str(api.url).rstrip("/")):
            names = [f"model-{i:03d}" for i in range(count)]
            created: dict[str, float] = {}

            async def make(name: str) -> None:
                await harness.create(api, harness.MD_RES, harness.model_distribution(name))
                created[name] = time.perf_counter()

            started, cpu = time.perf_counter(), time.process_time()
            await asyncio.gather(*(make(name) for name in names))
            children, status = await watch(api, names=names, since=started, within=within)
            CPU["seconds"] = time.process_time() - cpu
            return [children[n] - created[n] for n in names if n in children], [
                status[n] - created[n] for n in names if n in status
            ]


async def watch(
    api: Any, *, names: list[str], since: float, within: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Scan KMock's store every 10 ms (one pass, cheap: it shares the loop with KMock); note when
    each resource's children and its status first appear."""
    children: dict[str, float] = {}
    status: dict[str, float] = {}
    wanted = {name: children_of(harness.model_distribution(name)) for name in names}
    while (len(children) < len(names) or len(status) < len(names)) and time.perf_counter() - since < within:
        now = time.perf_counter()
        present: set[tuple[str, str]] = set()
        with_status: set[str] = set()
        for (resource, _, name), obj in list(api.objects.items()):
            if obj.deleted:
                continue
            present.add((resource.plural, name))
            if resource.plural == constants.MD_PLURAL and obj.get("status"):
                with_status.add(name)
        for name in names:
            if name not in children and wanted[name] <= present:
                children[name] = now
            if name not in status and name in with_status:
                status[name] = now
        await asyncio.sleep(0.01)
    return children, status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--own-process", action="store_true", help="run the operator in a process of its own")
    parser.add_argument("--operator-for", metavar="URL", help=argparse.SUPPRESS)  # the operator's own process
    args = parser.parse_args()
    if args.operator_for:
        serve_operator(args.operator_for)
        return 0
    logging.basicConfig(level=logging.ERROR)
    errors = ErrorCount()
    logging.getLogger().addHandler(errors)
    children, status = asyncio.run(measure(count=args.count, within=args.timeout, own_process=args.own_process))
    where = "its own process" if args.own_process else "a thread of the benchmark"
    print(f"{args.count} ModelDistributions created at once against KMock ({constants.API_VERSION})")
    print(f"  operator in {where}")
    print(
        f"  create -> all children present ({len(children)}/{args.count}):  {percentiles(children or [float('nan')])}"
    )
    print(f"  create -> first status patch   ({len(status)}/{args.count}):  {percentiles(status or [float('nan')])}")
    if args.own_process:  # the operator's own process has its own CPU clock
        operator_cpu = CPU.get("operator", float("nan"))
        per = operator_cpu / args.count * 1e3
        print(f"  operator process CPU, ready to stop: {operator_cpu:.2f} s ({per:.1f} ms per resource)")
    else:
        print(f"  process CPU until all were done: {CPU.get('seconds', float('nan')):.2f} s (operator + KMock)")
    clean = not errors.records
    print(f"  clean end (no ERROR logged): {'yes' if clean else 'NO'} ({len(errors.records)} records)")
    ok = len(children) == len(status) == args.count
    ok = ok and all(statistics.median(v) <= 0.5 and p95(v) <= 2 for v in (children, status))
    print("  target p50 <= 0.5 s, p95 <= 2 s:", "met" if ok else "NOT met")
    return 0 if ok and clean else 1


if __name__ == "__main__":
    sys.exit(main())
