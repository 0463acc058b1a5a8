"""Reduction operators and element types of the collective engine (numpy only, no I/O).

What this module owns
- :class:`ReduceOp` (SUM, AVG, MIN, MAX, PROD, and BAND, BOR, BXOR on integers) and how each
  combines two buffers in place.
- The mapping between numpy dtypes and wire dtype codes (``protocol.frames.DType``).
- bfloat16 without a numpy bfloat16: a bf16 buffer is ``uint16`` storage labelled ``DType.BF16``;
  it is widened to float32 (``u16 << 16``), combined, and narrowed back with
  round-to-nearest-even (NaN stays NaN).

Numeric rules (the same on every peer, so results are bit-identical everywhere)
- float16 and bfloat16 are combined in float32 per hop and rounded back to 16 bits after each
  hop; a long ring therefore rounds N-1 times, like NCCL's ring does.
- Integer SUM and PROD wrap around (two's complement), like torch.
- AVG is SUM followed by one division by the world size at the segment's owner; it is defined
  for floating types only. Integer AVG raises ``ValueError`` before anything is sent.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence

import numpy as np

from ringseed.protocol import frames


class ReduceOp(enum.Enum):
    SUM = "sum"
    AVG = "avg"
    MIN = "min"
    MAX = "max"
    PROD = "prod"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"


_BY_NUMPY: dict[np.dtype[np.generic], frames.DType] = {
    np.dtype(np.float32): frames.DType.F32,
    np.dtype(np.float64): frames.DType.F64,
    np.dtype(np.float16): frames.DType.F16,
    np.dtype(np.int8): frames.DType.I8,
    np.dtype(np.uint8): frames.DType.U8,
    np.dtype(np.int16): frames.DType.I16,
    np.dtype(np.int32): frames.DType.I32,
    np.dtype(np.int64): frames.DType.I64,
}
_STORAGE: dict[frames.DType, np.dtype[np.generic]] = {v: k for k, v in _BY_NUMPY.items()}
_STORAGE[frames.DType.BF16] = np.dtype(np.uint16)
FLOATING = frozenset({frames.DType.F32, frames.DType.F64, frames.DType.F16, frames.DType.BF16})

_UFUNC: dict[ReduceOp, Callable[..., object]] = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVG: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PROD: np.multiply,
    ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or,
    ReduceOp.BXOR: np.bitwise_xor,
}
BITWISE = frozenset({ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR})


def wire_dtype(array: np.ndarray, *, bfloat16: bool = False) -> frames.DType:
    """The wire dtype of ``array``; ``bfloat16=True`` labels uint16 storage as bf16."""
    if bfloat16:
        if array.dtype != np.uint16:
            raise ValueError(f"bfloat16 storage must be uint16, got {array.dtype}")
        return frames.DType.BF16
    try:
        return _BY_NUMPY[array.dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {array.dtype}; supported: {sorted(str(d) for d in _BY_NUMPY)}") from None


def storage_dtype(dtype: frames.DType) -> np.dtype[np.generic]:
    """The numpy dtype that holds ``dtype`` elements (uint16 for bf16)."""
    return _STORAGE[dtype]


def check_op(op: ReduceOp, dtype: frames.DType) -> None:
    if op is ReduceOp.AVG and dtype not in FLOATING:
        raise ValueError(f"ReduceOp.AVG is defined for floating dtypes only, not {dtype.name}")
    if op in BITWISE and dtype in FLOATING:
        raise ValueError(f"ReduceOp.{op.name} is defined for integer dtypes only, not {dtype.name}")


def combine(dst: np.ndarray, src: np.ndarray, *, op: ReduceOp, dtype: frames.DType) -> None:
    """``dst = op(dst, src)`` elementwise, in place (IEEE results, overflow and NaN without warnings)."""
    combine_all(dst, (src,), op=op, dtype=dtype)


def combine_all(dst: np.ndarray, sources: Sequence[np.ndarray], *, op: ReduceOp, dtype: frames.DType) -> None:
    """``dst = op(...op(op(dst, sources[0]), sources[1])..., sources[-1])``: in this order, so that
    every rank computing it from the same operands gets the same bits."""
    ufunc = _UFUNC[op]
    with np.errstate(all="ignore"):
        for src in sources:
            if dtype is frames.DType.BF16:
                wide = bf16_to_f32(dst)
                ufunc(wide, bf16_to_f32(src), out=wide)
                f32_to_bf16(wide, out=dst)
            else:
                ufunc(dst, src, out=dst)


def divide(dst: np.ndarray, *, divisor: int, dtype: frames.DType) -> None:
    """``dst /= divisor`` in place (AVG's last step, floating dtypes only)."""
    with np.errstate(all="ignore"):
        if dtype is frames.DType.BF16:
            wide = bf16_to_f32(dst)
            np.divide(wide, np.float32(divisor), out=wide)
            f32_to_bf16(wide, out=dst)
        elif dtype is frames.DType.F16:
            dst[...] = (dst.astype(np.float32) / np.float32(divisor)).astype(np.float16)
        else:
            np.divide(dst, dst.dtype.type(divisor), out=dst)


def bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    """Widen bfloat16 bit patterns (uint16) to a new float32 array."""
    return (u16.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(f32: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """Narrow float32 to bfloat16 bit patterns with round-to-nearest-even; NaN stays a quiet NaN."""
    bits = f32.view(np.uint32)
    lsb = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = (bits.astype(np.uint64) + np.uint64(0x7FFF) + lsb) >> np.uint64(16)
    result = rounded.astype(np.uint16)
    nan = np.isnan(f32)
    if nan.any():
        result[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    if out is None:
        return result
    out[...] = result
    return out
