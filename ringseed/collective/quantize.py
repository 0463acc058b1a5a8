"""Quantised transfer encodings for floating-point segments (numpy only, no I/O).

What this module owns
- ``"int8"``: per-segment min-max: payload = float32 ``lo``, float32 ``scale``, then one uint8
  code per element; ``x ~ lo + code * scale`` with ``scale = (hi - lo) / 255``. Non-finite
  input makes the whole segment decode to NaN (a NaN never silently becomes a number).
- ``"fp16"`` / ``"bf16"``: each element rounded to IEEE half or bfloat16.

Rules
- Encoding and decoding are pure functions of bytes: the same bytes decode to the same values
  on every peer, which is how quantised all-reduce keeps all peers bit-identical (the owner of a
  segment encodes its final value once; everyone, the owner included, decodes those bytes).
- Error: one int8 hop errs by at most ``scale / 2`` per element (plus float32 rounding); during
  reduce-scatter every hop re-quantises a partial sum, so the error of an N-peer all-reduce is
  bounded by about ``N * (range of the partial sums) / 510``. fp16 keeps 11 significant bits,
  bf16 keeps 8.
"""

from __future__ import annotations

import numpy as np

from ringseed.collective import ops
from ringseed.protocol import frames

MODES = ("int8", "fp16", "bf16")
_Q8_PREFIX = 8
_WIRE = {"int8": frames.DType.Q8, "fp16": frames.DType.F16, "bf16": frames.DType.BF16}


def check_mode(mode: str, dtype: frames.DType) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown quantize mode {mode!r}; use one of {MODES} or None")
    if dtype not in ops.FLOATING:
        raise ValueError(f"quantize={mode!r} needs a floating dtype, not {dtype.name}")


def wire_dtype(mode: str) -> frames.DType:
    return _WIRE[mode]


def encoded_nbytes(count: int, mode: str) -> int:
    return _Q8_PREFIX + count if mode == "int8" else 2 * count


def encode(src: np.ndarray, *, dtype: frames.DType, mode: str, out: np.ndarray) -> None:
    """Encode ``src`` (elements of ``dtype``) into the uint8 array ``out`` of encoded_nbytes."""
    values = _as_f32(src, dtype)
    if mode == "fp16":
        out.view(np.float16)[...] = values
    elif mode == "bf16":
        ops.f32_to_bf16(values, out=out.view(np.uint16))
    else:
        _encode_q8(values, out)


def decode(data: np.ndarray, *, dtype: frames.DType, mode: str, out: np.ndarray) -> None:
    """Decode the uint8 array ``data`` into ``out`` (elements of ``dtype``)."""
    if mode == "fp16":
        values = data.view(np.float16).astype(np.float32)
    elif mode == "bf16":
        values = ops.bf16_to_f32(data.view(np.uint16))
    else:
        values = _decode_q8(data)
    if dtype is frames.DType.BF16:
        ops.f32_to_bf16(values, out=out)
    else:
        out[...] = values


def _as_f32(src: np.ndarray, dtype: frames.DType) -> np.ndarray:
    if dtype is frames.DType.BF16:
        return ops.bf16_to_f32(src)
    return src.astype(np.float32, copy=False)


def _encode_q8(values: np.ndarray, out: np.ndarray) -> None:
    lo = np.float32(values.min())
    hi = np.float32(values.max())
    if not (np.isfinite(lo) and np.isfinite(hi)):
        lo, scale = np.float32(np.nan), np.float32(np.nan)
        codes = np.zeros(values.shape, np.uint8)
    else:
        scale = np.float32((np.float64(hi) - np.float64(lo)) / 255.0) or np.float32(1.0)
        scaled = (values - lo) / scale
        codes = np.clip(np.rint(scaled), 0, 255).astype(np.uint8)
    out[:_Q8_PREFIX].view(np.float32)[...] = (lo, scale)
    out[_Q8_PREFIX:] = codes


def _decode_q8(data: np.ndarray) -> np.ndarray:
    lo, scale = data[:_Q8_PREFIX].view(np.float32)
    result: np.ndarray = data[_Q8_PREFIX:].astype(np.float32)
    result *= scale
    result += lo
    return result
