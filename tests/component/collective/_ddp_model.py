"""Test helper: the small MLP and data the DDP test trains, in 3 processes and in one."""

from __future__ import annotations

import torch

STEPS = 5
BATCH = 24


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(BATCH, 16, generator=g), torch.randn(BATCH, 4, generator=g)


def train(model: torch.nn.Module, *, rank: int, world: int) -> dict[str, torch.Tensor]:
    """SGD on this rank's equal share of every global batch; returns the final parameters."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    share = BATCH // world
    for step in range(STEPS):
        x, y = batch(step)
        x, y = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    inner = getattr(model, "module", model)
    return {k: v.detach().clone() for k, v in inner.state_dict().items()}


def train_accumulating(
    model: torch.nn.Module, *, rank: int, world: int, hook: str | None = None
) -> dict[str, torch.Tensor]:
    """:func:`train`, each rank's share in two micro-batches whose gradients accumulate: the first
    under DDP's ``no_sync`` (no communication), the second synchronised. ``hook`` registers a DDP
    communication hook first: ``"allreduce"`` (torch's default hook) or ``"then"`` (an all-reduce
    whose future is chained with ``then`` to average). The parameters equal :func:`train`'s."""
    import contextlib

    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if hook == "allreduce":
        model.register_comm_hook(None, default_hooks.allreduce_hook)  # type: ignore[operator]
    elif hook == "then":

        def averaged(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks the annotations: none or GradBucket
            work = dist.all_reduce(bucket.buffer(), async_op=True)
            assert work is not None
            return work.get_future().then(lambda fut: fut.value()[0].div_(world))

        model.register_comm_hook(None, averaged)  # type: ignore[operator]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    share, half = BATCH // world, BATCH // world // 2
    quiet = getattr(model, "no_sync", contextlib.nullcontext)
    for step in range(STEPS):
        x, y = batch(step)
        x, y = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
        opt.zero_grad()
        with quiet():
            (0.5 * torch.nn.functional.mse_loss(model(x[:half]), y[:half])).backward()
        (0.5 * torch.nn.functional.mse_loss(model(x[half:]), y[half:])).backward()
        opt.step()
    inner = getattr(model, "module", model)
    return {k: v.detach().clone() for k, v in inner.state_dict().items()}
