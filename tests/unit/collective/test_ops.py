"""Reduction operators and the bfloat16 conversions (no sockets)."""

from __future__ import annotations

import numpy as np
import pytest

from ringseed.collective import ops
from ringseed.protocol import frames

Op = ops.ReduceOp


def test_integer_sum_and_prod_wrap_like_torch() -> None:
    a = np.array([127, -128, 100], np.int8)
    ops.combine(a, np.array([1, -1, 100], np.int8), op=Op.SUM, dtype=frames.DType.I8)
    np.testing.assert_array_equal(a, np.array([-128, 127, -56], np.int8))
    b = np.array([2**62], np.int64)
    ops.combine(b, np.array([4], np.int64), op=Op.PROD, dtype=frames.DType.I64)
    assert b[0] == 0


@pytest.mark.parametrize(("op", "want"), [(Op.MIN, [1.0, -2.0]), (Op.MAX, [3.0, 5.0]), (Op.PROD, [3.0, -10.0])])
def test_float_ops(op: Op, want: list[float]) -> None:
    a = np.array([1.0, -2.0], np.float32)
    ops.combine(a, np.array([3.0, 5.0], np.float32), op=op, dtype=frames.DType.F32)
    np.testing.assert_array_equal(a, np.array(want, np.float32))


def test_avg_only_for_floats() -> None:
    ops.check_op(Op.AVG, frames.DType.BF16)
    with pytest.raises(ValueError, match="floating dtypes only"):
        ops.check_op(Op.AVG, frames.DType.I32)


def test_bf16_narrowing_rounds_to_nearest_even_and_keeps_nan() -> None:
    # 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even (1.0)
    # 1 + 3 * 2^-8 is halfway between 1.0078125 (odd) and 1.015625: ties to even (1.015625)
    values = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, np.nan, np.inf, -0.0], np.float32)
    got = ops.bf16_to_f32(ops.f32_to_bf16(values))
    np.testing.assert_array_equal(got[:3], np.array([1.0, 1.015625, 1.0078125], np.float32))
    assert np.isnan(got[3]) and got[4] == np.inf and np.signbit(got[5])


def test_bf16_sum_in_float32_then_rounded() -> None:
    a = ops.f32_to_bf16(np.array([1.0, 256.0], np.float32))
    ops.combine(a, ops.f32_to_bf16(np.array([2.0**-9, 1.0], np.float32)), op=Op.SUM, dtype=frames.DType.BF16)
    np.testing.assert_array_equal(ops.bf16_to_f32(a), np.array([1.0, 256.0], np.float32))  # both round away


def test_divide_half_precision() -> None:
    h = np.array([3.0, 1.0], np.float16)
    ops.divide(h, divisor=3, dtype=frames.DType.F16)
    np.testing.assert_array_equal(h, np.array([1.0, 1 / 3], np.float16))


def test_unsupported_dtype_is_named() -> None:
    with pytest.raises(ValueError, match="complex64"):
        ops.wire_dtype(np.zeros(1, np.complex64))
