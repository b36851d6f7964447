"""Every error named in API.md, and "nothing changed" after a rejected load_state_dict."""

import numpy as np
import pytest

import attnc
from attnc import functional as F
from toolkit import MODEL_IDS, MODELS, MASKED_MODELS, MASKED_IDS

DIM = 13


# ----------------------------------------------------------------------------
# dtype arguments and input dtypes


@pytest.mark.parametrize("bad", [None, "int32", np.int64, np.complex64, "complex128", np.float128, bool, object,
                                 "U3", "not-a-dtype", "V2"], ids=str)
def test_bad_dtype_argument(bad):
    for make in (lambda: attnc.SelfAttentionV1(4, dtype=bad), lambda: attnc.Linear(3, 2, dtype=bad),
                 lambda: attnc.MultiHeadAttention(4, 2, dtype=bad), lambda: attnc.SelfAttention(4, 3, 3, dtype=bad)):
        with pytest.raises(TypeError):
            make()


@pytest.mark.parametrize("bad", [None, "int32", np.complex128])
def test_bad_dtype_in_to(bad):
    m = attnc.SelfAttentionV1(4)
    with pytest.raises(TypeError):
        m.to(bad)
    assert m.dtype == np.float32


BAD_INPUTS = [
    np.ones((2, 3, DIM), np.complex64),
    np.ones((2, 3, DIM), np.complex128),
    np.ones((2, 3, DIM), object),
    np.full((2, 3, DIM), "a"),
    np.full((2, 3, DIM), b"a"),
]
BAD_IDS = ["c8", "c16", "object", "str", "bytes"]


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
@pytest.mark.parametrize("x", BAD_INPUTS, ids=BAD_IDS)
def test_bad_input_dtype(case, x):
    m = case.make(DIM)
    with pytest.raises(TypeError):
        m(x)


@pytest.mark.parametrize("x", BAD_INPUTS, ids=BAD_IDS)
def test_bad_input_dtype_functional(x):
    good = np.ones((2, 3, DIM), np.float32)
    w = np.ones((4, DIM), np.float32)
    with pytest.raises(TypeError):
        F.linear(x, w)
    with pytest.raises(TypeError):
        F.linear(good, x[0, :, :].reshape(3, DIM))
    with pytest.raises(TypeError):
        F.linear(good, w, x[0, 0, :4])
    with pytest.raises(TypeError):
        F.softmax(x)
    for i in range(3):
        args = [good, good, good]
        args[i] = x
        with pytest.raises(TypeError):
            F.scaled_dot_product_attention(*args)
    with pytest.raises(TypeError):
        attnc.Dropout(0.5)(x)


def test_object_array_of_numbers_is_rejected():
    x = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=object)
    with pytest.raises(TypeError):
        attnc.SelfAttentionV1(2)(x)


def _masked_at_one_element(data):
    """data as a numpy.ma.MaskedArray with its first element masked (data not copied)."""
    mask = np.zeros(data.shape, bool)
    mask.flat[0] = True
    return np.ma.array(data, mask=mask)


MASKED_REFUSAL = "a masked array with masked elements"


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_masked_input_with_masked_elements_is_refused(case):
    """attnc reads every element's value, masked or not: a masked array with an element
    masked raises ValueError naming the argument rather than compute with the values under
    the mask; the array and its mask are left as they were."""
    data = np.arange(2 * 3 * DIM, dtype=np.float32).reshape(2, 3, DIM)
    x = _masked_at_one_element(data.copy())
    with pytest.raises(ValueError, match=f"^x: {MASKED_REFUSAL}"):
        case.make(DIM)(x)
    np.testing.assert_array_equal(x.data, data)
    assert x.mask.sum() == 1 and x.mask.flat[0]


def test_masked_arrays_with_masked_elements_are_refused_by_every_entry():
    """The functional layer's arrays, a module's parameter assignment and an attention mask
    given as a masked array: each a ValueError naming its argument."""
    q = np.ones((1, 2, 3, 4), np.float32)
    w = np.ones((5, 4), np.float32)
    calls = {
        "x": lambda: F.linear(_masked_at_one_element(q.copy()), w),
        "weight": lambda: F.linear(q, _masked_at_one_element(w.copy())),
        "bias": lambda: F.linear(q, w, _masked_at_one_element(np.ones(5, np.float32))),
        "query": lambda: F.scaled_dot_product_attention(_masked_at_one_element(q.copy()), q, q),
        "key": lambda: F.scaled_dot_product_attention(q, _masked_at_one_element(q.copy()), q),
        "value": lambda: F.scaled_dot_product_attention(q, q, _masked_at_one_element(q.copy())),
        "attn_mask": lambda: F.scaled_dot_product_attention(q, q, q,
                                                            attn_mask=_masked_at_one_element(np.ones((3, 3), bool))),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match=f"^{name}: {MASKED_REFUSAL}"):
            call()
    m = attnc.MultiHeadAttention(4, 2)
    before = m.query_linear.weight.copy()
    with pytest.raises(ValueError, match=f"^weight: {MASKED_REFUSAL}"):
        m.query_linear.weight = _masked_at_one_element(before.copy())
    np.testing.assert_array_equal(m.query_linear.weight, before)
    # placed past the assignment's check: the forward's conversion of the parameter refuses it
    object.__setattr__(m.query_linear, "weight", _masked_at_one_element(before.copy()))
    with pytest.raises(ValueError, match=f"^query_linear.weight: {MASKED_REFUSAL}"):
        m(np.ones((1, 3, 4), np.float32))


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_masked_array_with_nothing_masked_is_read_as_its_data(case):
    """A masked array none of whose elements is masked holds exactly its data: input and
    parameter alike give the bits the plain arrays give."""
    m = case.make(DIM).eval()
    x = np.random.default_rng(0).standard_normal((2, 3, DIM)).astype(np.float32)
    expected = m(x)
    np.testing.assert_array_equal(m(np.ma.array(x, mask=np.zeros(x.shape, bool))), expected)
    name, value = next(iter(m.state_dict().items()))
    m.load_state_dict({**m.state_dict(), name: np.ma.array(value)})
    np.testing.assert_array_equal(m(x), expected)
    np.testing.assert_array_equal(F.linear(np.ma.array(x), np.ma.array(np.eye(DIM, dtype=np.float32))),
                                  F.linear(x, np.eye(DIM, dtype=np.float32)))


# ----------------------------------------------------------------------------
# shapes


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_ndim_below_two(case):
    m = case.make(DIM)
    for x in (np.ones(DIM, np.float32), np.float32(1.0), np.ones((), np.float32)):
        with pytest.raises(ValueError):
            m(x)


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_wrong_last_dim_names_sizes(case):
    m = case.make(DIM)
    for shape in ((2, 3, 17), (3, 17)):
        with pytest.raises(ValueError) as e:
            m(np.ones(shape, np.float32))
        msg = str(e.value)
        assert "13" in msg and "17" in msg, msg


@pytest.mark.parametrize("case", MASKED_MODELS, ids=MASKED_IDS)
def test_mask_does_not_broadcast(case):
    dim = 4
    m = case.make(dim)
    x = np.ones((3, 5, dim), np.float32)
    h = case.n_heads(dim)
    scores = (3,) + ((h,) if h else ()) + (5, 5)
    candidates = [(3, 4, 5), (5, 4), (2, 5, 5), (4,), (7, 3, 5, 5), (2, 3, 5, 5), (3, 7, 5, 5), (3, 5, 5),
                  (1, 3, 5, 5), (1, 1, 1, 1, 1), (3, 1, 1, 1, 5), (5, 5, 5)]
    bad = []
    for shape in candidates:      # the oracle: NumPy's broadcast_to the scores' shape
        try:
            np.broadcast_to(np.empty(shape), scores)
        except ValueError:
            bad.append(shape)
    assert len(bad) >= 8
    for shape in bad:
        with pytest.raises(ValueError):
            m(x, np.ones(shape, bool))
    # and the ones that broadcast are accepted
    for shape in set(candidates) - set(bad):
        assert m(x, np.ones(shape, bool)).shape[:-1] == (3, 5)


@pytest.mark.parametrize("case", MASKED_MODELS, ids=MASKED_IDS)
@pytest.mark.parametrize("mask_dtype", [np.complex64, object, "U1", "S1"], ids=str)
def test_mask_bad_dtype(case, mask_dtype):
    m = case.make(4)
    x = np.ones((2, 3, 4), np.float32)
    mask = np.ones((3, 3)).astype(mask_dtype)
    with pytest.raises(TypeError):
        m(x, mask)
    with pytest.raises(TypeError):
        F.scaled_dot_product_attention(x, x, x, attn_mask=mask)


def test_functional_shape_errors():
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(ValueError):
        F.linear(np.float32(1.0), np.ones((2, 1), np.float32))     # x must be at least 1-D
    with pytest.raises(ValueError):
        F.linear(x, np.ones(4, np.float32))                       # weight must be 2-D
    with pytest.raises(ValueError):
        F.linear(x, np.ones((2, 3, 4), np.float32))
    with pytest.raises(ValueError):
        F.linear(x, np.ones((5, 3), np.float32))                  # in_features mismatch
    with pytest.raises(ValueError):
        F.linear(x, np.ones((5, 4), np.float32), np.ones(4, np.float32))   # bias size
    with pytest.raises(ValueError):
        F.scaled_dot_product_attention(x, np.ones((2, 3, 5), np.float32), x)      # E mismatch
    with pytest.raises(ValueError):
        F.scaled_dot_product_attention(x, x, np.ones((2, 4, 4), np.float32))      # S mismatch
    with pytest.raises(ValueError):
        F.scaled_dot_product_attention(x, np.ones((3, 3, 4), np.float32), np.ones((3, 3, 4), np.float32))
    with pytest.raises(ValueError):
        F.scaled_dot_product_attention(np.ones(4, np.float32), x, x)
    with pytest.raises(ValueError):
        F.scaled_dot_product_attention(x, x, x, attn_mask=np.ones((4, 3), bool))
    with pytest.raises(ValueError):
        F.softmax(x, axis=3)


# ----------------------------------------------------------------------------
# dropout p


BAD_P = [-0.1, 1.0001, 2, float("nan"), float("inf"), -float("inf")]


@pytest.mark.parametrize("p", BAD_P, ids=str)
def test_bad_dropout_p(p):
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(ValueError):
        attnc.Dropout(p)
    with pytest.raises(ValueError):
        attnc.SelfAttentionV3(4, dropout_rate=p)
    with pytest.raises(ValueError):
        attnc.SelfAttentionV4(4, p)
    with pytest.raises(ValueError):
        attnc.MultiHeadAttention(4, 2, dropout=p)
    with pytest.raises(ValueError):
        F.scaled_dot_product_attention(x, x, x, dropout_p=p)


@pytest.mark.parametrize("p", [0.0, 1.0, 0.5])
def test_boundary_dropout_p_accepted(p):
    attnc.Dropout(p)
    attnc.SelfAttentionV3(4, p)
    attnc.MultiHeadAttention(4, 2, p)
    x = np.ones((2, 3, 4), np.float32)
    F.scaled_dot_product_attention(x, x, x, dropout_p=p)


# ----------------------------------------------------------------------------
# sizes and heads


@pytest.mark.parametrize("make", [
    lambda: attnc.SelfAttentionV1(0), lambda: attnc.SelfAttentionV1(-3),
    lambda: attnc.SelfAttentionV2(0), lambda: attnc.SelfAttentionV3(0), lambda: attnc.SelfAttentionV4(-1),
    lambda: attnc.MultiHeadAttention(8, 3), lambda: attnc.MultiHeadAttention(8, 0),
    lambda: attnc.MultiHeadAttention(0, 2),
    lambda: attnc.MultiHeadAttention(8, -2), lambda: attnc.MultiHeadAttention(8, 16),
    lambda: attnc.SelfAttention(0, 3, 3), lambda: attnc.SelfAttention(4, 0, 3), lambda: attnc.SelfAttention(4, 3, 0),
    lambda: attnc.MultiHeadSelfAttention(4, 6, 8, 4), lambda: attnc.MultiHeadSelfAttention(4, 8, 6, 4),
    lambda: attnc.MultiHeadSelfAttention(4, 8, 8, 0), lambda: attnc.MultiHeadSelfAttention(4, 8, 8, 3),
    lambda: attnc.MultiHeadSelfAttention(0, 8, 8, 2), lambda: attnc.MultiHeadSelfAttention(4, 4, 4),  # 8 heads
    lambda: attnc.Linear(-1, 3), lambda: attnc.Linear(3, -1),
])
def test_bad_sizes(make):
    with pytest.raises(ValueError):
        make()


def test_linear_accepts_zero():
    assert attnc.Linear(0, 0).weight.shape == (0, 0)
    assert attnc.Linear(0, 2).weight.shape == (2, 0)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_scale(scale):
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(ValueError):
        F.scaled_dot_product_attention(x, x, x, scale=scale)


@pytest.mark.parametrize("n", [0, -1])
def test_set_num_threads_bad(n, restore_threads):
    with pytest.raises(ValueError):
        attnc.set_num_threads(n)
    assert attnc.get_num_threads() == restore_threads


# ----------------------------------------------------------------------------
# load_state_dict


def _snapshot(m):
    return {k: v.copy() for k, v in m.state_dict().items()}


def _unchanged(m, snap):
    sd = m.state_dict()
    assert list(sd) == list(snap)
    for k in snap:
        np.testing.assert_array_equal(sd[k], snap[k])


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_load_state_dict_missing_and_unexpected(case):
    m = case.make(4, rng=np.random.default_rng(0))
    snap = _snapshot(m)
    new = {k: np.full_like(v, 0.25) for k, v in snap.items()}
    keys = list(new)
    # missing keys: all listed
    partial = {k: v for k, v in new.items() if k not in keys[:2]}
    with pytest.raises(KeyError) as e:
        m.load_state_dict(partial)
    assert all(k in str(e.value) for k in keys[:2])
    _unchanged(m, snap)
    # unexpected keys: all listed
    extra = dict(new, **{"extra.weight": np.ones(2), "zzz": np.ones(1)})
    with pytest.raises(KeyError) as e:
        m.load_state_dict(extra)
    assert "extra.weight" in str(e.value) and "zzz" in str(e.value)
    _unchanged(m, snap)
    # both at once: all listed
    both = dict(partial, bogus=np.ones(1))
    with pytest.raises(KeyError) as e:
        m.load_state_dict(both, strict=True)
    assert all(k in str(e.value) for k in keys[:2] + ["bogus"])
    _unchanged(m, snap)
    # strict=False loads what it knows, returns (missing, unexpected)
    missing, unexpected = m.load_state_dict(both, strict=False)
    assert sorted(missing) == sorted(keys[:2]) and list(unexpected) == ["bogus"]
    sd = m.state_dict()
    for k in keys[:2]:
        np.testing.assert_array_equal(sd[k], snap[k])
    for k in keys[2:]:
        np.testing.assert_array_equal(sd[k], 0.25)


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
@pytest.mark.parametrize("strict", [True, False])
def test_load_state_dict_wrong_shape(case, strict):
    m = case.make(4, rng=np.random.default_rng(1))
    snap = _snapshot(m)
    keys = list(snap)
    bad_key = keys[-1]
    new = {k: np.full_like(v, 0.5) for k, v in snap.items()}
    new[bad_key] = np.ones(snap[bad_key].shape + (1,))
    with pytest.raises(ValueError) as e:
        m.load_state_dict(new, strict=strict)
    assert bad_key in str(e.value)
    _unchanged(m, snap)          # the valid keys before it were not loaded either
    new[bad_key] = np.ones(snap[bad_key].size + 1)
    with pytest.raises(ValueError):
        m.load_state_dict(new, strict=strict)
    _unchanged(m, snap)


def test_load_state_dict_transposed_weight_rejected():
    m = attnc.SelfAttention(4, 3, 3)
    sd = m.state_dict()
    sd["linear_q.weight"] = sd["linear_q.weight"].T
    with pytest.raises(ValueError, match="linear_q.weight"):
        m.load_state_dict(sd)


def test_load_state_dict_bad_value_dtype():
    m = attnc.SelfAttentionV1(2)
    snap = _snapshot(m)
    sd = {k: np.ones_like(v) for k, v in snap.items()}
    sd["V_proj.bias"] = np.ones(2, np.complex64)
    with pytest.raises(TypeError):
        m.load_state_dict(sd)
    _unchanged(m, snap)
