"""float16 and bfloat16: stored in 16 bits, computed in float32 (products
accumulated, softmax and log-sum-exp), rounded once into the result.

Every result is checked against a float64 oracle computed from the same
rounded inputs, within one unit in the last place beyond float32's own error
(toolkit.assert_rounded_once; at the AVX512_BF16 level's bfloat16, whose
products round probabilities first, within PyTorch's own float16/bfloat16 SDPA
tolerances, toolkit.LOW_PRECISION_TOLERANCES), at every kernel ISA level, across the
flash path's tile edges and the row path's split edges, with masks, bias,
causal, windows and dropout; the conversions themselves against NumPy's
float16 and ml_dtypes' bfloat16 rounding; bits the same for any thread
count and whether or not the weights are asked for."""
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest
import torch

import attnc
from attnc import functional as F
from toolkit import K_BLOCK, LOW_PRECISION_TOLERANCES, MODEL, assert_close, assert_rounded_once

BF16 = np.dtype(ml_dtypes.bfloat16)
LOW = [np.dtype(np.float16), BF16]
LOW_IDS = ["f16", "bf16"]


@pytest.fixture(params=LOW, ids=LOW_IDS)
def low(request):
    return request.param


@pytest.fixture
def simd_mode(simd_mode_all):
    """Every kernel ISA level here, those that add bfloat16 kernels only too."""
    return simd_mode_all


def normal(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def wide(*arrays):
    """The rounded inputs, exactly, in float64: what every oracle computes from."""
    return [None if a is None else np.asarray(a).astype(np.float64) for a in arrays]


# The AVX512_BF16 level (kernels_avx512bf16.c) multiplies bfloat16 as pairs (vdpbf16ps): its
# flash path (items of more than ROWS_MAX_QUERIES queries) rounds each key tile's probabilities
# to bfloat16 before the value product, as PyTorch's and OpenVINO's CPU kernels do
# (attention_impl.h: flash_step; attention_tiles.h: BLOCK_K, ROWS_MAX_QUERIES in attention_rows.h).
ROWS_MAX_QUERIES = 16
KEY_TILE = 192


FLASH_MAX_HEAD = 2048  # attention_impl.h: E + Ev above it take the row path


def pairs_level(low):
    return np.dtype(low) == BF16 and attnc._C.simd_level() == "avx512bf16"


def rounds_probabilities(low, L, E, Ev):
    return pairs_level(low) and L > ROWS_MAX_QUERIES and E + Ev <= FLASH_MAX_HEAD


def check_low(actual, expected, low, what=""):
    """An attnc result of dtype `low` against the float64 oracle: computed in float32 and
    rounded once (assert_rounded_once), but at the AVX512_BF16 level's bfloat16, whose
    products take pairs and whose flash path rounds each key tile's probabilities to
    bfloat16 first (one more rounding per term, as PyTorch's CPU kernels round): within
    PyTorch's own tolerances there."""
    if pairs_level(low):
        assert_close(actual, expected, low, what)
    else:
        assert_rounded_once(actual, expected, low, what)


def rounded(x, low):
    return x.astype(np.float32).astype(low).astype(np.float64)


def out_of_rounded_probabilities(s, v, factors, low):
    """The flash path's output when it rounds probabilities: keys in tiles of KEY_TILE from
    key 0 and a running max m; each tile's exp(s - m) (times the dropout factors) rounded
    to `low` for the value product, their sum unrounded; what came before rescaled when m
    grows."""
    m = np.full(s.shape[:-1] + (1,), -np.inf)
    total, acc = np.zeros_like(m), 0.0
    with np.errstate(invalid="ignore"):
        for j0 in range(0, s.shape[-1], KEY_TILE):
            tile = s[..., j0:j0 + KEY_TILE]
            new = np.maximum(m, tile.max(-1, keepdims=True))
            shift = np.where(np.isneginf(new), 0.0, new)
            correction = np.where(np.isneginf(m), 0.0, np.exp(m - shift))
            e = np.exp(tile - shift)
            total = total * correction + e.sum(-1, keepdims=True)
            p = e if factors is None else e * factors[..., j0:j0 + KEY_TILE]
            acc = acc * correction + rounded(p, low) @ v[..., j0:j0 + KEY_TILE, :]
            m = new
    return acc / total


def oracle(q, k, v, bias=None, keep=None, causal=False, scale=None, factors=None, exact=False):
    """float64 (out, weights, lse) of attention from the definition: a float bias added,
    a top-left causal band, keep (0/1 mask) applied as attn_mask, the weights times the
    dropout factors in out; out as the flash path computes it where it rounds
    probabilities (rounds_probabilities), unless exact."""
    low = q.dtype
    q, k, v, bias = wide(q, k, v, bias)
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if bias is not None:
        s = s + bias
    if keep is not None:
        s = np.where(keep, s, -1e20)
    L, S = s.shape[-2:]
    if causal:
        s = s + np.where(np.triu(np.ones((L, S), bool), 1), -np.inf, 0)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    w = e / e.sum(-1, keepdims=True)
    if rounds_probabilities(low, L, q.shape[-1], v.shape[-1]) and not exact:
        out = out_of_rounded_probabilities(s, np.broadcast_to(v, s.shape[:-2] + v.shape[-2:]), factors, low)
    else:
        out = (w if factors is None else w * factors) @ v
    return out, w, (m + np.log(e.sum(-1, keepdims=True)))[..., 0]


# ----------------------------------------------------------------------------
# the conversions: the kernels round as NumPy (float16) and ml_dtypes (bfloat16)


def special_values(dtype):
    """Values whose products with 1, 0.5, 2^-13 and 2^13 (exact in float32) need every
    case of the rounding: ties, subnormals, overflow to inf, zeros, inf and NaN."""
    info = ml_dtypes.finfo(dtype)
    rng = np.random.default_rng(1)
    values = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, float(info.max), float(info.smallest_normal),
              float(info.smallest_subnormal), 3 * float(info.smallest_subnormal), 1 + float(info.eps) / 2]
    values += list(rng.standard_normal(200) * 10.0 ** rng.integers(-8, 6, 200))
    with np.errstate(over="ignore"):
        return np.array(values).astype(dtype)


def flushed(a):
    """Subnormal values (of float32, and so of bfloat16, which has its exponents) as zeros
    of their sign: what vdpbf16ps takes and gives."""
    a = np.asarray(a, np.float32)
    return np.where(np.abs(a) < np.finfo(np.float32).tiny, np.copysign(np.float32(0), a), a)


@pytest.mark.parametrize("n_out", [64, 1024], ids=["direct", "packed"])
def test_rounding_matches_numpy_and_ml_dtypes(low, n_out, simd_mode):
    """linear with K = 1: each result is one float32 product, exact, rounded once into
    the dtype: the same bits as NumPy's float16 or ml_dtypes' bfloat16 cast of it, by the
    scalar path (small) and the vector path (packed), at every ISA level; at the
    AVX512_BF16 level bfloat16 products are vdpbf16ps', whose subnormal inputs and results
    are zeros (and which take the packed path at every size)."""
    x = special_values(low)
    w = np.array([1.0, 0.5, 2.0 ** -13, 2.0 ** 13] * (n_out // 4)).astype(low)[:, None]
    out = F.linear(x[:, None], w)
    flush = flushed if pairs_level(low) else (lambda a: np.asarray(a, np.float32))
    with np.errstate(over="ignore"):
        expected = flush(flush(x)[:, None] * flush(w)[:, 0]).astype(low)
    assert out.dtype == low
    # the same values (NaN where NaN; a sum starts from +0, so an exact -0 product gives +0),
    # and the same bits wherever the result is not zero or NaN
    np.testing.assert_array_equal(out.astype(np.float32), expected.astype(np.float32))
    nonzero = expected.astype(np.float32) != 0
    np.testing.assert_array_equal(out.view(np.uint16)[nonzero], expected.view(np.uint16)[nonzero])


def test_widening_is_exact(low, simd_mode):
    """softmax over one element is 1; attention over one key returns the value itself:
    every finite 16-bit value goes through the kernels unchanged."""
    bits = np.arange(1 << 16, dtype=np.uint16).view(low)
    finite = bits[np.isfinite(bits.astype(np.float32))]
    value = finite.reshape(-1, 1, 1, 64)[: 1 << 9]  # (512, 1, 1, 64): items with one key each
    q = np.zeros((value.shape[0], 1, 1, 64), low)
    out = F.scaled_dot_product_attention(q, q, value)
    # -0 comes out +0: the weighted sum starts from +0, as in float32
    np.testing.assert_array_equal(out.view(np.uint16), (value + np.zeros((), low)).view(np.uint16))


# ----------------------------------------------------------------------------
# scaled_dot_product_attention


SDPA_SHAPES = {  # name: (batch, L, S, E, Ev)
    "tiny": ((2, 3), 5, 7, 8, 8),
    "tile-edges": ((2,), 97, 193, 36, 40),
    "tiles": ((1,), 192, 384, 64, 64),
    "rows": ((2, 4), 16, 1025, 64, 64),
    "decode": ((1, 4), 1, 3 * 1024 + 5, 128, 128),
    "odd-head": ((2,), 33, 65, 13, 11),
}


@pytest.mark.parametrize("shape", list(SDPA_SHAPES))
def test_sdpa_against_float64(low, shape, simd_mode):
    batch, L, S, E, Ev = SDPA_SHAPES[shape]
    rng = np.random.default_rng(L + S)
    q, k, v = normal(rng, batch + (L, E), low), normal(rng, batch + (S, E), low), normal(rng, batch + (S, Ev), low)
    out, weights, lse = F.scaled_dot_product_attention(q, k, v, return_weights=True, return_lse=True)
    r_out, r_weights, r_lse = oracle(q, k, v)
    assert out.dtype == low and weights.dtype == low and lse.dtype == np.float32
    check_low(out, r_out, low, "out")
    check_low(weights, r_weights, low, "weights")
    assert_close(lse, r_lse, np.float32, "lse", tol=1e-5)


@pytest.mark.parametrize("L,S", [(7, 9), (97, 193), (4, 2050)])
def test_sdpa_masks_bias_causal(low, L, S, simd_mode):
    rng = np.random.default_rng(L * S)
    q, k, v = (normal(rng, (2, 3, n, 16), low) for n in (L, S, S))
    keep = rng.random((2, 1, L, S)) > 0.3
    bias = normal(rng, (3, L, S), low)
    for kw, ref in (({"attn_mask": keep}, {"keep": keep}), ({"attn_bias": bias}, {"bias": bias}),
                    ({"is_causal": True}, {"causal": True}),
                    ({"attn_bias": bias, "is_causal": True, "scale": 0.3}, {"bias": bias, "causal": True,
                                                                            "scale": 0.3})):
        out, weights = F.scaled_dot_product_attention(q, k, v, return_weights=True, **kw)
        r_out, r_weights, _ = oracle(q, k, v, **ref)
        check_low(out, r_out, low, str(kw.keys()))
        check_low(weights, r_weights, low, str(kw.keys()))


def test_sdpa_window_and_gqa_decode(low, simd_mode):
    """Bottom-right causal with a window, grouped-query heads, three splits of keys."""
    rng = np.random.default_rng(3)
    S, window = 3 * 1024 + 7, 1500
    q, k, v = normal(rng, (2, 8, 4, 64), low), normal(rng, (2, 2, S, 64), low), normal(rng, (2, 2, S, 64), low)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom_right",
                                         window=(window, 0), enable_gqa=True)
    i, j = np.arange(4)[:, None], np.arange(S)[None, :]
    diagonal = i + S - 4
    bias = np.where((j <= diagonal) & (j >= diagonal - window), 0.0, -np.inf)
    r_out = oracle(q, np.repeat(k, 4, axis=1), np.repeat(v, 4, axis=1), bias=bias)[0]
    check_low(out, r_out, low)


def test_sdpa_dropout(low):
    """Dropout with a seed: the same factors as float32 (a counter-based mask keyed by the seed
    and the element), read off with zero q, k and value = I; then the output against the
    oracle with those factors."""
    rng = np.random.default_rng(4)
    p, seed, L, S = 0.3, 77, 40, 200
    eye = np.broadcast_to(np.eye(S, dtype=np.float32), (2, S, S))
    factors = F.scaled_dot_product_attention(np.zeros((2, L, 8), np.float32), np.zeros((2, S, 8), np.float32), eye,
                                             dropout_p=p, seed=seed) * S
    q, k, v = normal(rng, (2, L, 8), low), normal(rng, (2, S, 8), low), normal(rng, (2, S, 8), low)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, seed=seed)
    check_low(out, oracle(q, k, v, factors=factors)[0], low)


def test_subnormal_values_through_the_flash_path(low, simd_mode):
    """One key: its weight is exactly 1 and out is v. Every level passes subnormal values
    through exactly, but for bfloat16 at the AVX512_BF16 level, whose pair products
    (vdpbf16ps) take subnormal inputs as zeros (docs/API.md); normal values pass everywhere."""
    info = ml_dtypes.finfo(low)
    values = np.array([float(info.smallest_subnormal), -3 * float(info.smallest_subnormal), 1.5,
                       float(info.smallest_normal), -2.0, float(info.max)]).astype(low)
    subnormal = np.abs(values.astype(np.float64)) < float(info.smallest_normal)
    q, k = np.ones((2, 17, 4), low), np.ones((2, 1, 4), low)
    out = F.scaled_dot_product_attention(q, k, np.broadcast_to(values, (2, 1, values.size)))
    expected = np.where(subnormal & pairs_level(low), 0.0, values.astype(np.float64))
    np.testing.assert_array_equal(out.astype(np.float64), np.broadcast_to(expected, out.shape))


def test_probabilities_near_the_smallest_normal_give_every_query_the_same_bits(low, simd_mode):
    """Identical queries get identical outputs, whatever their column of the score tile.
    Regression: at the AVX512_BF16 level a probability just below float32's smallest normal
    was rounded to bfloat16's smallest normal by the tile's last columns (scalar) and to zero
    by the others (vcvtneps2bf16), so queries 16-19 of 20 differed from the rest. Here exp
    of scores near -87.3 lands on both sides of it, and V's 2^100 makes it visible."""
    L = 20
    q = np.ones((L, 2), low)
    v = np.array([[0, 0], [2.0 ** 100, 2.0 ** 100]]).astype(low) if low == BF16 else np.zeros((2, 2), low)
    for last in np.arange(-0.30, -0.38, -2.0 ** -10):
        k = np.array([[0, 0], [-87, last]]).astype(low)
        out = F.scaled_dot_product_attention(q, k, v, scale=1.0)
        np.testing.assert_array_equal(out.view(np.uint16), np.broadcast_to(out[:1], out.shape).view(np.uint16))


def test_lse_carries_the_flash_exp_at_float_accuracy(low, simd_mode):
    """The flash path's exp has a few float32 ulp of error; where bfloat16 probabilities
    are rounded right after it (the AVX512_BF16 level), 5.6e-6 relative at most (vexp.h:
    for_bf16), 1/350 of that rounding. Its error reaches lse unrounded: query i against two
    keys with scores 0 and d_i (every value of the dtype in [-16, 0]) has
    lse_i = log(1 + exp(d_i)), off by at most 5.6e-6 * exp(d_i) / (1 + exp(d_i)) <= 2.8e-6
    from the exp and by float32's rounding of the sum and the log (< 1.2e-7 here)."""
    bits = np.arange(1 << 16, dtype=np.uint16).view(low)
    with np.errstate(invalid="ignore"):  # the signalling NaNs among the bits
        wide = bits.astype(np.float64)
    d = bits[(wide >= -16) & (wide <= 0)]
    q = np.stack([d, np.zeros_like(d)], -1)  # (L, 2), L > ROWS_MAX_QUERIES: the flash path
    k = np.array([[0, 0], [1, 0]], low)
    _, lse = F.scaled_dot_product_attention(q, k, np.zeros((2, 2), low), scale=1.0, return_lse=True)
    expected = np.log1p(np.exp(d.astype(np.float64)))
    assert np.abs(lse - expected).max() <= 3e-6


@pytest.mark.parametrize("shape", ["tile-edges", "rows", "decode"])
def test_sdpa_same_bits_any_threads_and_with_weights(low, shape, restore_threads):
    batch, L, S, E, Ev = SDPA_SHAPES[shape]
    rng = np.random.default_rng(5)
    q, k, v = normal(rng, batch + (L, E), low), normal(rng, batch + (S, E), low), normal(rng, batch + (S, Ev), low)
    attnc.set_num_threads(1)
    alone = F.scaled_dot_product_attention(q[:1], k[:1], v[:1], is_causal=True)
    results = []
    for threads in (1, 2, 3):
        attnc.set_num_threads(threads)
        results.append(F.scaled_dot_product_attention(q, k, v, is_causal=True))
        results.append(F.scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)[0])
    for other in results[1:]:
        np.testing.assert_array_equal(other.view(np.uint16), results[0].view(np.uint16))
    np.testing.assert_array_equal(alone.view(np.uint16), results[0][:1].view(np.uint16))


@pytest.mark.parametrize("L,S", [(97, 300), (3, 2100)], ids=["tiles", "rows"])
def test_sdpa_is_float32_rounded_once(low, L, S, simd_mode):
    """Computed in float32: the output and the weights are the float32 kernel's, on the
    widened inputs, rounded once (the two instantiations share every operation; the row
    path keeps each split's e in float32 until the weights are scaled)."""
    if rounds_probabilities(low, L, 32, 32):
        pytest.skip("bfloat16 pairs: products of bfloat16, checked against their own oracle")
    rng = np.random.default_rng(6)
    q, k, v = normal(rng, (2, 3, L, 32), low), normal(rng, (2, 3, S, 32), low), normal(rng, (2, 3, S, 32), low)
    out, weights = F.scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)
    out32, weights32 = F.scaled_dot_product_attention(*(a.astype(np.float32) for a in (q, k, v)), is_causal=True,
                                                      return_weights=True)
    np.testing.assert_array_equal(out.view(np.uint16), out32.astype(low).view(np.uint16))
    np.testing.assert_array_equal(weights.view(np.uint16), weights32.astype(low).view(np.uint16))


# ----------------------------------------------------------------------------
# linear


@pytest.mark.parametrize("M,K,N", [(3, 5, 7), (1, 4 * K_BLOCK, 64), (64, K_BLOCK + 232, 96), (130, 64, 700),
                                   (1000, K_BLOCK + 8, 40), (1300, K_BLOCK + 8, 1100)])
def test_linear_against_float64(low, M, K, N, simd_mode):
    """K past one K block sums over several (K_BLOCK): the sums stay in
    float32 between them, rounded once. (130, 64, 700) takes the GEMM's streamed
    order, (1000, K_BLOCK + 8, 40) its blocked order, (1300, K_BLOCK + 8, 1100)
    the blocked order too but on Intel at AVX-512, where its x (5.3 MB widened)
    is streamed by blocks of weight slivers (GEMM_FAR_A_BY_B_BLOCKS)."""
    rng = np.random.default_rng(M + K + N)
    x, w, b = normal(rng, (M, K), low), normal(rng, (N, K), low) / np.sqrt(K).astype(low), normal(rng, (N,), low)
    out = F.linear(x, w, b)
    x64, w64, b64 = wide(x, w, b)
    assert out.dtype == low
    check_low(out, x64 @ w64.T + b64, low)


def test_edge_tiles_of_every_height(low, simd_mode):
    """As test_simd_levels.py's test of edge tiles, in 16 bits at every level
    (the bfloat16 pairs' score product scales as it stores, pair_probabilities
    rounds whole runs of queries): x of 13 to 36 rows against 97 to 108 weight
    rows, and attention of 17 to 40 queries over as many keys or 192 more."""
    rng = np.random.default_rng(4)
    for n_out in range(97, 109):
        w, b = normal(rng, (n_out, 70), low), normal(rng, (n_out,), low)
        for m in range(13, 37):
            x = normal(rng, (m, 70), low)
            x64, w64, b64 = wide(x, w, b)
            check_low(F.linear(x, w, b), x64 @ w64.T + b64, low, f"{simd_mode} M={m} N={n_out}")
    for n in range(17, 41):
        for s in (n, 192 + n):
            q, k, v = normal(rng, (1, n, 16), low), normal(rng, (1, s, 16), low), normal(rng, (1, s, 24), low)
            check_low(F.scaled_dot_product_attention(q, k, v), oracle(q, k, v)[0], low,
                         f"{simd_mode} L={n} S={s}")


@pytest.mark.parametrize("M", [1, 3, 8])
def test_linear_few_rows(low, M, simd_mode):
    """A few rows take the GEMM's order that reads the weights in place (but
    at the AVX512_BF16 level, whose bfloat16 products all run in pairs):
    against float64, and each row's bits as when alone and as among 100 rows
    (a packed order). 70 outputs end in a part-filled block of lanes; K =
    K_BLOCK + 9 is two K blocks, the second 9 steps. This guards the widening and the one
    rounding at the end; the float and double tests of test_simd_levels.py
    guard the order of the sums, whose last bit a 16-bit result hides."""
    rng = np.random.default_rng(M)
    k = K_BLOCK + 9
    x, w, b = normal(rng, (M, k), low), normal(rng, (70, k), low) / np.sqrt(k).astype(low), normal(rng, (70,), low)
    out = F.linear(x, w, b)
    x64, w64, b64 = wide(x, w, b)
    check_low(out, x64 @ w64.T + b64, low)
    among = F.linear(np.concatenate([normal(rng, (60, k), low), x, normal(rng, (40, k), low)]), w, b)
    np.testing.assert_array_equal(among[60:60 + M].view(np.uint16), out.view(np.uint16))
    for i in range(M):
        np.testing.assert_array_equal(F.linear(x[i:i + 1], w, b).view(np.uint16), out[i:i + 1].view(np.uint16))


def test_softmax_and_the_layer_backwards(low, simd_mode):
    """softmax, and the backward functions of softmax and linear, against float64 on the
    rounded inputs (each computed in float32 and rounded once)."""
    rng = np.random.default_rng(12)
    x, g = normal(rng, (4, 300), low), normal(rng, (4, 300), low)
    out = F.softmax(x * np.array(4, low))
    x64, g64 = wide(x * np.array(4, low), g)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    check_low(out, e / e.sum(-1, keepdims=True), low, "softmax")
    o64 = wide(out)[0]
    check_low(F.softmax_backward(g, out), o64 * (g64 - (g64 * o64).sum(-1, keepdims=True)), low, "softmax'")
    x, w, g = normal(rng, (5, 70), low), normal(rng, (3, 70), low), normal(rng, (5, 3), low)
    grad_x, grad_w, grad_b = F.linear_backward(g, x, w)
    x64, w64, g64 = wide(x, w, g)
    for got, want, name in ((grad_x, g64 @ w64, "grad_x"), (grad_w, g64.T @ x64, "grad_w"),
                            (grad_b, g64.sum(0), "grad_b")):
        check_low(got, want, low, name)


# ----------------------------------------------------------------------------
# the dtype rule


@pytest.mark.parametrize("dts,expected", [
    ((BF16, BF16, BF16), BF16), ((BF16, BF16, np.float16), np.float32), ((BF16, np.float32, BF16), np.float32),
    ((BF16, np.int8, BF16), np.float32), ((np.float16, np.float16, np.float64), np.float64),
    ((np.float16, np.bool_, np.float16), np.float32),
], ids=str)
def test_mixed_inputs_promote_never_down(dts, expected):
    rng = np.random.default_rng(7)
    q, k, v = (rng.integers(-2, 3, (2, 4, 8)).astype(d) for d in dts)
    out, lse = F.scaled_dot_product_attention(q, k, v, return_lse=True)
    assert out.dtype == np.dtype(expected)
    assert lse.dtype == (np.float64 if np.dtype(expected) == np.float64 else np.float32)
    assert F.linear(q[0], k[0], v[0, :, 0]).dtype == np.dtype(expected)


NARROW_NUMBERS = [name for name in ("float8_e5m2", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2fnuz",
                                     "float8_e4m3b11fnuz", "float6_e2m3fn", "float4_e2m1fn", "int4", "uint4")
                  if hasattr(ml_dtypes, name)]


@pytest.mark.parametrize("name", NARROW_NUMBERS)
def test_narrower_numbers_count_as_float32(name):
    """ml_dtypes' float8 and narrower numbers, which NumPy casts to float32 exactly: all
    taken as float32 inputs, as integers are. float8_e5m2 (of kind 'f') was taken and every
    other one (of kind 'V') refused as "unsupported" (a review helper, 2026-11-24)."""
    dt = np.dtype(getattr(ml_dtypes, name))
    rng = np.random.default_rng(9)
    values = rng.integers(0, 4, (2, 5, 8))  # exact in every one of them
    x = values.astype(dt)
    exact = values.astype(np.float64)
    w = normal(rng, (3, 8), np.float32)
    y = F.linear(x, w)
    assert y.dtype == np.float32
    assert_close(y, exact @ w.astype(np.float64).T, np.float32)
    out = F.scaled_dot_product_attention(x, x, x, attn_mask=np.ones((5, 5)).astype(dt))
    scores = exact @ np.swapaxes(exact, -1, -2) / np.sqrt(8)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    assert_close(out, weights / weights.sum(-1, keepdims=True) @ exact, np.float32)
    assert attnc.Linear(8, 3)(x).dtype == np.float32
    # the gradient of a float8 input comes in the module's dtype (float8_e5m2's, of kind 'f',
    # came back in float8 with 2 mantissa bits, the others' in float32)
    layer = attnc.Linear(8, 3).train()
    assert layer.backward(np.ones_like(layer(x))).dtype == np.float32


def test_nn_multihead_takes_a_bfloat16_float_mask():
    """nn.MultiheadAttention's float masks are added to the scores: a bfloat16 one was refused
    as "neither bool nor floating" (its dtype's kind is 'V'); it adds as its float32 values."""
    rng = np.random.default_rng(10)
    m = attnc.nn.MultiheadAttention(8, 2, batch_first=True)
    x = normal(rng, (2, 5, 8), np.float32)
    mask = np.triu(np.full((5, 5), -3.0), 1)
    expected, _ = m(x, x, x, attn_mask=mask.astype(np.float32))
    got, _ = m(x, x, x, attn_mask=mask.astype(BF16))
    np.testing.assert_array_equal(got, expected)
    twin = torch.nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64)  # (an audit: attnc only)
    twin.load_state_dict({name: torch.from_numpy(value.astype(np.float64)) for name, value in m.state_dict().items()})
    tx = torch.from_numpy(x.astype(np.float64))
    with torch.no_grad():
        oracle = twin(tx, tx, tx, attn_mask=torch.from_numpy(mask))[0].numpy()
    assert_close(got, oracle, np.float32)


def test_mask_and_bias_never_change_the_dtype(low):
    rng = np.random.default_rng(8)
    q = normal(rng, (2, 5, 8), low)
    for kw in ({"attn_bias": np.zeros((5, 5))}, {"attn_mask": np.ones((5, 5), np.float64)}):
        assert F.scaled_dot_product_attention(q, q, q, **kw).dtype == low


# ----------------------------------------------------------------------------
# backward: within PyTorch's gradient tolerances


# PyTorch's tests of its fused kernels' low-precision gradients multiply the deviation of
# its own low-precision math path by fudge factors above 1 (test_transformers.py,
# get_tolerances); here a single factor of 2, below the ones it uses.
FUDGE = 2.0


def assert_as_close_as_torch(got, expected, torch_low, dtype, what):
    """PyTorch's test for low-precision gradients (test_transformers.py: get_tolerances):
    atol is the larger of the default and FUDGE times torch's own float16/bfloat16 result's
    largest deviation from the float64 oracle; rtol is the default. So attnc is within twice
    torch's own error of the exact gradient, wherever that error is above the default."""
    atol, rtol = LOW_PRECISION_TOLERANCES[np.dtype(dtype).name]
    atol = max(atol, FUDGE * float(np.max(np.abs(np.asarray(torch_low, np.float64) - expected))))
    assert got.dtype == dtype, (what, got.dtype)
    excess = np.abs(got.astype(np.float64) - expected) - (atol + rtol * np.abs(expected))
    worst = np.unravel_index(int(np.argmax(excess)), excess.shape)
    assert excess[worst] <= 0, f"{what}: |{got[worst]} - {expected[worst]}| > {atol:.2e} + {rtol} * |expected|"


def torch_low(dtype):
    return torch.float16 if np.dtype(dtype) == np.float16 else torch.bfloat16


def torch_sdpa_grads(q, k, v, g, causal, tdt, enable_gqa=False, bias=None):
    """torch's SDPA and autograd in tdt on the given values: (grad_q, grad_k, grad_v)."""
    tq, tk, tv = (torch.tensor(np.asarray(a, np.float64)).to(tdt).requires_grad_() for a in (q, k, v))
    mask = None if bias is None else torch.tensor(np.asarray(bias, np.float64)).to(tdt)
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask, is_causal=causal,
                                                           enable_gqa=enable_gqa)
    out.backward(torch.tensor(np.asarray(g, np.float64)).to(tdt))
    return [t.grad.double().numpy() for t in (tq, tk, tv)]


@pytest.mark.parametrize("L,S,causal", [(7, 9, False), (97, 193, True), (200, 130, False)])
def test_sdpa_backward_against_float64(low, L, S, causal, simd_mode):
    """The gradients from the 16-bit out and lse (as a training step has them), against
    float64 autograd on the same rounded inputs, within PyTorch's tolerances."""
    rng = np.random.default_rng(L)
    q, k, v = (normal(rng, (2, 3, n, 16), low) for n in (L, S, S))
    g = normal(rng, (2, 3, L, 16), low)
    out, lse = F.scaled_dot_product_attention(q, k, v, is_causal=causal, return_lse=True)
    grads = F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, is_causal=causal)
    expected = torch_sdpa_grads(*wide(q, k, v, g), causal, torch.float64)
    torch_grads = torch_sdpa_grads(*wide(q, k, v, g), causal, torch_low(low))
    for got, want, theirs, name in zip(grads, expected, torch_grads, ("dq", "dk", "dv")):
        assert_as_close_as_torch(got, want, theirs, low, name)


@pytest.mark.parametrize("q_shape,kv_shape,gqa", [((64, 8, 16), (1, 20, 16), False),
                                                   ((1, 128, 8, 16), (1, 1, 20, 16), True)], ids=["shared", "gqa"])
def test_sdpa_backward_sums_shared_gradients_in_float32(low, q_shape, kv_shape, gqa):
    """A key and value shared by a batch (or by a group of query heads) get their gradients
    summed over it: the sum ran in 16 bits, in NumPy, with a rounding at each add (dk, dv
    beyond PyTorch's tolerances, bfloat16 max error 0.08); now it runs in float32 and rounds
    once (a review helper, 2026-11-24)."""
    rng = np.random.default_rng(19)
    q, k, v = normal(rng, q_shape, low), normal(rng, kv_shape, low), normal(rng, kv_shape, low)
    out, lse = F.scaled_dot_product_attention(q, k, v, return_lse=True, enable_gqa=gqa)
    g = normal(rng, out.shape, low)
    grads = F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, enable_gqa=gqa)
    expected = torch_sdpa_grads(*wide(q, k, v, g), False, torch.float64, enable_gqa=gqa)
    torch_grads = torch_sdpa_grads(*wide(q, k, v, g), False, torch_low(low), enable_gqa=gqa)
    for got, want, theirs, name in zip(grads, expected, torch_grads, ("dq", "dk", "dv")):
        assert got.shape == want.shape
        assert_as_close_as_torch(got, want, theirs, low, name)


def test_sdpa_backward_of_a_shared_key_keeps_the_bias_as_the_forward_rounded_it(low):
    """The float32 computation of a summed gradient took a float32 attn_bias at its own
    precision, where the forward (whose out and lse the backward uses) had rounded it to 16
    bits: an item's gradients then changed with a unit batch axis (a review helper,
    2026-11-24). The same item gives the same bits alone and batched."""
    rng = np.random.default_rng(0)
    q, k, v = normal(rng, (16, 8), low), normal(rng, (24, 8), low), normal(rng, (24, 8), low)
    values = rng.standard_normal((16, 24)) * 3
    for bias_dtype in (np.float32, BF16 if low == np.float16 else np.float16):  # the other 16 bits too
        bias = values.astype(bias_dtype)
        out, lse = F.scaled_dot_product_attention(q, k, v, attn_bias=bias, return_lse=True)
        g = normal(rng, out.shape, low)
        alone = F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, attn_bias=bias)
        batched = F.scaled_dot_product_attention_backward(g[None], q[None], k, v, out[None], lse[None],
                                                          attn_bias=bias)
        np.testing.assert_array_equal(batched[0][0], alone[0])
        np.testing.assert_array_equal(batched[1], alone[1])
        np.testing.assert_array_equal(batched[2], alone[2])
        if bias_dtype == np.float32:
            expected = torch_sdpa_grads(*wide(q, k, v, g), False, torch.float64, bias=bias.astype(low))
            theirs = torch_sdpa_grads(*wide(q, k, v, g), False, torch_low(low), bias=bias.astype(low))
            for got, want, torch_got, name in zip(batched, expected, theirs, ("dq", "dk", "dv")):
                assert_as_close_as_torch(got.reshape(want.shape), want, torch_got, low, name)


def test_nn_multihead_sums_and_averages_16_bits_in_float32(low):
    """nn.MultiheadAttention's bias_k / bias_v gradients (summed over the batch) and its
    head-averaged weights were summed in the 16-bit dtype (bfloat16 bias_v gradient off by
    12 % at a batch of 512, stuck at 256 beyond; averaged weights 5 ulps off): now float32
    sums rounded once, against torch in float64 on the same rounded values."""
    torch.manual_seed(0)
    tdt = torch_low(low)
    tm = torch.nn.MultiheadAttention(4, 1, add_bias_kv=True).to(tdt).train()
    m = attnc.from_torch(tm)
    t64 = torch.nn.MultiheadAttention(4, 1, add_bias_kv=True).double()
    t64.load_state_dict({key: value.double() for key, value in tm.state_dict().items()})
    x = torch.randn(2, 512, 4).to(tdt)
    xa = x.float().numpy().astype(low)
    m(xa, xa, xa, need_weights=False)
    m.backward(np.ones((2, 512, 4), low))
    xd = x.double()
    t64(xd, xd, xd, need_weights=False)[0].sum().backward()
    tm(x, x, x, need_weights=False)[0].float().sum().backward()
    grads = dict(m.named_grads())
    for name in ("bias_k", "bias_v"):
        want = getattr(t64, name).grad.numpy()
        assert_as_close_as_torch(grads[name], want, getattr(tm, name).grad.double().numpy(), low, name)

    heads = 64
    m = attnc.nn.MultiheadAttention(heads * 2, heads, dtype=low, rng=np.random.default_rng(1)).eval()
    x = normal(np.random.default_rng(2), (3, 2, heads * 2), low)
    _, per_head = m(x, x, x, average_attn_weights=False)
    _, averaged = m(x, x, x)
    exact = per_head.astype(np.float64).mean(axis=1)
    np.testing.assert_array_equal(averaged, exact.astype(np.float32).astype(low))


@pytest.mark.parametrize("low", [np.float16, ml_dtypes.bfloat16], ids=["f16", "bf16"])
def test_nn_mha_self_attention_in_one_call(low, simd_mode):
    """A 16-bit nn.MultiheadAttention's eval-mode self-attention, the document
    modules' one C call: the general path's bits (the same call with distinct
    copies) at every kernel level, and torch's values (the float64 oracle,
    within twice torch's own float16 / bfloat16 error)."""
    m = attnc.nn.MultiheadAttention(32, 4, batch_first=True, dtype=low, rng=np.random.default_rng(15)).eval()
    m.in_proj_bias[...] = np.linspace(-1, 1, 96)
    x = normal(np.random.default_rng(16), (3, 20, 32), low)
    one_call, general = m(x, x, x, average_attn_weights=False), m(x, x.copy(), x.copy(), average_attn_weights=False)
    for got, expected in zip(one_call, general):
        assert got.dtype == expected.dtype and np.array_equal(got.view(np.uint16), expected.view(np.uint16))
    state = {key: torch.from_numpy(np.asarray(value, np.float64)) for key, value in m.state_dict().items()}
    outputs = {}
    for tdt in (torch.float64, torch_low(low)):
        tm = torch.nn.MultiheadAttention(32, 4, batch_first=True, dtype=tdt)
        tm.load_state_dict({key: value.to(tdt) for key, value in state.items()})
        with torch.no_grad():
            outputs[tdt] = tm.eval()(*(torch.from_numpy(np.asarray(x, np.float64)).to(tdt),) * 3)[0]
    assert_as_close_as_torch(one_call[0], outputs[torch.float64].numpy(),
                             outputs[torch_low(low)].double().numpy(), low, "attn_output")


def set_dropout(module, p):
    """The dropout submodule's rate (the same attribute name in attnc and the documents)."""
    for name in ("attention_dropout", "dropout"):
        if getattr(module, name, None) is not None:
            getattr(module, name).p = p


def torch_module_run(tm, x, g, masked):
    """(out, grad_x, {name: grad}) of a document's torch module, by autograd."""
    xt = torch.as_tensor(x).detach().clone().requires_grad_(True)
    out = tm(xt, None) if masked else tm(xt)
    out.backward(torch.as_tensor(g).to(out.dtype))
    return (out.detach().double().numpy(), xt.grad.double().numpy(),
            {name: p.grad.double().numpy() for name, p in tm.named_parameters()})


@pytest.mark.parametrize("name", ["V2", "MHA", "SA-bias", "MHSA-bias"])
def test_module_forward_backward_against_float64(low, name, simd_mode):
    """A document's module in 16 bits against the document's torch module in float64 with
    the same rounded weights, on the same rounded input: output, input gradient and every
    parameter gradient, within PyTorch's tolerances (its own 16-bit module's deviation:
    the projections are rounded to 16 bits between the steps, in both)."""
    model = MODEL[name]
    torch.manual_seed(1)
    tm = model.make_torch(32).eval()
    for p in tm.parameters():
        p.data = p.data.to(torch_low(low)).double()   # weights exactly representable in 16 bits
    tm_low = model.make_torch(32).eval().to(torch_low(low))
    tm_low.load_state_dict(tm.state_dict())
    am = model.make(32, dtype=low, rng=np.random.default_rng(0)).train()
    for module in (am, tm, tm_low):
        set_dropout(module, 0.0)
    am.load_state_dict({key: value.numpy() for key, value in tm.state_dict().items()})
    rng = np.random.default_rng(2)
    x = normal(rng, (2, 10, 32), low)
    out = am(x, None) if model.masked else am(x)
    g = normal(rng, out.shape, low)
    grad_x = am.backward(g)
    expected = torch_module_run(tm, *wide(x, g), model.masked)
    theirs = torch_module_run(tm_low, *(torch.tensor(a).to(torch_low(low)) for a in wide(x, g)), model.masked)
    assert_as_close_as_torch(out, expected[0], theirs[0], low, "out")
    assert_as_close_as_torch(grad_x, expected[1], theirs[1], low, "grad_x")
    for key, grad in am.named_grads():
        assert_as_close_as_torch(grad, expected[2][key], theirs[2][key], low, key)


def test_training_steps_in_16_bits(low):
    """AdamW on a 16-bit module lowers the loss without overflow or NaN (its update is
    computed in float32: Adam's eps is 0 in float16), parameters stay 16-bit."""
    rng = np.random.default_rng(10)
    m = attnc.MultiHeadAttention(32, 4, dtype=low, rng=rng).train()
    m.dropout.p = 0.0
    opt = attnc.optim.AdamW(m, lr=1e-2)
    x = normal(rng, (4, 8, 32), low)
    losses = []
    for _ in range(10):
        y = m(x).astype(np.float32)
        losses.append(float((y ** 2).mean()))
        opt.zero_grad()
        m.backward((2 * y / y.size).astype(low))
        opt.step()
    assert all(np.isfinite(losses)) and losses[-1] < 0.5 * losses[0], losses
    assert all(p.dtype == low for _, p in m.named_parameters())


# ----------------------------------------------------------------------------
# modules and dtypes


def test_module_dtype_spellings():
    for spelling in (np.float16, "float16", "f2"):
        assert attnc.Linear(2, 2, dtype=spelling).dtype == np.float16
    for spelling in (ml_dtypes.bfloat16, BF16, "bfloat16"):
        assert attnc.Linear(2, 2, dtype=spelling).dtype == BF16
    assert attnc.Linear(2, 2).to("bfloat16").weight.dtype == BF16


def test_bfloat16_without_ml_dtypes_says_how_to_get_it():
    """Without ml_dtypes, bfloat16 is not offered: the error names the argument and the package."""
    code = textwrap.dedent("""
        import sys
        sys.modules["ml_dtypes"] = None  # as if not installed
        import numpy as np, attnc
        try:
            attnc.MultiHeadAttention(8, 2, dtype="bfloat16")
        except TypeError as error:
            print(error)
        print(attnc.functional.linear(np.ones((2, 2), np.float16), np.ones((2, 2), np.float16)).dtype)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    message, f16 = result.stdout.strip().splitlines()
    assert message.startswith("dtype: bfloat16 needs the ml_dtypes package") and "pip install ml_dtypes" in message
    assert f16 == "float16"


def test_tolerances_are_pytorchs():
    """The tolerances these tests use are the ones PyTorch's SDPA tests use (and torch's
    float16/bfloat16 math SDPA meets them against the same float64 oracle here)."""
    assert LOW_PRECISION_TOLERANCES == {"float16": (1e-3, 1e-3), "bfloat16": (1e-3, 1.6e-2)}
    rng = np.random.default_rng(11)
    for low, tdt in zip(LOW, (torch.float16, torch.bfloat16)):
        q, k, v = (normal(rng, (2, 3, 50, 16), low) for _ in range(3))
        t_out = torch.nn.functional.scaled_dot_product_attention(
            *(torch.tensor(a.astype(np.float32)).to(tdt) for a in (q, k, v)))
        assert_close(t_out.float().numpy().astype(low), oracle(q, k, v, exact=True)[0], low, "torch")


def test_a_wide_bias_beyond_float16_is_read_as_minus_inf_without_an_overflow_warning():
    """Regression (a 16-bit audit, 2026-12-02): a float32 bias of -1e9 (a finite mask the docs
    list) with float16 inputs, converted to float16, is -inf by design, but NumPy's cast
    warned "overflow encountered in cast" at every call (an error under np.seterr(over=
    "raise") or warnings as errors, naming nothing); so did the broadcast backward's cast
    and nn.MultiheadAttention's sum of two float16 finfo.min masks. Silenced there; the
    results are those of the -inf the value becomes."""
    import warnings
    q = np.random.default_rng(0).standard_normal((2, 1, 3, 4)).astype(np.float16)
    wide = np.zeros((3, 3), np.float32)
    wide[:, 2] = -1e9
    hidden = np.where(wide < 0, -np.inf, 0).astype(np.float16)
    x = np.random.default_rng(1).standard_normal((1, 3, 8)).astype(np.float16)
    m = attnc.nn.MultiheadAttention(8, 2, batch_first=True, dtype=np.float16).eval()
    least = np.finfo(np.float16).min
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        out, lse = F.scaled_dot_product_attention(q, q[0], q[0], attn_bias=wide, return_lse=True)
        grads = F.scaled_dot_product_attention_backward(np.ones_like(out), q, q[0], q[0], out, lse, attn_bias=wide)
        both = m(x, x, x, attn_mask=np.full((3, 3), least, np.float16),
                 key_padding_mask=np.array([[0, 0, least]], np.float16))
    expected_out, expected_lse = F.scaled_dot_product_attention(q, q[0], q[0], attn_bias=hidden, return_lse=True)
    np.testing.assert_array_equal(out, expected_out)
    np.testing.assert_array_equal(lse, expected_lse)
    for grad, expected in zip(grads, F.scaled_dot_product_attention_backward(np.ones_like(out), q, q[0], q[0], out,
                                                                             lse, attn_bias=hidden)):
        np.testing.assert_array_equal(grad, expected)
    combined = np.full((3, 3), least, np.float16)  # the two masks' sum, given as one: its last key -inf
    combined[:, 2] = -np.inf
    expected = m(x, x, x, attn_mask=combined)
    np.testing.assert_array_equal(both[0], expected[0])
    np.testing.assert_array_equal(both[1], expected[1])
    assert not both[1][..., 2].any()


def test_a_training_linear_warns_once_for_an_input_beyond_its_dtype():
    """Regression (a 16-bit audit, 2026-12-06): a training-mode Linear converts x to its
    dtype twice (for the product and for the copy its backward keeps), and a float32 x
    beyond a float16 layer's range warned "overflow encountered in cast" at each, where
    eval mode and the attention modules warn once. The oracle: NumPy's own cast of x
    warns once, and the outputs are eval mode's bits."""
    import warnings
    x = np.array([[1e6, 0.5, -2.0, 3.0]], np.float32)
    m = attnc.Linear(4, 3, dtype=np.float16, rng=np.random.default_rng(0))
    counts = {}
    for name, convert in (("numpy", lambda: x.astype(np.float16)), ("eval", lambda: m.eval()(x)),
                          ("train", lambda: m.train()(x))):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            convert()
            counts[name] = sum("overflow encountered in cast" in str(w.message) for w in caught)
    assert counts == {"numpy": 1, "eval": 1, "train": 1}, counts
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(m.train()(x), m.eval()(x))
