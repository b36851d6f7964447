"""attnc.Dropout and the attention dropout of V3 / V4 / MultiHeadAttention / SDPA."""
import math

import numpy as np
import pytest

import attnc
from helpers import DROPOUT_CASES, DROPOUT_IDS, assert_close, make_pair, np_reference, np_sd


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


def test_dropout_does_not_modify_input_and_returns_fresh():
    x = _x((20, 20), seed=9)
    before = x.copy()
    y = attnc.Dropout(0.5)(x)
    np.testing.assert_array_equal(x, before)
    assert not np.shares_memory(y, x) and y.flags.c_contiguous


# ----------------------------------------------------------------------------
# attention dropout inside the modules


@pytest.mark.parametrize("case", DROPOUT_CASES, ids=DROPOUT_IDS)
def test_module_dropout_train_vs_eval(case):
    dim = 8
    tm, am = make_pair(case, dim, np.float64, seed=10)
    x = np.random.default_rng(10).standard_normal((3, 6, dim))
    am.eval()
    ev = am(x)
    ref, _ = np_reference(case.kind, np_sd(tm), x, None, case.n_heads(dim))
    assert_close(ev, ref, np.float64)
    am.train()
    tr1, tr2 = am(x), am(x)
    assert not np.allclose(tr1, ev) and not np.allclose(tr1, tr2)
    # return_weights gives the weights before dropout, in both modes
    _, w_train = am(x, return_weights=True)
    _, w_eval = am.eval()(x, return_weights=True)
    np.testing.assert_array_equal(w_train, w_eval)


@pytest.mark.parametrize("case", DROPOUT_CASES, ids=DROPOUT_IDS)
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


@pytest.mark.parametrize("case", DROPOUT_CASES, ids=DROPOUT_IDS)
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
