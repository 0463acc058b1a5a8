"""A short DDP training run over ringseed's ``torch.distributed`` backend, inside a TrainingGroup.

Run by examples/cluster/traininggroup-ddp.yaml (mounted from the ConfigMap ``ddp-train``), or alone
as one process (``python ddp_train.py --single MODEL_DIR``) to get the losses a group must match.

- Initial weights come from the distributed model: the first bytes of its first ``.bin`` file
  (sorted by name), mapped to small floats, so every rank starts from what ringseed delivered.
- Rank and world size come from the TrainingGroup's coordinator (``Communicator``); rank 0's pod
  address is broadcast over the ring, then ``init_process_group("ringseed", ...)`` with rank 0
  hosting the c10d store. The data set is fixed (seeded); each rank trains on its shard of every
  batch and DDP averages the gradients, so the global loss equals a single process's.
- Prints one JSON line ``{"rank", "world", "losses", "weights_from"}``, then keeps its place in the
  group (a TrainingGroup's workers run until the group is deleted).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

SAMPLES, FEATURES, HIDDEN, STEPS, LR = 256, 32, 16, 8, 0.05
STORE_PORT, BACKEND_PORT = 29500, 8473


def model_from(model_dir: str) -> tuple[nn.Module, str]:
    weights = sorted(name for name in os.listdir(model_dir) if name.endswith(".bin"))
    if not weights:
        raise SystemExit(f"no .bin file in {model_dir}")
    net = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))
    count = sum(p.numel() for p in net.parameters())
    with open(os.path.join(model_dir, weights[0]), "rb") as f:
        raw = np.frombuffer(f.read(count), dtype=np.uint8).astype(np.float32)
    values = torch.from_numpy((raw / 255.0 - 0.5) * 0.4)
    offset = 0
    with torch.no_grad():
        for param in net.parameters():
            param.copy_(values[offset : offset + param.numel()].view_as(param))
            offset += param.numel()
    return net, weights[0]


def data() -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((SAMPLES, FEATURES)).astype(np.float32)
    y = np.tanh(x @ rng.standard_normal((FEATURES, 1)).astype(np.float32))
    return torch.from_numpy(x), torch.from_numpy(y)


def train(net: nn.Module, *, rank: int, world: int) -> list[float]:
    x, y = data()
    shard = slice(rank, SAMPLES, world)
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(net(x[shard]), y[shard])
        loss.backward()  # DDP all-reduces (averages) the gradients here
        optimizer.step()
        total = loss.detach().clone()
        if world > 1:
            dist.all_reduce(total, op=dist.ReduceOp.AVG)
        losses.append(float(total))
    return losses


def join_group() -> tuple[int, int, str]:
    """Rank, world size and rank 0's address, from the TrainingGroup's coordinator."""
    from ringseed.collective import communicator

    comm = communicator.Communicator(
        coordinator_url=os.environ["RINGSEED_COORDINATOR_URL"],
        token=os.environ["RINGSEED_TOKEN"],
        peer_id=os.environ["RINGSEED_PEER_ID"],
        host=os.environ["RINGSEED_LISTEN_HOST"],
        port=int(os.environ["RINGSEED_LISTEN_PORT"]),
    )
    comm.connect()
    address = np.frombuffer(ipaddress.IPv4Address(os.environ["RINGSEED_LISTEN_HOST"]).packed, dtype=np.uint8).copy()
    comm.broadcast(address, root=0).wait()
    return comm.rank, comm.world_size, str(ipaddress.IPv4Address(address.tobytes()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--single", metavar="MODEL_DIR", help="one process, no group: the reference losses")
    args = parser.parse_args()
    if args.single:
        net, source = model_from(args.single)
        print(json.dumps({"rank": 0, "world": 1, "losses": train(net, rank=0, world=1), "weights_from": source}))
        return 0
    import ringseed.collective.torch_backend  # noqa: F401 - registers the "ringseed" backend

    rank, world, master = join_group()
    os.environ["RINGSEED_LISTEN_PORT"] = str(BACKEND_PORT)  # the communicator keeps 8472
    dist.init_process_group("ringseed", init_method=f"tcp://{master}:{STORE_PORT}", rank=rank, world_size=world)
    net, source = model_from(os.environ["RINGSEED_MODEL_PATH"])
    ddp = nn.parallel.DistributedDataParallel(net)
    losses = train(ddp, rank=rank, world=world)
    print(json.dumps({"rank": rank, "world": world, "losses": losses, "weights_from": source}), flush=True)
    dist.destroy_process_group()
    while True:  # stay in the group until it is deleted
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
