"""The ``ringseed`` backend of ``torch.distributed``: importing this module registers it.

Usage::

    import ringseed.collective.torch_backend  # registers "ringseed"
    torch.distributed.init_process_group("ringseed", rank=rank, world_size=world, store=store)
    # or init_method="tcp://..." / env://, like any backend; DDP works on top.

What this module owns
- :class:`RingseedProcessGroup`, a Python ``ProcessGroup`` over one :class:`engine.RingEngine`:
  allreduce (SUM, AVG, MIN, MAX, PROD), broadcast, allgather (also into one tensor),
  reduce_scatter, barrier; CPU and CUDA tensors (via ``tensors.py``); async ``Work`` handles.
- Rendezvous through the c10d store torch passes in: each rank publishes its engine address
  under ``ringseed/addr/<rank>``; rank 0 publishes a random group token (unless
  ``RINGSEED_TOKEN`` is set) and every rank reads it before the ring connects.
  The engine listens on ``RINGSEED_LISTEN_HOST`` (default 127.0.0.1) and ``RINGSEED_LISTEN_PORT``
  (default 0: any free port).

Fault-tolerance contract
- None here: this is a fixed world, like Gloo. When a peer dies or stalls past the process
  group's timeout, the pending ``Work`` fails with ``CollectiveAborted`` and the group is
  unusable. For fault tolerance (votes, retry with survivors, new peers) use
  ``ringseed.collective.communicator.Communicator`` instead.
- Operations must be issued in the same order on every rank (as torch requires anyway); each
  gets the next tag, and a rank that diverges fails with a tag mismatch instead of mixing data.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import functools
import json
import os
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from ringseed.collective import engine, ops, tensors

BACKEND = "ringseed"
_OPS = {
    dist.ReduceOp.SUM: ops.ReduceOp.SUM,
    dist.ReduceOp.AVG: ops.ReduceOp.AVG,
    dist.ReduceOp.MIN: ops.ReduceOp.MIN,
    dist.ReduceOp.MAX: ops.ReduceOp.MAX,
    dist.ReduceOp.PRODUCT: ops.ReduceOp.PROD,
}


class Work(c10d.Work):
    """A handle on engine futures; ``finish`` runs once they all succeeded, then the torch future is set."""

    def __init__(
        self, futures: Sequence[concurrent.futures.Future[None]], *, result: Any, finish: Callable[[], None]
    ) -> None:
        super().__init__()
        self._torch_future: torch.futures.Future[Any] = torch.futures.Future()
        self._done = concurrent.futures.Future[None]()
        self._pending = len(futures)
        self._lock = threading.Lock()
        self._completing = False
        self._result, self._finish = result, finish
        if not futures:
            self._complete(None)
        for f in futures:
            f.add_done_callback(self._one_done)

    def _one_done(self, future: concurrent.futures.Future[None]) -> None:
        error = future.exception()
        if error is not None:
            self._complete(error)
            return
        with self._lock:
            self._pending -= 1
            last = self._pending == 0
        if last:
            self._complete(None)

    def _complete(self, error: BaseException | None) -> None:
        with self._lock:
            if self._completing:
                return
            self._completing = True
        if error is None:
            try:
                self._finish()
            except Exception as exc:  # a failed copy-back fails the work, never the engine thread
                error = exc
        if error is None:
            self._done.set_result(None)
            self._torch_future.set_result(self._result)
        else:
            self._done.set_exception(error)
            self._torch_future.set_exception(error)

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        self._done.result(timeout=timeout.total_seconds() if timeout else None)
        return True

    def is_completed(self) -> bool:
        return self._done.done()

    def is_success(self) -> bool:
        return self._done.done() and self._done.exception() is None

    def get_future(self) -> torch.futures.Future[Any]:
        return self._torch_future


class RingseedProcessGroup(dist.ProcessGroup):
    """A fixed-world process group whose collectives run on a ringseed ring."""

    def __init__(self, *, store: c10d.Store, rank: int, size: int, timeout: datetime.timedelta) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the two-argument form for Python groups
        token = os.environ.get("RINGSEED_TOKEN") or _shared_token(store, rank=rank)
        self._engine = engine.RingEngine(
            peer_id=f"rank-{rank}",
            token=token,
            host=os.environ.get("RINGSEED_LISTEN_HOST", "127.0.0.1"),
            port=int(os.environ.get("RINGSEED_LISTEN_PORT", "0")),
            io_timeout=timeout.total_seconds(),
        )
        address = self._engine.start()
        store.set(f"ringseed/addr/{rank}", json.dumps([address.peer_id, address.host, address.port]))
        keys = [f"ringseed/addr/{r}" for r in range(size)]
        store.wait(keys, timeout)
        ring = [engine.PeerAddress(*json.loads(store.get(k))) for k in keys]
        self._engine.set_ring(ring, epoch=1, timeout=timeout.total_seconds())
        self._tag = 0

    def getBackendName(self) -> str:
        return BACKEND

    def _next_tag(self) -> int:
        self._tag += 1
        return self._tag

    def allreduce(self, tensor_list: list[torch.Tensor], opts: Any = None) -> Work:  # type: ignore[override]
        op = _OPS[opts.reduceOp.op] if opts is not None else ops.ReduceOp.SUM
        staged = [tensors.stage(t) for t in tensor_list]
        futures = [
            self._engine.all_reduce_async(s.array, op=op, tag=self._next_tag(), bfloat16=s.bfloat16, reducer=s.reducer)
            for s in staged
        ]
        return Work(futures, result=tensor_list, finish=_finish_all(staged))

    def broadcast(self, tensor_list: list[torch.Tensor], opts: Any = None) -> Work:  # type: ignore[override]
        root = opts.rootRank if opts is not None else 0
        staged = [tensors.stage(t) for t in tensor_list]
        futures = [
            self._engine.broadcast_async(s.array, root=root, tag=self._next_tag(), bfloat16=s.bfloat16) for s in staged
        ]
        return Work(futures, result=tensor_list, finish=_finish_all(staged))

    def allgather(  # type: ignore[override]
        self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any = None
    ) -> Work:
        futures, finishers = [], []
        for outs, tensor in zip(output_tensors, input_tensors, strict=True):
            future, finish = self._gather(tensor, functools.partial(_scatter_into, outs=outs))
            futures.append(future)
            finishers.append(finish)
        return Work(futures, result=output_tensors, finish=_run_all(finishers))

    def _allgather_base(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> Work:
        future, finish = self._gather(tensor, lambda gathered: output.detach().view(-1).copy_(gathered))
        return Work([future], result=[output], finish=finish)

    def all_gather_single(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> Work:
        return self._allgather_base(output, tensor, opts)

    def _gather(
        self, tensor: torch.Tensor, deliver: Callable[[torch.Tensor], object]
    ) -> tuple[concurrent.futures.Future[None], Callable[[], None]]:
        source = tensors.stage(tensor, device_reduce=False)
        gathered = torch.empty(tensor.numel() * self.size(), dtype=tensor.dtype)
        future = self._engine.all_gather_async(
            source.array, tensors.to_numpy(gathered), tag=self._next_tag(), bfloat16=source.bfloat16
        )
        return future, lambda: _ignore(deliver(gathered))

    def reduce_scatter(  # type: ignore[override]
        self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: Any = None
    ) -> Work:
        op = _OPS[opts.reduceOp.op] if opts is not None else ops.ReduceOp.SUM
        futures, finishers = [], []
        for out, inputs in zip(output_tensors, input_tensors, strict=True):
            work = torch.cat([t.detach().reshape(-1).cpu() for t in inputs])
            result = torch.empty(out.numel(), dtype=out.dtype)
            futures.append(
                self._engine.reduce_scatter_async(
                    tensors.to_numpy(work),
                    tensors.to_numpy(result),
                    op=op,
                    tag=self._next_tag(),
                    bfloat16=out.dtype == torch.bfloat16,
                )
            )
            finishers.append(lambda out=out, result=result: _ignore(out.detach().copy_(result.view_as(out))))
        return Work(futures, result=output_tensors, finish=_run_all(finishers))

    def reduce_scatter_single(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> Work:
        return self.reduce_scatter([output], [list(tensor.reshape(self.size(), -1).unbind(0))], opts)

    def barrier(self, opts: Any = None) -> Work:
        future = self._engine.all_reduce_async(np.zeros(1, np.int32), op=ops.ReduceOp.SUM, tag=self._next_tag())
        return Work([future], result=None, finish=_run_all([]))

    def shutdown(self) -> None:
        self._engine.close()

    def __del__(self) -> None:
        engine_ = getattr(self, "_engine", None)
        if engine_ is not None:
            engine_.close()


def _finish_all(staged: Sequence[tensors.Staged]) -> Callable[[], None]:
    return _run_all([s.finish for s in staged])


def _run_all(steps: Sequence[Callable[[], None]]) -> Callable[[], None]:
    def run() -> None:
        for step in steps:
            step()

    return run


def _ignore(_: object) -> None:
    return None


def _scatter_into(gathered: torch.Tensor, *, outs: Sequence[torch.Tensor]) -> None:
    offset = 0
    for out in outs:
        out.detach().view(-1).copy_(gathered[offset : offset + out.numel()])
        offset += out.numel()


def _shared_token(store: c10d.Store, *, rank: int) -> str:
    if rank == 0:
        store.set("ringseed/token", secrets.token_hex(16))
    store.wait(["ringseed/token"])
    token: bytes = store.get("ringseed/token")
    return token.decode()


def _create(store: c10d.Store, rank: int, size: int, timeout: datetime.timedelta) -> RingseedProcessGroup:
    return RingseedProcessGroup(store=store, rank=rank, size=size, timeout=timeout)


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])
