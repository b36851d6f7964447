"""attnc.functional against torch.nn.functional and float64 NumPy references."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import attnc
from attnc import functional as F
from toolkit import assert_close, ref_attend, ref_softmax


def _r(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


# ----------------------------------------------------------------------------
# linear


@pytest.mark.parametrize("x_shape", [(5,), (4, 5), (2, 3, 4, 5), (0, 5), (3, 0, 5)],
                         ids=lambda s: "x".join(map(str, s)) or "scalar")
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
def test_linear_vs_torch(x_shape, with_bias, dtype, simd_mode):
    rng = np.random.default_rng(len(x_shape))
    x, w = _r(rng, x_shape, dtype), _r(rng, (7, 5), dtype)
    b = _r(rng, (7,), dtype) if with_bias else None
    out = F.linear(x, w, b) if with_bias else F.linear(x, w)
    expected = TF.linear(torch.from_numpy(x), torch.from_numpy(w), None if b is None else torch.from_numpy(b))
    assert out.dtype == dtype and out.flags.c_contiguous
    assert out.shape == tuple(expected.shape)
    assert_close(out, expected, dtype)
    if with_bias:
        np.testing.assert_array_equal(F.linear(x, w, bias=None), F.linear(x, w))


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (17, 13, 29), (64, 96, 200), (3, 300, 7), (130, 5, 513)])
def test_linear_odd_sizes(m, n, k, dtype, simd_mode):
    rng = np.random.default_rng(m * n * k)
    x, w, b = _r(rng, (m, k), dtype), _r(rng, (n, k), dtype), _r(rng, (n,), dtype)
    assert_close(F.linear(x, w, b), x.astype(np.float64) @ w.astype(np.float64).T + b, dtype)


def test_linear_empty_dims():
    x = np.ones((3, 4), np.float32)
    assert F.linear(x, np.ones((0, 4), np.float32)).shape == (3, 0)
    # K == 0: the output is the bias (or zeros)
    np.testing.assert_array_equal(F.linear(np.ones((3, 0), np.float32), np.ones((2, 0), np.float32),
                                           np.array([1.5, -2], np.float32)), [[1.5, -2]] * 3)
    np.testing.assert_array_equal(F.linear(np.ones((3, 0)), np.ones((2, 0))), np.zeros((3, 2)))


# ----------------------------------------------------------------------------
# softmax


@pytest.mark.parametrize("shape,axis", [((7,), 0), ((3, 5, 7), -1), ((3, 5, 7), 1), ((3, 5, 7), 0),
                                        ((4, 1), -1), ((2, 3, 1000), -1), ((1000, 3), 0)])
def test_softmax_vs_torch(shape, axis, dtype, simd_mode):
    x = _r(np.random.default_rng(sum(shape)), shape, dtype) * 5
    out = F.softmax(x, axis=axis)
    assert out.dtype == dtype and out.flags.c_contiguous and out.shape == shape
    assert_close(out, torch.softmax(torch.from_numpy(x), dim=axis), dtype)
    assert_close(out, ref_softmax(x, axis), dtype)


def test_softmax_default_axis_is_last():
    x = _r(np.random.default_rng(1), (3, 4), np.float32)
    np.testing.assert_array_equal(F.softmax(x), F.softmax(x, axis=-1))
    np.testing.assert_array_equal(F.softmax(x), F.softmax(x, axis=1))


@pytest.mark.parametrize("magnitude", [1e4, 1e30, -1e4])
def test_softmax_is_stable(dtype, magnitude, simd_mode):
    x = (np.array([[1.0, 2.0, 3.0], [0.5, 0.25, 0.0], [-3.0, 7.0, 0.0]]) * magnitude).astype(dtype)
    out = F.softmax(x)
    assert np.all(np.isfinite(out))
    assert_close(out, torch.softmax(torch.from_numpy(x), -1), dtype)
    assert_close(out.sum(-1), np.ones(3), dtype)
    # shift invariance
    shifted = F.softmax((x.astype(np.float64) + 1e4).astype(dtype)) if magnitude < 1e20 else out
    assert_close(shifted, ref_softmax(x.astype(np.float64) + 1e4), dtype)


def test_softmax_minus_inf_and_nan():
    x = np.array([[-np.inf, 0.0, 1.0], [np.nan, 0.0, 1.0], [0.0, 0.0, 0.0]], np.float32)
    out = F.softmax(x)
    expected = torch.softmax(torch.from_numpy(x), -1).numpy()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    assert out[0, 0] == 0.0
    assert_close(out[[0, 2]], expected[[0, 2]], np.float32)
    assert_close(out[2], [1 / 3] * 3, np.float32)


# ----------------------------------------------------------------------------
# scaled_dot_product_attention vs torch

SDPA_SHAPES = [
    # q, k, v
    ((2, 5, 8), (2, 5, 8), (2, 5, 8)),
    ((3, 4, 6), (3, 9, 6), (3, 9, 11)),          # L < S, Ev != E
    ((2, 9, 6), (2, 4, 6), (2, 4, 3)),           # L > S
    ((2, 1, 5, 8), (1, 3, 7, 8), (1, 3, 7, 8)),  # broadcast batch dims
    ((5, 8), (7, 8), (7, 2)),                    # 2-D
    ((2, 2, 3, 1, 4), (3, 6, 4), (3, 6, 5)),     # L = 1, 5-D over 3-D
    ((1, 13, 7), (1, 13, 7), (1, 13, 7)),
]


@pytest.mark.parametrize("shapes", SDPA_SHAPES, ids=lambda s: "-".join("x".join(map(str, t)) for t in s))
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_sdpa_vs_torch(shapes, is_causal, dtype, simd_mode):
    rng = np.random.default_rng(sum(map(sum, shapes)))
    q, k, v = (_r(rng, s, dtype) for s in shapes)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    expected = TF.scaled_dot_product_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                                               is_causal=is_causal)
    assert out.dtype == dtype and out.flags.c_contiguous
    assert_close(out, expected, dtype)


@pytest.mark.parametrize("scale", [0.05, 1.0, -0.7, 3.0, 0.0])
def test_sdpa_custom_scale(scale, dtype):
    rng = np.random.default_rng(2)
    q, k, v = _r(rng, (2, 4, 5), dtype), _r(rng, (2, 6, 5), dtype), _r(rng, (2, 6, 3), dtype)
    out = F.scaled_dot_product_attention(q, k, v, scale=scale)
    expected = TF.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), scale=scale)
    assert_close(out, expected, dtype)


def test_sdpa_default_scale_is_inv_sqrt_e(dtype):
    rng = np.random.default_rng(3)
    q, k, v = _r(rng, (3, 4, 9), dtype), _r(rng, (3, 4, 9), dtype), _r(rng, (3, 4, 2), dtype)
    np.testing.assert_array_equal(F.scaled_dot_product_attention(q, k, v),
                                  F.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(9)))


@pytest.mark.parametrize("mask_shape", [(4, 6), (2, 4, 6), (2, 1, 6), (6,), (1, 1, 6)])
def test_sdpa_bool_mask_vs_torch(mask_shape, dtype, simd_mode):
    rng = np.random.default_rng(4)
    q, k, v = _r(rng, (2, 4, 5), dtype), _r(rng, (2, 6, 5), dtype), _r(rng, (2, 6, 7), dtype)
    keep = rng.random(mask_shape) < 0.6
    keep[..., 0] = True   # no fully masked row here (torch would differ: see test_masks)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    expected = TF.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)),
                                               attn_mask=torch.from_numpy(keep))
    assert_close(out, expected, dtype)


def test_sdpa_return_weights_vs_torch_softmax(dtype, simd_mode):
    rng = np.random.default_rng(5)
    q, k, v = _r(rng, (2, 1, 5, 8), dtype), _r(rng, (1, 3, 7, 8), dtype), _r(rng, (1, 3, 7, 4), dtype)
    keep = rng.random((5, 7)) < 0.7
    keep[:, 2] = True
    out, w = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=0.3, return_weights=True)
    assert out.shape == (2, 3, 5, 4) and w.shape == (2, 3, 5, 7)
    assert w.dtype == dtype and w.flags.c_contiguous
    qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))
    scores = (qt @ kt.transpose(-1, -2) * 0.3).masked_fill(torch.from_numpy(~keep), -1e20)
    expected_w = torch.softmax(scores, -1)
    assert_close(w, expected_w, dtype)
    assert_close(out, expected_w @ vt, dtype)
    np.testing.assert_array_equal(w[..., ~keep], 0)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=0.3), dtype)


@pytest.mark.parametrize("L,S", [(3, 7), (7, 3), (5, 5), (1, 4)])
def test_sdpa_causal_weights(L, S, dtype):
    rng = np.random.default_rng(L * 10 + S)
    q, k, v = _r(rng, (2, L, 4), dtype), _r(rng, (2, S, 4), dtype), _r(rng, (2, S, 3), dtype)
    out, w = F.scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)
    allowed = np.tril(np.ones((L, S), dtype=bool))
    np.testing.assert_array_equal(w[..., ~allowed], 0)   # excluded keys: exactly 0
    scores = np.where(allowed, q.astype(np.float64) @ np.swapaxes(k, -1, -2) / 2.0, -np.inf)
    ew = ref_softmax(scores)
    assert_close(w, ew, dtype)
    assert_close(out, ew @ v.astype(np.float64), dtype)


def test_sdpa_causal_with_mask():
    """is_causal and attn_mask together: causal keys excluded, mask zeros -1e20 among the rest."""
    rng = np.random.default_rng(6)
    L = S = 4
    q, k, v = _r(rng, (L, 3), np.float64), _r(rng, (S, 3), np.float64), _r(rng, (S, 2), np.float64)
    keep = np.array([[1, 1, 1, 1],
                     [0, 1, 1, 1],
                     [0, 0, 0, 1],    # all causal-allowed keys masked: uniform over keys 0..2
                     [1, 0, 1, 0]], dtype=np.int32)
    out, w = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=True, return_weights=True)
    scores = q @ k.T / math.sqrt(3)
    allowed = np.tril(np.ones((L, S), bool))
    scores = np.where(keep == 0, -1e20, scores)
    scores = np.where(allowed, scores, -np.inf)
    ew = ref_softmax(scores)
    np.testing.assert_allclose(w[2], [1 / 3, 1 / 3, 1 / 3, 0], rtol=1e-12)
    np.testing.assert_array_equal(w[0], [1, 0, 0, 0])
    assert_close(w, ew, np.float64)
    assert_close(out, ew @ v, np.float64)
    assert_close(out[2], v[:3].mean(0), np.float64)


def test_sdpa_zero_keys_gives_zeros(dtype):
    q = np.ones((2, 3, 4), dtype)
    k = np.ones((2, 0, 4), dtype)
    v = np.ones((2, 0, 5), dtype)
    out, w = F.scaled_dot_product_attention(q, k, v, return_weights=True)
    assert out.shape == (2, 3, 5) and out.dtype == dtype
    np.testing.assert_array_equal(out, 0)
    assert w.shape == (2, 3, 0)
    assert F.scaled_dot_product_attention(np.ones((2, 0, 4), dtype), np.ones((2, 3, 4), dtype),
                                          np.ones((2, 3, 5), dtype)).shape == (2, 0, 5)


def test_sdpa_mask_all_false_row_is_uniform(dtype):
    rng = np.random.default_rng(7)
    q, k, v = _r(rng, (3, 4), dtype), _r(rng, (5, 4), dtype), _r(rng, (5, 2), dtype)
    keep = np.ones((3, 5), bool)
    keep[1] = False
    out, w = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, return_weights=True)
    assert np.all(np.isfinite(out))
    assert_close(w[1], np.full(5, 0.2), dtype)
    assert_close(out[1], v.astype(np.float64).mean(0), dtype)


# ----------------------------------------------------------------------------
# dtype rule


@pytest.mark.parametrize("dts,expected", [
    (("f4", "f4", "f4"), np.float32),
    (("f4", "f8", "f4"), np.float64),
    (("f4", "f4", ">f8"), np.float64),
    (("i4", "i8", "i2"), np.float32),
    (("?", "u1", "f2"), np.float32),
    (("f2", "f4", "i8"), np.float32),
    ((">f4", "<f4", ">f4"), np.float32),
    (("i8", "f8", "?"), np.float64),
    (("f2", "f2", "f2"), np.float16),
    ((">f2", "f2", "<f2"), np.float16),
    (("f2", "f2", "f8"), np.float64),
])
def test_sdpa_result_dtype(dts, expected):
    rng = np.random.default_rng(8)
    q, k, v = (rng.integers(0, 3, (2, 3, 4)).astype(d) for d in dts)
    out, w = F.scaled_dot_product_attention(q, k, v, return_weights=True)
    assert out.dtype == expected and w.dtype == expected
    ref, ref_w = F.scaled_dot_product_attention(*(a.astype(expected) for a in (q, k, v)), return_weights=True)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(w, ref_w)


@pytest.mark.parametrize("mask_dtype", ["f8", ">f8", "?", "i8", "f4"])
def test_sdpa_mask_never_changes_dtype(mask_dtype):
    rng = np.random.default_rng(9)
    q, k, v = (_r(rng, (2, 3, 4), np.float32) for _ in range(3))
    mask = np.array([[1, 0, 1], [1, 1, 0], [0, 1, 1]]).astype(mask_dtype)
    assert F.scaled_dot_product_attention(q, k, v, attn_mask=mask).dtype == np.float32
    q64 = q.astype(np.float64)
    assert F.scaled_dot_product_attention(q64, k, v, attn_mask=mask).dtype == np.float64


@pytest.mark.parametrize("dts,expected", [
    (("f4", "f4", "f4"), np.float32), (("f4", "f4", "f8"), np.float64), (("i4", ">f8", None), np.float64),
    (("i4", "i4", "?"), np.float32), (("f2", "f4", None), np.float32), ((">f8", "f4", "f4"), np.float64),
    (("f2", "f2", None), np.float16), (("f2", "f2", "f2"), np.float16), (("f2", "i1", None), np.float32),
])
def test_linear_result_dtype(dts, expected):
    rng = np.random.default_rng(10)
    x = rng.integers(-2, 3, (3, 4)).astype(dts[0])
    w = rng.integers(-2, 3, (5, 4)).astype(dts[1])
    b = None if dts[2] is None else rng.integers(0, 2, (5,)).astype(dts[2])
    out = F.linear(x, w, b)
    assert out.dtype == expected
    ref = x.astype(np.float64) @ w.astype(np.float64).T + (0 if b is None else b.astype(np.float64))
    np.testing.assert_array_equal(out, ref)   # small integers: exact in either precision


@pytest.mark.parametrize("in_dtype,expected", [("f4", np.float32), ("f8", np.float64), (">f8", np.float64),
                                               ("i4", np.float32), ("?", np.float32), ("f2", np.float16)])
def test_softmax_result_dtype(in_dtype, expected):
    x = np.array([[0, 1, 2], [1, 1, 0]]).astype(in_dtype)
    out = F.softmax(x)
    assert out.dtype == expected
    assert_close(out, ref_softmax(x.astype(np.float64)), expected)


# ----------------------------------------------------------------------------
# dropout_p inside scaled_dot_product_attention


def test_sdpa_dropout_drops_weights(dtype):
    """With V = I, the output is the dropped-out weights: each is 0 or weight / (1 - p)."""
    rng = np.random.default_rng(11)
    L, S, p = 6, 8, 0.4
    q, k = _r(rng, (3, L, 5), dtype), _r(rng, (3, S, 5), dtype)
    v = np.broadcast_to(np.eye(S, dtype=dtype), (3, S, S))
    out, w = F.scaled_dot_product_attention(q, k, v, dropout_p=p, rng=np.random.default_rng(0),
                                            return_weights=True)
    w_ref = F.scaled_dot_product_attention(q, k, v, return_weights=True)[1]
    np.testing.assert_array_equal(w, w_ref)       # weights returned before dropout
    dropped = out == 0
    assert 0 < dropped.mean() < 1
    assert_close(out[~dropped], w[~dropped].astype(np.float64) / (1 - p), dtype)
    assert abs(dropped.mean() - p) < 5 * math.sqrt(p * (1 - p) / dropped.size)


def test_sdpa_dropout_reproducible_and_fresh():
    rng = np.random.default_rng(12)
    q, k, v = (_r(rng, (2, 5, 4), np.float32) for _ in range(3))
    a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, rng=np.random.default_rng(3))
    b = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, rng=np.random.default_rng(3))
    np.testing.assert_array_equal(a, b)
    g = np.random.default_rng(3)
    c = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, rng=g)
    d = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, rng=g)
    np.testing.assert_array_equal(a, c)
    assert not np.array_equal(c, d)
    attnc.manual_seed(7)
    e = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    attnc.manual_seed(7)
    f = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    np.testing.assert_array_equal(e, f)


def test_sdpa_dropout_p0_and_p1(dtype):
    rng = np.random.default_rng(13)
    q, k, v = (_r(rng, (2, 5, 4), dtype) for _ in range(3))
    np.testing.assert_array_equal(F.scaled_dot_product_attention(q, k, v, dropout_p=0.0),
                                  F.scaled_dot_product_attention(q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=1.0)
    np.testing.assert_array_equal(out, np.zeros((2, 5, 4)))


# ----------------------------------------------------------------------------
# long rows (several key tiles), many queries (several query tiles), large head sizes
#
# The kernel's tiles (csrc/attention_tiles.h): BLOCK_Q = 96 queries, BLOCK_K = 192 keys.
# S = 613 > 3 x 192 keys and L = 211 > 2 x 96 queries reach several tiles of each, on the
# flash path (no weights) and on the weights path; L = 613 makes causal rows of up to 613
# keys (the causal flash path stops each query tile's key loop at its diagonal).


@pytest.mark.parametrize("L", [7, 211, 613])
@pytest.mark.parametrize("S,E,Ev", [(613, 8, 5), (130, 300, 257), (1, 1, 1), (257, 33, 65)])
def test_sdpa_long_rows_vs_numpy(L, S, E, Ev, dtype, simd_mode):
    rng = np.random.default_rng(S + E + L)
    q, k, v = _r(rng, (2, L, E), dtype), _r(rng, (2, S, E), dtype), _r(rng, (2, S, Ev), dtype)
    keep = np.zeros((L, S), bool)
    keep[0] = True                  # everything
    keep[1, -3:] = True             # only the last keys (last tile)
    keep[2, 0] = True               # only the first key
    keep[3, ::7] = True             # sparse
    # row 4: fully masked -> uniform, output = mean of V
    keep[5:] = rng.random((L - 5, S)) < 0.5
    keep[5:, 0] = True
    keep[-1, :] = False             # the last query row (last query tile) fully masked too
    scale = 1 / math.sqrt(E)
    ref_out, ref_w = ref_attend(q, k, v, scale, keep)
    out, w = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, return_weights=True)
    assert_close(w, ref_w, dtype, "weights")
    assert_close(out, ref_out, dtype, "out (weights path)")
    out_flash = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    assert_close(out_flash, ref_out, dtype, "out (flash path)")
    vmean = v.astype(np.float64).mean(1)
    for got in (out, out_flash):
        assert_close(got[:, 4], vmean, dtype, "fully masked row")
        assert_close(got[:, -1], vmean, dtype, "fully masked last row")
    ref_causal, ref_causal_w = ref_attend(q, k, v, scale, causal=True)
    assert_close(F.scaled_dot_product_attention(q, k, v, is_causal=True), ref_causal, dtype, "causal (flash)")
    out_c, w_c = F.scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)
    assert_close(w_c, ref_causal_w, dtype, "causal weights")
    assert_close(out_c, ref_causal, dtype, "causal (weights path)")


def test_softmax_inf_like_torch():
    s = np.array([[np.inf, 1.0, 2.0], [np.inf, np.inf, 0.0], [-np.inf, -np.inf, -np.inf], [-np.inf, 0.0, 1.0]],
                 np.float32)
    out = F.softmax(s)
    expected = torch.softmax(torch.from_numpy(s), -1).numpy()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    np.testing.assert_allclose(out[3], expected[3], rtol=1e-6)


@pytest.mark.parametrize("length", [40, 200], ids=["one-tile", "many-tiles"])
@pytest.mark.parametrize("where", ["key", "value"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("weights", [False, True], ids=["flash", "weights"])
def test_causal_non_finite_key_or_value_propagates_like_torch_math(length, where, value, weights, simd_mode):
    """A NaN or inf in a key or value that most causal queries cannot see
    (three quarters down the sequence): NaN positions and finite values as in
    PyTorch's math path (score + -inf, then 0 x value), for the flash path,
    which otherwise stops each query tile's key loop at its diagonal, and for
    the materialised-weights path."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rng = np.random.default_rng(17)
    q, k, v = (rng.standard_normal((2, length, 16)).astype(np.float32) for _ in range(3))
    hidden = int(length * 0.75)
    (k if where == "key" else v)[0, hidden, 3] = value
    with sdpa_kernel(SDPBackend.MATH):
        expected = TF.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), is_causal=True).numpy()
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=weights)
    out = out[0] if weights else out
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    assert np.isnan(expected[0, :hidden]).any() or value == -np.inf and where == "key"
    finite = np.isfinite(expected)
    np.testing.assert_allclose(out[finite], expected[finite], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[~finite & ~np.isnan(expected)], expected[~finite & ~np.isnan(expected)])


def test_empty_batch_with_weights_and_huge_feature_size():
    """Nothing to compute: empty results, even when a workspace for the
    (zero-size) inputs' feature size could not be sized."""
    q = np.empty((0, 3, 2**56), np.float32)  # 0 bytes
    v = np.empty((0, 5, 2), np.float32)
    out, w = F.scaled_dot_product_attention(q, np.empty((0, 5, 2**56), np.float32), v, return_weights=True)
    assert out.shape == (0, 3, 2) and w.shape == (0, 3, 5)
