"""The ``ringseed`` backend of ``torch.distributed``: importing this module registers it.

Usage::

    import ringseed.collective.torch_backend  # registers "ringseed"
    torch.distributed.init_process_group("ringseed", rank=rank, world_size=world, store=store)
    # or init_method="tcp://..." / env://, like any backend; DDP works on top.

What this module owns
- :class:`RingseedProcessGroup`: every c10d operation on CPU (and CUDA) tensors. Reductions
  (all_reduce and its coalesced form, reduce, reduce_scatter, barrier) run on the ring engine:
  SUM, AVG, MIN, MAX, PRODUCT, and BAND, BOR, BXOR on integers; small buffers take the engine's
  latency path on the calling thread. Data movement (broadcast, all_gather and its forms) runs
  on the ring as raw bytes, so any dtype (bool, complex, float8) moves. Point-to-point (send,
  recv, recv from any source, isend/irecv, ``batch_isend_irecv``) and the rooted or personalised
  operations (gather, scatter, all_to_all, all_to_all_single with splits, and the ``_object``
  forms torch builds on them) run on direct links between every pair of ranks
  (``mesh.py``). ``monitored_barrier`` names the ranks that did not arrive; importing this module
  makes ``torch.distributed.monitored_barrier`` accept ringseed groups too (torch refuses every
  backend not named "gloo" before calling the group's method; see :func:`monitored_barrier`). Sparse COO tensors
  are all-reduced with SUM (as Gloo does: indices and values gathered, then coalesced); every
  other operation refuses them with an error naming ringseed and the operation.
- Rendezvous through the c10d store torch passes in: each rank publishes its engine address
  under ``ringseed/addr/<rank>``; rank 0 publishes a random group token (unless
  ``RINGSEED_TOKEN`` is set). The engine listens on ``RINGSEED_LISTEN_HOST`` (default 127.0.0.1)
  and ``RINGSEED_LISTEN_PORT`` (default 0: any free port). A subgroup (``new_group``) is a group
  of its own with its own engine; destroying it closes that engine.

Registration: torch's modern route is a ``c10d.Backend`` per device wrapped by its own
``ProcessGroup`` (what ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` wraps). In torch 2.13 ``c10d.Backend``
has no Python constructor (``c10d.Backend(0, 1)`` raises "No constructor defined!"; only
``ProcessGroup`` has a Python trampoline), so a Python backend can only be a ``ProcessGroup``
subclass, which torch uses as the group itself. DETAIL mode therefore runs (its checks in
``distributed_c10d`` apply) without torch's collective-fingerprint wrapper; ringseed's own frame
checks (every frame carries the operation's tag, sequence, dtype and size) catch ranks that
issue different collectives.

Fault-tolerance contract
- None here: this is a fixed world, like Gloo. When a peer dies or stalls past the process
  group's timeout, the pending ``Work`` fails with ``CollectiveAborted`` and the group is
  unusable. For fault tolerance (votes, retry with survivors, new peers) use
  ``ringseed.collective.communicator.Communicator`` instead.
- Collectives must be issued in the same order on every rank (as torch requires anyway); each
  gets the next tag, and a rank that diverges fails with a tag mismatch instead of mixing data.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import functools
import json
import os
import secrets
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from ringseed.collective import engine, mesh, ops, tensors

BACKEND = "ringseed"
_OPS = {
    dist.ReduceOp.SUM: ops.ReduceOp.SUM,
    dist.ReduceOp.AVG: ops.ReduceOp.AVG,
    dist.ReduceOp.MIN: ops.ReduceOp.MIN,
    dist.ReduceOp.MAX: ops.ReduceOp.MAX,
    dist.ReduceOp.PRODUCT: ops.ReduceOp.PROD,
    dist.ReduceOp.BAND: ops.ReduceOp.BAND,
    dist.ReduceOp.BOR: ops.ReduceOp.BOR,
    dist.ReduceOp.BXOR: ops.ReduceOp.BXOR,
}
USER_TAGS = 1 << 62  # send/recv tags must be below; the group's own mesh messages use tags above
_MONITOR = 1 << 63


class Work(c10d.Work):
    """A handle on engine futures; ``finish`` runs once they all succeeded, then the torch future is set.

    Without futures (the operation already ran on the caller's thread) the work is complete at
    once and costs no synchronisation: its torch future is only made if someone asks for it."""

    def __init__(
        self,
        futures: Sequence[concurrent.futures.Future[Any]] = (),
        *,
        result: Any,
        finish: Callable[[], None] = lambda: None,
        helper: engine.RingEngine | None = None,
    ) -> None:
        super().__init__()
        self._result, self._finish, self._helper = result, finish, helper
        self._futures = list(futures)
        self._torch_future: torch.futures.Future[Any] | None = None
        if not self._futures:
            self._done = _finished(finish)
            return
        self._torch_future = torch.futures.Future()
        self._done = concurrent.futures.Future[None]()
        self._pending = len(self._futures)
        self._lock = threading.Lock()
        self._completing = False
        for f in self._futures:
            f.add_done_callback(self._one_done)

    def _one_done(self, future: concurrent.futures.Future[Any]) -> None:
        error = future.exception() if not future.cancelled() else engine.CollectiveAborted("operation cancelled")
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
        assert self._torch_future is not None
        if error is None:
            self._done.set_result(None)
            self._torch_future.set_result(self._result)
        else:
            self._done.set_exception(error)
            self._torch_future.set_exception(error)

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if self._done is _DONE:
            return True
        if self._helper is not None:
            for f in self._futures:
                self._helper.help(f)  # a synchronous caller runs its own operation: no thread hand-off
        seconds = timeout.total_seconds() if timeout else None
        try:
            self._done.result(timeout=seconds)
        except concurrent.futures.TimeoutError:
            raise RuntimeError(f"ringseed: Timed out waiting {seconds} s for the operation") from None
        return True

    def is_completed(self) -> bool:
        return self._done.done()

    def is_success(self) -> bool:
        return self._done.done() and self._done.exception() is None

    def exception(self) -> BaseException | None:
        return self._done.exception() if self._done.done() else None

    def get_future(self) -> torch.futures.Future[Any]:
        if self._torch_future is None:  # complete from the start: made on demand
            future: torch.futures.Future[Any] = torch.futures.Future()
            error = self._done.exception()
            if error is None:
                future.set_result(self._result)
            else:
                future.set_exception(error)
            self._torch_future = future
        return self._torch_future

    def _source_rank(self) -> int:
        self.wait()
        source: int = self._futures[0].result()
        return source

    def source_rank(self) -> int:
        return self._source_rank()


class RingseedProcessGroup(dist.ProcessGroup):
    """A fixed-world process group whose collectives run on a ringseed ring and direct links."""

    def __init__(self, *, store: c10d.Store, rank: int, size: int, timeout: datetime.timedelta) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the two-argument form for Python groups
        token = os.environ.get("RINGSEED_TOKEN") or _shared_token(store, rank=rank)
        self._timeout = timeout.total_seconds()
        self._engine = engine.RingEngine(
            peer_id=f"rank-{rank}",
            token=token,
            host=os.environ.get("RINGSEED_LISTEN_HOST", "127.0.0.1"),
            port=int(os.environ.get("RINGSEED_LISTEN_PORT", "0")),
            io_timeout=self._timeout,
        )
        address = self._engine.start()
        try:
            store.set(f"ringseed/addr/{rank}", json.dumps([address.peer_id, address.host, address.port]))
            keys = [f"ringseed/addr/{r}" for r in range(size)]
            store.wait(keys, timeout)
            ring = [engine.PeerAddress(*json.loads(store.get(k))) for k in keys]
            self._engine.set_ring(ring, epoch=1, timeout=self._timeout)
            if size > 1:
                self._engine.connect_mesh(timeout=self._timeout)
        except BaseException:
            self._engine.close()
            raise
        self._tag = 0
        self._monitor = 0
        self._group_name = self._group_desc = ""

    def getBackendName(self) -> str:
        return BACKEND

    # torch keeps a group's name and description in its backends, and a Python group has none:
    # without these, destroy_process_group(subgroup) fails with "ProcessGroup name not set"
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:  # type: ignore[override]  # torch types it GroupName, a str
        return self._group_name

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_desc(self) -> str:
        return self._group_desc

    def _next_tag(self) -> int:
        self._tag += 1
        return self._tag

    def _work(
        self, futures: Sequence[concurrent.futures.Future[Any]], result: Any, *finishers: Callable[[], None]
    ) -> Work:
        return Work(futures, result=result, finish=_run_all(finishers), helper=self._engine)

    # ----- reductions ------------------------------------------------------------------------

    def allreduce(self, tensor_list: list[torch.Tensor], opts: Any = None) -> Work:  # type: ignore[override]
        if len(tensor_list) == 1 and _waits_at_once(opts):
            plain = _plain_cpu(tensor_list[0])
            if plain is not None:  # the common case, with as few calls into torch as it takes (see _plain_cpu)
                op, tag = _op(opts, "all_reduce"), self._next_tag()
                if self._engine.all_reduce_here(plain, op=op, tag=tag):
                    return Work(result=tensor_list)
                future = self._engine.all_reduce_async(plain, op=op, tag=tag, run_here=True)
                return self._work([future], tensor_list)
        op = _op(opts, "all_reduce")
        if any(t.layout is torch.sparse_coo for t in tensor_list):
            for t in tensor_list:
                self._sparse_sum(t, op)
            return Work(result=tensor_list)
        staged = [tensors.stage(_dense(t, "all_reduce")) for t in tensor_list]
        if len(staged) == 1 and _waits_at_once(opts):  # runs right here when idle, with no future at all
            tag = self._next_tag()
            one = staged[0]
            if self._engine.all_reduce_here(one.array, op=op, tag=tag, bfloat16=one.bfloat16, reducer=one.reducer):
                return Work(result=tensor_list, finish=staged[0].finish)
            return self._work([self._reduce(staged[0], op, opts, tag=tag)], tensor_list, staged[0].finish)
        futures = [self._reduce(s, op, opts) for s in staged]
        return self._work(futures, tensor_list, *(s.finish for s in staged))

    def allreduce_coalesced(self, tensor_list: list[torch.Tensor], opts: Any = None) -> Work:
        """One all-reduce of the tensors laid end to end (one latency, not one per tensor)."""
        op = _op(opts, "all_reduce_coalesced")
        if not tensor_list:
            return self._work([], tensor_list)
        flat = torch.cat([_dense(t, "all_reduce_coalesced").detach().reshape(-1) for t in tensor_list])
        staged = tensors.stage(flat)

        def scatter_back() -> None:
            staged.finish()
            offset = 0
            for t in tensor_list:
                t.detach().copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()

        return self._work([self._reduce(staged, op, opts)], tensor_list, scatter_back)

    def _sparse_sum(self, tensor: torch.Tensor, op: ops.ReduceOp) -> None:
        """All-reduce a sparse COO tensor in place (SUM, as Gloo): every rank's coalesced indices
        and values are gathered (padded to the largest count), then summed by ``coalesce``.

        Runs on the caller's thread: three all-gathers (the metadata, then indices and values).
        Ranks whose tensors differ in shape or sparse dimensions are named in the error."""
        if tensor.layout is not torch.sparse_coo:
            raise RuntimeError("ringseed all-reduces sparse and dense tensors in separate calls")
        if op is not ops.ReduceOp.SUM:
            raise ValueError(f"ringseed reduces sparse tensors with SUM only (all_reduce got {op.name})")
        local = tensor.detach().coalesce()
        indices, values = local.indices().contiguous(), local.values().contiguous()
        shape_code = zlib.crc32(repr((tuple(tensor.shape), local.sparse_dim(), str(values.dtype))).encode())
        meta = self._gather_now(torch.tensor([indices.shape[1], shape_code], dtype=torch.int64))
        codes = meta[:, 1].tolist()
        if len(set(codes)) != 1:
            odd = [r for r, c in enumerate(codes) if c != codes[self.rank()]]
            raise RuntimeError(
                f"ringseed sparse all_reduce: ranks {odd} hold a tensor of another shape, sparse "
                f"dimension or dtype than rank {self.rank()}'s {tuple(tensor.shape)} ({values.dtype})"
            )
        counts = meta[:, 0].tolist()
        most = max(counts)
        padded_indices = torch.zeros((indices.shape[0], most), dtype=indices.dtype)
        padded_indices[:, : indices.shape[1]] = indices
        padded_values = torch.zeros((most, *values.shape[1:]), dtype=values.dtype)
        padded_values[: values.shape[0]] = values
        all_indices, all_values = self._gather_now(padded_indices), self._gather_now(padded_values)
        summed = torch.sparse_coo_tensor(
            torch.cat([all_indices[r][:, :n] for r, n in enumerate(counts)], dim=1),
            torch.cat([all_values[r][:n] for r, n in enumerate(counts)]),
            tuple(tensor.shape),
            check_invariants=True,  # indices from peers: out of range is an error, not a crash
        ).coalesce()
        with torch.no_grad():
            tensor.copy_(summed)

    def _gather_now(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` (the same shape on each), stacked in rank order, on this thread."""
        gathered = torch.empty((self.size(), *tensor.shape), dtype=tensor.dtype)
        if tensor.numel():
            source = tensors.stage_bytes(_dense(tensor.contiguous(), "all_reduce"))
            out = tensors.stage_bytes(_dense(gathered, "all_reduce"))
            self._engine.all_gather_async(source.array, out.array, tag=self._next_tag(), run_here=True).result()
        return gathered

    def reduce(self, tensor_list: list[torch.Tensor], opts: Any = None) -> Work:  # type: ignore[override]
        """The root's tensor gets the reduction; the others' tensors are left as they were."""
        op = _op(opts, "reduce")
        root = opts.rootRank if opts is not None else 0
        work = []
        for t in tensor_list:
            target = _dense(t, "reduce") if self.rank() == root else t.detach().clone()
            work.append(tensors.stage(target))
        futures = [self._reduce(s, op, opts) for s in work]
        return self._work(futures, tensor_list, *(s.finish for s in work if self.rank() == root))

    def _reduce(
        self, staged: tensors.Staged, op: ops.ReduceOp, opts: Any, *, tag: int | None = None
    ) -> concurrent.futures.Future[None]:
        return self._engine.all_reduce_async(
            staged.array,
            op=op,
            tag=self._next_tag() if tag is None else tag,
            bfloat16=staged.bfloat16,
            reducer=staged.reducer,
            run_here=_waits_at_once(opts),
        )

    def reduce_scatter(  # type: ignore[override]
        self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: Any = None
    ) -> Work:
        op = _op(opts, "reduce_scatter")
        futures, finishers = [], []
        for out, inputs in zip(output_tensors, input_tensors, strict=True):
            work = torch.cat([_dense(t, "reduce_scatter").detach().reshape(-1).cpu() for t in inputs])
            result = torch.empty(out.numel(), dtype=out.dtype)
            futures.append(
                self._engine.reduce_scatter_async(
                    tensors.to_numpy(work),
                    tensors.to_numpy(result),
                    op=op,
                    tag=self._next_tag(),
                    bfloat16=out.dtype == torch.bfloat16,
                    run_here=_waits_at_once(opts),
                )
            )
            finishers.append(lambda out=out, result=result: _ignore(out.detach().copy_(result.view_as(out))))
        return self._work(futures, output_tensors, *finishers)

    def reduce_scatter_single(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> Work:
        return self.reduce_scatter([output], [list(tensor.reshape(self.size(), -1).unbind(0))], opts)

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Work:
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return _joined(works, outputs, self._engine)

    def barrier(self, opts: Any = None) -> Work:
        """A one-element all-reduce; a synchronous caller's runs on its thread with no future (like
        ``allreduce``): a rank leaving a barrier is what its peers' next operation waits for."""
        token, tag, now = np.zeros(1, np.int32), self._next_tag(), _waits_at_once(opts)
        if now and self._engine.all_reduce_here(token, op=ops.ReduceOp.SUM, tag=tag):
            return Work(result=None)
        return self._work([self._engine.all_reduce_async(token, op=ops.ReduceOp.SUM, tag=tag, run_here=now)], None)

    # ----- data movement on the ring ---------------------------------------------------------

    def broadcast(self, tensor_list: list[torch.Tensor], opts: Any = None) -> Work:  # type: ignore[override]
        root = opts.rootRank if opts is not None else 0
        staged = [tensors.stage_bytes(_dense(t, "broadcast")) for t in tensor_list]
        now = _waits_at_once(opts)
        futures = [self._engine.broadcast_async(s.array, root=root, tag=self._next_tag(), run_here=now) for s in staged]
        return self._work(futures, tensor_list, *(s.finish for s in staged))

    def allgather(  # type: ignore[override]
        self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any = None
    ) -> Work:
        futures, finishers = [], []
        for outs, tensor in zip(output_tensors, input_tensors, strict=True):
            future, finish = self._gather_all(tensor, functools.partial(_split_into, outs=outs), opts)
            futures.append(future)
            finishers.append(finish)
        return self._work(futures, output_tensors, *finishers)

    def allgather_coalesced(
        self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor], opts: Any = None
    ) -> Work:
        """``output_lists[rank][i]`` receives ``rank``'s ``input_list[i]`` (torch's layout)."""
        per_input = [[output_lists[r][i] for r in range(self.size())] for i in range(len(input_list))]
        return _joined([self.allgather(per_input, input_list, opts)], output_lists, self._engine)

    def _allgather_base(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> Work:
        future, finish = self._gather_all(tensor, functools.partial(_split_into, outs=[output]), opts)
        return self._work([future], [output], finish)

    def all_gather_single(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> Work:
        return self._allgather_base(output, tensor, opts)

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Work:
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return _joined(works, outputs, self._engine)

    def _gather_all(
        self, tensor: torch.Tensor, deliver: Callable[[np.ndarray], None], opts: Any
    ) -> tuple[concurrent.futures.Future[None], Callable[[], None]]:
        source = tensors.stage_bytes(_dense(tensor, "all_gather"))
        gathered = np.empty(source.array.nbytes * self.size(), np.uint8)
        future = self._engine.all_gather_async(
            source.array, gathered, tag=self._next_tag(), run_here=_waits_at_once(opts)
        )
        return future, lambda: deliver(gathered)

    # ----- rooted and personalised operations on the direct links ------------------------------

    def gather(  # type: ignore[override]
        self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any = None
    ) -> Work:
        root = opts.rootRank if opts is not None else 0
        source = tensors.stage_bytes(_dense(input_tensors[0], "gather"))
        outs = [tensors.stage_bytes(_dense(t, "gather")) for t in output_tensors[0]] if self.rank() == root else []
        tag = self._mesh_tag()

        def run() -> None:
            if self.rank() != root:
                self._engine.direct.send(root, tag=tag, payload=_view(source.array))
                return
            receives = [self._post(r, tag, outs[r].array) for r in range(self.size()) if r != root]
            outs[root].array[...] = source.array
            _wait_all(receives)

        return self._mesh_op(run, tag, output_tensors, *(o.finish for o in outs))

    def scatter(  # type: ignore[override]
        self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: Any = None
    ) -> Work:
        root = opts.rootRank if opts is not None else 0
        target = tensors.stage_bytes(_dense(output_tensors[0], "scatter"))
        ins = [tensors.stage_bytes(_dense(t, "scatter")) for t in input_tensors[0]] if self.rank() == root else []
        tag = self._mesh_tag()

        def run() -> None:
            if self.rank() != root:
                _wait_all([self._post(root, tag, target.array)])
                return
            for r in range(self.size()):
                if r != root:
                    self._engine.direct.send(r, tag=tag, payload=_view(ins[r].array))
            target.array[...] = ins[root].array

        return self._mesh_op(run, tag, output_tensors, target.finish)

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor], opts: Any = None) -> Work:
        outs = [tensors.stage_bytes(_dense(t, "all_to_all")) for t in output_tensors]
        ins = [tensors.stage_bytes(_dense(t, "all_to_all")) for t in input_tensors]
        return self._exchange([o.array for o in outs], [i.array for i in ins], output_tensors, [o.finish for o in outs])

    def alltoall_base(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> Work:
        out = tensors.stage_bytes(_dense(output, "all_to_all_single"))
        src = tensors.stage_bytes(_dense(tensor, "all_to_all_single"))
        outs = _split_rows(out.array, output, output_split_sizes, self.size())
        ins = _split_rows(src.array, tensor, input_split_sizes, self.size())
        return self._exchange(outs, ins, output, [out.finish])

    def all_to_all_single(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> Work:
        return self.alltoall_base(output, tensor, output_split_sizes, input_split_sizes, opts)

    def _exchange(
        self, outs: list[np.ndarray], ins: list[np.ndarray], result: Any, finishers: list[Callable[[], None]]
    ) -> Work:
        tag = self._mesh_tag()
        me = self.rank()

        def run() -> None:
            receives = [self._post(r, tag, outs[r]) for r in range(self.size()) if r != me]
            for step in range(1, self.size()):  # everyone sends to a different rank at each step
                dst = (me + step) % self.size()
                self._engine.direct.send(dst, tag=tag, payload=_view(ins[dst]))
            outs[me][...] = ins[me]
            _wait_all(receives)

        return self._mesh_op(run, tag, result, *finishers)

    def _mesh_tag(self) -> int:
        return USER_TAGS | self._next_tag()

    def _post(self, src: int, tag: int, array: np.ndarray) -> mesh.Receive:
        return self._engine.direct.post(src=src, tag=tag, buffer=_view(array))

    def _mesh_op(self, run: Callable[[], None], tag: int, result: Any, *finishers: Callable[[], None]) -> Work:
        return self._work([self._engine.submit(run, tag=tag)], result, *finishers)

    # ----- point to point ----------------------------------------------------------------------

    def send(self, tensors_: list[torch.Tensor], dst: int, tag: int) -> Work:
        source = tensors.stage_bytes(_dense(tensors_[0], "send"))
        _check_tag(tag)
        try:
            self._engine.direct.send(dst, tag=tag, payload=_view(source.array))
        except mesh.MeshError as exc:
            raise engine.CollectiveAborted(f"ringseed send to rank {dst} failed: {exc}") from exc
        return self._work([], tensors_)

    def recv(self, tensors_: list[torch.Tensor], src: int, tag: int) -> Work:
        return self._receive(tensors_, src, tag)

    def recv_anysource(self, tensors_: list[torch.Tensor], tag: int) -> Work:
        return self._receive(tensors_, None, tag)

    def _receive(self, tensors_: list[torch.Tensor], src: int | None, tag: int) -> Work:
        _check_tag(tag)
        target = tensors.stage_bytes(_dense(tensors_[0], "recv"))
        receive = self._engine.direct.post(src=src, tag=tag, buffer=_view(target.array))
        return Work([receive.future], result=tensors_, finish=target.finish)

    def monitored_barrier(self, timeout: datetime.timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """Rank 0 waits for every other rank until ``timeout`` and names those that did not arrive."""
        seconds = timeout.total_seconds() if timeout is not None else self._timeout
        deadline = time.monotonic() + seconds
        self._monitor += 1
        tag, me, token = _MONITOR | self._monitor, self.rank(), np.zeros(1, np.uint8)
        direct = self._engine.direct
        if me != 0:
            try:
                direct.send(0, tag=tag, payload=_view(token))
                direct.recv(src=0, tag=tag, buffer=_view(token), timeout=mesh.deadline_left(deadline))
            except (mesh.MeshError, TimeoutError) as exc:
                raise RuntimeError(
                    f"Rank {me} successfully reached monitoredBarrier, but received errors while waiting for "
                    f"send/recv from rank 0: {exc}"
                ) from exc
            return
        missing = self._missing(tag, deadline, wait_all_ranks=wait_all_ranks)
        if missing:
            ms = int(seconds * 1000)
            if seconds <= 0 and not wait_all_ranks:
                raise RuntimeError(f"Rank 0 timed out in monitoredBarrier after {ms} ms")
            who = f"Ranks {', '.join(map(str, missing))}" if wait_all_ranks else f"Rank {missing[0]}"
            raise RuntimeError(f"{who} failed to pass monitoredBarrier in {ms} ms")
        for r in range(1, self.size()):
            direct.send(r, tag=tag, payload=_view(token))

    def _missing(self, tag: int, deadline: float, *, wait_all_ranks: bool) -> list[int]:
        missing = []
        for r in range(1, self.size()):
            receive = self._engine.direct.post(src=r, tag=tag, buffer=_view(np.zeros(1, np.uint8)))
            try:
                receive.wait(mesh.deadline_left(deadline))
            except (TimeoutError, mesh.MeshError):
                self._engine.direct.cancel(receive)
                missing.append(r)
                if not wait_all_ranks:
                    break
        return missing

    # ----- lifecycle ---------------------------------------------------------------------------

    def shutdown(self) -> None:
        self._engine.close()

    def abort(self) -> None:
        self._engine.close()

    def __del__(self) -> None:
        engine_ = getattr(self, "_engine", None)
        if engine_ is not None:
            with contextlib.suppress(Exception):  # interpreter shutdown: modules may be gone, stay quiet
                engine_.close()


def _op(opts: Any, name: str) -> ops.ReduceOp:
    if opts is None:
        return ops.ReduceOp.SUM
    try:
        return _OPS[opts.reduceOp.op]
    except KeyError:
        raise ValueError(f"ringseed does not support {opts.reduceOp.op} in {name}") from None


def _waits_at_once(opts: Any) -> bool:
    """torch sets ``asyncOp`` False when it calls ``wait()`` right after the call (``async_op=False``):
    then the operation runs on the caller's thread at once (no hand-off; see ``sequencer.py``).
    Options without it, or built by hand, count as asynchronous (the engine's thread runs them)."""
    return opts is not None and getattr(opts, "asyncOp", True) is False


_PLAIN_DTYPES = tensors.TORCH_DTYPES - {torch.bfloat16}


def _plain_cpu(tensor: torch.Tensor) -> np.ndarray | None:
    """A contiguous dense CPU tensor of a dtype numpy reduces natively, as a 1-D numpy view of its
    memory (what ``tensors.stage`` gives it, with fewer calls); None for every other tensor.

    Each call into torch costs microseconds when the caches are cold, and they are cold whenever
    the ranks outnumber the cores (every operation follows a context switch): at N = 3 on two
    cores the general path's calls cost more CPU than the ring's own work for a small message."""
    plain = tensor.dtype in _PLAIN_DTYPES and tensor.layout is torch.strided and not tensor.is_cuda
    if plain and tensor.is_contiguous():
        flat: np.ndarray = tensor.detach().numpy().reshape(-1)
        return flat
    return None


def _dense(tensor: torch.Tensor, name: str) -> torch.Tensor:
    if tensor.layout is not torch.strided:
        raise RuntimeError(f"ringseed does not support {tensor.layout} tensors ({name}); densify them first")
    return torch.view_as_real(tensor) if tensor.is_complex() else tensor


def _check_tag(tag: int) -> None:
    if not 0 <= tag < USER_TAGS:
        raise ValueError(f"ringseed send/recv tags must be in [0, 2**62), got {tag}")


def _view(array: np.ndarray) -> memoryview:
    return array.data.cast("B")


def _wait_all(receives: Sequence[mesh.Receive]) -> None:
    for receive in receives:
        receive.wait()


def _split_rows(flat: np.ndarray, tensor: torch.Tensor, sizes: list[int], world: int) -> list[np.ndarray]:
    """Byte ranges of ``tensor``'s rows split along dim 0 by ``sizes`` (equal parts when empty)."""
    rows = tensor.shape[0] if tensor.dim() else 1
    if not sizes:
        if rows % world:
            raise ValueError(f"ringseed all_to_all_single: {rows} rows do not split evenly over {world} ranks")
        sizes = [rows // world] * world
    row_bytes = flat.nbytes // rows if rows else 0
    bounds = np.cumsum([0, *sizes]) * row_bytes
    return [flat[bounds[r] : bounds[r + 1]] for r in range(world)]


def _split_into(gathered: np.ndarray, outs: Sequence[torch.Tensor]) -> None:
    offset = 0
    for out in outs:
        target = _dense(out, "all_gather").detach()
        n = target.numel() * target.element_size()
        if n == 0:
            continue  # an empty tensor has nothing to receive (and its byte view cannot be reinterpreted)
        source = torch.from_numpy(gathered[offset : offset + n]).view(target.dtype).view(target.shape)
        target.copy_(source)
        offset += n


_DONE = concurrent.futures.Future[None]()
_DONE.set_result(None)  # shared by every work complete from the start (nothing waits on it)


def _finished(finish: Callable[[], None]) -> concurrent.futures.Future[None]:
    """The state of a work complete from the start: ``finish`` ran, or failed (a failed copy-back)."""
    try:
        finish()
    except Exception as exc:
        failed = concurrent.futures.Future[None]()
        failed.set_exception(exc)
        return failed
    return _DONE


def _joined(works: Sequence[Work], result: Any, helper: engine.RingEngine) -> Work:
    return Work([w._done for w in works], result=result, helper=helper)


def _run_all(steps: Sequence[Callable[[], None]]) -> Callable[[], None]:
    def run() -> None:
        for step in steps:
            step()

    return run


def _ignore(_: object) -> None:
    return None


def _shared_token(store: c10d.Store, *, rank: int) -> str:
    if rank == 0:
        store.set("ringseed/token", secrets.token_hex(16))
    store.wait(["ringseed/token"])
    token: bytes = store.get("ringseed/token")
    return token.decode()


def _create(store: c10d.Store, rank: int, size: int, timeout: datetime.timedelta) -> RingseedProcessGroup:
    return RingseedProcessGroup(store=store, rank=rank, size=size, timeout=timeout)


_TORCH_MONITORED_BARRIER = dist.distributed_c10d.monitored_barrier


def monitored_barrier(
    group: Any = dist.GroupMember.WORLD, timeout: datetime.timedelta | float | None = None, wait_all_ranks: bool = False
) -> None:
    """``torch.distributed.monitored_barrier``, for ringseed groups too.

    torch's function refuses every backend not named "gloo" before it calls the group's own
    ``monitored_barrier``; for a ringseed group this calls that method with torch's argument
    handling (a float timeout in seconds, None for the group's timeout). Any other group,
    and a rank outside the group, go to torch's function unchanged."""
    pg = dist.distributed_c10d._get_default_group() if group is None else group
    if dist.distributed_c10d._rank_not_in_group(group) or not isinstance(pg, RingseedProcessGroup):
        return _TORCH_MONITORED_BARRIER(group, timeout, wait_all_ranks)  # type: ignore[no-any-return]
    if isinstance(timeout, int | float):
        timeout = datetime.timedelta(seconds=timeout)
    pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
    return None


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])
    # what a script written for gloo calls by name (see monitored_barrier above)
    dist.monitored_barrier = dist.distributed_c10d.monitored_barrier = monitored_barrier
