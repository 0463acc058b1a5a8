"""torch tensors to engine buffers and back; CUDA tensors staged through pinned host memory.

What this module owns
- :func:`stage`: gives the engine a 1-D C-contiguous numpy array for a tensor of any shape,
  and a ``finish()`` that writes the result back into the tensor.
  * CPU, contiguous: the array *is* the tensor's memory (no copy); ``finish`` does nothing.
  * CPU, non-contiguous: a contiguous copy; ``finish`` copies it back.
  * CUDA: a pinned host buffer holds a copy the ring sends from and receives into; the
    reduction runs on the GPU through :class:`TorchReducer` (received values are uploaded,
    combined into the device tensor, and the result copied back to the pinned buffer for the
    next hop); ``finish`` copies the final pinned buffer to the device.
  * bfloat16 is exposed as uint16 storage with ``bfloat16=True`` (numpy has no bfloat16).
- :func:`stage_bytes`: any tensor as raw bytes, for operations that only move data.
- :data:`TORCH_DTYPES`: the dtypes the engine reduces (float32/64/16, bfloat16, int8..int64, uint8).

Rules
- The only modules that import torch are this one and ``torch_backend.py``; the engine works on
  numpy. ``finish`` must run after the engine op completed successfully; after a
  ``CollectiveAborted`` the tensor is left as it was for CUDA and non-contiguous tensors and
  may be partly modified for contiguous CPU tensors (the caller restores it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch

from ringseed.collective import ops, runner

TORCH_DTYPES = frozenset(
    {
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int8,
        torch.uint8,
        torch.int16,
        torch.int32,
        torch.int64,
    }
)


@dataclasses.dataclass(frozen=True)
class Staged:
    array: np.ndarray
    bfloat16: bool
    reducer: runner.Reducer | None
    finish: Callable[[], None]


def stage(tensor: torch.Tensor, *, device_reduce: bool | None = None) -> Staged:
    """Prepare ``tensor`` for the engine; ``device_reduce`` forces (or forbids) the torch reducer."""
    if tensor.dtype not in TORCH_DTYPES:
        raise ValueError(f"ringseed reductions do not support {tensor.dtype}")
    use_torch = tensor.is_cuda if device_reduce is None else device_reduce
    bf16 = tensor.dtype == torch.bfloat16
    if not tensor.is_cuda and not use_torch:
        flat = tensor.detach()
        if flat.is_contiguous():
            return Staged(array=to_numpy(flat.view(-1)), bfloat16=bf16, reducer=None, finish=_nothing)
        copy = flat.contiguous().view(-1)

        def copy_back() -> None:
            tensor.detach().copy_(copy.view_as(tensor))

        return Staged(array=to_numpy(copy), bfloat16=bf16, reducer=None, finish=copy_back)
    return _stage_on_device(tensor, bf16=bf16)


def stage_bytes(tensor: torch.Tensor) -> Staged:
    """The tensor's bytes as a 1-D uint8 array (any dtype: nothing is reduced, only moved).

    CPU contiguous: the tensor's own memory; otherwise a contiguous host copy that ``finish``
    writes back (for CUDA through pinned memory)."""
    flat = tensor.detach()
    if not flat.is_cuda and flat.is_contiguous():
        return Staged(array=_byte_view(flat), bfloat16=False, reducer=None, finish=_nothing)
    host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=flat.is_cuda)
    host.copy_(flat)

    def copy_back() -> None:
        tensor.detach().copy_(host)

    return Staged(array=_byte_view(host), bfloat16=False, reducer=None, finish=copy_back)


def _byte_view(contiguous: torch.Tensor) -> np.ndarray:
    flat = contiguous.reshape(-1)
    if flat.numel() == 0:
        return np.zeros(0, np.uint8)
    return flat.view(torch.uint8).numpy()


def _stage_on_device(tensor: torch.Tensor, *, bf16: bool) -> Staged:
    device_flat = tensor.detach().contiguous().view(-1)
    if device_flat.data_ptr() == tensor.data_ptr() and tensor.is_contiguous():
        device_flat = device_flat.clone()  # keep the caller's tensor untouched until finish
    host = torch.empty(device_flat.shape, dtype=tensor.dtype, pin_memory=tensor.is_cuda)
    host.copy_(device_flat)
    array = to_numpy(host)

    def finish() -> None:
        tensor.detach().copy_(host.view_as(tensor))

    return Staged(array=array, bfloat16=bf16, reducer=TorchReducer(device=device_flat, host=host), finish=finish)


def to_numpy(flat: torch.Tensor) -> np.ndarray:
    """A numpy view of a 1-D contiguous CPU tensor (bfloat16 as uint16 bit patterns)."""
    if flat.dtype == torch.bfloat16:
        return flat.view(torch.int16).numpy().view(np.uint16)
    return flat.numpy()


def from_numpy(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    tensor = torch.from_numpy(array)
    return tensor.view(torch.bfloat16) if dtype == torch.bfloat16 else tensor


@dataclasses.dataclass(frozen=True)
class TorchReducer:
    """Combines on the tensor's device (the GPU for CUDA tensors) and mirrors results to ``host``."""

    device: torch.Tensor  # 1-D working copy on the device
    host: torch.Tensor  # 1-D pinned host buffer the engine sends from

    def combine(self, *, start: int, stop: int, src: np.ndarray, op: ops.ReduceOp) -> None:
        incoming = from_numpy(src, self.device.dtype).to(self.device.device, non_blocking=False)
        dst = self.device[start:stop]
        if op in (ops.ReduceOp.SUM, ops.ReduceOp.AVG):
            dst.add_(incoming)
        elif op is ops.ReduceOp.PROD:
            dst.mul_(incoming)
        elif op is ops.ReduceOp.MIN:
            torch.minimum(dst, incoming, out=dst)
        elif op is ops.ReduceOp.MAX:
            torch.maximum(dst, incoming, out=dst)
        elif op is ops.ReduceOp.BAND:
            dst.bitwise_and_(incoming)
        elif op is ops.ReduceOp.BOR:
            dst.bitwise_or_(incoming)
        else:
            dst.bitwise_xor_(incoming)
        self.host[start:stop].copy_(dst)

    def divide(self, *, start: int, stop: int, divisor: int) -> None:
        dst = self.device[start:stop]
        dst.div_(divisor)
        self.host[start:stop].copy_(dst)


def _nothing() -> None:
    return None
