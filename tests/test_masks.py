"""attention_mask semantics: broadcasting, dtypes (nonzero keeps, NaN keeps, not additive),
fully masked rows (uniform weights, output = mean of the V rows, no NaN)."""
import numpy as np
import pytest
import torch

import attnc
from toolkit import (LOW_PRECISION_TOLERANCES, MASKED_MODELS, MASKED_IDS, assert_close, lone_key_masks, make_pair,
                     padded_batch, padding_bias, ref_attend, ref_linear, ref_forward, ref_module, np_sd, ref_values,
                     random_keep_mask, torch_forward)

B, S = 3, 5


def _x(dim, dtype=np.float32, seed=0, shape=None):
    return np.random.default_rng(seed).standard_normal(shape or (B, S, dim)).astype(dtype)


SINGLE_HEAD_MASK_SHAPES = [(S, S), (B, 1, S), (B, S, S), (S,), (1, S), (B, S, 1), (1, 1, 1)]
MULTI_HEAD_MASK_SHAPES = [(B, 1, 1, S), (B, 1, S, S), (S, S), (1, S), (B, 2, S, S), (2, 1, S), (1, 1, 1, 1)]


@pytest.mark.parametrize("case", [c for c in MASKED_MODELS if c.heads is None],
                         ids=[c.name for c in MASKED_MODELS if c.heads is None])
@pytest.mark.parametrize("mask_shape", SINGLE_HEAD_MASK_SHAPES, ids=str)
def test_single_head_mask_broadcast(case, mask_shape, dtype):
    dim = 4
    tm, am = make_pair(case, dim, dtype, seed=1)
    x = _x(dim, dtype, 1)
    mask = random_keep_mask(np.random.default_rng(hash(mask_shape) % 1000), mask_shape)
    out, w = am(x, mask, return_weights=True)
    assert w.shape == (B, S, S)
    assert_close(out, torch_forward(case, tm, x, np.broadcast_to(mask, (B, S, S))), dtype)
    ref, ref_w = ref_forward(case.kind, np_sd(tm), x, mask)
    assert_close(out, ref, dtype)
    assert_close(w, ref_w, dtype)
    np.testing.assert_array_equal(w[np.broadcast_to(mask, (B, S, S)) == 0], 0)


@pytest.mark.parametrize("case", [c for c in MASKED_MODELS if c.heads is not None],
                         ids=[c.name for c in MASKED_MODELS if c.heads is not None])
@pytest.mark.parametrize("mask_shape", MULTI_HEAD_MASK_SHAPES, ids=str)
def test_multi_head_mask_broadcast(case, mask_shape, dtype):
    dim = 4 if case.kind == "MultiHeadAttention" else 5   # MHA: 2 heads; MHSA: 3 heads
    h = case.n_heads(dim)
    if len(mask_shape) == 4 and mask_shape[1] == 2 and h != 2:
        mask_shape = (B, h, S, S)
    if mask_shape == (2, 1, S):
        mask_shape = (h, 1, S)          # a per-head key mask
    tm, am = make_pair(case, dim, dtype, seed=2)
    x = _x(dim, dtype, 2)
    mask = random_keep_mask(np.random.default_rng(len(mask_shape)), mask_shape).astype(bool)
    full = np.broadcast_to(mask, (B, h, S, S))
    out, w = am(x, mask, return_weights=True)
    assert w.shape == (B, h, S, S)
    assert_close(out, torch_forward(case, tm, x, full), dtype)
    ref, ref_w = ref_forward(case.kind, np_sd(tm), x, mask, h)
    assert_close(out, ref, dtype)
    assert_close(w, ref_w, dtype)
    np.testing.assert_array_equal(w[~full], 0)


@pytest.mark.parametrize("case", MASKED_MODELS, ids=MASKED_IDS)
def test_mask_leading_dims(case):
    """x (2, 3, S, dim): the mask broadcasts to the scores' shape over all leading dims."""
    dim = 6
    tm, am = make_pair(case, dim, np.float64, seed=3)
    x = _x(dim, np.float64, 3, shape=(2, 3, S, dim))
    h = case.n_heads(dim)
    mask_shape = (3, 1, S) if h is None else (2, 1, 1, 1, S)   # to (2,3,S,S) / (2,3,h,S,S)
    mask = random_keep_mask(np.random.default_rng(3), mask_shape)
    out = am(x, mask)
    ref, _ = ref_forward(case.kind, np_sd(tm), x, mask, h)
    assert_close(out, ref, np.float64)
    full = np.broadcast_to(mask, (2, 3) + ((h,) if h else ()) + (S, S))
    assert_close(out, torch_forward(case, tm, x, full), np.float64)


MASK_DTYPES = [bool, np.int8, np.uint8, np.int32, np.int64, np.uint64, np.float16, np.float32, np.float64, ">i4",
               ">f8"]


@pytest.mark.parametrize("mask_dtype", MASK_DTYPES, ids=str)
@pytest.mark.parametrize("case", MASKED_MODELS[:3], ids=MASKED_IDS[:3])
def test_mask_dtypes_nonzero_keeps(case, mask_dtype):
    dim = 4
    _, am = make_pair(case, dim, np.float32, seed=4)
    x = _x(dim, np.float32, 4)
    h = case.n_heads(dim)
    shape = (B, 1, S) if h is None else (B, 1, 1, S)
    keep = random_keep_mask(np.random.default_rng(4), shape).astype(bool)
    expected = am(x, keep)
    assert_close(expected, ref_module(am, x, keep)[0], np.float32)  # (an audit: attnc against attnc only)
    mask = keep.astype(mask_dtype)
    np.testing.assert_array_equal(am(x, mask), expected)
    kind = np.dtype(mask_dtype).kind
    if kind == "i":
        np.testing.assert_array_equal(am(x, np.where(keep, -3, 0).astype(mask_dtype)), expected)
    if kind in "iu":
        np.testing.assert_array_equal(am(x, np.where(keep, 7, 0).astype(mask_dtype)), expected)
    if kind == "f":
        # any nonzero value keeps (negative, fractional, large, NaN): not additive
        for value in (-2.5, 0.25, 1000.0, np.nan, np.inf):
            np.testing.assert_array_equal(am(x, np.where(keep, value, 0.0).astype(mask_dtype)), expected)
        # -0.0 is zero: masked
        np.testing.assert_array_equal(am(x, np.where(keep, 1.0, -0.0).astype(mask_dtype)), expected)


def test_float_mask_is_not_additive_vs_torch_sdpa():
    """A float mask of ones changes nothing in attnc (it would add 1 in torch's SDPA, also nothing),
    and a float mask of -inf is 'keep' in attnc but 'masked' (additive) in torch's SDPA."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 4, 3)) for _ in range(3))
    mask = np.zeros((4, 4))
    mask[:, 1] = -np.inf
    mask[:, 0] = 1.0
    mask[:, 2] = 0.5
    out = attnc.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    keep = mask != 0
    expected = attnc.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    np.testing.assert_array_equal(out, expected)
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(3)
    scores[..., ~keep] = -1e20
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    assert_close(out, w @ v, np.float64)
    torch_additive = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(a) for a in (q, k, v)), attn_mask=torch.from_numpy(mask)).numpy()
    assert np.max(np.abs(out - torch_additive)) > 1e-3


# ----------------------------------------------------------------------------
# fully masked rows


@pytest.mark.parametrize("case", MASKED_MODELS, ids=MASKED_IDS)
def test_fully_masked_rows_uniform(case, dtype):
    dim = 4
    tm, am = make_pair(case, dim, dtype, seed=6)
    sd = np_sd(tm)
    x = _x(dim, dtype, 6)
    h = case.n_heads(dim)
    mask = np.ones((B, S, S), dtype=np.int64)
    mask[0] = 0                 # batch 0: everything masked
    mask[1, 2] = 0              # batch 1: query row 2 masked
    if h is not None:
        mask = mask[:, None]
    out, w = am(x, mask, return_weights=True)
    assert not np.isnan(out).any() and not np.isnan(w).any()
    np.testing.assert_allclose(w[0], 1.0 / S, rtol=1e-6)
    np.testing.assert_allclose(w[1][..., 2, :], 1.0 / S, rtol=1e-6)
    # output = mean of the V rows (then the output projection, if any)
    mean_v = ref_values(case.kind, sd, x).mean(axis=-2)   # (B, dim_v)
    if case.kind == "SelfAttentionV3":
        mean_v = ref_linear(mean_v, sd["output_proj.weight"], sd["output_proj.bias"])
    if case.kind == "MultiHeadAttention":
        mean_v = ref_linear(mean_v, sd["output_linear.weight"], sd["output_linear.bias"])
    assert_close(out[0], np.broadcast_to(mean_v[0], out[0].shape), dtype)
    assert_close(out[1, 2], mean_v[1], dtype)
    ref, _ = ref_forward(case.kind, sd, x, mask, h)
    assert_close(out, ref, dtype)


def test_fully_masked_with_large_scores_stays_uniform():
    """Masked scores are replaced (-1e20), not added: even with huge scores the row is uniform."""
    q = np.array([[1e3, -1e3], [5.0, 7.0]], np.float32)
    k = np.array([[1e3, 0], [0, 1e3], [-1e3, 1e3]], np.float32)
    v = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 9.0]], np.float32)
    mask = np.array([[0, 0, 0], [1, 1, 1]], bool)
    out, w = attnc.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, return_weights=True)
    np.testing.assert_allclose(w[0], 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(out[0], [3.0, 5.0], rtol=1e-6)


# ----------------------------------------------------------------------------
# masks that hide whole blocks of keys (padding): the flash path leaves those
# keys out of a query's sums, which must not change a result or a bit

@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_padding_mask_against_float64(causal, dtype, simd_mode):
    q, k, v, keep = padded_batch(np.random.default_rng(20), dtype)
    out, w, lse = attnc.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=causal,
                                                                return_weights=True, return_lse=True)
    ref, ref_w = ref_attend(q, k, v, 1 / 4, keep, causal)
    assert_close(out, ref, dtype)
    assert_close(w, ref_w, dtype)
    # the rows that see a kept key (causal: not every row of item 1 does) weigh each hidden key 0
    sees_a_key = (np.broadcast_to(keep, w.shape) & (np.tril(np.ones(w.shape[-2:], bool)) if causal else True)).any(-1)
    np.testing.assert_array_equal(np.where(sees_a_key[..., None], w, 0)[~np.broadcast_to(keep, w.shape)], 0)
    assert np.isfinite(lse).all()


def test_padding_mask_leaves_the_bits_as_computing_every_key(dtype, simd_mode):
    """The same rows computed with every key tile: a query tile with a row that hides
    every key (every 8th row here) is computed over all key tiles, so its other rows are
    the oracle for the rows of the padding mask, whose tiles leave the hidden keys out."""
    q, k, v, keep = padded_batch(np.random.default_rng(21), dtype)
    L = q.shape[-2]
    dead = np.arange(L) % 8 == 0
    every_key = np.broadcast_to(keep, (3, 1, L, keep.shape[-1])).copy()
    every_key[:, :, dead] = False
    for causal in (False, True):
        skipped = attnc.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=causal)
        computed = attnc.functional.scaled_dot_product_attention(q, k, v, attn_mask=every_key, is_causal=causal)
        assert skipped[..., ~dead, :].tobytes() == computed[..., ~dead, :].tobytes()


def test_padding_mask_with_scores_below_the_fill(dtype, simd_mode):
    """Queries whose every kept score is below -1e20: the hidden keys (-1e20) win, as in
    the documents' masked_fill, so their weights are not 0 and must not be left out."""
    q, k, v, keep = padded_batch(np.random.default_rng(22), dtype)
    q[:, :, :10] = 1e11
    q[:, :, 10:] = 0      # every score 0: exact in the oracle too (scores near 1e11 would not be)
    k[:, :, :] = -1e11    # the first ten queries' every score is -4e22
    out, w = attnc.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep, return_weights=True)
    ref, ref_w = ref_attend(q, k, v, 1 / 4, keep)
    assert_close(w, ref_w, dtype)
    assert_close(out, ref, dtype)
    hidden = ~keep[:, 0, 0]                           # (3, S)
    mean_hidden = np.stack([v[b][:, hidden[b]].astype(np.float64).mean(axis=-2) for b in range(3)])
    assert_close(out[:, :, :10], np.broadcast_to(mean_hidden[:, :, None], out[:, :, :10].shape), dtype)


@pytest.mark.parametrize("bad", [np.inf, np.nan], ids=["inf", "nan"])
def test_padding_mask_non_finite_hidden_value_reaches_the_rows(bad, dtype):
    """A hidden key's weight is 0 and 0 * inf is NaN, as in PyTorch's math path: a key
    tile is left out only when its values are finite."""
    q, k, v, keep = padded_batch(np.random.default_rng(23), dtype)
    v[0, 1, 600, 3] = bad     # item 0 hides keys 250..699
    out = attnc.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    ref, _ = ref_attend(q, k, v, 1 / 4, keep)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    assert np.isnan(out[0, 1, :, 3]).all() and not np.isnan(out[0, 0]).any()
    finite = ~np.isnan(ref)
    assert_close(out[finite], ref[finite], dtype)


def test_random_two_dimensional_mask_against_float64(dtype, simd_mode):
    """A mask that changes from query to query (half hidden, at random): the flash
    path's per-position fill."""
    rng = np.random.default_rng(24)
    q, k, v = (rng.standard_normal((2, 3, n, 16)).astype(dtype) for n in (150, 300, 300))
    keep = rng.random((2, 1, 150, 300)) < 0.5
    out, w = attnc.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep, return_weights=True)
    ref, ref_w = ref_attend(q, k, v, 1 / 4, keep)
    assert_close(out, ref, dtype)
    assert_close(w, ref_w, dtype)


# (L, S): query tiles of 96 over key tiles of 192; and 2 queries (the row path)
LONE_SIZES = ((100, 77), (100, 200), (100, 269), (2, 77), (2, 269))


@pytest.mark.parametrize("lone", ["hidden", "kept"])
@pytest.mark.parametrize("layout", ["(L, S)", "(S,)", "(S, L).T"])
def test_one_key_unlike_the_rest_of_its_tile_against_float64(lone, layout, dtype, simd_mode):
    """A mask that keeps (or hides) every key of a query tile but one: the one is seen
    wherever it sits in its row of mask bytes. A tile's mask is told keeping all, hiding
    all or mixed from its bytes (mask_cover), a vector at a time where its rows are
    contiguous; taking the tile for one it is not would fill or skip the lone key with the
    rest."""
    rng = np.random.default_rng(25)
    for L, S in LONE_SIZES:
        q, k, v = (rng.standard_normal((1, 2, n, 8)).astype(dtype) for n in (L, S, S))
        for query, key, mask, keep in lone_key_masks(layout, lone, L, S):
            out = attnc.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            ref, _ = ref_attend(q, k, v, 1 / np.sqrt(8), keep)
            assert_close(out, ref, dtype, f"L={L} S={S} query {query} key {key}")


# windows (left, right, alignment) over L = 131 queries and S = 419 keys (key tiles of 192)
WEIGHT_WINDOWS = {
    # query i sees keys i + 138 .. i + 308: the second query tile (queries 96..130) leaves key
    # tile 0 out whole, the first one's keys end inside the last key tile
    "window_left": (150, 20, "bottom_right"),
    # query i sees keys i - 20 .. i + 150: both query tiles leave the last key tile out whole
    # and end inside key tile 1; the second one starts inside key tile 0
    "window_right": (20, 150, "top_left"),
}


@pytest.mark.parametrize("kind", ["plain", "masked", "causal", *WEIGHT_WINDOWS])
def test_weights_over_many_key_tiles_against_float64(kind, dtype, simd_mode):
    """Weights of more keys than one key tile holds: each tile's exponentials turned into
    the weights' rows in registers, with the query and key counts past whole vectors,
    then rescaled to the row's final max. The windows leave whole key tiles out of a query
    tile and end others inside a key tile: those keys' weights must be exactly 0."""
    rng = np.random.default_rng(25)
    L, S = 131, 419
    q, k, v = (rng.standard_normal((2, 3, n, 16)).astype(dtype) for n in (L, S, S))
    keep = rng.random((2, 1, L, S)) < 0.7 if kind == "masked" else None
    options = {"is_causal": kind == "causal"}
    if kind in WEIGHT_WINDOWS:
        left, right, alignment = WEIGHT_WINDOWS[kind]
        options.update(window=(left, right), causal_alignment=alignment)
        centre = np.arange(L)[:, None] + (S - L if alignment == "bottom_right" else 0)
        keep = (np.arange(S) >= centre - left) & (np.arange(S) <= centre + right)
    out, w = attnc.functional.scaled_dot_product_attention(q, k, v, attn_mask=None if kind in WEIGHT_WINDOWS else keep,
                                                           return_weights=True, **options)
    ref, ref_w = ref_attend(q, k, v, 1 / 4, keep, causal=kind == "causal")
    assert_close(w, ref_w, dtype)
    assert_close(out, ref, dtype)
    if kind in WEIGHT_WINDOWS:
        np.testing.assert_array_equal(w[..., ~keep], 0)


def test_float16_weights_over_many_key_tiles_against_float64():
    """The same in float16, whose weights are computed in a float buffer and rounded
    once: within PyTorch's float16 SDPA tolerances of the float64 weights."""
    rng = np.random.default_rng(26)
    q, k, v = (rng.standard_normal((2, 3, n, 16)).astype(np.float16) for n in (131, 419, 419))
    _, w = attnc.functional.scaled_dot_product_attention(q, k, v, return_weights=True)
    _, ref_w = ref_attend(q, k, v, 1 / 4)
    atol, rtol = LOW_PRECISION_TOLERANCES["float16"]
    assert w.dtype == np.float16
    np.testing.assert_allclose(w.astype(np.float64), ref_w, atol=atol, rtol=rtol)


# ----------------------------------------------------------------------------
# padding in torch's convention, a -inf attn_bias (nn.MultiheadAttention's
# key_padding_mask becomes one): key tiles whose every score is -inf are left out

@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_padding_bias_matches_torch(causal, dtype, simd_mode):
    q, k, v, keep = padded_batch(np.random.default_rng(25), dtype)
    bias = padding_bias(keep, dtype)
    out, w = attnc.functional.scaled_dot_product_attention(q, k, v, attn_bias=bias, is_causal=causal,
                                                           return_weights=True)
    tq, tk, tv = (torch.from_numpy(a.astype(np.float64)) for a in (q, k, v))
    want = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.from_numpy(
        bias.astype(np.float64)) + (torch.full((150, 700), -np.inf, dtype=torch.float64).triu(1) if causal else 0))
    rows_with_a_key = ~np.isnan(want.numpy())   # torch: NaN for a row with no key (attnc: 0)
    assert_close(out[rows_with_a_key], want.numpy()[rows_with_a_key], dtype)
    np.testing.assert_array_equal(out[~rows_with_a_key], 0)
    np.testing.assert_array_equal(w[np.broadcast_to(~keep, w.shape)], 0)


@pytest.mark.parametrize("values", ["normal", "overflowing", "nan hidden value"])
@pytest.mark.parametrize("hidden_key", [600, 300], ids=["in a hidden key tile", "in a key tile's hidden end"])
def test_padding_bias_leaves_the_bits_as_computing_every_key(values, hidden_key, dtype, simd_mode):
    """The oracle: the same rows computed over every key tile. Every 8th row keeps every
    key (a bias of 0), so no key tile is hidden from all of a tile's rows and none is
    left out or cut short; the other rows' bits must be the same.
    With overflowing hidden scores (inf - inf: NaN, as in PyTorch) or a NaN value (times
    its weight 0: NaN) nothing may be left out: at key 600 (item 0 keeps keys 0..249, so
    the key tile holding 600 is hidden whole) or 300 (in the hidden end of the key tile
    that holds 249)."""
    q, k, v, keep = padded_batch(np.random.default_rng(26), dtype)
    if values == "nan hidden value":
        v[0, 0, hidden_key, 5] = np.nan
    scale = None
    if values == "overflowing":
        # the hidden key's scores overflow to +inf through the scale, the rows' norms finite
        big, scale = (1e17, 1e4) if dtype == np.float32 else (1e150, 1e10)
        q[0] = np.abs(q[0]) * big
        k[0, :, hidden_key] = np.abs(k[0, :, hidden_key]) * big
    L = q.shape[-2]
    bias = np.broadcast_to(padding_bias(keep, dtype), (3, 1, L, keep.shape[-1]))
    every_key = bias.copy()
    dead = np.arange(L) % 8 == 0
    every_key[:, :, dead] = 0
    with np.errstate(all="ignore"):
        skipped = attnc.functional.scaled_dot_product_attention(q, k, v, attn_bias=bias, scale=scale)
        computed = attnc.functional.scaled_dot_product_attention(q, k, v, attn_bias=every_key, scale=scale)
    assert skipped[..., ~dead, :].tobytes() == computed[..., ~dead, :].tobytes()
    if values != "normal":
        assert np.isnan(skipped[0, 0, 1]).any()


@pytest.mark.parametrize("values", ["normal", "overflowing"])
def test_causal_band_with_padding_bias_leaves_the_bits_as_computing_every_key(values, dtype, simd_mode):
    """is_causal with a -inf padding bias: the band's hidden keys are left out too (-inf
    plus the band's -inf is -inf). The oracle: the same rows computed over every key.
    Every 8th row gets a +inf bias at the last key, which the band hides from it (that
    row's scores become NaN, as in PyTorch's math path), so that no query tile may leave
    the band's keys out; the other rows' bits must be the same. With a hidden key's
    scores overflowing, nothing may be left out."""
    q, k, v, keep = padded_batch(np.random.default_rng(28), dtype, L=300, S=300)
    scale = None
    if values == "overflowing":
        big, scale = (1e17, 1e4) if dtype == np.float32 else (1e150, 1e10)
        q[0] = np.abs(q[0]) * big
        k[0, :, 200] = np.abs(k[0, :, 200]) * big     # kept by item 0; hidden from queries 0..199
    bias = np.ascontiguousarray(np.broadcast_to(padding_bias(keep, dtype), (3, 1, 300, 300)))
    every_key = bias.copy()
    dead = np.arange(300) % 8 == 0
    every_key[:, :, dead, -1] = np.inf
    with np.errstate(all="ignore"):
        skipped = attnc.functional.scaled_dot_product_attention(q, k, v, attn_bias=bias, is_causal=True,
                                                                scale=scale)
        computed = attnc.functional.scaled_dot_product_attention(q, k, v, attn_bias=every_key, is_causal=True,
                                                                 scale=scale)
    assert np.isnan(computed[..., dead[:-1].nonzero()[0], :]).all()
    assert skipped[..., ~dead, :].tobytes() == computed[..., ~dead, :].tobytes()
    if values == "overflowing":
        assert np.isnan(skipped[0, :, :200]).all()


@pytest.mark.parametrize("layout", ["(L, S)", "(B, 1, L, S)", "(B, H, L, S)"])
def test_causal_mask_as_a_bias_matches_torch_and_is_causal(layout, dtype, simd_mode):
    """A causal mask given as a -inf bias per query (torch's float attn_mask, as models
    pass it with their padding): each query tile computes only the key tiles and the keys
    of the diagonal tile it sees. Oracles: torch's math over every key, and attnc's own
    band (is_causal), whose bits a bias of 0 and -inf must give; with padding, the rows'
    torch values."""
    rng = np.random.default_rng(41)
    L, S = 300, 450
    q, k, v = (rng.standard_normal((2, 3, n, 16)).astype(dtype) for n in (L, S, S))
    causal = np.where(np.tril(np.ones((L, S), bool), S - L), 0.0, -np.inf)
    shape = {"(L, S)": (L, S), "(B, 1, L, S)": (2, 1, L, S), "(B, H, L, S)": (2, 3, L, S)}[layout]
    bias = np.ascontiguousarray(np.broadcast_to(causal, shape)).astype(dtype)
    out = attnc.functional.scaled_dot_product_attention(q, k, v, attn_bias=bias)
    band = attnc.functional.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom_right")
    assert out.tobytes() == band.tobytes()
    if len(shape) == 4:
        bias[0, ..., :100] = -np.inf     # item 0 padded on the left as well
        bias[1, ..., 400:] = -np.inf     # item 1 on the right
    out = attnc.functional.scaled_dot_product_attention(q, k, v, attn_bias=bias)
    tq, tk, tv, tb = (torch.from_numpy(a.astype(np.float64)) for a in (q, k, v, bias))
    want = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tb).numpy()
    rows_with_a_key = ~np.isnan(want)   # torch: NaN for a row with no key (attnc: 0)
    assert_close(out[rows_with_a_key], want[rows_with_a_key], dtype)
    np.testing.assert_array_equal(out[~rows_with_a_key], 0)


# finite masks as biases: torch.finfo(dtype).min (Hugging Face's), -1e4 (BERT's), which
# weigh exactly 0 once a row's max is far enough above them (attention_impl.h's bias_floor)

FINITE_FILLS = {"finfo.min": None, "-1e4": -1e4, "-1e3": -1e3, "-30": -30.0}


def _finite_mask_case(variant, dtype):
    """q, k, v (3, 2, 300, 16) with keys (500) hidden by padding and a causal band
    (bottom-right): keep (3, 1, 300, 500). Variants whose hidden keys must still be
    computed: every query 0 (all scores 0, so a fill of -30 weighs e^-30, not 0); hidden
    keys whose q . k outweighs a fill of -1e3; kept scores far below zero (about -1e3 to
    -1e4, so that a fill of -1e4 is not far below them); a tile's rows' maxima far apart
    (odd rows' kept keys biased by 1e4: the fill must be far below the lowest max). Also
    returns the bias of the kept keys."""
    rng = np.random.default_rng(51)
    q, k, v, keep = padded_batch(rng, dtype, L=300, S=500)
    keep = keep & np.tril(np.ones((300, 500), bool), 200)
    if variant == "queries 0":
        q[:] = 0
    elif variant == "hidden keys score high":   # item 0's q . k / 4 about 1e3 at its hidden keys 250..499
        q[0] = np.abs(q[0])
        k[0, :, 250:] = np.abs(k[0, :, 250:]) * 600
    elif variant == "kept scores far below 0":
        q[:] = -np.abs(q) * 30
        k[:] = np.abs(k) * 30
    kept = np.where(np.arange(300)[:, None] % 2, 1e4, 0.0) if variant == "rows' maxima far apart" else 0.0
    return q, k, v, keep, kept


@pytest.mark.parametrize("variant", ["normal", "queries 0", "hidden keys score high", "kept scores far below 0",
                                     "rows' maxima far apart"])
@pytest.mark.parametrize("fill", list(FINITE_FILLS))
def test_finite_mask_bias_leaves_the_bits_as_computing_every_key(fill, variant, dtype, simd_mode):
    """The oracle: the same rows computed over every key (_assert_bits_as_every_key); their
    bits must be the same whichever keys their tiles leave out."""
    q, k, v, keep, kept = _finite_mask_case(variant, dtype)
    low = np.finfo(dtype).min if FINITE_FILLS[fill] is None else FINITE_FILLS[fill]
    _assert_bits_as_every_key(q, k, v, np.where(keep, kept, low).astype(dtype))


def _assert_bits_as_every_key(q, k, v, bias, **kwargs):
    """The rows of SDPA with `bias` have the bits of the same rows computed over every key:
    every 8th query's bias 1e30 at every key, far above any floor its tile's maxima could
    make, so that no tile leaves a key out; the other rows are compared."""
    every_key = np.array(np.broadcast_to(bias, bias.shape[:-2] + q.shape[-2:-1] + bias.shape[-1:]))
    dead = np.arange(q.shape[-2]) % 8 == 0
    every_key[..., dead, :] = 1e30
    skipped = attnc.functional.scaled_dot_product_attention(q, k, v, attn_bias=bias, **kwargs)
    computed = attnc.functional.scaled_dot_product_attention(q, k, v, attn_bias=every_key, **kwargs)
    assert skipped[..., ~dead, :].tobytes() == computed[..., ~dead, :].tobytes()


@pytest.mark.parametrize("dtype, variant", [(np.float64, "normal"), (np.float64, "hidden keys score high"),
                                            (np.float64, "kept scores far below 0"),
                                            (np.float64, "rows' maxima far apart"), (np.float32, "normal")])
@pytest.mark.parametrize("fill", list(FINITE_FILLS))
def test_finite_mask_bias_matches_torch(fill, variant, dtype):
    """torch's float64 math over every key, on the rows that keep a key. In float32, the
    variants' scores of +-1e3 and more keep only a few digits, whose rounding alone moves
    the weights by 1e-4 and more; and a row that keeps no key has scores fill + q . k,
    which round to the fill itself (equal weights) in float32 and not in float64."""
    q, k, v, keep, kept = _finite_mask_case(variant, dtype)
    low = np.finfo(dtype).min if FINITE_FILLS[fill] is None else FINITE_FILLS[fill]
    bias = np.where(keep, kept, low).astype(dtype)
    out = attnc.functional.scaled_dot_product_attention(q, k, v, attn_bias=bias)
    tq, tk, tv, tb = (torch.from_numpy(a.astype(np.float64)) for a in (q, k, v, bias))
    want = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tb).numpy()
    sees_a_key = np.broadcast_to(keep.any(-1), out.shape[:-1])
    assert sees_a_key.mean() > 0.7
    assert_close(out[sees_a_key], want[sees_a_key], dtype)


def _left_padded_case(variant, dtype):
    """q (3, 2, 300, 16), k, v (3, 2, 700, 16), and the keys a finite mask hides: item b's
    first 0, 250, 450 (left padding: whole key tiles and part of one, before every kept key
    of a row). Variants: "ramp" biases the kept keys -0.05 x their distance from key i + 400,
    so that a row's max climbs key tile by key tile in steps far under 88 (the padding's
    sums, were they computed first, would be scaled down step by step); "padded values huge"
    gives the padding's values 1e30 (1e4 in float16) in column 0, which is 0 at the kept
    keys; "padding outscores the kept keys": kept q . k about -5000, padding (bias -3000,
    keys near 0) weighs everything. Returns q, k, v, padded (3, 1, 1, 700) and the kept
    keys' bias (broadcast to (1, 1, 300, 700))."""
    rng = np.random.default_rng(53)
    q, k, v = (rng.standard_normal((3, 2, n, 16)).astype(dtype) for n in (300, 700, 700))
    padded = np.zeros((3, 1, 1, 700), bool)
    for b, first_kept in enumerate((0, 250, 450)):
        padded[b, ..., :first_kept] = True
    kept_bias = np.zeros((1, 1, 1, 700))
    if variant == "ramp":
        kept_bias = -0.05 * np.abs(np.arange(700) - np.arange(300)[:, None] - 400)[None, None]
    elif variant == "padded values huge":
        v[..., 0] = np.where(padded[:, :, 0], 1e4 if dtype == np.float16 else 1e30, 0)
    elif variant == "padding outscores the kept keys":
        q[:] = -np.abs(q) * 45
        k[:] = np.where(padded[..., 0, :, None], k * 0.01, np.abs(k) * 45)
    return q, k, v, padded, kept_bias


LEFT_PADDED_CASES = [("normal", "finfo.min"), ("normal", -1e9), ("normal", -1e4), ("normal", -30.0),
                     ("ramp", "finfo.min"), ("ramp", -1e4), ("padded values huge", "finfo.min"),
                     ("padding outscores the kept keys", -3000.0)]


def _left_padded_bias(variant, fill, dtype, causal):
    """The case's bias: fill at the padding (finfo.min: the dtype's), the kept keys' bias
    elsewhere; (3, 1, 1, 700) when that is 0, else (3, 1, 300, 700). With causal, also
    torch's float64 mask: the bias plus -inf above the (top-left) diagonal."""
    q, k, v, padded, kept_bias = _left_padded_case(variant, dtype)
    low = np.finfo(dtype).min if fill == "finfo.min" else fill
    bias = np.where(padded, low, kept_bias).astype(dtype)
    torch_mask = bias.astype(np.float64) + np.where(np.tril(np.ones((300, 700), bool)), 0, -np.inf) if causal else bias
    return q, k, v, bias, torch_mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("variant, fill", LEFT_PADDED_CASES)
def test_finite_mask_left_padding_leaves_the_bits_as_computing_every_key(variant, fill, causal, dtype, simd_mode):
    """Keys before a row's first kept one (left padding), which a finite mask hides: the
    oracle is the same rows over every key (_assert_bits_as_every_key)."""
    q, k, v, bias, _ = _left_padded_bias(variant, fill, dtype, causal)
    _assert_bits_as_every_key(q, k, v, bias, is_causal=causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("variant, fill", LEFT_PADDED_CASES)
def test_finite_mask_left_padding_matches_torch(variant, fill, causal):
    """torch's float64 math over every key (float64: the variants' large scores keep few
    digits in float32), every row: a row whose keys are all padding (causal: item 2's)
    weighs them by their q . k."""
    q, k, v, bias, torch_mask = _left_padded_bias(variant, fill, np.float64, causal)
    out = attnc.functional.scaled_dot_product_attention(q, k, v, attn_bias=bias, is_causal=causal)
    want = torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v, torch_mask)))
    assert_close(out, want, np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_finite_mask_left_padding_with_values_near_the_largest_matches_torch(dtype):
    """The padding's values an eighth of the dtype's largest: their weights are exactly 0,
    as in torch; computed under the padding's own max (weights about 1), a key tile's P.V
    sum overflowed to inf, and the later rescale by exactly 0 made NaN rows (before the
    padding was left out from the bias's least max)."""
    q, k, v, padded, _ = _left_padded_case("normal", dtype)
    v[:] = np.where(padded[..., 0, :, None], np.finfo(dtype).max / 8, v)
    bias = np.where(padded, np.finfo(dtype).min, 0).astype(dtype)
    out = attnc.functional.scaled_dot_product_attention(q, k, v, attn_bias=bias)
    want = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(a.astype(np.float64)) for a in (q, k, v, bias)))
    assert_close(out, want, dtype)


def test_finite_mask_bias_under_a_bool_mask_hiding_its_largest_values_matches_torch():
    """A bias of -1e5 on keys 0..249 and 0 after, and a bool mask hiding keys 250.. from
    every query: the keys of the largest bias are hidden, so keys 0..249 weigh everything
    (a least max made from the bias alone, 0, would leave them out). float64: in float32,
    scores near -1e5 keep only two decimals."""
    dtype = np.float64
    rng = np.random.default_rng(57)
    q, k, v = (rng.standard_normal((2, 2, n, 16)).astype(dtype) for n in (300, 700, 700))
    bias = np.where(np.arange(700) < 250, -1e5, 0.0).astype(dtype)
    keep = np.arange(700) < 250
    out = attnc.functional.scaled_dot_product_attention(q, k, v, attn_bias=bias, attn_mask=keep)
    tq, tk, tv = (torch.from_numpy(a.astype(np.float64)) for a in (q, k, v))
    want = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.from_numpy(
        np.where(keep, bias.astype(np.float64), -np.inf)[None]))
    assert_close(out, want, dtype)


def test_nn_multihead_key_padding_mask_matches_torch(dtype):
    """nn.MultiheadAttention's key_padding_mask over hundreds of keys (whole key tiles)."""
    rng = np.random.default_rng(27)
    torch.manual_seed(27)
    tm = torch.nn.MultiheadAttention(32, 4, batch_first=True).to(torch.float64).eval()
    am = attnc.nn.MultiheadAttention(32, 4, batch_first=True, dtype=dtype).eval()
    am.load_state_dict({name: t.numpy() for name, t in tm.state_dict().items()})
    x = rng.standard_normal((3, 600, 32)).astype(dtype)
    padding = np.zeros((3, 600), bool)
    padding[0, 200:] = True
    padding[1, :350] = True
    padding[2, 50:550] = True
    out, _ = am(x, x, x, key_padding_mask=padding, need_weights=False)
    tx = torch.from_numpy(x.astype(np.float64))
    want, _ = tm(tx, tx, tx, key_padding_mask=torch.from_numpy(padding), need_weights=False)
    assert_close(out, want.detach().numpy(), dtype)


# ----------------------------------------------------------------------------
# the document's V3 example mask in training mode: dropout on the weights


def test_v3_doc_mask_train_mode_rows_are_dropped_or_kept():
    """Document 000 prints V3 in training mode: in batch 2 (only key 0 kept) each row is either
    output_proj(V[0] / (1 - p)) (weight kept) or output_proj(0) = bias (weight dropped)."""
    p = 0.5
    am = attnc.SelfAttentionV3(2, dropout_rate=p, dtype=np.float64, rng=np.random.default_rng(7))
    assert am.training
    sd = am.state_dict()
    x = np.random.default_rng(7).standard_normal((3, 4, 2))
    mask = np.repeat(np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]])[:, None, :], 4, axis=1)
    v0 = ref_linear(x[2, 0], sd["proj.weight"], sd["proj.bias"])[4:]
    kept = ref_linear(v0 / (1 - p), sd["output_proj.weight"], sd["output_proj.bias"])
    dropped = sd["output_proj.bias"]
    seen = set()
    for _ in range(10):
        out = am(x, mask)
        for row in out[2]:
            is_kept = np.allclose(row, kept, rtol=1e-12, atol=1e-12)
            is_dropped = np.allclose(row, dropped, rtol=1e-12, atol=1e-12)
            assert is_kept != is_dropped, row
            seen.add(is_kept)
    assert seen == {True, False}


def _empty_float64(shape, strides):
    """An empty array with the given strides over an 8-byte buffer: legal,
    since NumPy never reads an empty array."""
    return np.ndarray(shape, dtype=np.float64, buffer=bytearray(8), strides=strides)


@pytest.mark.parametrize("where", ["no queries", "no keys"])
@pytest.mark.parametrize("kind", ["attn_mask", "attn_bias"])
def test_an_empty_mask_with_a_zero_stride_empty_axis_is_not_read(where, kind):
    """The mask conversion collapsed every zero-stride axis to length 1, the
    empty one too, and read a (4096, 1) view of an 8-byte buffer: a segfault
    (a robustness review, 2026-11-24). Over no queries the result is empty;
    over no keys, the weighted sum of nothing: zeros."""
    L = S = 4096
    if where == "no queries":
        q, k, v = np.zeros((0, L, 1), np.float32), np.ones((S, 1), np.float32), np.ones((S, 1), np.float32)
        mask, expected = _empty_float64((0, L, S), (0, 8 * S, 8)), np.zeros((0, L, 1), np.float32)
    else:
        q, k, v = np.ones((L, 4), np.float32), np.ones((0, 4), np.float32), np.ones((0, 3), np.float32)
        mask, expected = _empty_float64((L, 0), (2**20, 0)), np.zeros((L, 3), np.float32)
    out = attnc.functional.scaled_dot_product_attention(q, k, v, **{kind: mask})
    np.testing.assert_array_equal(out, expected)


def test_a_modules_empty_mask_with_a_zero_stride_empty_axis_is_not_read():
    """The same through a module's attention_mask (an empty batch)."""
    L = 4096
    out = attnc.MultiHeadAttention(8, 2).eval()(np.zeros((0, L, 8), np.float32),
                                                 _empty_float64((0, 1, L, L), (0, 0, 8 * L, 8)))
    assert out.shape == (0, L, 8) and out.dtype == np.float32
