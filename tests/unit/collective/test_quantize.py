"""Quantised encodings: round trips, error bounds, determinism, non-finite input (no sockets)."""

from __future__ import annotations

import numpy as np
import pytest

from ringseed.collective import ops, quantize
from ringseed.protocol import frames


def round_trip(values: np.ndarray, mode: str, dtype: frames.DType = frames.DType.F32) -> np.ndarray:
    buf = np.empty(quantize.encoded_nbytes(len(values), mode), np.uint8)
    quantize.encode(values, dtype=dtype, mode=mode, out=buf)
    out = np.empty_like(values)
    quantize.decode(buf, dtype=dtype, mode=mode, out=out)
    return out


@pytest.mark.parametrize(("mode", "bound"), [("int8", 20 / 510 * 1.001), ("fp16", 2**-11 * 10), ("bf16", 2**-8 * 10)])
def test_error_within_bound(mode: str, bound: float) -> None:
    values = np.random.default_rng(0).uniform(-10, 10, 10_001).astype(np.float32)
    err = np.abs(round_trip(values, mode) - values).max()
    assert err <= bound


def test_int8_keeps_extremes_and_constants_exactly() -> None:
    values = np.array([-3.0, 0.5, 7.0], np.float32)
    out = round_trip(values, "int8")
    assert out[0] == -3.0 and abs(out[2] - 7.0) < 1e-5
    np.testing.assert_array_equal(round_trip(np.full(5, 2.5, np.float32), "int8"), np.full(5, 2.5, np.float32))


def test_decoding_the_same_bytes_gives_the_same_values() -> None:
    values = np.random.default_rng(1).standard_normal(999).astype(np.float32)
    once = round_trip(values, "int8")
    np.testing.assert_array_equal(round_trip(values, "int8"), once)


def test_non_finite_segment_decodes_to_nan() -> None:
    out = round_trip(np.array([1.0, np.inf, 2.0], np.float32), "int8")
    assert np.isnan(out).all()


def test_bf16_storage_round_trip() -> None:
    stored = ops.f32_to_bf16(np.array([1.5, -2.25, 1000.0], np.float32))
    out = round_trip(stored, "fp16", dtype=frames.DType.BF16)
    np.testing.assert_array_equal(out, stored)


def test_mode_checks() -> None:
    with pytest.raises(ValueError, match="unknown quantize mode"):
        quantize.check_mode("int4", frames.DType.F32)
    with pytest.raises(ValueError, match="floating"):
        quantize.check_mode("int8", frames.DType.I64)
