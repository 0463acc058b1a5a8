"""All-reduce on loopback, side by side: ringseed's ring, torch.distributed Gloo and a star baseline.

Usage::

    .venv/bin/python bench/allreduce.py                 # N = 2, 3, 4; 1, 4, 16, 64, 256 MiB
    .venv/bin/python bench/allreduce.py --quick         # N = 2, 3, 4; 1 and 16 MiB
    .venv/bin/python bench/allreduce.py --peers 4 --sizes 16,64 --no-kill
    .venv/bin/python bench/allreduce.py --sweep --peers 2,3     # 4 B .. 256 MiB, ringseed vs Gloo

Every (backend, N, size) runs in N fresh processes on 127.0.0.1 with float32 SUM; each rank
checks its result against the known sum. Time per all-reduce is the slowest rank's median over
``--iters`` timed iterations after one warm-up. algbw = bytes / time; busbw = algbw * 2(N-1)/N.

- ringseed: ``collective.engine.RingEngine`` (reduce-scatter + all-gather, pipelined segments;
  below ``small.SMALL_BYTES`` the latency path on the caller's thread).
- torch-ringseed: ``torch.distributed`` with the ``ringseed`` backend (what a training script sees).
- gloo: ``torch.distributed`` with the Gloo backend (skipped when torch is missing).

``--sweep`` measures every size from 4 B to 256 MiB in one set of processes per backend
(torch-ringseed, gloo and the bare engine) and prints time per call, busbw and the time ratio
ringseed/Gloo (issue 14's targets: <= 1 up to 64 KiB, busbw >= Gloo's from 1 MiB).
``--fifo-up-to BYTES`` (root) runs every thread of every rank at SCHED_FIFO while it measures
sizes up to BYTES, for every backend alike: on a shared machine the other tenants' load otherwise
decides the comparison (a rank waiting for a CPU behind a dozen others). Larger sizes run at
normal priority (so a long run does not starve the machine's other users).
- star: what a simple TCP transport does: every peer sends its whole buffer to rank 0, which
  sums and sends the result back to each peer (one thread per peer on rank 0).

``--link-rate 1gbit`` runs every rank in its own network namespace (``ringseed.testbed``) with
its link shaped in both directions, as on real hosts: there the ring's advantage over the star
(N/2 in theory) shows; on loopback all peers share the same CPUs and memory bus, so every
scheme is bound by the total bytes copied, which is the same for ring and star.

The last row is the time from a SIGKILL of one peer to the completed retry on the survivors,
measured by ``ringseed local allreduce --kill-peer-at`` (control part).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
MiB = 1 << 20


def ringseed_rank(w: Worker) -> dict[int, list[float]]:
    from ringseed.collective import engine, small

    if os.environ.get("RINGSEED_BENCH_SMALL_BYTES"):  # --small-bytes: measure the crossover
        small.SMALL_BYTES = int(os.environ["RINGSEED_BENCH_SMALL_BYTES"])

    eng = engine.RingEngine(peer_id=f"r{w.rank}", token="bench", host=w.host, io_timeout=120)
    try:
        address = eng.start()
        w.publish(f"addr{w.rank}", [address.host, address.port])
        ring = [engine.PeerAddress(f"r{r}", *w.lookup(f"addr{r}")) for r in range(w.world)]
        eng.set_ring(ring, epoch=1, timeout=60)
        results = {}
        for count, iters in w.plan():
            array = np.empty(count, np.float32)

            def once(array: np.ndarray = array) -> None:
                array.fill(w.rank + 1)
                eng.all_reduce(array, op=engine.ReduceOp.SUM, tag=0)

            results[count] = _timed(once, array=array, world=w.world, iters=iters, sync=lambda: eng.barrier(tag=0))
        return results
    finally:
        eng.close()


def _torch_rank(w: Worker, backend: str) -> dict[int, list[float]]:
    import torch
    import torch.distributed as dist

    if backend == "ringseed":
        import ringseed.collective.torch_backend  # noqa: F401  (registers the backend)
    torch.set_num_threads(1)  # N ranks share the machine's cores; spinning intra-op threads would starve peers
    if w.rank == 0:
        with socket.socket() as s:
            s.bind((w.host, 0))
            w.publish(backend, [w.host, s.getsockname()[1]])
    host, port = w.lookup(backend)
    dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=w.rank, world_size=w.world)
    try:
        results = {}
        for count, iters in w.plan():
            tensor = torch.empty(count, dtype=torch.float32)

            def once(tensor: torch.Tensor = tensor) -> None:
                tensor.fill_(w.rank + 1)
                dist.all_reduce(tensor)

            results[count] = _timed(once, array=tensor.numpy(), world=w.world, iters=iters, sync=dist.barrier)
        return results
    finally:
        dist.destroy_process_group()


def gloo_rank(w: Worker) -> dict[int, list[float]]:
    return _torch_rank(w, "gloo")


def torch_ringseed_rank(w: Worker) -> dict[int, list[float]]:
    """ringseed through torch.distributed, as a training script calls it (the sweep compares this to Gloo)."""
    return _torch_rank(w, "ringseed")


def star_rank(w: Worker) -> dict[int, list[float]]:
    (count, iters), *_ = w.plan()
    array = np.empty(count, np.float32)
    if w.rank == 0:
        server = socket.create_server((w.host, 0))
        w.publish("star", [w.host, server.getsockname()[1]])
        conns = [server.accept()[0] for _ in range(w.world - 1)]
        server.close()
        scratch = [np.empty(count, np.float32) for _ in conns]
        lock = threading.Lock()

        def once() -> None:
            array.fill(w.rank + 1)
            pairs = zip(conns, scratch, strict=True)
            _in_threads([functools.partial(_star_gather, c, s, array, lock) for c, s in pairs])
            _in_threads([functools.partial(c.sendall, array.data.cast("B")) for c in conns])
    else:
        conn = socket.create_connection(tuple(w.lookup("star")))
        conns = [conn]

        def once() -> None:
            array.fill(w.rank + 1)
            conn.sendall(array.data.cast("B"))
            _recv_into(conn, array.data.cast("B"))

    for c in conns:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        return {count: _timed(once, array=array, world=w.world, iters=iters, sync=lambda: None)}
    finally:
        for c in conns:
            c.close()


def _star_gather(conn: socket.socket, scratch: np.ndarray, total: np.ndarray, lock: threading.Lock) -> None:
    """Rank 0's side of one peer: receive its buffer and add it to the total."""
    _recv_into(conn, scratch.data.cast("B"))
    with lock:
        np.add(total, scratch, out=total)


def _in_threads(jobs: list[Callable[[], object]]) -> None:
    threads = [threading.Thread(target=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _recv_into(conn: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed")
        got += n


def _timed(
    once: Callable[[], None], *, array: np.ndarray, world: int, iters: int, sync: Callable[[], Any]
) -> list[float]:
    _fifo(array.nbytes <= int(os.environ.get("RINGSEED_BENCH_FIFO_UP_TO", "-1")))  # --fifo-up-to
    once()  # warm-up (connections, page faults)
    want = world * (world + 1) / 2
    if not np.all(array == want):
        raise AssertionError(f"wrong sum: {array[:4]} != {want}")
    times = []
    for _ in range(iters):
        sync()
        start = time.perf_counter()
        once()
        times.append(time.perf_counter() - start)
    return times


def _fifo(on: bool) -> None:
    """Every thread of this process (the backend's own I/O threads too) to SCHED_FIFO, or back."""
    policy, param = (os.SCHED_FIFO, os.sched_param(10)) if on else (os.SCHED_OTHER, os.sched_param(0))
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setscheduler(int(tid), policy, param)


RUNNERS: dict[str, Callable[[Worker], dict[int, list[float]]]] = {
    "ringseed": ringseed_rank,
    "torch-ringseed": torch_ringseed_rank,
    "gloo": gloo_rank,
    "star": star_rank,
}


@dataclasses.dataclass(frozen=True)
class Worker:
    """One rank's arguments; rendezvous goes through small files in ``folder`` (works across namespaces)."""

    backend: str
    rank: int
    world: int
    counts: str  # "count:iters,count:iters,..." float32 elements and timed iterations per size
    folder: Path
    host: str

    def plan(self) -> list[tuple[int, int]]:
        return [(int(c), int(i)) for c, i in (item.split(":") for item in self.counts.split(","))]

    def publish(self, key: str, value: Any) -> None:
        tmp = self.folder / f".{key}.tmp"
        tmp.write_text(json.dumps(value))
        tmp.rename(self.folder / key)

    def lookup(self, key: str, timeout: float = 120.0) -> Any:
        deadline = time.monotonic() + timeout
        while not (self.folder / key).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"nobody published {key!r}")
            time.sleep(0.02)
        return json.loads((self.folder / key).read_text())


def worker_main(argv: list[str]) -> int:
    backend, rank, world, counts, folder, host = argv
    w = Worker(backend=backend, rank=int(rank), world=int(world), counts=counts, folder=Path(folder), host=host)
    try:
        w.publish(f"result{w.rank}", {str(k): v for k, v in RUNNERS[backend](w).items()})
    except BaseException as exc:
        w.publish(f"result{w.rank}", f"{type(exc).__name__}: {exc}")
        return 1
    return 0


def measure(backend: str, *, world: int, nbytes: int, iters: int, testbed: Any = None) -> float:
    """Median over iterations of the slowest rank's time for one all-reduce, in seconds."""
    return measure_sizes(backend, world=world, plan=[(nbytes, iters)], testbed=testbed)[nbytes]


def measure_sizes(backend: str, *, world: int, plan: list[tuple[int, int]], testbed: Any = None) -> dict[int, float]:
    """bytes -> median of the slowest rank's time, every size in one set of N processes."""
    counts = ",".join(f"{max(1, nbytes // 4)}:{iters}" for nbytes, iters in plan)
    with tempfile.TemporaryDirectory(prefix="ringseed-bench-") as folder:
        procs = []
        for rank in range(world):
            host = testbed.nodes[rank] if testbed is not None else None
            args = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--worker",
                backend,
                str(rank),
                str(world),
                counts,
                folder,
                host.address if host else "127.0.0.1",
            ]
            env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0" if host else "lo", "PYTHONPATH": str(REPO)}
            procs.append(host.popen(args, env=env) if host else subprocess.Popen(args, env=env))
        for p in procs:
            try:
                p.wait(timeout=1800)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        reports = [Worker.lookup(_reader(folder), f"result{r}", timeout=5) for r in range(world)]
    errors = [v for v in reports if isinstance(v, str)]
    if errors:
        raise RuntimeError(f"{backend} N={world}: {errors[0]}")
    result = {}
    for nbytes, _ in plan:
        key = str(max(1, nbytes // 4))
        result[nbytes] = float(statistics.median(max(ts) for ts in zip(*(r[key] for r in reports), strict=True)))
    return result


def _reader(folder: str) -> Worker:
    return Worker(backend="", rank=0, world=0, counts="", folder=Path(folder), host="")


def kill_row(world: int, size_mib: int) -> dict[str, Any] | None:
    cmd = [
        sys.executable,
        "-m",
        "ringseed.cli",
        "local",
        "allreduce",
        "--peers",
        str(world),
        "--size",
        f"{size_mib}Mi",
        "--iters",
        "3",
        "--kill-peer-at",
        "1",
        "--json",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    try:
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return result
    except (IndexError, json.JSONDecodeError):
        print(f"  kill row failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
        return None


def main() -> int:
    if sys.argv[1:2] == ["--worker"]:
        return worker_main(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="sizes 1 and 16 MiB only")
    parser.add_argument("--peers", default="2,3,4")
    parser.add_argument("--sizes", default=None, help="MiB, comma-separated (default 1,4,16,64,256)")
    parser.add_argument("--backends", default="ringseed,gloo,star")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument(
        "--link-rate",
        default=None,
        help="run each rank in its own network namespace with links shaped to this rate "
        "(e.g. 1gbit; needs root, ip and tc) instead of plain loopback",
    )
    parser.add_argument("--no-kill", action="store_true", help="skip the SIGKILL recovery row")
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="latency/bandwidth curve from 4 B to 256 MiB (every size in one set of processes per backend), "
        "torch-ringseed vs gloo vs the bare engine; --peers picks N",
    )
    parser.add_argument(
        "--sweep-range",
        default=None,
        metavar="MIN,MAX",
        help="with --sweep: only the sizes from MIN to MAX bytes (e.g. 262144,16777216 while iterating)",
    )
    parser.add_argument(
        "--fifo-up-to",
        type=int,
        default=None,
        metavar="BYTES",
        help="measure sizes up to BYTES with every rank's threads at SCHED_FIFO (root), all backends alike",
    )
    parser.add_argument(
        "--small-bytes",
        type=int,
        default=None,
        help="override collective.small.SMALL_BYTES in the bare engine's ranks (to measure the crossover)",
    )
    args = parser.parse_args()
    if args.small_bytes is not None:
        os.environ["RINGSEED_BENCH_SMALL_BYTES"] = str(args.small_bytes)
    if args.fifo_up_to is not None:
        os.environ["RINGSEED_BENCH_FIFO_UP_TO"] = str(args.fifo_up_to)
    if args.sweep:
        low, high = (int(b) for b in (args.sweep_range or f"0,{SWEEP[-1]}").split(","))
        sizes = [n for n in SWEEP if low <= n <= high]
        if not sizes:
            parser.error(f"--sweep-range {args.sweep_range} holds none of the sweep's sizes (4 B x 4^k)")
        return sweep(peers=[int(n) for n in args.peers.split(",")], backends=args.backends, sizes=sizes)
    sizes = [int(s) for s in (args.sizes or ("1,16" if args.quick else "1,4,16,64,256")).split(",")]
    peers = [int(n) for n in args.peers.split(",")]
    backends = [b for b in args.backends.split(",") if b != "gloo" or _has_torch()]
    where = f"network namespaces, links shaped to {args.link_rate}" if args.link_rate else "loopback"
    print(
        f"float32 SUM all-reduce on {where}\n"
        f"{'backend':<9} {'N':>2} {'size':>8} {'time ms':>9} {'algbw GB/s':>11} {'busbw GB/s':>11}"
    )
    table: dict[tuple[str, int, int], float] = {}
    for world in peers:
        with _testbed(world, args.link_rate) as testbed:
            for size in sizes:
                for backend in backends:
                    seconds = measure(backend, world=world, nbytes=size * MiB, iters=args.iters, testbed=testbed)
                    algbw = size * MiB / seconds / 1e9
                    table[backend, world, size] = algbw * 2 * (world - 1) / world
                    print(
                        f"{backend:<9} {world:>2} {size:>5} MiB {seconds * 1e3:>9.2f} {algbw:>11.3f} "
                        f"{table[backend, world, size]:>11.3f}",
                        flush=True,
                    )
    _print_ratios(table, peers=peers, sizes=sizes)
    if not args.no_kill:
        result = kill_row(world=max(peers), size_mib=16)
        if result is not None:
            print(
                f"SIGKILL of 1 of {max(peers)} peers during 16 MiB all-reduces (loopback): retry completed "
                f"{result.get('recovery_seconds', float('nan')):.3f} s after the kill "
                f"(abort seen after {result.get('abort_seconds')}, ok={result.get('ok')})"
            )
    return 0


SWEEP = [4 << (2 * k) for k in range(14)]  # 4 B, 16 B, ..., 64 MiB, 256 MiB


def _sweep_iters(nbytes: int) -> int:
    return 200 if nbytes <= 64 << 10 else 30 if nbytes <= 4 * MiB else 5 if nbytes <= 16 * MiB else 3


def sweep(*, peers: list[int], backends: str, sizes: list[int]) -> int:
    """Latency and busbw per size, side by side; ratios against Gloo (targets in issue 14)."""
    names = [b for b in (backends if backends != "ringseed,gloo,star" else "torch-ringseed,gloo,ringseed").split(",")]
    names = [b for b in names if b not in ("gloo", "torch-ringseed") or _has_torch()]
    plan = [(n, _sweep_iters(n)) for n in sizes]
    for world in peers:
        times = {b: measure_sizes(b, world=world, plan=plan) for b in names}
        up_to = int(os.environ.get("RINGSEED_BENCH_FIFO_UP_TO", "-1"))
        fifo = f" (sizes <= {_size(up_to)} at SCHED_FIFO)" if up_to >= 0 else ""
        print(f"\nfloat32 SUM all-reduce, N={world}, loopback{fifo}; time per call (median of the slowest rank), busbw")
        print(f"{'size':>9} " + " ".join(f"{b + ' us':>16} {'GB/s':>6}" for b in names) + "   ringseed/gloo")
        for nbytes, _ in plan:
            cells = []
            for b in names:
                t = times[b][nbytes]
                cells.append(f"{t * 1e6:>16.1f} {nbytes / t / 1e9 * 2 * (world - 1) / world:>6.2f}")
            mine, gloo = times.get("torch-ringseed", {}).get(nbytes), times.get("gloo", {}).get(nbytes)
            ratio = f"time {mine / gloo:.2f}x" if mine and gloo else "-"
            print(f"{_size(nbytes):>9} " + " ".join(cells) + f"   {ratio}", flush=True)
    return 0


def _size(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


@contextlib.contextmanager
def _testbed(world: int, rate: str | None) -> Iterator[Any]:
    if rate is None:
        yield None
        return
    from ringseed.testbed import links, netns

    problem = netns.can_run()
    if problem:
        raise SystemExit(f"--link-rate needs a testbed: {problem}")
    with netns.Testbed(nodes=world, origin_rate=None, node_rate=links.parse_rate(rate)) as testbed:
        yield testbed


def _print_ratios(table: dict[tuple[str, int, int], float], *, peers: list[int], sizes: list[int]) -> None:
    print(f"\n{'N':>2} {'size':>8} {'ringseed/gloo':>14} {'ringseed/star':>14}")
    for world in peers:
        for size in sizes:
            mine = table.get(("ringseed", world, size))
            gloo, star = table.get(("gloo", world, size)), table.get(("star", world, size))
            print(f"{world:>2} {size:>5} MiB {_ratio(mine, gloo):>14} {_ratio(mine, star):>14}")


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
