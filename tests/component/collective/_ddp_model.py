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
