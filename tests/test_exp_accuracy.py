"""The kernels' vectorised exp (csrc/vexp.h), seen through softmax, at every
ISA level: a row [0, x] with x <= 0 has weights 1/(1 + e^x) and e^x/(1 + e^x),
so the second weight over the first is e^x up to two roundings. Oracle:
float64 NumPy (float32 inputs) and the exact ulp size of each result."""
import numpy as np
import pytest

from attnc import functional as F

# (dtype, lowest x whose e^x is still normal, ulp tolerance: exp's few ulp + the ratio's two roundings)
CASES = [(np.float32, -87.0, 4), (np.float64, -707.0, 4)]


@pytest.mark.parametrize("dtype, lowest, ulps", CASES, ids=["f32", "f64"])
def test_exp_within_a_few_ulp_over_the_normal_range(dtype, lowest, ulps, simd_mode):
    x = np.concatenate([np.linspace(lowest, 0, 20001), -np.random.default_rng(3).random(2000) * -lowest])
    x = x.astype(dtype)
    rows = np.stack([np.zeros_like(x), x], axis=1)
    weights = F.softmax(rows, axis=-1)
    ratio = weights[:, 1].astype(np.float64) / weights[:, 0].astype(np.float64)
    expected = np.exp(x.astype(np.float64))
    ulp = np.spacing(expected.astype(dtype)).astype(np.float64)
    worst = np.max(np.abs(ratio - expected) / ulp)
    assert worst <= ulps, f"{worst:.2f} ulp"


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_exp_edges(dtype, simd_mode):
    tiny = np.finfo(dtype).tiny
    big = np.finfo(dtype).max
    x = np.array([-np.inf, -big, -1e4, np.log(tiny) - 1, np.nan, 0.0, np.copysign(np.nan, -1)], dtype=dtype)
    weights = F.softmax(np.stack([np.zeros_like(x), x], axis=1), axis=-1)
    assert np.all(weights[:4, 1] < tiny)  # below the smallest normal: 0 or subnormal
    assert np.all(weights[:3, 1] == 0) and np.all(weights[:3, 0] == 1)  # -inf and far below: exactly 0
    assert np.all(np.isnan(weights[4]))  # NaN reaches the whole row, as in PyTorch
    assert np.all(np.isnan(weights[6])) and np.signbit(x[6])  # a negative NaN too
    assert np.all(weights[5] == 0.5)
    # a huge positive score takes all the weight (exp of the others' gap is 0)
    huge = F.softmax(np.array([[big, 0.0], [1e4, -1e4]], dtype=dtype), axis=-1)
    np.testing.assert_array_equal(huge, [[1, 0], [1, 0]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_exp_same_bits_in_whole_vectors_and_the_last_short_one(dtype, simd_mode):
    """Rows [0, x, ..., x] of every length up to three AVX-512 vectors of
    float and a few: each x's weight is one value, whether x falls in a
    whole vector or in the row's last, short one (csrc/vexp.h), and it is
    e^x / (1 + (n - 1) e^x) (float64 NumPy) within a relative n + 4
    epsilons: a rounding of the sum per addition, a few of exp's, the
    reciprocal's and the product's."""
    for n in range(2, 3 * 16 + 4):
        for x in (-1.25, -30.0):
            row = np.full((1, n), x, dtype)
            row[0, 0] = 0
            weights = F.softmax(row, axis=-1)[0]
            assert np.all(weights[1:] == weights[1]), (n, x, np.unique(weights[1:]))
            expected = np.exp(x) / (1 + (n - 1) * np.exp(x))
            assert abs(weights[1] - expected) <= (n + 4) * np.finfo(dtype).eps * expected, (n, x)
