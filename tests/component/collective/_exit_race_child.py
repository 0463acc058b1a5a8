"""Run as a script by test_torch_backend: a rank exits while the engine's thread is still inside
torch's C++, completing an asynchronous barrier (a Python callback on its future waits for the exit).
Before engines were closed at exit, finalization killed that thread there and the process aborted
with "terminate called without an active exception" (in about 1 run of 3 to 5 here: the thread must
take the GIL back after finalization began); now it must exit 0 after printing "ok"."""

from __future__ import annotations

import atexit
import threading
from typing import Any

import torch.distributed as dist

import ringseed.collective.torch_backend  # noqa: F401  (registers the backend; its exit hook comes first)

dist.init_process_group("ringseed", store=dist.HashStore(), rank=0, world_size=1)
group = dist.distributed_c10d._get_default_group()
gate, inside, exiting = threading.Event(), threading.Event(), threading.Event()
group._engine.submit(gate.wait, tag=1)  # holds the engine's thread until the barrier's callback is in place
work = group.barrier(dist.BarrierOptions())  # asynchronous (no device, asyncOp True): the engine's thread runs it


def callback(_: Any) -> None:
    inside.set()
    exiting.wait()  # on the engine's thread, inside torch's Future.set_result, while the main thread exits


work.get_future().then(callback)
atexit.register(exiting.set)  # runs before ringseed's exit hook (the last registered runs first)
gate.set()
inside.wait()
print("ok", flush=True)
