"""One rank of the torch-ops test (``test_torch_ops.py``), run as its own process:
``python -m tests.component.collective._torch_ops_worker RANK WORLD INIT_FILE``.

Checks every c10d operation against values computed locally from the rank numbers; exits 0 when
all hold. Its stderr is part of the test: nothing may be printed at shutdown.
"""

from __future__ import annotations

import datetime
import sys

import torch
import torch.distributed as dist

import ringseed.collective.torch_backend  # noqa: F401  (registers "ringseed")


def point_to_point(rank: int, world: int) -> None:
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    # tags received out of order: the message of tag 2 is sent first, received second
    if rank == 0:
        dist.send(torch.full((3,), 2.0), dst=1, tag=2)
        dist.send(torch.full((3,), 1.0), dst=1, tag=1)
    elif rank == 1:
        first, second = torch.empty(3), torch.empty(3)
        dist.recv(first, src=0, tag=1)
        dist.recv(second, src=0, tag=2)
        assert first.tolist() == [1.0] * 3 and second.tolist() == [2.0] * 3
    # isend / irecv around the ring, then batch_isend_irecv the other way
    out, got = torch.full((5,), float(rank)), torch.empty(5)
    works = [dist.isend(out, dst=nxt), dist.irecv(got, src=prev)]
    for w in works:
        w.wait()
    assert got.tolist() == [float(prev)] * 5
    back = torch.empty(4, dtype=torch.int64)
    ops = [dist.P2POp(dist.isend, torch.full((4,), rank), prev), dist.P2POp(dist.irecv, back, nxt)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert back.tolist() == [nxt] * 4
    # receive from any source: rank 0 hears from everyone, in whatever order they come
    if rank == 0:
        senders = set()
        for _ in range(world - 1):
            buf = torch.empty(1, dtype=torch.int32)
            senders.add(dist.recv(buf))
            assert buf.item() == 100
        assert senders == set(range(1, world))
    else:
        dist.send(torch.tensor([100], dtype=torch.int32), dst=0)


def rooted(rank: int, world: int) -> None:
    t = torch.full((6,), float(rank + 1))
    dist.reduce(t, dst=1, op=dist.ReduceOp.SUM)
    expect = float(sum(range(1, world + 1))) if rank == 1 else float(rank + 1)
    assert t.tolist() == [expect] * 6, "reduce: the root holds the sum, the others keep their tensor"
    gathered = [torch.empty(2, dtype=torch.int16) for _ in range(world)] if rank == 2 % world else None
    dist.gather(torch.tensor([rank, -rank], dtype=torch.int16), gathered, dst=2 % world)
    if gathered is not None:
        assert [g.tolist() for g in gathered] == [[r, -r] for r in range(world)]
    part = torch.empty(3)
    pieces = [torch.full((3,), 10.0 * r) for r in range(world)] if rank == 0 else None
    dist.scatter(part, pieces, src=0)
    assert part.tolist() == [10.0 * rank] * 3
    objects: list[object] = [None] * world
    dist.all_gather_object(objects, {"rank": rank, "name": f"r{rank}"})
    assert objects == [{"rank": r, "name": f"r{r}"} for r in range(world)]
    received: list[object] = [None] * world if rank == 0 else []
    dist.gather_object(("hello", rank), received if rank == 0 else None, dst=0)
    if rank == 0:
        assert received == [("hello", r) for r in range(world)]
    mine: list[object] = [None]
    dist.scatter_object_list(mine, [[r] * r for r in range(world)] if rank == 0 else None, src=0)
    assert mine[0] == [rank] * rank


def personalised(rank: int, world: int) -> None:
    outs = [torch.empty(2, dtype=torch.int64) for _ in range(world)]
    dist.all_to_all(outs, [torch.tensor([rank, r]) for r in range(world)])
    assert [o.tolist() for o in outs] == [[r, rank] for r in range(world)]
    single = torch.empty(world * 2)
    dist.all_to_all_single(single, torch.arange(world * 2.0) + 100 * rank)
    assert single.tolist() == [100.0 * r + i for r in range(world) for i in (2 * rank, 2 * rank + 1)]
    # uneven splits: rank r sends r + 1 rows to every rank
    in_splits = [rank + 1] * world
    out_splits = [r + 1 for r in range(world)]
    src = torch.full((sum(in_splits), 2), float(rank))
    dst = torch.empty(sum(out_splits), 2)
    dist.all_to_all_single(dst, src, out_splits, in_splits)
    assert dst[:, 0].tolist() == [float(r) for r in range(world) for _ in range(r + 1)]


def coalesced_and_bitwise(rank: int, world: int) -> None:
    a, b = torch.full((3,), float(rank)), torch.full((5,), 2.0 * rank)
    dist.all_reduce_coalesced([a, b])
    total = float(sum(range(world)))
    assert a.tolist() == [total] * 3 and b.tolist() == [2 * total] * 5
    outs = [[torch.empty(2), torch.empty(1)] for _ in range(world)]  # outs[rank][i]: rank's input i
    dist.all_gather_coalesced(outs, [torch.full((2,), float(rank)), torch.full((1,), -float(rank))])
    assert [[o.tolist() for o in per_rank] for per_rank in outs] == [
        [[float(r)] * 2, [-float(r)]] for r in range(world)
    ]
    bits = [1 << r | 1 << 10 for r in range(world)]
    for op, fold in (
        (dist.ReduceOp.BAND, int.__and__),
        (dist.ReduceOp.BOR, int.__or__),
        (dist.ReduceOp.BXOR, int.__xor__),
    ):
        t = torch.tensor([bits[rank]] * 4, dtype=torch.int32)
        dist.all_reduce(t, op=op)
        expect = bits[0]
        for v in bits[1:]:
            expect = fold(expect, v)
        assert t.tolist() == [expect] * 4, op
    flags = torch.tensor([rank % 2 == 0, True])
    dist.broadcast(flags, src=1)
    assert flags.tolist() == [False, True]
    z = torch.tensor([complex(rank, -rank)])
    dist.all_reduce(z)
    assert z.item() == complex(total, -total)
    # sparse COO all_reduce sums like Gloo: rank r holds 1.0 at index r and 2.0 at the last index
    # (listed twice, uncoalesced); in the second tensor (a dense tail dim) rank 0 holds nothing
    size = world + 2
    sparse = torch.sparse_coo_tensor(
        torch.tensor([[rank, world + 1, world + 1]]), torch.tensor([1.0, 1.0, 1.0]), (size,)
    )
    dist.all_reduce(sparse)
    assert sparse.to_dense().tolist() == [1.0] * world + [0.0, 2.0 * world]
    rows = torch.sparse_coo_tensor(torch.tensor([[0], [rank]]), torch.ones(1, 2), (2, world, 2))  # a dense tail dim
    empty = torch.sparse_coo_tensor(torch.zeros((2, 0), dtype=torch.int64), torch.zeros(0, 2), (2, world, 2))
    mine = empty if rank == 0 else rows
    dist.all_reduce(mine)
    expect = torch.zeros(2, world, 2)
    expect[0, 1:] = 1.0
    assert torch.equal(mine.to_dense(), expect)
    try:
        dist.all_reduce(torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), (3,)), op=dist.ReduceOp.MAX)
    except ValueError as exc:
        assert "ringseed reduces sparse tensors with SUM only" in str(exc), exc
    else:
        raise AssertionError("a sparse MAX all_reduce was accepted")
    try:
        dist.broadcast(torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), (3,)), src=0)
    except RuntimeError as exc:
        assert "ringseed does not support" in str(exc) and "sparse" in str(exc), exc
    else:
        raise AssertionError("a sparse broadcast was accepted")


def barriers_and_groups(rank: int, world: int) -> None:
    # torch's own dist.monitored_barrier refuses every backend not named "gloo"; importing ringseed's
    # backend makes it take ringseed groups too, and the group's own method works as well
    group = dist.distributed_c10d._get_default_group()
    dist.barrier()
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30), wait_all_ranks=True)
    group.monitored_barrier(datetime.timedelta(seconds=30), wait_all_ranks=True)
    late = world - 1
    if rank == 0:
        try:
            dist.monitored_barrier(timeout=2.0)  # a float is seconds, as torch takes it
        except RuntimeError as exc:
            assert f"Rank {late} failed to pass monitoredBarrier" in str(exc), exc
        else:
            raise AssertionError("monitored_barrier passed without the late rank")
    elif rank != late:
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=3))
        except RuntimeError as exc:
            assert "successfully reached monitoredBarrier" in str(exc), exc
        else:
            raise AssertionError("monitored_barrier passed although rank 0 failed it")
    if rank == 0:  # a zero timeout fails at once, naming rank 0 itself
        try:
            group.monitored_barrier(datetime.timedelta(seconds=0))
        except RuntimeError as exc:
            assert "Rank 0 timed out in monitoredBarrier" in str(exc), exc
        else:
            raise AssertionError("a zero-timeout monitored_barrier passed")
    dist.barrier()  # the late rank catches up here; every rank leaves the failed barriers behind
    sub = dist.new_group(ranks=[0, 1])
    if rank in (0, 1):
        t = torch.full((4,), float(rank + 1))
        dist.all_reduce(t, group=sub)
        assert t.tolist() == [3.0] * 4
        dist.destroy_process_group(sub)
    dist.barrier()


def main() -> None:
    rank, world, init_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group(
        "ringseed",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    for check in (point_to_point, rooted, personalised, coalesced_and_bitwise, barriers_and_groups):
        check(rank, world)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
