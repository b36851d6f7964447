"""The attention kernel's row path, taken by items of at most 16 queries
(decode, chunked prefill): K and V read in place, the keys cut into splits of
1024 merged by their log-sum-exp. Against a float64 NumPy oracle written from
the definition, across split edges, with grouped-query attention, causal
alignment, windows that hide whole splits, bias, dropout, and the weights;
bits the same for 1, 2 and 3 threads, for a head alone or inside its group,
with or without the weights."""
import numpy as np
import pytest

import attnc
from attnc import functional as F
from toolkit import assert_close

SPLIT = 1024  # keys per split of the row path (attention_rows.h: SPLIT_KEYS)


def visible(L, S, window=None):
    """(L, S) bool: bottom-right causal, within the window around the diagonal."""
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    diagonal = i + S - L
    seen = j <= diagonal
    if window is not None:
        seen &= j >= diagonal - window
    return seen


def oracle(q, k, v, window=None, bias=None, keep=None):
    """float64 (out, weights, lse) of bottom-right causal GQA attention: query head h uses
    key/value head h // (H // Hkv); keep: dropout factors applied to the weights before V.
    A row with no visible key gives out 0, weights 0 and lse -inf. The query heads of a
    key/value head are one axis of their own, against that head broadcast (not repeated), and
    the scores are turned into the weights in place: at 32768 keys (float32 inputs) repeating K
    and V took 0.96 s of this oracle's 1.77 s, exp(s - m) with its temporary 0.5 s (2026-12-07)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    *lead, heads, L, E = q.shape
    kv_heads, S = k.shape[-3], k.shape[-2]
    group = heads // kv_heads
    by_kv_head = (*lead, kv_heads, group, L)   # query head h: (h // group, h % group)
    s = (q.reshape(*by_kv_head, E) @ np.swapaxes(k, -1, -2)[..., None, :, :]).reshape(*lead, heads, L, S)
    s /= np.sqrt(E)
    if bias is not None:
        s = s + bias
    s += np.where(visible(L, S, window), 0, -np.inf)   # a NaN score stays NaN, as in torch's math path
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    s -= m
    e = np.exp(s, out=s)
    total = e.sum(-1, keepdims=True)
    weights = np.divide(e, total, out=np.zeros_like(e), where=total != 0)
    dropped = weights if keep is None else weights * keep
    with np.errstate(divide="ignore"):
        lse = (m + np.log(total))[..., 0]
    out = dropped.reshape(*by_kv_head, S) @ v[..., None, :, :]
    return out.reshape(*lead, heads, L, v.shape[-1]), weights, lse


def normal(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def decode_inputs(rng, L, S, dtype, heads=8, kv_heads=2, E=36, Ev=40):
    """E and Ev that no vector width divides, so the column tails run too."""
    return (normal(rng, (2, heads, L, E), dtype), normal(rng, (2, kv_heads, S, E), dtype),
            normal(rng, (2, kv_heads, S, Ev), dtype))


def attend(q, k, v, **kw):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom_right",
                                          enable_gqa=q.shape[-3] != k.shape[-3], **kw)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("S", [1, SPLIT - 1, SPLIT + 1, 3 * SPLIT, 32768])
@pytest.mark.parametrize("L", [1, 4, 16])
def test_against_float64(L, S, dtype, simd_mode):
    rng = np.random.default_rng(L * 7 + S)
    q, k, v = decode_inputs(rng, L, S, dtype)
    out, weights, lse = attend(q, k, v, return_weights=True, return_lse=True)
    r_out, r_weights, r_lse = oracle(q, k, v)
    assert_close(out, r_out, dtype, "out")
    assert_close(weights, r_weights, dtype, "weights")
    assert_close(lse, r_lse, dtype, "lse")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("Ev", [16, 120, 200, 240, 511])
def test_one_query_row_every_value_width(Ev, dtype, simd_mode):
    """One query row per key/value head: the value loop's blocks of halving widths (a row of
    Ev = 240 floats at AVX-512 runs blocks of 8, 4, 2 and 1 vectors), then the column tail."""
    rng = np.random.default_rng(Ev)
    q, k = normal(rng, (2, 3, 1, 64), dtype), normal(rng, (2, 3, 700, 64), dtype)
    v = normal(rng, (2, 3, 700, Ev), dtype)
    out, weights = attend(q, k, v, return_weights=True)
    r_out, r_weights, _ = oracle(q, k, v)
    assert_close(out, r_out, dtype, "out")
    assert_close(weights, r_weights, dtype, "weights")


@pytest.mark.parametrize("window", [0, 100, 2 * SPLIT + 5])
@pytest.mark.parametrize("L", [1, 16])
def test_windows_and_bias_across_splits(L, window, simd_mode):
    """Windows that leave whole splits outside every query's band (skipped), and a bias with
    -inf holes, in float64 against the oracle."""
    rng = np.random.default_rng(window + L)
    S = 5 * SPLIT + 3
    q, k, v = decode_inputs(rng, L, S, np.float64)
    bias = normal(rng, (8, L, S), np.float64)
    bias[rng.random(bias.shape) < 0.05] = -np.inf
    out, weights, lse = attend(q, k, v, window=(window, 0), attn_bias=bias, return_weights=True, return_lse=True)
    r_out, r_weights, r_lse = oracle(q, k, v, window=window, bias=bias)
    assert_close(out, r_out, np.float64, "out")
    assert_close(weights, r_weights, np.float64, "weights")
    assert_close(lse, r_lse, np.float64, "lse")


def test_rows_without_keys():
    """S < L bottom-right: the first L - S queries see no key: out 0, weights 0, lse -inf."""
    rng = np.random.default_rng(3)
    q, k, v = decode_inputs(rng, 16, 5, np.float64)
    out, weights, lse = attend(q, k, v, return_weights=True, return_lse=True)
    r_out, r_weights, r_lse = oracle(q, k, v)
    np.testing.assert_array_equal(out[..., :11, :], 0)
    np.testing.assert_array_equal(lse[..., :11], -np.inf)
    assert_close(out, r_out, np.float64, "out")
    assert_close(weights, r_weights, np.float64, "weights")
    assert_close(lse, r_lse, np.float64, "lse")


def test_nan_in_a_hidden_split_reaches_out():
    """A NaN value in a split the window hides still reaches out (weight 0 times NaN), as in
    PyTorch's math path; without it the same split is skipped and out is finite."""
    rng = np.random.default_rng(4)
    S = 4 * SPLIT
    q, k, v = decode_inputs(rng, 1, S, np.float32)
    assert np.isfinite(attend(q, k, v, window=(10, 0))).all()
    v[:, :, 5] = np.nan
    assert np.isnan(attend(q, k, v, window=(10, 0))).all()


@pytest.mark.parametrize("L", [1, 4, 16])
def test_same_bits_threads_alone_weights(L, restore_threads, simd_mode):
    """Bits: for 1, 2 and 3 threads; a query head alone (its key/value head alone) or inside
    its group and batch; with the weights asked for or not."""
    rng = np.random.default_rng(L)
    q, k, v = decode_inputs(rng, L, 3 * SPLIT + 17, np.float32)
    runs = []
    for n in (1, 2, 3):
        attnc.set_num_threads(n)
        runs.append(attend(q, k, v, return_lse=True))
    for out, lse in runs[1:]:
        np.testing.assert_array_equal(out, runs[0][0])
        np.testing.assert_array_equal(lse, runs[0][1])
    out = runs[0][0]
    for b, h in [(0, 0), (1, 5), (1, 7)]:
        kv = h // 4
        alone = attend(q[b:b + 1, h:h + 1], k[b:b + 1, kv:kv + 1], v[b:b + 1, kv:kv + 1])
        np.testing.assert_array_equal(alone[0, 0], out[b, h])
    with_weights, _ = attend(q, k, v, return_weights=True)
    np.testing.assert_array_equal(with_weights, out)


def attnc_keep_factors(q_shape, k_shape, p, seed):
    """attnc's dropout factors for these shapes: zero q and k make each of query i's n_i
    visible keys weigh 1/n_i, and value = I makes out * n_i each visible key's factor (the
    same seed and item layout)."""
    L, S = q_shape[-2], k_shape[-2]
    eye = np.broadcast_to(np.eye(S), k_shape[:-1] + (S,))
    out = attend(np.zeros(q_shape), np.zeros(k_shape), eye, dropout_p=p, seed=seed)
    factors = out * visible(L, S).sum(-1)[:, None]
    keep = out > 0
    assert_close(factors[keep], np.full(keep.sum(), 1 / (1 - p)), np.float64, "kept factors")
    return np.where(keep, 1 / (1 - p), 0.0)


def test_dropout_across_splits():
    """Dropout (seeded) on a cache of three splits, against the oracle with attnc's own factors;
    the factors keep about 1 - p of the weights."""
    rng = np.random.default_rng(6)
    p, seed, S = 0.25, 1234, 2 * SPLIT + 50
    q, k, v = decode_inputs(rng, 4, S, np.float64, heads=4, kv_heads=1)
    keep = attnc_keep_factors(q.shape, k.shape, p, seed)
    kept = (keep > 0)[..., visible(4, S)]
    assert abs(kept.mean() - (1 - p)) < 0.01
    out = attend(q, k, v, dropout_p=p, seed=seed)
    assert_close(out, oracle(q, k, v, keep=keep)[0], np.float64, "out")


def test_hidden_nan_query_or_bias_does_not_depend_on_the_group():
    """A NaN query or bias meets the keys a window hides (NaN - inf = NaN): a split hidden from
    every row of a group is skipped only when that changes nothing, so a head's result is the
    same alone or sharing its K/V with other heads, and equals the float64 oracle."""
    rng = np.random.default_rng(9)
    L, S = 5, SPLIT + 4
    q, k, v = normal(rng, (1, 4, L, 8), np.float64), normal(rng, (1, 1, S, 8), np.float64), \
        normal(rng, (1, 1, S, 8), np.float64)
    bias = np.zeros((4, L, S))
    bias[3, 1, 0] = np.nan             # head 3, query 1, a key its window hides
    q[0, 2, 4] = np.nan                # head 2, query 4
    out = attend(q, k, v, window=(0, 0), attn_bias=bias)
    r_out = oracle(q, k, v, window=0, bias=bias)[0]
    assert_close(out, r_out, np.float64, "out")
    assert np.isnan(out[0, 3, 1]).all() and np.isnan(out[0, 2, 4]).all()
    for h in range(4):
        alone = attend(q[:, h:h + 1], k, v, window=(0, 0), attn_bias=bias[h:h + 1])
        np.testing.assert_array_equal(alone[0, 0], out[0, h])


# ----------------------------------------------------------------------------
# a left-padded batch of decoding steps: the chunks of keys a mask hides from
# every row of a group are not read (their scores are the fill whatever the keys)

def _masked_oracle(q, k, v, keep):
    """float64 out of the documents' masked_fill(-1e20) attention (no band)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    with np.errstate(invalid="ignore"):
        s = np.where(keep, q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]), -1e20)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("L", [1, 3])
def test_left_padding_against_float64(L, dtype, simd_mode):
    """Keys hidden by the mask are never needed: a NaN or inf key among them changes
    nothing (its score is the fill), across splits and chunks."""
    rng = np.random.default_rng(30)
    S = 2500
    q, k, v = (normal(rng, (4, 2, n, 24), dtype) for n in (L, S, S))
    keep = np.ones((4, 1, 1, S), bool)
    for b, pad in enumerate((0, 31, 700, 1500)):
        keep[b, ..., :pad] = False
    k[2, :, 100] = np.nan
    k[3, :, 1200] = np.inf
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    assert_close(out, _masked_oracle(q, k, v, keep), dtype)


def test_left_padding_bits_as_reading_every_key(dtype, simd_mode):
    """The oracle: the same row with a second query row in its group that keeps every key,
    so that no chunk is hidden from the whole group and every key is read."""
    rng = np.random.default_rng(31)
    S = 2000
    q, k, v = (normal(rng, (2, 3, n, 24), dtype) for n in (2, S, S))
    keep = np.ones((2, 1, 2, S), bool)
    keep[:, :, 0, :900] = False
    skipped = F.scaled_dot_product_attention(q[:, :, :1], k, v, attn_mask=keep[:, :, :1])
    read = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    assert skipped.tobytes() == np.ascontiguousarray(read[:, :, :1]).tobytes()
    alone = F.scaled_dot_product_attention(q[:, :, 1:], k, v, attn_mask=keep[:, :, 1:])   # reads every key
    assert alone.tobytes() == np.ascontiguousarray(read[:, :, 1:]).tobytes()
