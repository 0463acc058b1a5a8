"""All-reduce on loopback, side by side: ringseed's ring, torch.distributed Gloo and a star baseline.

Usage::

    .venv/bin/python bench/allreduce.py                 # N = 2, 3, 4; 1, 4, 16, 64, 256 MiB
    .venv/bin/python bench/allreduce.py --quick         # N = 2, 3, 4; 1 and 16 MiB
    .venv/bin/python bench/allreduce.py --peers 4 --sizes 16,64 --no-kill

Every (backend, N, size) runs in N fresh processes on 127.0.0.1 with float32 SUM; each rank
checks its result against the known sum. Time per all-reduce is the slowest rank's median over
``--iters`` timed iterations after one warm-up. algbw = bytes / time; busbw = algbw * 2(N-1)/N.

- ringseed: ``collective.engine.RingEngine`` (reduce-scatter + all-gather, pipelined segments).
- gloo: ``torch.distributed`` with the Gloo backend (skipped when torch is missing).
- star: what a simple TCP transport does: every peer sends its whole buffer to rank 0, which
  sums and sends the result back to each peer (one thread per peer on rank 0).

The last row is the time from a SIGKILL of one peer to the completed retry on the survivors,
measured by ``ringseed local allreduce --kill-peer-at`` (control part).
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
MiB = 1 << 20


def ringseed_rank(
    rank: int, world: int, count: int, iters: int, rendezvous: Queue[Any], mine: Queue[Any]
) -> list[float]:
    from ringseed.collective import engine

    eng = engine.RingEngine(peer_id=f"r{rank}", token="bench", io_timeout=120)
    try:
        rendezvous.put((rank, eng.start()))
        ring = mine.get(timeout=120)
        eng.set_ring(ring, epoch=1, timeout=60)
        array = np.empty(count, np.float32)

        def once() -> None:
            array.fill(rank + 1)
            eng.all_reduce(array, op=engine.ReduceOp.SUM, tag=0)
        return _timed(once, array=array, world=world, iters=iters, sync=lambda: eng.barrier(tag=0))
    finally:
        eng.close()


def gloo_rank(
    rank: int, world: int, count: int, iters: int, rendezvous: Queue[Any], mine: Queue[Any]
) -> list[float]:
    import torch
    import torch.distributed as dist

    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for _ in range(world - 1):
            rendezvous.put(port)
    else:
        port = mine.get(timeout=120)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    tensor = torch.empty(count, dtype=torch.float32)

    def once() -> None:
        tensor.fill_(rank + 1)
        dist.all_reduce(tensor)
    try:
        return _timed(once, array=tensor.numpy(), world=world, iters=iters, sync=dist.barrier)
    finally:
        dist.destroy_process_group()


def star_rank(
    rank: int, world: int, count: int, iters: int, rendezvous: Queue[Any], mine: Queue[Any]
) -> list[float]:
    array = np.empty(count, np.float32)
    if rank == 0:
        server = socket.create_server(("127.0.0.1", 0))
        for _ in range(world - 1):
            rendezvous.put(server.getsockname()[1])
        conns = [server.accept()[0] for _ in range(world - 1)]
        server.close()
        scratch = [np.empty(count, np.float32) for _ in conns]
        lock = threading.Lock()

        def once() -> None:
            array.fill(rank + 1)
            pairs = zip(conns, scratch, strict=True)
            _in_threads([functools.partial(_star_gather, c, s, array, lock) for c, s in pairs])
            _in_threads([functools.partial(c.sendall, array.data.cast("B")) for c in conns])
    else:
        conn = socket.create_connection(("127.0.0.1", mine.get(timeout=120)))
        conns = [conn]

        def once() -> None:
            array.fill(rank + 1)
            conn.sendall(array.data.cast("B"))
            _recv_into(conn, array.data.cast("B"))
    for c in conns:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        return _timed(once, array=array, world=world, iters=iters, sync=lambda: None)
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


def _timed(once: Callable[[], None], *, array: np.ndarray, world: int, iters: int, sync: Callable[[], Any]
           ) -> list[float]:
    once()                                                          # warm-up (connections, page faults)
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


RUNNERS = {"ringseed": ringseed_rank, "gloo": gloo_rank, "star": star_rank}


def _child(backend: str, rank: int, world: int, count: int, iters: int, rendezvous: Queue[Any], mine: Queue[Any],
           results: Queue[Any]) -> None:
    try:
        results.put((rank, RUNNERS[backend](rank, world, count, iters, rendezvous, mine)))
    except BaseException as exc:
        results.put((rank, f"{type(exc).__name__}: {exc}"))


def measure(backend: str, *, world: int, nbytes: int, iters: int) -> float:
    """Median over iterations of the slowest rank's time for one all-reduce, in seconds."""
    ctx = multiprocessing.get_context("spawn")
    rendezvous, results = ctx.Queue(), ctx.Queue()
    mines = [ctx.Queue() for _ in range(world)]
    procs = [ctx.Process(target=_child, args=(backend, r, world, nbytes // 4, iters, rendezvous, mines[r], results))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        _relay(backend, world=world, rendezvous=rendezvous, mines=mines)
        reports = dict(results.get(timeout=600) for _ in range(world))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    errors = [v for v in reports.values() if isinstance(v, str)]
    if errors:
        raise RuntimeError(f"{backend} N={world}: {errors[0]}")
    return float(statistics.median(max(ts) for ts in zip(*reports.values(), strict=True)))


def _relay(backend: str, *, world: int, rendezvous: Queue[Any], mines: list[Queue[Any]]) -> None:
    if backend == "ringseed":
        addresses = dict(rendezvous.get(timeout=120) for _ in range(world))
        ring = [addresses[r] for r in range(world)]
        for q in mines:
            q.put(ring)
    else:
        for r in range(1, world):
            mines[r].put(rendezvous.get(timeout=120))


def kill_row(world: int, size_mib: int) -> dict[str, Any] | None:
    cmd = [sys.executable, "-m", "ringseed.cli", "local", "allreduce", "--peers", str(world), "--size",
           f"{size_mib}Mi", "--iters", "3", "--kill-peer-at", "1", "--json"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    try:
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return result
    except (IndexError, json.JSONDecodeError):
        print(f"  kill row failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="sizes 1 and 16 MiB only")
    parser.add_argument("--peers", default="2,3,4")
    parser.add_argument("--sizes", default=None, help="MiB, comma-separated (default 1,4,16,64,256)")
    parser.add_argument("--backends", default="ringseed,gloo,star")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--no-kill", action="store_true", help="skip the SIGKILL recovery row")
    args = parser.parse_args()
    sizes = [int(s) for s in (args.sizes or ("1,16" if args.quick else "1,4,16,64,256")).split(",")]
    peers = [int(n) for n in args.peers.split(",")]
    backends = [b for b in args.backends.split(",") if b != "gloo" or _has_torch()]
    print(f"{'backend':<9} {'N':>2} {'size':>8} {'time ms':>9} {'algbw GB/s':>11} {'busbw GB/s':>11}")
    table: dict[tuple[str, int, int], float] = {}
    for world in peers:
        for size in sizes:
            for backend in backends:
                seconds = measure(backend, world=world, nbytes=size * MiB, iters=args.iters)
                algbw = size * MiB / seconds / 1e9
                table[backend, world, size] = algbw * 2 * (world - 1) / world
                print(f"{backend:<9} {world:>2} {size:>5} MiB {seconds * 1e3:>9.2f} {algbw:>11.3f} "
                      f"{table[backend, world, size]:>11.3f}", flush=True)
    _print_ratios(table, peers=peers, sizes=sizes)
    if not args.no_kill:
        result = kill_row(world=max(peers), size_mib=16)
        if result is not None:
            print(f"SIGKILL of 1 of {max(peers)} peers during 16 MiB all-reduces: retry completed "
                  f"{result.get('recovery_seconds', float('nan')):.3f} s after the kill "
                  f"(abort seen after {result.get('abort_seconds')}, ok={result.get('ok')})")
    return 0


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
