"""attnc.Dropout and the attention dropout of V3 / V4 / MultiHeadAttention / SDPA."""
import math

import numpy as np
import pytest

import attnc
from toolkit import DROPOUT_MODELS, DROPOUT_IDS, assert_close, make_pair, ref_forward, np_sd


def _x(shape, seed=0, dtype=np.float32):
    # strictly nonzero inputs, so that an output zero means "dropped"
    rng = np.random.default_rng(seed)
    return (rng.uniform(1.0, 2.0, shape) * rng.choice([-1, 1], shape)).astype(dtype)


# ----------------------------------------------------------------------------
# attnc.Dropout


def test_dropout_training_by_default_and_eval_identity():
    d = attnc.Dropout(0.5)
    assert d.training
    x = _x((4, 5))
    assert d.eval() is d and not d.training
    y = d(x)
    assert y is not x and not np.shares_memory(y, x)
    np.testing.assert_array_equal(y, x)
    assert d.train() is d and d.training


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.75, 0.9])
def test_dropout_zero_fraction_and_scale(p):
    n = 400_000
    x = _x((n,), seed=1)
    y = attnc.Dropout(p, rng=np.random.default_rng(1))(x)
    assert y.shape == x.shape and y.dtype == np.float32
    dropped = y == 0
    sigma = math.sqrt(n * p * (1 - p))
    assert abs(dropped.sum() - n * p) <= 5 * sigma, (dropped.mean(), p)
    kept = ~dropped
    if p in (0.5, 0.75):
        # 1/(1-p) is a power of two: the scaling is exact whichever way it is computed
        np.testing.assert_array_equal(y[kept], x[kept] * np.float32(1 / (1 - p)))
    else:
        np.testing.assert_allclose(y[kept], x[kept].astype(np.float64) / (1 - p), rtol=2.5e-7)


def test_dropout_float64_scale():
    x = _x((10_000,), seed=2, dtype=np.float64)
    p = 0.3
    d = attnc.Dropout(p, dtype=np.float64, rng=np.random.default_rng(2))
    assert d.dtype == np.float64
    y = d(x)
    assert y.dtype == np.float64
    kept = y != 0
    np.testing.assert_allclose(y[kept], x[kept] / (1 - p), rtol=4e-16)
    # a float32 Dropout (the default) converts its input, like every module
    assert attnc.Dropout(p).dtype == np.float32
    assert attnc.Dropout(p)(x).dtype == np.float32
    np.testing.assert_array_equal(attnc.Dropout(p).eval()(x), x.astype(np.float32))


def test_dropout_mask_is_not_structured():
    """Zeros are independent of position: each row and column of a big array drops ~p."""
    p, n = 0.5, 512
    y = attnc.Dropout(p, rng=np.random.default_rng(3))(np.ones((n, n), np.float32))
    rows, cols = (y == 0).mean(1), (y == 0).mean(0)
    bound = 5 * math.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(rows - p) < bound) and np.all(np.abs(cols - p) < bound)
    # no two rows share a mask
    assert len({r.tobytes() for r in (y == 0)}) == n


def test_dropout_p0_equals_eval_and_p1_zeros():
    x = _x((3, 7), seed=4)
    y0 = attnc.Dropout(0.0)(x)
    np.testing.assert_array_equal(y0, x)
    assert not np.shares_memory(y0, x)
    y1 = attnc.Dropout(1.0)(x)
    assert not np.isnan(y1).any()
    np.testing.assert_array_equal(y1, np.zeros_like(x))
    x_inf = x.copy()
    x_inf[0, 0] = np.inf
    assert not np.isnan(attnc.Dropout(1.0)(x_inf)[1:]).any()


def test_dropout_reproducible_with_seeded_rng():
    x = _x((50, 40), seed=5)
    a = attnc.Dropout(0.5, rng=np.random.default_rng(0))
    b = attnc.Dropout(0.5, rng=np.random.default_rng(0))
    ya1, yb1 = a(x), b(x)
    np.testing.assert_array_equal(ya1, yb1)
    ya2, yb2 = a(x), b(x)
    np.testing.assert_array_equal(ya2, yb2)
    assert not np.array_equal(ya1, ya2)      # every call draws a new mask


def test_dropout_manual_seed_global_rng():
    x = _x((50, 40), seed=6)
    d = attnc.Dropout(0.5)
    attnc.manual_seed(123)
    a1, a2 = d(x), d(x)
    attnc.manual_seed(123)
    b1, b2 = d(x), d(x)
    np.testing.assert_array_equal(a1, b1)
    np.testing.assert_array_equal(a2, b2)
    assert not np.array_equal(a1, a2)
    attnc.manual_seed(124)
    assert not np.array_equal(d(x), a1)


def test_dropout_same_bits_for_any_thread_count(restore_threads):
    x = _x((300, 1000), seed=7)
    outs = []
    for n in (1, 2, 3):
        attnc.set_num_threads(n)
        outs.append(attnc.Dropout(0.3, rng=np.random.default_rng(8))(x))
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def _documented_keeps(seed, index, p):
    """The documented draw, in NumPy's wrapping uint64 arithmetic: splitmix64's
    output at position `index` of stream `seed`, as the uniform (bits >> 11) *
    2**-53; kept where it is >= p."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + (np.asarray(index, np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53 >= p


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.93])
def test_dropout_mask_is_the_documented_draw(dtype, p):
    """Element i of attnc.Dropout is kept exactly where draw i of the seed drawn from
    its generator is (a vector of draws at a time in the kernels: every lane, the
    runs' tails and the tasks' chunks of 65536 against the scalar definition)."""
    x = _x((3, 70001), seed=5, dtype=dtype)
    out = attnc.Dropout(p, rng=np.random.default_rng(6), dtype=dtype)(x)
    seed = int(np.random.default_rng(6).integers(0, 2**64, dtype=np.uint64))
    expected = _documented_keeps(seed, np.arange(x.size), p).reshape(x.shape)
    np.testing.assert_array_equal(out != 0, expected)


def test_dropout_does_not_modify_input_and_returns_fresh():
    x = _x((20, 20), seed=9)
    before = x.copy()
    y = attnc.Dropout(0.5)(x)
    np.testing.assert_array_equal(x, before)
    assert not np.shares_memory(y, x) and y.flags.c_contiguous


# ----------------------------------------------------------------------------
# attention dropout inside the modules


@pytest.mark.parametrize("case", DROPOUT_MODELS, ids=DROPOUT_IDS)
def test_module_dropout_train_vs_eval(case):
    dim = 8
    tm, am = make_pair(case, dim, np.float64, seed=10)
    x = np.random.default_rng(10).standard_normal((3, 6, dim))
    am.eval()
    ev = am(x)
    ref, _ = ref_forward(case.kind, np_sd(tm), x, None, case.n_heads(dim))
    assert_close(ev, ref, np.float64)
    am.train()
    tr1, tr2 = am(x), am(x)
    assert not np.allclose(tr1, ev) and not np.allclose(tr1, tr2)
    # return_weights gives the weights before dropout, in both modes
    _, w_train = am(x, return_weights=True)
    _, w_eval = am.eval()(x, return_weights=True)
    np.testing.assert_array_equal(w_train, w_eval)


@pytest.mark.parametrize("case", DROPOUT_MODELS, ids=DROPOUT_IDS)
def test_module_dropout_rate_zero_train_equals_eval(case):
    dim = 8
    am = case.make(dim, rng=np.random.default_rng(11))
    am2 = {"SelfAttentionV3": lambda: attnc.SelfAttentionV3(dim, 0.0),
           "SelfAttentionV4": lambda: attnc.SelfAttentionV4(dim, 0.0),
           "MultiHeadAttention": lambda: attnc.MultiHeadAttention(dim, 2, 0.0)}[case.kind]()
    am2.load_state_dict(am.state_dict())
    x = np.random.default_rng(11).standard_normal((2, 5, dim)).astype(np.float32)
    assert am2.training
    np.testing.assert_array_equal(am2(x), am2.eval()(x))


@pytest.mark.parametrize("case", DROPOUT_MODELS, ids=DROPOUT_IDS)
def test_module_dropout_reproducible(case, restore_threads):
    dim = 8
    x = np.random.default_rng(12).standard_normal((2, 7, dim)).astype(np.float32)
    a = case.make(dim, rng=np.random.default_rng(0))
    b = case.make(dim, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(a(x), b(x))
    np.testing.assert_array_equal(a(x), b(x))
    attnc.manual_seed(5)
    c = case.make(dim)
    c1, c2 = c(x), c(x)
    attnc.manual_seed(5)
    d = case.make(dim)
    np.testing.assert_array_equal(d(x), c1)
    np.testing.assert_array_equal(d(x), c2)
    assert not np.array_equal(c1, c2)
    outs = []
    for n in (1, 2):
        attnc.set_num_threads(n)
        e = case.make(dim, rng=np.random.default_rng(1))
        outs.append(e(x))
    np.testing.assert_array_equal(outs[0], outs[1])


def test_v4_dropout_applies_to_weights():
    """V4 with value = identity and x = I: the output is the dropped-out weights."""
    s, p = 8, 0.4
    am = attnc.SelfAttentionV4(s, dropout_rate=p, dtype=np.float64, rng=np.random.default_rng(13))
    sd = am.state_dict()
    sd["value.weight"] = np.eye(s)
    sd["value.bias"] = np.zeros(s)
    am.load_state_dict(sd)
    x = np.broadcast_to(np.eye(s), (4, s, s))
    _, w = am(x, return_weights=True)
    n_zero = 0
    for _ in range(3):
        out = am(x)
        dropped = out == 0
        n_zero += dropped.sum()
        np.testing.assert_allclose(out[~dropped], w[~dropped] / (1 - p), rtol=1e-14)
    n = 3 * out.size
    assert abs(n_zero - n * p) < 5 * math.sqrt(n * p * (1 - p))


def test_mha_dropout_applies_to_weights():
    """MultiHeadAttention with value/output identity and x = I: out[i, c] is the dropped weight
    of head c // head_dim at (i, c)."""
    s, heads, p = 8, 2, 0.5
    am = attnc.MultiHeadAttention(s, heads, dropout=p, dtype=np.float64, rng=np.random.default_rng(14))
    sd = am.state_dict()
    for name in ("value_linear", "output_linear"):
        sd[name + ".weight"] = np.eye(s)
        sd[name + ".bias"] = np.zeros(s)
    am.load_state_dict(sd)
    x = np.eye(s)[None]
    _, w = am(x, return_weights=True)        # (1, heads, s, s)
    hd = s // heads
    expected = np.stack([w[0, c // hd, :, c] for c in range(s)], axis=-1)   # (s, s)
    out = am(x)[0]
    dropped = out == 0
    assert dropped.any() and not dropped.all()
    np.testing.assert_allclose(out[~dropped], expected[~dropped] / (1 - p), rtol=1e-14)


def test_v3_dropout_applies_to_weights():
    s, p = 6, 0.5
    am = attnc.SelfAttentionV3(s, dropout_rate=p, dtype=np.float64, rng=np.random.default_rng(15))
    sd = am.state_dict()
    sd["proj.weight"][2 * s:] = np.eye(s)
    sd["proj.bias"][2 * s:] = 0
    sd["output_proj.weight"] = np.eye(s)
    sd["output_proj.bias"] = np.zeros(s)
    am.load_state_dict(sd)
    x = np.eye(s)[None].repeat(3, 0)
    _, w = am(x, return_weights=True)
    out = am(x)
    dropped = out == 0
    assert dropped.any() and not dropped.all()
    np.testing.assert_allclose(out[~dropped], w[~dropped] / (1 - p), rtol=1e-14)


def test_module_dropout_p1_train_gives_output_of_zero_weights():
    am = attnc.SelfAttentionV4(4, dropout_rate=1.0, rng=np.random.default_rng(16))
    out = am(np.ones((2, 3, 4), np.float32))
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(out, 0)


def test_dropout_nan_inf_like_torch():
    """torch computes x * mask / (1 - p): a dropped NaN stays NaN, a dropped inf becomes NaN."""
    x = np.full((2, 64), np.nan, np.float32)
    x[1] = np.inf
    y = attnc.Dropout(0.5, rng=np.random.default_rng(17))(x)
    assert np.isnan(y[0]).all()
    assert set(np.unique(np.where(np.isnan(y[1]), -1, y[1]))) == {-1, np.inf}


def test_module_rng_is_independent_of_global_seed():
    """A module given an rng draws only from it: the global seed changes nothing."""
    x = np.random.default_rng(18).standard_normal((2, 6, 8)).astype(np.float32)
    attnc.manual_seed(1)
    a = attnc.SelfAttentionV4(8, 0.5, rng=np.random.default_rng(3))
    ya = a(x)
    attnc.manual_seed(2)
    b = attnc.SelfAttentionV4(8, 0.5, rng=np.random.default_rng(3))
    np.testing.assert_array_equal(b(x), ya)
    # and a module without rng follows the global generator at each draw
    attnc.manual_seed(4)
    c = attnc.SelfAttentionV4(8, 0.5)
    c1 = c(x)
    attnc.manual_seed(4)
    d = attnc.SelfAttentionV4(8, 0.5)
    attnc.manual_seed(5)
    assert not np.array_equal(d(x), c1)       # init equal, but this draw used seed 5's stream
    attnc.manual_seed(4)
    e = attnc.SelfAttentionV4(8, 0.5)
    np.testing.assert_array_equal(e(x), c1)


# ----------------------------------------------------------------------------
# attention dropout, large samples: the mask itself, exposed exactly
#
# With query = 0 every weight is 1/S (uniform), and with value = the S x S
# identity (Ev = S) the output is the dropped-out weights themselves:
# out[..., i, j] = dropout(weights)[..., i, j], kept = (1/S) / (1 - p),
# dropped = 0. The mask of every (batch element, head, query, key) is then
# read off the output, and tested as independent Bernoulli(p) draws.

def _uniform_attention_inputs(batch, L, S, E=3, dtype=np.float64):
    q = np.zeros(batch + (L, E), dtype)
    k = np.random.default_rng(20).standard_normal(batch + (S, E)).astype(dtype)   # any keys
    v = np.broadcast_to(np.eye(S, dtype=dtype), batch + (S, S))
    return q, k, v


def _sdpa_mask(p, seed, batch=(6, 4), L=100, S=200, weights=True, dtype=np.float64):
    """The dropout mask of one SDPA call (True = dropped), shape batch + (L, S), after
    checking the kept values and the returned (pre-dropout) weights."""
    q, k, v = _uniform_attention_inputs(batch, L, S, dtype=dtype)
    result = attnc.functional.scaled_dot_product_attention(q, k, v, dropout_p=p, rng=np.random.default_rng(seed),
                                                           return_weights=weights)
    out = result[0] if weights else result
    if weights:
        np.testing.assert_array_equal(result[1], np.full(batch + (L, S), 1 / S, dtype))   # before dropout
    return _mask_of(out, p, S)


def _mask_of(out, p, S):
    """Dropped (True) where out == 0; every kept entry must be (1/S) / (1 - p), the scaling exact
    up to the last bit or two (float64) or a few ulp (float32)."""
    dropped = out == 0
    kept = out[~dropped].astype(np.float64)
    expected = (1 / S) / (1 - p)
    rtol = 4e-16 if out.dtype == np.float64 else 4e-7
    if kept.size:
        assert np.max(np.abs(kept - expected)) <= rtol * expected, \
            f"kept values {kept.min()!r}..{kept.max()!r}, expected (1/S)/(1-p) = {expected!r}"
    return dropped


def _check_rate(dropped, p, what, sigmas=5.0):
    n = dropped.size
    rate = float(dropped.mean())
    se = math.sqrt(p * (1 - p) / n)
    assert abs(rate - p) <= sigmas * se, f"{what}: drop rate {rate:.5f} for p = {p} ({(rate - p) / se:+.1f} s.e.)"


def _check_agreement(a, b, p, what, sigmas=6.0):
    """Two masks of independent draws agree (both dropped or both kept) with probability
    p^2 + (1 - p)^2; identical or shifted-copy masks agree far more often."""
    expected = p * p + (1 - p) * (1 - p)
    n = a.size
    agree = float(np.mean(a == b))
    se = math.sqrt(expected * (1 - expected) / n)
    assert abs(agree - expected) <= sigmas * se, \
        f"{what}: agreement {agree:.4f}, independent draws give {expected:.4f} ({(agree - expected) / se:+.1f} s.e.)"


def _pairs(m, axis, shift=1):
    """Disjoint pairs of neighbours along `axis`: (0, shift), (2 shift, 3 shift), ... so that
    no entry is in two pairs and the pairs' agreements are independent draws."""
    n = m.shape[axis] // (2 * shift) * (2 * shift)
    idx = np.arange(n).reshape(-1, 2, shift)
    return np.take(m, idx[:, 0].ravel(), axis=axis), np.take(m, idx[:, 1].ravel(), axis=axis)


def _check_independent(dropped, p, item_axes):
    """dropped: (*items, L, S) with item_axes named (e.g. ("batch element", "head")). Every
    item's mask is Bernoulli(p) on its own, and independent of its neighbours along every
    axis: neighbouring items (batch elements, heads; and items half an axis apart),
    neighbouring queries (also with one key shifted either way: no row is a shifted copy
    of the next) and neighbouring keys. Each agreement is counted over disjoint pairs."""
    for index in np.ndindex(dropped.shape[:-2]):
        _check_rate(dropped[index], p, f"item {index}", sigmas=6.0)
    for axis, name in enumerate(item_axes):
        size = dropped.shape[axis]
        if size > 1:
            _check_agreement(*_pairs(dropped, axis), p, f"neighbouring {name}s")
        if size > 3:
            _check_agreement(*_pairs(dropped, axis, size // 2), p, f"{name}s {size // 2} apart")
    rows_a, rows_b = _pairs(dropped, dropped.ndim - 2)
    _check_agreement(rows_a, rows_b, p, "neighbouring queries")
    _check_agreement(rows_a[..., 1:], rows_b[..., :-1], p, "query i+1 shifted by one key (-1)")
    _check_agreement(rows_a[..., :-1], rows_b[..., 1:], p, "query i+1 shifted by one key (+1)")
    _check_agreement(*_pairs(dropped, dropped.ndim - 1), p, "neighbouring keys")
    flat = dropped.reshape(-1, dropped.shape[-2] * dropped.shape[-1])
    if flat.shape[0] > 1:   # no item's mask is a (shifted) continuation of the previous item's
        a, b = _pairs(flat, 0)
        _check_agreement(a[:, 1:], b[:, :-1], p, "item b+1 shifted by one element")


@pytest.mark.parametrize("weights", [True, False], ids=["weights", "flash"])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_sdpa_dropout_rate_and_scale_large_sample(p, weights):
    """480,000 weights: the drop rate within 5 standard errors of p (0.9 p would be off
    by >= 20), each kept weight scaled by exactly 1 / (1 - p)."""
    dropped = _sdpa_mask(p, seed=21, weights=weights)
    assert dropped.shape == (6, 4, 100, 200)
    _check_rate(dropped, p, "all")


@pytest.mark.parametrize("p", [0.25, 0.5])
def test_sdpa_dropout_rate_and_scale_float32(p):
    """The same in float32 (kept values within a few ulp of (1/S) / (1 - p))."""
    dropped = _sdpa_mask(p, seed=22, batch=(3, 4), dtype=np.float32)
    _check_rate(dropped, p, "all")


@pytest.mark.parametrize("weights", [True, False], ids=["weights", "flash"])
@pytest.mark.parametrize("p", [0.3, 0.5])
def test_sdpa_dropout_masks_independent(p, weights):
    """Independent across batch elements, heads, queries and keys (no mask shared by
    items, no row a shifted copy of the next, no correlation between neighbours);
    several query tiles (100 > 96) and key tiles (200 > 192)."""
    _check_independent(_sdpa_mask(p, seed=23, weights=weights), p, ("batch element", "head"))


def test_sdpa_dropout_mask_follows_the_seed():
    """The same seed gives the same mask, another seed (or the next draw of one
    generator) an independent one."""
    p = 0.5
    a, b = _sdpa_mask(p, seed=24, batch=(2, 2)), _sdpa_mask(p, seed=24, batch=(2, 2))
    np.testing.assert_array_equal(a, b)
    _check_agreement(a, _sdpa_mask(p, seed=25, batch=(2, 2)), p, "seeds 24 and 25")
    q, k, v = _uniform_attention_inputs((2, 2), 100, 200)
    g = np.random.default_rng(24)
    first = attnc.functional.scaled_dot_product_attention(q, k, v, dropout_p=p, rng=g) == 0
    second = attnc.functional.scaled_dot_product_attention(q, k, v, dropout_p=p, rng=g) == 0
    np.testing.assert_array_equal(first, a)
    _check_agreement(first, second, p, "two draws of one generator")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("L, S", [(1, 37), (3, 1500), (100, 200), (97, 130)])
@pytest.mark.parametrize("seed", [11, 2**64 - 3])
def test_sdpa_dropout_mask_is_the_documented_draw(dtype, L, S, seed):
    """Weight (item, i, j) is kept exactly where draw (item * L + i) * S + j of the
    seed's stream is (docs/API.md), in the forward (few-query rows, split keys
    past 1024, and query tiles) and in the backward, whose dV = (P m)^T dO shows
    the mask it recomputes when dO is the identity."""
    p, batch = 0.3, (2, 3)
    q, k, _ = _uniform_attention_inputs(batch, L, S, dtype=dtype)
    v = np.random.default_rng(21).standard_normal(batch + (S, L)).astype(dtype)
    v_identity = np.broadcast_to(np.eye(S, dtype=dtype), batch + (S, S))
    index = np.arange(np.prod(batch) * L * S).reshape(batch + (L, S))
    expected = _documented_keeps(seed, index, p)
    F = attnc.functional
    out = F.scaled_dot_product_attention(q, k, v_identity, dropout_p=p, seed=seed)
    np.testing.assert_array_equal(out != 0, expected)
    out, lse = F.scaled_dot_product_attention(q, k, v, dropout_p=p, seed=seed, return_lse=True)
    grad_out = np.broadcast_to(np.eye(L, dtype=dtype), batch + (L, L))
    _, _, grad_v = F.scaled_dot_product_attention_backward(grad_out, q, k, v, out, lse, dropout_p=p, seed=seed)
    np.testing.assert_array_equal(np.swapaxes(grad_v, -1, -2) != 0, expected)


def _exposing_module(kind, S, heads, p, seed):
    """A float64 module in training mode whose output, for x = the identity, is the
    dropped-out uniform weights of every head: query projection 0 (weights 1/S), value
    projection giving V = I_S in every head, output projection (if any) the identity."""
    rng = np.random.default_rng(seed)
    if kind == "SelfAttentionV3":
        m = attnc.SelfAttentionV3(S, p, dtype=np.float64, rng=rng)
        sd = m.state_dict()
        sd["proj.weight"][:S] = 0
        sd["proj.bias"][:S] = 0
        sd["proj.weight"][2 * S:] = np.eye(S)
        sd["proj.bias"][2 * S:] = 0
        sd["output_proj.weight"], sd["output_proj.bias"] = np.eye(S), np.zeros(S)
    elif kind == "SelfAttentionV4":
        m = attnc.SelfAttentionV4(S, p, dtype=np.float64, rng=rng)
        sd = m.state_dict()
        sd["query.weight"], sd["query.bias"] = np.zeros((S, S)), np.zeros(S)
        sd["value.weight"], sd["value.bias"] = np.eye(S), np.zeros(S)
    else:   # MultiHeadAttention, head_dim = S: x = [I_S, 0], V of every head = I_S
        d = heads * S
        m = attnc.MultiHeadAttention(d, heads, p, dtype=np.float64, rng=rng)
        sd = m.state_dict()
        sd["query_linear.weight"], sd["query_linear.bias"] = np.zeros((d, d)), np.zeros(d)
        sd["value_linear.weight"] = np.zeros((d, d))
        for h in range(heads):
            sd["value_linear.weight"][h * S:(h + 1) * S, :S] = np.eye(S)
        sd["value_linear.bias"] = np.zeros(d)
        sd["output_linear.weight"], sd["output_linear.bias"] = np.eye(d), np.zeros(d)
    m.load_state_dict(sd)
    assert m.training
    return m


def _module_mask(kind, p, seed, B=24, S=128, heads=2):
    """The dropout mask (True = dropped) of one training-mode forward: (B, S, S), or
    (B, heads, S, S) for MultiHeadAttention."""
    m = _exposing_module(kind, S, heads, p, seed)
    d = heads * S if kind == "MultiHeadAttention" else S
    x = np.zeros((B, S, d))
    x[:, :, :S] = np.eye(S)
    out = m(x)
    _, w = m(x, return_weights=True)
    np.testing.assert_allclose(w, 1 / S, rtol=1e-15)        # the weights before dropout are uniform
    dropped = _mask_of(out, p, S)
    if kind == "MultiHeadAttention":
        dropped = dropped.reshape(B, S, heads, S).transpose(0, 2, 1, 3)
    return dropped


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("kind", ["SelfAttentionV3", "SelfAttentionV4", "MultiHeadAttention"])
def test_module_attention_dropout_large_sample(kind, p):
    """393,216 (V3, V4) or 786,432 (MHA) weights: drop rate within 5 standard errors,
    kept weights scaled by exactly 1 / (1 - p), masks independent across batch
    elements, heads, queries and keys (S = 128: two query tiles)."""
    dropped = _module_mask(kind, p, seed=26)
    _check_rate(dropped, p, "all")
    axes = ("batch element", "head") if kind == "MultiHeadAttention" else ("batch element",)
    _check_independent(dropped, p, axes)


@pytest.mark.parametrize("kind", ["SelfAttentionV3", "SelfAttentionV4", "MultiHeadAttention"])
def test_module_attention_dropout_follows_the_seed(kind):
    """Two modules made with the same seed draw the same masks, call after call; the
    next call and another seed draw independent ones."""
    p = 0.5
    B, S = 4, 64
    a = _exposing_module(kind, S, 2, p, seed=27)
    b = _exposing_module(kind, S, 2, p, seed=27)
    c = _exposing_module(kind, S, 2, p, seed=28)
    d = 2 * S if kind == "MultiHeadAttention" else S
    x = np.zeros((B, S, d))
    x[:, :, :S] = np.eye(S)
    a1, b1, c1 = a(x) == 0, b(x) == 0, c(x) == 0
    np.testing.assert_array_equal(a1, b1)
    a2, b2 = a(x) == 0, b(x) == 0
    np.testing.assert_array_equal(a2, b2)
    _check_agreement(a1, a2, p, "two calls of one module")
    _check_agreement(a1, c1, p, "seeds 27 and 28")
