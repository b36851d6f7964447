"""A hostile user's parameters: regression tests for findings 1, 2 and 6 of a
robustness review.

Every parameter of every class (from named_parameters()) is replaced or
changed in place in every odd way we know: 0-d, 1-d, 3-d, empty, resized,
`.shape` set, wrong dtype, read-only, unaligned, Fortran order, strided,
byte-swapped, None. Each call either works, and then matches the float64
oracle, or raises TypeError/ValueError whose message starts with the
parameter's name; it never crashes. load_state_dict changes nothing unless
it can change everything, whatever the current parameters are; a pickle
round trip with out-of-band buffers (read-only or unaligned) gives a module
that works; informational attributes (head_dim, ...) cannot break a
forward; a bad dropout probability set after construction is named.
"""
import copy
import pickle
import re
import types
import warnings

import numpy as np
import pytest
import torch

import attnc
from attnc import functional as F
from attnc.module import _initial_values, _sized_by
from toolkit import (DROPOUT_IDS, DROPOUT_MODELS, MODEL_IDS, MODELS, assert_close, make_module, merge_heads, ref_attend,
                     ref_linear, ref_module, split_heads)

DIM = 4


def _x(dtype=np.float32, shape=(2, 3, DIM)):
    return np.random.default_rng(1).standard_normal(shape).astype(dtype)


def _owner(module, key):
    """(submodule, attribute) holding the parameter named `key`."""
    *path, leaf = key.split(".")
    for name in path:
        module = getattr(module, name)
    return module, leaf


def _snapshot(module):
    """Every parameter bit for bit: key -> (dtype, shape, bytes)."""
    return {k: (v.dtype, v.shape, v.tobytes()) for k, v in module.named_parameters()}


def _assert_works(module, x, mask=None):
    """The forward (with and without weights) matches the float64 oracle."""
    args = (x,) if mask is None else (x, mask)
    out, weights = module(*args, return_weights=True)
    ref_out, ref_weights = ref_module(module, x, mask)
    assert_close(out, ref_out, module.dtype, "out")
    assert_close(weights, ref_weights, module.dtype, "weights")
    assert_close(module(*args), ref_out, module.dtype, "out without weights")


def _is_clean(array, dtype):
    flags = array.flags
    return (type(array) is np.ndarray and array.dtype == dtype and flags.c_contiguous and flags.aligned
            and flags.writeable)


# ============================================================================
# odd arrays


def _unaligned(a, writeable=True):
    """A copy of `a` whose data starts one byte past an aligned address."""
    raw = bytearray(a.nbytes + 1)
    out = np.frombuffer(raw, a.dtype, count=a.size, offset=1).reshape(a.shape)
    out[...] = a
    if not writeable:
        out = np.frombuffer(bytes(raw), a.dtype, count=a.size, offset=1).reshape(a.shape)
    assert not out.flags.aligned or a.size == 0
    return out


def _read_only(a):
    out = a.copy()
    out.flags.writeable = False
    return out


def _strided(a):
    return np.repeat(a, 2, axis=-1)[..., ::2]


def _transposed(shape):
    return shape[::-1] if len(shape) == 2 else shape + (2,)


def _resize(a, shape):
    a.resize(shape, refcheck=False)


def _set_shape(a):
    a.shape = (a.size,) if a.ndim == 2 else (1, a.size)


def _matrix(a):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        return np.asmatrix(a)


def _assign(make):
    """A mutation that assigns make(current) to the attribute (Module.__setattr__)."""
    return lambda owner, leaf, current: setattr(owner, leaf, make(current))


def _bypass(make):
    """A mutation that puts make(current) in the instance dict, as unpickling
    or object.__setattr__ would, so only the binding sees it."""
    return lambda owner, leaf, current: owner.__dict__.__setitem__(leaf, make(current))


def _in_place(change):
    return lambda owner, leaf, current: change(current)


WORKS, RAISES = "works", "raises"

# name -> (mutation(owner, attribute, current value), outcome or outcome(current))
MUTATIONS = {
    "0d": (_assign(lambda a: np.ones((), a.dtype)), RAISES),
    "1d": (_assign(lambda a: a.reshape(-1)), lambda a: RAISES if a.ndim == 2 else WORKS),
    "1d-longer": (_assign(lambda a: np.ones(a.size + 1, a.dtype)), RAISES),
    "3d": (_assign(lambda a: a[None]), RAISES),
    "empty": (_assign(lambda a: np.empty((0,) * a.ndim, a.dtype)), RAISES),
    "transposed": (_assign(lambda a: np.ones(_transposed(a.shape), a.dtype)),
                   lambda a: RAISES if _transposed(a.shape) != a.shape else WORKS),
    "resized-0d": (_in_place(lambda a: _resize(a, ())), RAISES),
    "resized-larger": (_in_place(lambda a: _resize(a, (a.shape[0] + 1,) + a.shape[1:])), RAISES),
    "resized-empty": (_in_place(lambda a: _resize(a, (0,) + a.shape[1:])), RAISES),
    "shape-set": (_in_place(_set_shape), RAISES),
    "none": (_assign(lambda a: None), lambda a: WORKS if a.ndim == 1 else RAISES),
    "none-bypass": (_bypass(lambda a: None), lambda a: WORKS if a.ndim == 1 else RAISES),
    "complex": (_assign(lambda a: a.astype(np.complex64)), RAISES),
    "complex-bypass": (_bypass(lambda a: a.astype(np.complex64)), RAISES),
    "object": (_assign(lambda a: a.astype(object)), RAISES),
    "str": (_assign(lambda a: "weights"), RAISES),
    "str-bypass": (_bypass(lambda a: "weights"), RAISES),
    "float64": (_assign(lambda a: a.astype(np.float64)), WORKS),
    "float64-bypass": (_bypass(lambda a: a.astype(np.float64)), WORKS),
    "int": (_assign(lambda a: np.round(a * 4).astype(np.int64)), WORKS),
    "bool": (_assign(lambda a: a > 0), WORKS),
    "list": (_assign(lambda a: a.tolist()), WORKS),
    "read-only": (_assign(_read_only), WORKS),
    "read-only-in-place": (_in_place(lambda a: a.flags.__setattr__("writeable", False)), WORKS),
    "read-only-bypass": (_bypass(_read_only), WORKS),
    "unaligned": (_assign(_unaligned), WORKS),
    "unaligned-bypass": (_bypass(_unaligned), WORKS),
    "unaligned-read-only-bypass": (_bypass(lambda a: _unaligned(a, writeable=False)), WORKS),
    "fortran": (_assign(np.asfortranarray), WORKS),
    "fortran-bypass": (_bypass(np.asfortranarray), WORKS),
    "strided-bypass": (_bypass(_strided), WORKS),
    "list-bypass": (_bypass(lambda a: a.tolist()), WORKS),
    "reversed-bypass": (_bypass(lambda a: a[::-1].copy()[::-1]), WORKS),
    "byteswapped": (_assign(lambda a: a.astype(a.dtype.newbyteorder())), WORKS),
    "byteswapped-bypass": (_bypass(lambda a: a.astype(a.dtype.newbyteorder())), WORKS),
    "matrix-subclass": (_assign(lambda a: _matrix(a) if a.ndim == 2 else a), WORKS),
}


def _parameters():
    for model in MODELS:
        for key, _ in make_module(model.name, DIM).named_parameters():
            yield pytest.param(model.name, key, id=f"{model.name}-{key}")


PARAMETERS = list(_parameters())


def test_every_parameter_is_covered():
    """The registry reaches every parameter of every class (bias and no bias)."""
    keys = {key for _, key in (p.values for p in PARAMETERS)}
    assert {"proj.weight", "proj.bias", "output_proj.weight", "output_linear.bias", "linear_v.bias",
            "Q_proj.weight", "value.bias"} <= keys
    assert {type(make_module(m.name)) for m in MODELS} >= {
        attnc.SelfAttentionV1, attnc.SelfAttentionV2, attnc.SelfAttentionV3, attnc.SelfAttentionV4,
        attnc.MultiHeadAttention, attnc.SelfAttention, attnc.MultiHeadSelfAttention}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
@pytest.mark.parametrize("model_name, key", PARAMETERS)
def test_parameter_mutation_works_or_names_the_parameter(model_name, key, mutation):
    m = make_module(model_name, DIM)
    x = _x()
    owner, leaf = _owner(m, key)
    current = getattr(owner, leaf)
    original = current.copy()
    change, outcome = MUTATIONS[mutation]
    outcome = outcome(current) if callable(outcome) else outcome
    if outcome == WORKS:
        change(owner, leaf, current)
        value = getattr(owner, leaf)
        if mutation in ("read-only", "unaligned", "fortran", "byteswapped", "float64", "int", "bool", "list",
                        "matrix-subclass"):
            assert _is_clean(value, m.dtype), f"{key}: assignment did not convert {mutation}"
        _assert_works(m, x)
        return
    try:
        change(owner, leaf, current)
    except (TypeError, ValueError) as error:  # rejected at assignment, by its attribute name
        assert str(error).startswith(leaf + ":"), str(error)
    else:
        with pytest.raises((TypeError, ValueError)) as info:
            m(x)
        assert str(info.value).startswith(key + ":"), str(info.value)
        with pytest.raises((TypeError, ValueError)) as info:
            m(x, return_weights=True)
        assert str(info.value).startswith(key + ":"), str(info.value)
    setattr(owner, leaf, original)  # the module works again once repaired
    _assert_works(m, x)


@pytest.mark.parametrize("form", ["torch", "tuple", "list", "masked-array", "matrix"])
def test_parameter_placed_past_assignment_state_dict_and_training_name_it(form):
    """Regression (fuzzing): a parameter put in the instance dict as a torch tensor or a tuple
    made state_dict() raise AttributeError ('Tensor' object has no attribute 'copy'), naming
    nothing, and a list's state_dict entry was a list; named_grads(), zero_grad() and an
    optimizer's step() raised a RuntimeError blaming another thread. state_dict now converts
    it as the assignment would (a copy of its own), and the gradient paths raise TypeError
    naming the parameter. An ndarray subclass placed there (a modules audit, 2026-12-02)
    had passed as a parameter: state_dict gave a MaskedArray, and SGD's step updated a
    masked array's data only where nothing was masked; it is converted and refused as the
    others are."""
    m = attnc.SelfAttentionV1(2, rng=np.random.default_rng(3))
    values = m.Q_proj.weight.astype(np.float64) + 0.5
    placed = {"torch": lambda: torch.from_numpy(values.copy()), "tuple": lambda: tuple(map(tuple, values.tolist())),
              "list": values.tolist, "masked-array": lambda: np.ma.masked_array(values.copy()),
              "matrix": lambda: _matrix(values.copy())}[form]()
    m.Q_proj.__dict__["weight"] = placed
    state = m.state_dict()
    entry = state["Q_proj.weight"]
    assert type(entry) is np.ndarray and entry.dtype == m.dtype
    np.testing.assert_array_equal(entry, values.astype(m.dtype))
    if form == "torch":
        assert not np.shares_memory(entry, placed.numpy())
    for call in (lambda: dict(m.named_grads()), m.zero_grad, lambda: attnc.optim.SGD(m, lr=0.1).step()):
        with pytest.raises(TypeError, match=r"^Q_proj\.weight: the parameter is "):
            call()
    m.Q_proj.weight = placed  # assigned, it is converted, and everything works
    np.testing.assert_array_equal(m.state_dict()["Q_proj.weight"], values.astype(m.dtype))
    m.zero_grad()
    assert not dict(m.named_grads())["Q_proj.weight"].any()


def test_a_masked_parameter_placed_past_assignment_is_refused_naming_it():
    """Regression (a modules audit, 2026-12-02): a masked array with masked elements put in
    the instance dict was updated by SGD's step everywhere but under its mask (no error), and
    state_dict returned it as a MaskedArray. The gradient paths now refuse it and state_dict
    converts it as assignment would, which refuses its masked elements; load_state_dict
    replaces it with the value loaded."""
    m = attnc.Linear(3, 3, rng=np.random.default_rng(0))
    values = m.weight.copy()
    m.__dict__["weight"] = np.ma.masked_array(values.copy(), mask=np.eye(3, dtype=bool))
    for call in (lambda: dict(m.named_grads()), m.zero_grad, lambda: attnc.optim.SGD(m, lr=0.1).step()):
        with pytest.raises(TypeError, match=r"^weight: the parameter is MaskedArray"):
            call()
    with pytest.raises(ValueError, match=r"^weight: a masked array with masked elements"):
        m.state_dict()
    m.load_state_dict({"weight": values + 1, "bias": m.bias})
    assert type(m.weight) is np.ndarray
    np.testing.assert_array_equal(m.weight, values + 1)


def test_commit_refuses_a_class_as_an_owner():
    """Regression (a C-boundary audit, 2026-12-02): commit set its assignments with
    PyObject_GenericSetAttr, which on a class writes the class's dict past type.__setattr__:
    CPython's attribute cache kept the old, freed value (a segfault in 3 of 3 runs of the
    audit's loop), and a built-in type's attributes could be changed (int.bit_length set to
    None). A class as an owner is refused, before any copy."""
    class Owner:
        def method(self):
            return 1
    target, source = np.zeros(2), np.ones(2)
    for owner in (Owner, int):
        with pytest.raises(TypeError, match="^commit: assignment 0 sets an attribute of a class"):
            attnc._C.commit([target], [source], [(owner, "method", None)])
    assert Owner().method() == 1 and (1).bit_length() == 1 and not target.any()


def test_issue_examples_of_finding_1():
    x = _x(shape=(2, 3, 64))
    m = attnc.MultiHeadAttention(64, 8)
    m.output_linear.weight.resize(())
    with pytest.raises(ValueError, match=r"^output_linear\.weight: expected shape \(64, 64\), got \(\)"):
        m(x)
    m = attnc.SelfAttentionV3(64)
    m.output_proj.weight.resize((), refcheck=False)
    with pytest.raises(ValueError, match=r"^output_proj\.weight: expected shape \(64, 64\), got \(\)"):
        m(x)
    m = attnc.MultiHeadAttention(1, 1)
    m.output_linear.weight.shape = ()
    with pytest.raises(ValueError, match=r"^output_linear\.weight: "):
        m(np.ones((2, 3, 1)))
    lin = attnc.Linear(3, 2)
    lin.weight.resize((), refcheck=False)
    with pytest.raises(ValueError, match=r"^weight: "):
        lin(np.ones((2, 3)))


def test_fused_weight_checked_before_split():
    """0-d, 1-d or wrongly sized fused proj.weight: named, never an IndexError."""
    for value in (np.float32(2), np.ones(12, np.float32), np.ones((11, 4), np.float32), np.ones((12, 5))):
        for cls in (attnc.SelfAttentionV2, attnc.SelfAttentionV3):
            m = cls(DIM)
            m.proj.weight = value
            with pytest.raises(ValueError, match=r"^proj\.weight: expected shape \(12, 4\)"):
                m(_x())


@pytest.mark.parametrize("cls", [attnc.SelfAttentionV2, attnc.SelfAttentionV3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_fused_projection_without_bias(cls, dtype):
    m = cls(DIM, dtype=dtype, rng=np.random.default_rng(2)).eval()
    m.proj.bias = None
    assert "proj.bias" not in m.state_dict()
    mask = np.array([[1, 0, 1], [1, 1, 0], [0, 0, 1]], bool)
    _assert_works(m, _x(dtype), mask if cls is attnc.SelfAttentionV3 else None)
    with_bias = cls(DIM, dtype=dtype, rng=np.random.default_rng(2)).eval()
    with_bias.proj.bias[...] = 0
    np.testing.assert_array_equal(m(_x(dtype)), with_bias(_x(dtype)))


# ============================================================================
# attributes that only describe the module


INFORMATIONAL = ["hidden_dim", "head_num", "head_dim", "dim", "dim_in", "dim_k", "dim_v", "num_heads",
                 "_norm_fact"]


@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
@pytest.mark.parametrize("value", [0, -1, None, "8"], ids=str)
def test_informational_attributes_cannot_break_a_forward(model, value):
    """The scale is 1/sqrt(Q's columns per head), taken from the weights."""
    m = make_module(model.name, DIM)
    x = _x()
    before = m(x, return_weights=True)
    for name in INFORMATIONAL:
        if hasattr(m, name):
            setattr(m, name, value)
    after = m(x, return_weights=True)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


def test_head_dim_zero_is_harmless():
    m = attnc.MultiHeadAttention(8, 2, rng=np.random.default_rng(3)).eval()
    x = _x(shape=(2, 3, 8))
    expected = ref_module(m, x)
    m.head_dim = 0
    out, weights = m(x, return_weights=True)
    assert_close(out, expected[0], np.float32, "out")
    assert_close(weights, expected[1], np.float32, "weights")


# ============================================================================
# dropout probabilities set after construction


def _dropouts(module):
    return [(name, child) for name, child in module._modules.items() if isinstance(child, attnc.Dropout)]


@pytest.mark.parametrize("model", DROPOUT_MODELS, ids=DROPOUT_IDS)
@pytest.mark.parametrize("bad, error", [("0.5", TypeError), (b"0.5", TypeError), ([0.5], TypeError),
                                        (None, TypeError), (1.5, ValueError), (-0.1, ValueError),
                                        (float("nan"), ValueError), (float("inf"), ValueError),
                                        (10 ** 400, ValueError)],
                         ids=["str", "bytes", "list", "None", "1.5", "-0.1", "nan", "inf", "huge-int"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_bad_dropout_p_after_construction_is_named(model, bad, error, training):
    m = make_module(model.name, DIM).train(training)
    [(name, dropout)] = _dropouts(m)
    dropout.p = bad
    with pytest.raises(error) as info:
        m(_x())
    assert str(info.value).startswith(f"{name}.p:"), str(info.value)
    with pytest.raises(error) as info:
        dropout(_x())
    assert str(info.value).startswith("p:"), str(info.value)
    dropout.p = 0.25  # and a good one works again
    m(_x())


@pytest.mark.parametrize("model", DROPOUT_MODELS, ids=DROPOUT_IDS)
def test_eval_mode_draws_no_seed(model):
    """Dropout draws from the generator only when it applies (p > 0, training)."""
    rng = np.random.default_rng(4)
    m = model.make(DIM, rng=rng)
    state = rng.bit_generator.state
    m.eval()(_x())
    assert rng.bit_generator.state == state
    _dropouts(m)[0][1].p = 0.0
    m.train()(_x())
    assert rng.bit_generator.state == state
    _dropouts(m)[0][1].p = 0.5
    m(_x())
    assert rng.bit_generator.state != state


# ============================================================================
# inputs with as many dimensions as NumPy allows


def test_64_dimensional_x():
    lead = (1,) * 62
    x = _x(shape=(2, DIM))
    mha = attnc.MultiHeadAttention(DIM, 2, rng=np.random.default_rng(5)).eval()
    with pytest.raises(ValueError, match=r"^x: "):  # weights (..., heads, seq, seq) would need 65
        mha(x.reshape(lead + x.shape), return_weights=True)
    out = mha(x.reshape(lead + x.shape))
    np.testing.assert_array_equal(out, mha(x).reshape(lead + (2, DIM)))
    mask = np.array([[1, 0], [1, 1]])
    np.testing.assert_array_equal(mha(x.reshape(lead + x.shape), mask), mha(x, mask).reshape(lead + (2, DIM)))
    v1 = attnc.SelfAttentionV1(DIM, rng=np.random.default_rng(5)).eval()
    out, weights = v1(x.reshape(lead + x.shape), return_weights=True)  # weights: 64 dimensions, allowed
    ref_out, ref_weights = v1(x, return_weights=True)
    np.testing.assert_array_equal(out, ref_out.reshape(lead + ref_out.shape))
    np.testing.assert_array_equal(weights, ref_weights.reshape(lead + ref_weights.shape))


# ============================================================================
# load_state_dict: all or nothing, whatever the current parameters are


def _new_values(module, fill=0.375):
    return {k: np.full_like(v, fill) for k, v in module.state_dict().items()}


BAD_VALUES = {
    "wrong-shape": (lambda v: np.ones(v.shape + (1,)), ValueError),
    "one-row-more": (lambda v: np.ones((v.shape[0] + 1,) + v.shape[1:]), ValueError),
    "0d": (lambda v: np.float64(1.0), ValueError),
    "complex": (lambda v: v.astype(np.complex64), TypeError),
    "str": (lambda v: "abc", TypeError),
    "ragged": (lambda v: [[1.0], [1.0, 2.0]], ValueError),
}


@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
@pytest.mark.parametrize("bad", list(BAD_VALUES))
@pytest.mark.parametrize("where", ["first", "last"])
@pytest.mark.parametrize("current", ["plain", "read-only", "unaligned"])
def test_load_state_dict_is_atomic(model, bad, where, current):
    m = make_module(model.name, DIM)
    keys = [k for k, _ in m.named_parameters()]
    for key in keys[:2]:  # make some current parameters odd (as after unpickling)
        owner, leaf = _owner(m, key)
        if current == "read-only":
            getattr(owner, leaf).flags.writeable = False
        elif current == "unaligned":
            owner.__dict__[leaf] = _unaligned(getattr(owner, leaf))
    snapshot = _snapshot(m)
    new = _new_values(m)
    bad_key = keys[0] if where == "first" else keys[-1]
    make_bad, error = BAD_VALUES[bad]
    new[bad_key] = make_bad(new[bad_key])
    for strict in (True, False):
        with pytest.raises(error) as info:
            m.load_state_dict(dict(new, unexpected=np.ones(1)) if not strict else new, strict=strict)
        assert str(info.value).startswith(bad_key + ":"), str(info.value)
        assert _snapshot(m) == snapshot
    new[bad_key] = np.full_like(m.state_dict()[bad_key], 0.375)
    assert m.load_state_dict(new) == ([], [])
    for key, value in m.named_parameters():
        assert _is_clean(value, m.dtype), key
        np.testing.assert_array_equal(value, 0.375)
    _assert_works(m, _x())


def test_load_state_dict_copies_into_writable_parameters():
    """As torch's copy_: a reference to a parameter sees the loaded values;
    a replaced read-only one never aliases the caller's arrays."""
    m = attnc.SelfAttentionV4(DIM, rng=np.random.default_rng(6))
    held = m.query.weight
    m.key.weight.flags.writeable = False
    new = _new_values(m, 0.5)
    m.load_state_dict(new)
    assert m.query.weight is held and np.all(held == 0.5)
    assert m.key.weight.flags.writeable and not np.shares_memory(m.key.weight, new["key.weight"])
    new["key.weight"][...] = 7
    assert np.all(m.key.weight == 0.5)


def test_load_state_dict_of_float64_values_into_float32():
    m = attnc.MultiHeadSelfAttention(DIM, 4, 6, 2, bias=True, rng=np.random.default_rng(7))
    new = {k: np.asarray(v, np.float64)[::-1].copy()[::-1] for k, v in _new_values(m, 0.25).items()}
    m.load_state_dict(new)
    for key, value in m.named_parameters():
        assert _is_clean(value, np.float32), key


# ============================================================================
# pickling with out-of-band buffers


def _buffers(kind, buffers):
    if kind == "bytes":        # read-only memory
        return [bytes(b.raw()) for b in buffers]
    if kind == "unaligned":    # memory one byte off alignment
        out = []
        for b in buffers:
            raw = bytearray(len(b.raw()) + 1)
            view = memoryview(raw)[1:]
            view[:] = b.raw()
            out.append(view)
        return out
    return [bytearray(b.raw()) for b in buffers]  # writable copies


@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
@pytest.mark.parametrize("kind", ["bytes", "unaligned", "bytearray"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_pickle_protocol_5_out_of_band(model, kind, dtype):
    m = make_module(model.name, DIM, dtype=dtype)
    x = _x(dtype)
    expected = m(x, return_weights=True)
    buffers = []
    data = pickle.dumps(m, protocol=5, buffer_callback=buffers.append)
    assert buffers, "no out-of-band buffers: the test would not test them"
    loaded = pickle.loads(data, buffers=_buffers(kind, buffers))
    for key, value in loaded.named_parameters():
        assert _is_clean(value, np.dtype(dtype)), key
    got = loaded(x, return_weights=True)
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)
    loaded.load_state_dict(_new_values(loaded))
    _assert_works(loaded, x)
    np.testing.assert_array_equal(m(x), expected[0])  # the original is untouched


@pytest.mark.parametrize("kind", ["bytes", "unaligned", "bytearray", "in band"])
def test_a_tied_parameter_stays_tied_through_pickle(kind):
    """Each module converted its unpickled parameters alone: one read-only out-of-band
    buffer shared by two modules became two copies, the tie lost (parameters() listed
    one more, and a step moved the two apart)."""
    m = attnc.SelfAttentionV1(DIM, rng=np.random.default_rng(9))
    m.K_proj.weight = m.Q_proj.weight
    buffers = []
    if kind == "in band":
        loaded = pickle.loads(pickle.dumps(m, protocol=5))
    else:
        loaded = pickle.loads(pickle.dumps(m, protocol=5, buffer_callback=buffers.append),
                              buffers=_buffers(kind, buffers))
    assert loaded.K_proj.weight is loaded.Q_proj.weight
    assert len(list(loaded.parameters())) == len(list(m.parameters()))
    for key, value in loaded.named_parameters():
        assert _is_clean(value, np.dtype(np.float32)), key
        np.testing.assert_array_equal(value, dict(m.named_parameters())[key], err_msg=key)


def test_pickle_round_trip_in_band():
    m = attnc.SelfAttentionV3(DIM, rng=np.random.default_rng(8)).eval()
    loaded = pickle.loads(pickle.dumps(m, protocol=5))
    np.testing.assert_array_equal(loaded(_x()), m(_x()))


# ============================================================================
# the functional layer and the package functions name their arguments too


def test_functional_errors_start_with_the_argument():
    q = np.ones((2, 3))
    sdpa = F.scaled_dot_product_attention
    cases = [
        (lambda: F.softmax(q, axis=2 ** 70), ValueError, "axis"),
        (lambda: F.softmax(q, axis=1.5), TypeError, "axis"),
        (lambda: F.softmax([[1.0], [1.0, 2.0]]), ValueError, "x"),
        (lambda: F.linear(q, [[1.0], [1.0, 2.0]]), ValueError, "weight"),
        (lambda: sdpa(q, q, q, scale="big"), TypeError, "scale"),
        (lambda: sdpa(q, q, q, scale=10 ** 400), ValueError, "scale"),
        (lambda: sdpa(q, q, q, dropout_p="0.1"), TypeError, "dropout_p"),
        (lambda: sdpa(q, q, q, dropout_p=0.1, rng=np.random.RandomState(0)), TypeError, "rng"),
        (lambda: attnc.set_num_threads(0), ValueError, "n"),
        (lambda: attnc.set_num_threads(2 ** 70), ValueError, "n"),
        (lambda: attnc.set_num_threads(2.0), TypeError, "n"),
        (lambda: attnc.Dropout("0.5"), TypeError, "p"),
        (lambda: attnc.SelfAttentionV3(DIM, dropout_rate=[0.1]), TypeError, "dropout_rate"),
        (lambda: attnc.SelfAttentionV1(DIM, rng=42), TypeError, "rng"),
    ]
    for call, error, name in cases:
        with pytest.raises(error) as info:
            call()
        assert str(info.value).startswith(name + ":"), str(info.value)


# A bool as Python, NumPy (scalar, 0-d and 1-element arrays) and torch give it: each
# converts to 0 or 1 as a number does (np.array(True) and torch.tensor(True) had passed
# the checks that refused True and np.True_: a review helper, 2026-11-30).
BOOLS = {"python": lambda truth: truth, "numpy scalar": np.bool_, "numpy 0-d": np.array,
         "numpy 1-element": lambda truth: np.array([truth]), "torch": lambda truth: torch.tensor(truth)}


@pytest.mark.parametrize("kind", list(BOOLS))
def test_a_bool_is_not_an_integer_argument(kind, restore_threads):
    # True where a count, an axis, a window side or a seed belongs is a slip
    # (NumPy refuses a bool axis, torch a bool dim): set_num_threads(True),
    # manual_seed(True), F.softmax(axis=True) and Linear(True, 2) used to run
    # as 1 (a review helper, 2026-11-24)
    q = np.ones((2, 3))
    true, false = BOOLS[kind](True), BOOLS[kind](False)
    cases = [
        (lambda: attnc.set_num_threads(true), "n"),
        (lambda: attnc.manual_seed(true), "manual_seed: n="),
        (lambda: attnc.manual_seed(false), "manual_seed: n="),
        (lambda: attnc.manual_seed([7, true]), "manual_seed: n="),  # NumPy took [7, True] as [7, 1] (2026-12-06)
        (lambda: attnc.manual_seed((false,)), "manual_seed: n="),
        (lambda: F.softmax(q, axis=true), "axis"),
        (lambda: F.softmax_backward(q, q, axis=true), "axis"),
        (lambda: F.scaled_dot_product_attention(q, q, q, window=(true, 1)), "window"),
        (lambda: F.scaled_dot_product_attention(q, q, q, dropout_p=0.5, seed=true), "seed"),
        (lambda: attnc.Linear(true, 2), "in_features"),
        (lambda: attnc.MultiHeadAttention(4, true), "head_num"),
        (lambda: attnc.nn.MultiheadAttention(4, num_heads=true), "num_heads"),
        (lambda: attnc.nn.MultiheadAttention(true, 1), "embed_dim"),
    ]
    before = attnc.get_num_threads()
    for call, name in cases:
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value).startswith(name), str(info.value)
    assert attnc.get_num_threads() == before


@pytest.mark.parametrize("kind", list(BOOLS))
def test_a_bool_is_not_a_number_argument(kind):
    # scale=False ran as a scale of 0 (uniform weights), scale=True as 1: the
    # backward's positional order (attn_mask, is_causal, scale, dropout_p)
    # differs from the forward's (attn_mask, dropout_p, is_causal, scale), so
    # a call in the forward's order put is_causal's bool in scale and ran
    # (grad_query 1.25 off); dropout_p=True ran as 1 (a review helper,
    # 2026-11-29)
    q = np.ones((2, 3, 4))
    out, lse = F.scaled_dot_product_attention(q, q, q, return_lse=True)
    bwd = F.scaled_dot_product_attention_backward
    true, false = BOOLS[kind](True), BOOLS[kind](False)
    cases = [
        (lambda: F.scaled_dot_product_attention(q, q, q, scale=false), "scale"),
        (lambda: F.scaled_dot_product_attention(q, q, q, scale=true), "scale"),
        (lambda: F.scaled_dot_product_attention(q, q, q, dropout_p=true), "dropout_p"),
        (lambda: bwd(out, q, q, q, out, lse, None, 0.0, false), "scale"),
        (lambda: bwd(out, q, q, q, out, lse, scale=true), "scale"),
        (lambda: bwd(out, q, q, q, out, lse, dropout_p=true), "dropout_p"),
        (lambda: attnc.Dropout(true), "p"),
        (lambda: attnc.MultiHeadAttention(4, 2, dropout=true), "dropout"),
        (lambda: attnc.nn.MultiheadAttention(4, 2, dropout=true), "dropout"),
    ]
    for call, name in cases:
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value).startswith(name + ":"), str(info.value)


def test_thread_count_above_the_cpu_count(restore_threads):
    attnc.set_num_threads(64)
    assert attnc.get_num_threads() == 64
    m = make_module("MHA", 8)
    x = _x(shape=(4, 5, 8))
    out = m(x)
    attnc.set_num_threads(1)
    np.testing.assert_array_equal(m(x), out)



# ============================================================================
# submodules and parameters replaced by the wrong kind of object (a review
# helper, 2026-11-24): a non-Module assigned to a submodule's name used to be
# ignored by the forward, which kept computing with the old submodule


@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
@pytest.mark.parametrize("value", [None, types.SimpleNamespace(weight=np.ones((DIM, DIM))), np.ones(3)],
                         ids=["None", "namespace", "array"])
def test_a_submodule_takes_only_a_module(model, value):
    m = make_module(model.name, DIM).eval()
    x = _x()
    before = m(x)
    for name in list(m._modules):
        with pytest.raises(TypeError, match=f"^{name}: a submodule takes a Module"):
            setattr(m, name, value)
    np.testing.assert_array_equal(m(x), before)  # refused: nothing changed


@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
def test_a_deleted_submodule_is_named_and_can_be_restored(model):
    m = make_module(model.name, DIM).eval()
    x = _x()
    before = m(x)
    for name, child in list(m._modules.items()):
        if isinstance(child, attnc.Dropout):
            continue  # the dropout probability has its own test above
        keys = list(m.state_dict())
        delattr(m, name)
        with pytest.raises(AttributeError, match=f"^{name}: the module has no such submodule"):
            m(x)
        assert not any(key.startswith(name + ".") for key in m.state_dict())
        setattr(m, name, child)
        assert sorted(m.state_dict()) == sorted(keys)
        np.testing.assert_array_equal(m(x), before)


def test_a_parameter_takes_no_module_and_the_dtype_attribute_is_checked():
    lin = attnc.Linear(2, 2)
    with pytest.raises(TypeError, match="^weight: a parameter takes an array or None"):
        lin.weight = attnc.Linear(2, 2)
    assert [name for name, _ in lin.named_parameters()] == ["weight", "bias"]
    with pytest.raises(TypeError, match="^dtype: "):
        lin.dtype = None  # used to make a Linear compute in float64
    assert lin.dtype == np.float32


def test_register_parameter_names_like_torch():
    m = attnc.Linear(2, 2)
    with pytest.raises(TypeError, match="^name: expected a str"):
        m.register_parameter(3, np.ones(2))
    for bad in ["", "a.b", "forward", "training"]:
        with pytest.raises(KeyError, match="name: "):
            m.register_parameter(bad, np.ones(2))
    attention = attnc.SelfAttentionV2(DIM)
    with pytest.raises(KeyError, match="name: attribute 'proj' already exists"):
        attention.register_parameter("proj", np.ones(2))
    m.register_parameter("bias", np.full(2, 7.0))  # again: replaces, never a second entry
    assert [name for name, _ in m.named_parameters()] == ["weight", "bias"]
    np.testing.assert_array_equal(m.bias, [7, 7])


MHA_REPLACEMENTS = [
    ("in_proj_weight", np.ones((25, 8)), "expected shape (24, 8)"),
    ("in_proj_weight", np.ones((24, 9)), "expected shape (24, 8)"),
    ("in_proj_weight", None, "expected shape (24, 8), got None"),
    ("in_proj_bias", np.ones(29), "expected shape (24,)"),
    ("in_proj_bias", np.float32(1), "expected shape (24,)"),
    ("q_proj_weight", np.ones((8, 8)), "expected None"),
    ("bias_k", np.ones((1, 1, 1)), "expected shape (1, 1, 8)"),
    ("bias_k", np.ones(8), "expected shape (1, 1, 8)"),
    ("bias_v", None, "expected shape (1, 1, 8), got None"),
    ("out_proj.weight", np.ones((9, 8)), "expected shape (8, 8)"),
    ("out_proj.bias", np.ones(9), "expected shape (8,)"),
    ("num_heads", 3, "3 heads do not divide embed_dim=8"),
    ("num_heads", 4, "4 heads of embed_dim=8 are 2 wide, but head_dim is 4"),
    ("embed_dim", None, "expected an integer, got NoneType"),
    ("embed_dim", "8", "expected an integer, got str"),
    ("embed_dim", 8.0, "expected an integer, got float"),
]


@pytest.mark.parametrize("key, value, message", MHA_REPLACEMENTS,
                         ids=[f"{key}-{i}" for i, (key, _, _) in enumerate(MHA_REPLACEMENTS)])
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_nn_multihead_replaced_parameter_or_size_is_named(key, value, message, training):
    """nn.MultiheadAttention used to run with a replaced parameter of the wrong shape (the first
    24 rows of a 25-row in_proj_weight, one scalar broadcast as bias_k) and fail later with
    NumPy's messages; now the forward names it. embed_dim set to a non-integer raised Python's
    "unsupported operand type(s) for %" (a review helper, 2026-11-28)."""
    m = attnc.nn.MultiheadAttention(8, 2, add_bias_kv=True, rng=np.random.default_rng(2)).train(training)
    x = np.random.default_rng(3).standard_normal((5, 2, 8)).astype(np.float32)
    before = m(x, x, x)[0]
    owner, name = (m.out_proj, key.split(".")[1]) if key.startswith("out_proj.") else (m, key)
    setattr(owner, name, value)
    with pytest.raises(TypeError if key == "embed_dim" else ValueError, match="^" + (key + ": " + message)
                       .replace("(", r"\(").replace(")", r"\)")):
        m(x, x, x)
    if key in ("num_heads", "embed_dim"):
        setattr(m, key, {"num_heads": 2, "embed_dim": 8}[key])
    else:
        setattr(owner, name, _mha_original(key))
    np.testing.assert_array_equal(m(x, x, x)[0], before)


@pytest.mark.parametrize("model_name, key", PARAMETERS)
def test_a_training_forward_names_a_parameter_that_is_not_an_array(model_name, key):
    """A list put in the instance dict works in eval mode (converted, as assignment would),
    but a training-mode forward raised AttributeError ('list' object has no attribute
    'shape') from keeping it for backward (a review helper, 2026-11-28); now TypeError
    naming it, and the repaired module trains."""
    m = make_module(model_name, DIM).train()
    x = _x()
    owner, leaf = _owner(m, key)
    original = getattr(owner, leaf).copy()
    owner.__dict__[leaf] = original.tolist()
    with pytest.raises(TypeError, match="^" + re.escape(key) + ": a training-mode forward needs the parameter as an "
                                        "ndarray"):
        m(x)
    setattr(owner, leaf, original)
    out = m(x)
    assert m.backward(np.ones_like(out)).shape == x.shape


def _nn_mha_reference(params, x, heads):
    """float64 oracle of nn.MultiheadAttention's self-attention on x (L, N, E), no masks, no
    bias_kv: (output (L, N, E), weights averaged over the heads (N, L, L))."""
    e = x.shape[-1]
    w_in, b_in = (np.asarray(params[key], np.float64) for key in ("in_proj_weight", "in_proj_bias"))
    batch_first = np.swapaxes(np.asarray(x, np.float64), 0, 1)
    q, k, v = (split_heads(ref_linear(batch_first, w_in[i * e:(i + 1) * e], b_in[i * e:(i + 1) * e]), heads)
               for i in range(3))
    out, weights = ref_attend(q, k, v, 1 / np.sqrt(e // heads))
    out = ref_linear(merge_heads(out), params["out_proj.weight"], params["out_proj.bias"])
    return np.swapaxes(out, 0, 1), weights.mean(axis=1)


def _float64_out_proj(m):
    m.out_proj = attnc.Linear(8, 8, dtype=np.float64, rng=np.random.default_rng(5))
    return {"out_proj.weight": m.out_proj.weight, "out_proj.bias": m.out_proj.bias}


def _bypassed_in_proj_weight(make):
    def change(m):
        value = make(m.in_proj_weight)
        m.__dict__["in_proj_weight"] = value
        return {"in_proj_weight": value}
    return change


@pytest.mark.parametrize("change", [
    _float64_out_proj,
    _bypassed_in_proj_weight(lambda w: w.astype(np.float64) * (1 + 1e-3)),
    _bypassed_in_proj_weight(lambda w: w.tolist()),
], ids=["float64-out_proj", "float64-in_proj_weight-bypass", "list-in_proj_weight-bypass"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_nn_multihead_output_in_the_module_dtype_whatever_its_parameters(change, dtype):
    """nn.MultiheadAttention computed with a replaced parameter as given, so a float64
    out_proj made its output float64 (a float16 module's float32), and a list in the
    instance dict raised AttributeError even in eval mode (a review helper, 2026-11-28);
    now each parameter is converted to the module dtype, as in the other modules."""
    m = attnc.nn.MultiheadAttention(8, 2, dtype=dtype, rng=np.random.default_rng(2)).eval()
    x = np.random.default_rng(3).standard_normal((5, 2, 8)).astype(dtype)
    params = {key: np.asarray(value) for key, value in m.state_dict().items()}
    params.update({key: np.asarray(value) for key, value in change(m).items()})
    out, weights = m(x, x, x)
    assert out.dtype == weights.dtype == dtype
    ref_out, ref_weights = _nn_mha_reference(params, x, 2)
    assert_close(out, ref_out, dtype, "out")
    assert_close(weights, ref_weights, dtype, "weights")


def _mha_original(key):
    """The value `key` had at construction (same seed as the test's module)."""
    fresh = attnc.nn.MultiheadAttention(8, 2, add_bias_kv=True, rng=np.random.default_rng(2))
    return fresh.state_dict().get(key)


# ============================================================================
# a call that fails part way changes nothing (a review helper, 2026-11-24):
# backward added the earlier parameters' gradients before failing on a later
# one, so the retry the docs promise counted them twice; an optimizer step
# updated three parameters before failing on a read-only fourth


def test_backward_failing_part_way_adds_nothing_so_a_retry_counts_once(monkeypatch):
    x = np.random.default_rng(0).standard_normal((2, 5, 8))
    m = attnc.SelfAttentionV3(8, dropout_rate=0.0, rng=np.random.default_rng(4))
    twin = attnc.SelfAttentionV3(8, dropout_rate=0.0, rng=np.random.default_rng(4))
    y, y_twin = m(x), twin(x)
    twin.backward(np.ones_like(y_twin))
    make_buffer = attnc.Module._grad

    def out_of_memory_at_the_last(module, name, key, renew=False):  # the last parameter's gradient buffer
        if module is m.output_proj and name == "bias":
            raise MemoryError
        return make_buffer(module, name, key, renew)

    monkeypatch.setattr(attnc.Module, "_grad", out_of_memory_at_the_last)
    with pytest.raises(MemoryError):
        m.backward(np.ones_like(y))
    monkeypatch.undo()
    assert all((g == 0).all() for _, g in m.named_grads())
    m.backward(np.ones_like(y))  # the retry
    for (name, g), (_, expected) in zip(m.named_grads(), twin.named_grads()):
        np.testing.assert_array_equal(g, expected, err_msg=name)


def _interrupted_at_line(n, call):
    """Runs call() with a KeyboardInterrupt raised at the n-th line the package's
    Python runs, as Ctrl-C raises one between any two lines; whether it came."""
    import linecache
    import os
    import sys
    package = os.path.dirname(attnc.__file__) + os.sep
    lines = [0]

    def trace(frame, event, arg):
        if not frame.f_code.co_filename.startswith(package):
            return None
        # (not at a `with` line: the trace also stops there on the way out,
        # before __exit__, where a signal's handler never runs)
        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
        if event == "line" and not line.lstrip().startswith("with "):
            lines[0] += 1
            if lines[0] == n:
                raise KeyboardInterrupt
        return trace

    sys.settrace(trace)
    try:
        call()
        return False
    except KeyboardInterrupt:
        return True
    finally:
        sys.settrace(None)


@pytest.mark.parametrize("make", [lambda rng: attnc.SelfAttentionV3(8, dropout_rate=0.0, rng=rng),
                                  lambda rng: attnc.nn.MultiheadAttention(8, 2, rng=rng)])
def test_backward_interrupted_at_any_line_then_retried_counts_each_gradient_once(make):
    # Ctrl-C raises KeyboardInterrupt between any two lines of Python: the
    # gradients had been added a buffer at a time, and a KeyboardInterrupt
    # between two left some added with the forward's state kept, so the retry
    # the docs promise added those twice (2x and 3x gradients; a review
    # helper, 2026-11-29). Here a trace function raises it at each line of the
    # package's Python in turn, until a backward runs through.
    x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)

    def forward(module):
        return module(x, x, x)[0] if isinstance(module, attnc.nn.MultiheadAttention) else module(x)

    twin = make(np.random.default_rng(4)).train()
    twin.backward(np.ones_like(forward(twin)))
    for n in range(1, 10_000):
        m = make(np.random.default_rng(4)).train()
        y = forward(m)
        interrupted = _interrupted_at_line(n, lambda: m.backward(np.ones_like(y)))
        if interrupted:
            try:
                m.backward(np.ones_like(y))  # the retry
            except RuntimeError:  # the interrupt came after the gradients were added and the state released
                pass
        for (name, g), (_, expected) in zip(m.named_grads(), twin.named_grads()):
            np.testing.assert_array_equal(g, expected, err_msg=f"{name}, interrupted at line {n}")
        if not interrupted:
            break
    assert n > 10  # the trace saw the backward's lines


@pytest.mark.parametrize("replaced", [False, True], ids=["in_place", "one_parameter_read_only"])
def test_load_state_dict_interrupted_at_any_line_leaves_the_module_as_it_was_or_loaded(replaced):
    # The copies into the parameters ran a parameter at a time in Python, so a
    # Ctrl-C between two left some loaded (a review helper, 2026-12-02: 5 of 8).
    # A trace function raises KeyboardInterrupt at each line of the package's
    # Python in turn, until a load runs through; after each, the module holds
    # the old values or the new ones, all of them.
    new = {key: value + 1 for key, value in attnc.nn.MultiheadAttention(8, 2, add_bias_kv=True,
                                                                       rng=np.random.default_rng(1)).state_dict().items()}
    for n in range(1, 10_000):
        m = attnc.nn.MultiheadAttention(8, 2, add_bias_kv=True, rng=np.random.default_rng(2))
        if replaced:
            m.bias_k.flags.writeable = False  # replaced by a copy, not copied into
        old = m.state_dict()
        interrupted = _interrupted_at_line(n, lambda: m.load_state_dict(new))
        now = m.state_dict()
        expected = old if all(np.array_equal(now[k], old[k]) for k in ("in_proj_weight",)) else new
        for key in now:
            np.testing.assert_array_equal(now[key], expected[key], err_msg=f"{key}, interrupted at line {n}")
        if not interrupted:
            break
    assert n > 10  # the trace saw the load's lines


@pytest.mark.parametrize("make, key", [
    (lambda: attnc.Linear(4, 6), "weight"),
    (lambda: attnc.SelfAttentionV3(4, dropout_rate=0.0), "output_proj.bias"),
    (lambda: attnc.nn.MultiheadAttention(4, 2), "in_proj_weight"),
    (lambda: attnc.nn.MultiheadAttention(4, 2), "out_proj.weight"),
])
@pytest.mark.parametrize("change", ["shape", "dtype"])
def test_backward_names_a_parameter_changed_in_place_since_the_forward(make, key, change):
    """A parameter reshaped (or its dtype reinterpreted) in place between forward and backward:
    Linear and nn.MultiheadAttention named `x` (linear_backward's argument), or went on with
    the new shape; now every module names the parameter, before computing anything (a review
    helper, 2026-11-24)."""
    m = make().train()
    x = np.random.default_rng(0).standard_normal((3, 2, 4)).astype(np.float32)
    out = m(x, x, x)[0] if isinstance(m, attnc.nn.MultiheadAttention) else m(x)
    owner, name = m, key
    while "." in name:
        prefix, name = name.split(".", 1)
        owner = getattr(owner, prefix)
    param = getattr(owner, name)
    if change == "shape":
        param.shape = (1, param.size)
    else:
        param.dtype = np.int32
    with pytest.raises(ValueError, match=rf"^{re.escape(key)}: changed in place after the forward"):
        m.backward(np.ones_like(out))
    assert all(not g.any() for _, g in m.named_grads())


@pytest.mark.parametrize("spoil", ["read-only", "int32"])
@pytest.mark.parametrize("optimizer", ["SGD", "AdamW"])
def test_optimizer_step_refuses_a_parameter_it_cannot_update_before_updating_any(spoil, optimizer):
    x = np.random.default_rng(0).standard_normal((2, 5, 8))
    m = attnc.SelfAttentionV3(8, dropout_rate=0.0, rng=np.random.default_rng(4))
    m.backward(np.ones_like(m(x)))
    opt = getattr(attnc.optim, optimizer)(m, lr=0.1, **({"momentum": 0.9} if optimizer == "SGD" else {}))
    opt.step()
    state = {name: {k: np.copy(v) for k, v in s.items()} for name, s in opt.state.items()}
    before = {name: p.copy() for name, p in m.named_parameters()}
    if spoil == "read-only":
        m.output_proj.bias.setflags(write=False)
    else:
        m.output_proj.bias.dtype = np.int32
    with pytest.raises(ValueError, match="^output_proj.bias: step\\(\\) updates parameters in place"):
        opt.step()
    for name, p in m.named_parameters():
        np.testing.assert_array_equal(p.view(before[name].dtype), before[name], err_msg=name)
    for name, s in opt.state.items():
        for k, v in s.items():
            np.testing.assert_array_equal(v, state[name][k], err_msg=f"{name} {k}")


# ============================================================================
# an argument reshaped in place by another argument's conversion (a review helper,
# 2026-11-24): the C layer read q's sizes, then ran the mask's __array__ (or a window
# side's __index__), then read q's strides from the same object, reshaped meanwhile:
# reads and writes out of bounds, a segfault. Each call now reads its own view.


def test_an_argument_reshaped_by_a_later_ones_conversion_is_computed_as_given():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 400, 8)).astype(np.float32)
    k = rng.standard_normal((1, 400, 8)).astype(np.float32)
    given = q.copy()
    expected = ref_attend(given, k, k, 1 / np.sqrt(8))[0]

    class ReshapesQ:
        def __array__(self, dtype=None, copy=None):
            q.shape = (1, 1, 3200)  # the same data, another geometry
            return np.ones((1, 400), bool)

    assert_close(F.scaled_dot_product_attention(q, k, k, attn_mask=ReshapesQ()), expected, np.float32)
    q.shape = given.shape

    class GivesQ:  # q reaches the call through another object's __array__
        def __array__(self, dtype=None, copy=None):
            return q

    assert_close(F.scaled_dot_product_attention(GivesQ(), k, k, attn_mask=ReshapesQ()), expected, np.float32)
    q.shape = given.shape

    class SideReshapesQ:
        def __index__(self):
            q.shape = (1, 1, 3200)
            return 500  # wider than the sequence: every key

    assert_close(F.scaled_dot_product_attention(q, k, k, window=(SideReshapesQ(), None)), expected, np.float32)
    q.shape = given.shape

    w = rng.standard_normal((6, 8)).astype(np.float32)

    class BiasReshapesX:
        def __array__(self, dtype=None, copy=None):
            q.shape = (3200,)
            return np.zeros(6, np.float32)

    assert_close(F.linear(q, w, BiasReshapesX()), given.astype(np.float64) @ w.T.astype(np.float64), np.float32)
    q.shape = given.shape


def test_a_module_input_reshaped_by_the_masks_conversion_is_computed_as_given():
    m = attnc.SelfAttentionV3(8, dropout_rate=0.0, rng=np.random.default_rng(1)).eval()
    x = np.random.default_rng(2).standard_normal((64, 4, 8)).astype(np.float32)
    given = x.copy()
    keep = np.ones((4, 4), bool)

    class ReshapesX:
        def __array__(self, dtype=None, copy=None):
            x.shape = (2048,)  # the output was sized from this shape: (8,), 2048 floats written
            return keep

    out = m(x, ReshapesX())
    assert out.shape == (64, 4, 8)
    assert_close(out, ref_module(m, given, keep)[0], np.float32)


def test_an_index_that_raises_reaches_the_caller_from_every_integer_argument():
    """seed replaced the exception an __index__ raised by "seed: expected an integer"
    (window and axis let it through); now every integer argument lets it through."""
    class Broken:
        def __index__(self):
            raise RuntimeError("broken __index__")

    q = np.ones((2, 3))
    for call in (lambda: F.scaled_dot_product_attention(q, q, q, dropout_p=0.5, seed=Broken()),
                 lambda: F.scaled_dot_product_attention(q, q, q, window=(Broken(), 1)),
                 lambda: F.softmax(q, axis=Broken())):
        with pytest.raises(RuntimeError, match="broken __index__"):
            call()


@pytest.mark.parametrize("error", [KeyboardInterrupt, MemoryError, LookupError])
def test_an_error_raised_while_a_number_or_window_is_read_reaches_the_caller(error):
    """The C layer read a number argument's `dtype` (to refuse bools and
    complex numbers) and cleared whatever reading it raised: a Ctrl-C
    landing in a `dtype` property was lost and the call ran to the end
    (a review helper reproduced it with SIGINT). A window whose items raise
    became "window: expected None or a pair", Ctrl-C and MemoryError
    included. Both now let the error through."""
    class RaisingDtype:  # a number whose dtype is computed in Python
        @property
        def dtype(self):
            raise error("raised reading dtype")

        def __float__(self):
            return 0.5

        def __index__(self):
            return 1

    class RaisingItems:
        def __len__(self):
            return 2

        def __getitem__(self, i):
            raise error("raised reading the window")

    q = np.ones((1, 2, 4, 8), np.float32)
    calls = {"scale": lambda: F.scaled_dot_product_attention(q, q, q, scale=RaisingDtype()),
             "dropout_p": lambda: F.scaled_dot_product_attention(q, q, q, dropout_p=RaisingDtype(), seed=0),
             "seed": lambda: F.scaled_dot_product_attention(q, q, q, dropout_p=0.5, seed=RaisingDtype()),
             "axis": lambda: F.softmax(q, axis=RaisingDtype()),
             "threads": lambda: attnc.set_num_threads(RaisingDtype()),
             "Dropout": lambda: attnc.Dropout(RaisingDtype()),
             "window": lambda: F.scaled_dot_product_attention(q, q, q, window=RaisingItems())}
    threads = attnc.get_num_threads()
    try:
        for name, call in calls.items():
            with pytest.raises(error) as info:
                call()
            assert "raised reading" in str(info.value), name
    finally:
        attnc.set_num_threads(threads)


def test_a_number_argument_whose_conversion_raises_keeps_that_error_as_the_cause():
    """__float__'s own ValueError or TypeError became "scale: expected a finite
    number" with no trace of it; the TypeError naming the argument now has it
    as its __cause__."""
    class Uncalibrated:
        def __float__(self):
            raise ValueError("not calibrated yet")

    q = np.ones((2, 3))
    with pytest.raises(TypeError, match="^scale:") as info:
        F.scaled_dot_product_attention(q, q, q, scale=Uncalibrated())
    assert isinstance(info.value.__cause__, ValueError) and "not calibrated" in str(info.value.__cause__)


def test_backward_takes_as_many_batch_axes_as_the_forward():
    """np.broadcast_shapes (32 axes at most) refused 33 batch axes in the backward, which
    the forward takes (a review helper, 2026-11-24)."""
    rng = np.random.default_rng(3)
    for gqa, kv_heads in ((False, 4), (True, 2)):
        q = rng.standard_normal((1,) * 33 + (4, 3, 8))
        k = rng.standard_normal((1,) * 33 + (kv_heads, 3, 8))
        out, lse = F.scaled_dot_product_attention(q, k, k, return_lse=True, enable_gqa=gqa)
        g = rng.standard_normal(out.shape)
        grads = F.scaled_dot_product_attention_backward(g, q, k, k, out, lse, enable_gqa=gqa)
        flat = F.scaled_dot_product_attention_backward(g.reshape(4, 3, 8), q.reshape(4, 3, 8),
                                                       k.reshape(kv_heads, 3, 8), k.reshape(kv_heads, 3, 8),
                                                       out.reshape(4, 3, 8), lse.reshape(4, 3), enable_gqa=gqa)
        for got, alone, given in zip(grads, flat, (q, k, k)):
            assert got.shape == given.shape
            np.testing.assert_array_equal(got.reshape(alone.shape), alone)


class _ChangesEachRead:
    """An array_like whose __array__ gives `first`, then `later` on every other read."""

    def __init__(self, first, later):
        self.reads, self.first, self.later = 0, first, later

    def __array__(self, dtype=None, copy=None):
        self.reads += 1
        return self.first if self.reads == 1 else self.later


def test_a_training_forward_reads_its_mask_and_input_once():
    """The attention modules' training forward read attention_mask once for the
    output and again for the backward's copy (Linear read x twice alike): an
    __array__ that changes gave gradients of another mask or input, silently
    (a robustness review, 2026-11-24). The oracle: the same calls with the
    first read's values as plain arrays."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, DIM))
    keep = rng.random((5, 5)) < 0.6
    np.fill_diagonal(keep, True)
    grad = rng.standard_normal((2, 5, DIM))
    results = []
    for mask in (_ChangesEachRead(keep, ~keep), keep):
        net = attnc.SelfAttentionV3(DIM, dropout_rate=0.0, dtype=np.float64, rng=np.random.default_rng(1))
        out = net(x, mask)
        results.append((out, net.backward(grad), dict(net.named_grads())))
    changing, plain = results
    np.testing.assert_array_equal(changing[0], plain[0])
    np.testing.assert_array_equal(changing[1], plain[1])
    for key, value in plain[2].items():
        np.testing.assert_array_equal(changing[2][key], value, err_msg=key)

    x2 = rng.standard_normal((3, DIM))
    results = []
    for given in (_ChangesEachRead(x2, 100 * x2), x2):
        layer = attnc.Linear(DIM, 2, dtype=np.float64, rng=np.random.default_rng(2))
        out = layer(given)
        results.append((out, layer.backward(np.ones_like(out)), dict(layer.named_grads())))
    changing, plain = results
    np.testing.assert_array_equal(changing[0], plain[0])
    np.testing.assert_array_equal(changing[1], plain[1])
    np.testing.assert_array_equal(changing[2]["weight"], plain[2]["weight"])


def test_a_training_forward_keeps_a_broadcast_mask_at_its_own_size():
    """The training forward kept np.array(mask, copy=True): a mask broadcast over
    the batch was kept expanded, 256 MiB for 4 MiB of data in the review's case
    (2026-11-24). NumPy reports its allocations to tracemalloc: the forward's
    peak stays below the expanded mask's size. The kept values are the mask's
    (the gradient matches the one given the expanded mask)."""
    import tracemalloc

    rng = np.random.default_rng(0)
    batch, seq = 64, 256
    own = np.tril(np.ones((seq, seq), bool))
    broadcast = np.broadcast_to(own, (batch, 1, seq, seq))
    x = rng.standard_normal((batch, seq, DIM)).astype(np.float32)
    net = attnc.MultiHeadAttention(DIM, 2, dropout=0.0, rng=np.random.default_rng(1))
    tracemalloc.start()
    try:
        out = net(x, broadcast)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < broadcast.size // 2, (peak, broadcast.size)  # the expanded bool mask: 4 MiB
    grad_x = net.backward(np.ones_like(out))
    net.zero_grad()
    out_expanded = net(x, np.array(broadcast))
    np.testing.assert_array_equal(out, out_expanded)
    np.testing.assert_array_equal(grad_x, net.backward(np.ones_like(out)))


@pytest.mark.parametrize("call, name", [
    (lambda q: F.scaled_dot_product_attention_backward(q, q, [[1.0], [1.0, 2.0]], q, q, np.zeros(2)), "key"),
    (lambda q: F.scaled_dot_product_attention(q[None], [[[1.0], [1.0, 2.0]]], q[None], enable_gqa=True), "key"),
    (lambda q: F.scaled_dot_product_attention(q[None], q[None], q[None], attn_mask=[[[1.0], [1.0, 2.0]]],
                                              enable_gqa=True), "attn_mask"),
    (lambda q: attnc.nn.MultiheadAttention(2, 1)(q, q, q, attn_mask=[[True], [True, False]]), "attn_mask"),
    (lambda q: attnc.nn.MultiheadAttention(2, 1)(q, q, q, key_padding_mask=[[True], [True, False]]),
     "key_padding_mask"),
    (lambda q: attnc.SelfAttentionV3(2)(q, [[True], [True, False]]), "attention_mask"),
    (lambda q: attnc.Linear(2, 2)([[1.0], [1.0, 2.0]]), "x"),
], ids=["backward key", "gqa key", "gqa attn_mask", "nn.MultiheadAttention attn_mask",
        "nn.MultiheadAttention key_padding_mask", "training module mask", "training Linear x"])
def test_a_ragged_argument_is_named_on_every_path(call, name):
    """Converted in Python (the backward, grouped-query attention, nn.MultiheadAttention's
    masks), a ragged list raised NumPy's message alone (a robustness review, 2026-11-24);
    a training forward's mask and Linear's x, converted in Python since then, are checked
    too (the C layer named them before)."""
    with pytest.raises(ValueError) as info:
        call(np.ones((2, 2)))
    assert str(info.value).startswith(name + ":"), str(info.value)


@pytest.mark.parametrize("name", ["query", "key", "attn_mask"])
def test_gqa_on_as_many_axes_as_numpy_allows_names_the_argument(name):
    """Grouped-query attention views its arguments with one more axis; on 64 axes (NumPy's
    limit) that raised NumPy's "maximum supported dimension" naming nothing (a review
    helper, 2026-11-28). Now the argument is named, and all of them on one axis fewer work
    (float64 oracle)."""
    q, k = np.ones((4, 3, 8), np.float32), np.ones((2, 5, 8), np.float32)
    mask = np.ones((4, 3, 5), bool)
    arrays = {"query": q, "key": k, "attn_mask": mask}
    deep = dict(arrays)
    deep[name] = arrays[name].reshape((1,) * (64 - arrays[name].ndim) + arrays[name].shape)
    # (a mask on more axes than the scores does not broadcast to them, as without grouping)
    expected = (r"attn_mask: shape \(1, 1, .* does not broadcast to the scores' shape \(4, 3, 5\)"
                if name == "attn_mask" else f"{name}: enable_gqa views it with its heads axis split in two")
    with pytest.raises(ValueError, match="^" + expected):
        F.scaled_dot_product_attention(deep["query"], deep["key"], deep["key"] if name == "key" else k,
                                       attn_mask=deep["attn_mask"], enable_gqa=True)
    fewer = {key: a.reshape((1,) * (63 - a.ndim) + a.shape) for key, a in arrays.items()}  # all on 63 axes
    out = F.scaled_dot_product_attention(fewer["query"], fewer["key"], fewer["key"], attn_mask=fewer["attn_mask"],
                                         enable_gqa=True)
    ref, _ = ref_attend(q, np.repeat(k, 2, axis=0), np.repeat(k, 2, axis=0), 1 / np.sqrt(8), mask)
    assert_close(out.reshape(ref.shape), ref, np.float32, "out")


@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
def test_a_deleted_parameter_is_named_by_its_key_and_can_be_restored(model):
    """After `del` of a submodule's parameter the forward raised Python's
    "'Linear' object has no attribute 'weight'", which does not say which
    Linear (an API review, 2026-11-24): now its state_dict key."""
    m = make_module(model.name, DIM).eval()
    x = _x()
    before = m(x)
    for key, value in list(m.named_parameters()):
        owner, name = _owner(m, key)
        delattr(owner, name)
        with pytest.raises(AttributeError, match=f"^{re.escape(key)}: the parameter was deleted"):
            m(x)
        # (the walkers too: named_parameters, zero_grad and state_dict had raised Python's
        # "'Linear' object has no attribute 'bias'", naming no key; a review, 2026-11-29)
        for walk in (lambda: list(m.named_parameters()), m.zero_grad, m.state_dict):
            with pytest.raises(AttributeError, match=f"^{re.escape(key)}: the parameter was deleted"):
                walk()
        setattr(owner, name, value)
        np.testing.assert_array_equal(m(x), before)


@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
def test_a_parameter_deleted_between_forward_and_backward_is_named(model):
    """The backward raised Python's "'Linear' object has no attribute 'weight'"
    (a review, 2026-11-30): now a RuntimeError naming the key, the forward's state
    kept, so that once the parameter is assigned again the backward runs."""
    m = make_module(model.name, DIM).train()
    twin = copy.deepcopy(m)
    x = _x()
    g = np.ones_like(m(x))
    twin(x)
    expected = twin.backward(g)
    for key, value in list(m.named_parameters()):
        owner, name = _owner(m, key)
        delattr(owner, name)
        with pytest.raises(RuntimeError, match=f"^{re.escape(key)}: the parameter was deleted after the forward"):
            m.backward(g)
        setattr(owner, name, value)
    np.testing.assert_array_equal(m.backward(g), expected)


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_a_linear_weight_set_to_none_is_named(training):
    """(It raised "weight: unsupported dtype dtype('O')", where the attention classes
    say what they expected; a review, 2026-11-30.)"""
    layer = attnc.Linear(3, 2).train(training)
    layer.weight = None
    with pytest.raises(TypeError, match=r"^weight: expected an array of shape \(out_features, in_features\), got None"):
        layer(np.ones((2, 3)))


def test_an_arrays_own_error_subclass_reaches_the_caller_as_raised():
    """Naming the argument rebuilt the exception as type(error)(message), which fails
    for a subclass taking other arguments (JSONDecodeError became a TypeError about
    its constructor; a review, 2026-11-24): a subclass now passes through as raised."""
    import json

    class Raises:
        def __array__(self, dtype=None, copy=None):
            raise json.JSONDecodeError("bad", "doc", 0)

    q = np.ones((2, 3))
    with pytest.raises(json.JSONDecodeError):
        F.scaled_dot_product_attention_backward(q, Raises(), q, q, q, np.zeros(2))
    with pytest.raises(json.JSONDecodeError):
        attnc.Linear(3, 2)(Raises())


# ============================================================================
# a fuzzing review (2026-11-25): a self-overlapping parameter, gradient buffers
# changed in place, a swap through load_state_dict, flags without a truth value,
# and errors that named an internal argument or none


def _trained(seed=4):
    """A SelfAttentionV3 after one training-mode forward and backward, its input and gradient."""
    m = attnc.SelfAttentionV3(8, dropout_rate=0.0, rng=np.random.default_rng(seed))
    x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    g = np.random.default_rng(1).standard_normal((2, 5, 8)).astype(np.float32)
    m(x)
    m.backward(g)
    return m, x, g


@pytest.mark.parametrize("optimizer", ["SGD", "AdamW"])
def test_optimizer_step_refuses_a_parameter_whose_elements_share_memory(optimizer):
    """A weight whose rows share memory (stride 0; set in place, as unpickling or
    `strides` would) was updated row after row by step(), every row ending as the last
    one's update: now ValueError naming it, nothing updated. A strided weight whose
    elements are distinct is still updated in place, as a contiguous one is."""
    m, _, _ = _trained()
    opt = getattr(attnc.optim, optimizer)(m, lr=0.1)
    weight = m.output_proj.weight
    m.output_proj.__dict__["weight"] = np.lib.stride_tricks.as_strided(weight, shape=weight.shape,
                                                                        strides=(0, weight.itemsize), writeable=True)
    before = {name: p.copy() for name, p in m.named_parameters()}
    with pytest.raises(ValueError, match=r"^output_proj\.weight: step\(\) updates parameters in place: expected an "
                                         r"array whose elements cannot share memory"):
        opt.step()
    for name, p in m.named_parameters():
        np.testing.assert_array_equal(p, before[name], err_msg=name)
    # distinct elements in a column-major layout: updated in place, as the contiguous twin
    twin, _, _ = _trained()
    column_major = np.asfortranarray(weight)
    m.output_proj.__dict__["weight"] = column_major
    twin.output_proj.weight[...] = weight
    getattr(attnc.optim, optimizer)(twin, lr=0.1).step()
    opt.step()
    assert m.output_proj.weight is column_major
    np.testing.assert_array_equal(column_major, twin.output_proj.weight)


@pytest.mark.parametrize("change", ["shape", "dtype", "read-only"])
def test_a_gradient_buffer_changed_in_place_is_named_and_zero_grad_renews_it(change):
    """A gradient buffer reshaped or retyped in place was silently replaced by zeros
    (its gradient lost) at the next step or backward; now they raise ValueError naming
    its parameter, and zero_grad gives it a new buffer."""
    m, x, g = _trained()
    reference, _, _ = _trained()
    opt = attnc.optim.SGD(m, lr=0.1)
    buffer = dict(m.named_grads())["proj.weight"]
    if change == "shape":
        buffer.shape = (buffer.size,)
    elif change == "dtype":
        buffer.dtype = np.int32
    else:
        buffer.setflags(write=False)
    before = {name: p.copy() for name, p in m.named_parameters()}
    pattern = r"^proj\.weight: its gradient buffer was changed in place"
    with pytest.raises(ValueError, match=pattern):
        opt.step()
    with pytest.raises(ValueError, match=pattern):
        dict(m.named_grads())
    m(x)
    with pytest.raises(ValueError, match=pattern):
        m.backward(g)
    for name, p in m.named_parameters():
        np.testing.assert_array_equal(p, before[name], err_msg=name)
    m.zero_grad()
    reference.zero_grad()
    m.backward(g)
    reference(x)
    reference.backward(g)
    for (name, got), (_, expected) in zip(m.named_grads(), reference.named_grads()):
        assert got.shape == expected.shape and got.dtype == expected.dtype, name
        np.testing.assert_array_equal(got, expected, err_msg=name)


def test_gradient_buffers_unpickled_from_read_only_buffers_keep_accumulating():
    """Unpickled with out-of-band (read-only) buffers, a module's gradient buffers are
    writable again: a second backward adds to the first, as it does on the original."""
    m, x, g = _trained()
    buffers = []
    loaded = pickle.loads(pickle.dumps(m, protocol=5, buffer_callback=buffers.append),
                          buffers=[bytes(b.raw()) for b in buffers])
    first = {name: grad.copy() for name, grad in loaded.named_grads()}
    assert any(grad.any() for grad in first.values())
    loaded(x)
    loaded.backward(g)
    for name, grad in loaded.named_grads():
        np.testing.assert_array_equal(grad, 2 * first[name], err_msg=name)


@pytest.mark.parametrize("kind", ["bytes", "unaligned", "in band"])
def test_a_gradient_buffer_copy_copy_shared_stays_shared_through_pickle(kind):
    """API.md: copy.copy shares the gradient buffers, and pickling keeps them. Regression,
    a persistence audit, 2026-12-06: a module and its copy.copy pickled together from
    read-only out-of-band buffers each made its own writable copy of the buffers they
    shared, so a backward of one no longer showed in the other. The oracle: the same
    backward on the original pair (in band, as before). A Linear: its own parameters'
    buffers are the ones copy.copy shares (a larger module shares its submodules)."""
    m = attnc.Linear(8, 4, rng=np.random.default_rng(5))
    x, g = np.ones((2, 8), np.float32), np.arange(8, dtype=np.float32).reshape(2, 4)
    m(x)
    m.backward(g)
    shallow = copy.copy(m)
    buffers = []
    if kind == "in band":
        loaded, loaded_copy = pickle.loads(pickle.dumps((m, shallow), protocol=5))
    else:
        loaded, loaded_copy = pickle.loads(pickle.dumps((m, shallow), protocol=5, buffer_callback=buffers.append),
                                           buffers=_buffers(kind, buffers))
    for model in (m, loaded):
        model(x)
        model.backward(g)
    expected = dict(shallow.named_grads())
    for name, grad in loaded_copy.named_grads():
        assert grad is dict(loaded.named_grads())[name], name
        np.testing.assert_array_equal(grad, expected[name], err_msg=name)


@pytest.mark.parametrize("optimizer", ["SGD", "AdamW"])
def test_an_optimizer_unpickled_from_read_only_buffers_steps_on(optimizer):
    """Regression, a persistence audit, 2026-12-06: unpickled with read-only out-of-band
    buffers, a module's arrays were made writable again but an optimizer's state was not,
    and its next step() refused its own momentum. The oracle: the same steps on the
    original pair, bit for bit."""
    m, x, g = _trained()
    make = {"SGD": lambda mod: attnc.optim.SGD(mod, lr=0.1, momentum=0.9),
            "AdamW": lambda mod: attnc.optim.AdamW(mod, lr=0.01)}[optimizer]
    opt = make(m)
    opt.step()
    buffers = []
    loaded, loaded_opt = pickle.loads(pickle.dumps((m, opt), protocol=5, buffer_callback=buffers.append),
                                      buffers=[bytes(b.raw()) for b in buffers])
    assert loaded_opt.module is loaded
    for model, o in ((m, opt), (loaded, loaded_opt)):
        model(x)
        model.backward(g)
        o.step()
    for (name, want), (_, got) in zip(m.named_parameters(), loaded.named_parameters()):
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_load_state_dict_swaps_parameters_given_as_the_modules_own_arrays():
    """Values were copied in one at a time, so a swap given as the live arrays read one
    already overwritten: both ended as the old K weight."""
    m = attnc.SelfAttentionV1(DIM, rng=np.random.default_rng(2))
    q, k = m.Q_proj.weight.copy(), m.K_proj.weight.copy()
    values = m.state_dict()
    values["Q_proj.weight"], values["K_proj.weight"] = m.K_proj.weight, m.Q_proj.weight
    m.load_state_dict(values)
    np.testing.assert_array_equal(m.Q_proj.weight, k)
    np.testing.assert_array_equal(m.K_proj.weight, q)


class _NoTruth:
    """An object whose truth raises a subclass of ValueError that takes other arguments."""

    def __bool__(self):
        import json
        raise json.JSONDecodeError("no truth", "doc", 0)


def _flag_calls(flag):
    q = np.ones((1, 2, 3, 4), np.float32)
    out, lse = F.scaled_dot_product_attention(q, q, q, return_lse=True)
    x = np.ones((3, 2, 8), np.float32)
    mha = attnc.nn.MultiheadAttention(8, 2)
    return [
        ("is_causal", lambda: F.scaled_dot_product_attention(q, q, q, is_causal=flag)),
        ("return_weights", lambda: F.scaled_dot_product_attention(q, q, q, return_weights=flag)),
        ("return_lse", lambda: F.scaled_dot_product_attention(q, q, q, return_lse=flag)),
        ("enable_gqa", lambda: F.scaled_dot_product_attention(q, q, q, enable_gqa=flag)),
        ("is_causal", lambda: F.scaled_dot_product_attention_backward(q, q, q, q, out, lse, is_causal=flag)),
        ("need_bias_grad", lambda: F.linear_backward(np.ones((2, 3)), np.ones((2, 4)), np.ones((3, 4)),
                                                     need_bias_grad=flag)),
        ("need_weights", lambda: mha(x, x, x, need_weights=flag)),
        ("average_attn_weights", lambda: mha(x, x, x, average_attn_weights=flag)),
        ("is_causal", lambda: mha(x, x, x, is_causal=flag, attn_mask=np.zeros((3, 3), bool))),
        ("batch_first", lambda: setattr(mha, "batch_first", flag)),
        ("add_zero_attn", lambda: setattr(mha, "add_zero_attn", flag)),
        ("mode", lambda: mha.train(flag)),
        ("strict", lambda: mha.load_state_dict(mha.state_dict(), strict=flag)),
        ("remove_duplicate", lambda: list(mha.named_parameters(remove_duplicate=flag))),
        ("remove_duplicate", lambda: list(mha.named_grads(remove_duplicate=flag))),
        ("return_weights", lambda: attnc.SelfAttentionV1(8)(x, return_weights=flag)),
        ("return_weights", lambda: attnc.MultiHeadAttention(8, 2).eval()(x, return_weights=flag)),
        ("bias", lambda: attnc.Linear(8, 2, bias=flag)),
        ("bias", lambda: attnc.SelfAttention(8, 4, 4, bias=flag)),
        ("bias", lambda: attnc.nn.MultiheadAttention(8, 2, bias=flag)),
        ("add_bias_kv", lambda: attnc.nn.MultiheadAttention(8, 2, add_bias_kv=flag)),
    ]


def test_a_flag_without_a_truth_value_is_named():
    """A bool argument given an array of several elements raised NumPy's "truth value
    ... is ambiguous" naming nothing; an error of a subclass passes through as raised."""
    import json
    for name, call in _flag_calls(np.array([True, False])):
        with pytest.raises(ValueError, match=f"^{name}: The truth value of an array"):
            call()
    for name, call in _flag_calls(_NoTruth()):
        with pytest.raises(json.JSONDecodeError):
            call()


def test_multihead_flags_set_after_construction_are_kept_as_bools():
    """add_zero_attn = 2 was added to a key count (two zero keys where the mask had one
    column); "no" failed inside the forward with a TypeError: both are now True, as
    the constructor takes them, and the forward matches the module built with True."""
    x = np.random.default_rng(3).standard_normal((3, 2, 8)).astype(np.float32)
    padding = np.array([[False, False, True], [False, False, False]])
    expected = attnc.nn.MultiheadAttention(8, 2, add_zero_attn=True, rng=np.random.default_rng(5)).eval()
    for value in (2, "no"):
        m = attnc.nn.MultiheadAttention(8, 2, rng=np.random.default_rng(5)).eval()
        m.add_zero_attn = value
        assert m.add_zero_attn is True
        for got, want in zip(m(x, x, x, key_padding_mask=padding), expected(x, x, x, key_padding_mask=padding)):
            np.testing.assert_array_equal(got, want)


def test_errors_that_named_an_internal_argument_or_none():
    x = np.ones((1, 3, 8), np.float32)
    m = attnc.MultiHeadAttention(8, 2)
    out = m(x)
    m.dtype = np.float64
    with pytest.raises(ValueError, match="^dtype: the module's dtype changed after the forward"):
        m.backward(np.ones_like(out))
    m = attnc.MultiHeadAttention(8, 2)
    with pytest.raises(TypeError, match="^query_linear: expected a Linear, got Dropout"):
        m.query_linear = attnc.Dropout(0.1)  # (refused where it enters: test_module_api.py)
    m = attnc.nn.MultiheadAttention(8, 2)
    m.out_proj = attnc.Dropout(0.1)  # (torch's module reads out_proj's weight too, and takes any module here)
    with pytest.raises(AttributeError, match="^out_proj.weight: out_proj is now a Dropout"):
        m(x, x, x)
    m = attnc.MultiHeadAttention(8, 2, 0.1)
    m.dropout = attnc.Linear(2, 2)
    with pytest.raises(TypeError, match="^dropout: expected a Dropout, got Linear"):
        m(x)
    m = attnc.SelfAttentionV3(8, 0.1)
    m.attention_dropout = attnc.Linear(2, 2)
    with pytest.raises(TypeError, match="^attention_dropout: expected a Dropout, got Linear"):
        m(x)
    for value in (None, [("weight", 1)]):
        with pytest.raises(TypeError, match="^state_dict: expected a mapping"):
            attnc.Linear(2, 2).load_state_dict(value)


@pytest.mark.parametrize("make, sizes", [
    (lambda: attnc.Linear(10 ** 12, 10 ** 12), "out_features, in_features"),
    (lambda: attnc.Linear(0, 10 ** 19), "out_features, in_features"),  # an empty weight NumPy still refuses
    (lambda: attnc.SelfAttentionV1(10 ** 12), "hidden_dim"),
    (lambda: attnc.SelfAttentionV2(10 ** 12), "dim"),
    (lambda: attnc.SelfAttentionV3(10 ** 12), "dim"),
    (lambda: attnc.MultiHeadAttention(2 ** 40, 1), "hidden_dim"),
    (lambda: attnc.SelfAttention(2, 2 ** 62, 2), "dim_in, dim_k, dim_v"),
    (lambda: attnc.MultiHeadSelfAttention(2, 2 ** 62, 8, num_heads=2), "dim_in, dim_k, dim_v"),
    (lambda: attnc.nn.MultiheadAttention(2 ** 40, 1), "embed_dim"),
    (lambda: attnc.nn.MultiheadAttention(8, 2, kdim=2 ** 62), "embed_dim, kdim"),
    (lambda: attnc.nn.MultiheadAttention(8, 2, vdim=2 ** 62), "embed_dim, vdim"),
    # past any float (regression, fuzzing: the init's scale raised a bare OverflowError first)
    (lambda: attnc.Linear(2 ** 1024, 2), "out_features, in_features"),
    (lambda: attnc.SelfAttentionV1(2 ** 1024), "hidden_dim"),
    (lambda: attnc.MultiHeadAttention(2 ** 1024, 1), "hidden_dim"),
    (lambda: attnc.nn.MultiheadAttention(2 ** 1024, 1), "embed_dim"),
    (lambda: attnc.nn.MultiheadAttention(8, 1, kdim=2 ** 1024), "embed_dim, kdim"),
], ids=["linear", "linear-no-inputs", "V1", "V2", "V3", "document-mha", "self-attention", "mhsa", "nn-mha",
        "nn-mha-kdim", "nn-mha-vdim", "linear-past-float", "V1-past-float", "document-mha-past-float",
        "nn-mha-past-float", "nn-mha-kdim-past-float"])
def test_sizes_too_big_for_any_parameter_are_named(make, sizes):
    """SelfAttentionV1(10**12) raised NumPy's "array is too big", naming nothing (a
    fuzzing review, 2026-11-25): the constructor's own arguments that asked for the
    parameter now come first (a module's, not its Linear layers' "out_features,
    in_features"), and a Linear made afterwards names its own again."""
    with pytest.raises(ValueError, match=f"^{re.escape(sizes)}: no parameter of shape"):
        make()
    with pytest.raises(ValueError, match="^out_features, in_features: no parameter of shape"):
        attnc.Linear(10 ** 12, 10 ** 12)


@pytest.mark.parametrize("make", [lambda: attnc.MultiHeadAttention(12, 3), lambda: attnc.nn.MultiheadAttention(12, 3),
                                  lambda: attnc.SelfAttentionV4(12)], ids=["document-mha", "nn-mha", "V4"])
def test_training_takes_the_truth_of_what_is_assigned(make):
    """`module.training = np.array([1, 2])` (no truth value) was stored, and the next
    forward raised NumPy's "truth value ... ambiguous" naming nothing (a fuzzing review,
    2026-11-29): the assignment raises naming `training`, as train(mode) names `mode`,
    the mode unchanged; a value with a truth is stored as that bool, and the forward
    runs in that mode (oracle: the same module switched by eval() / train())."""
    module = make()
    x = np.random.default_rng(0).standard_normal((2, 5, 12)).astype(np.float32)
    inputs = (x, x, x) if isinstance(module, attnc.nn.MultiheadAttention) else (x,)
    for target in (module, attnc.Dropout(0.5)):
        with pytest.raises(ValueError, match="^training: The truth value"):
            target.training = np.array([1, 2])
        assert target.training is True
        target.training = np.float64(0.0)
        assert target.training is False
    module.training = np.array(0)
    assert module.training is False
    module.eval()  # the submodules too (assigning `training` sets the attribute alone, as torch's)
    module.training = np.array([True])
    assert module.training is True
    module.training = np.array(0)
    reference = make()
    reference.load_state_dict(module.state_dict())
    got, expected = module(*inputs), reference.eval()(*inputs)
    for a, b in zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple) else (expected,)):
        if a is not None:
            np.testing.assert_array_equal(a, b)


def test_parameters_too_big_to_allocate_raise_a_named_memory_error():
    """An array NumPy can describe but not allocate keeps NumPy's MemoryError, with
    the constructor's sizes in front (the allocation's failure is planted: a
    real one would need more memory than CI's machine refuses outright)."""
    def refuse(shape):
        raise MemoryError(f"Unable to allocate an array with shape {shape}")

    with pytest.raises(MemoryError, match=r"^out_features, in_features: no parameter of shape \(2, 3\) can be made "
                                          r"\(Unable to allocate"):
        _initial_values(refuse, (2, 3), "out_features, in_features", np.float32)
    with _sized_by("dim_in, dim_k, dim_v"), pytest.raises(MemoryError, match=r"^dim_in, dim_k, dim_v: no parameter"):
        _initial_values(refuse, (2, 3), "out_features, in_features", np.float32)


# ============================================================================
# memory a callback could free or resize during a call (a C audit's findings)


def test_backward_holds_the_kept_arrays_against_a_resize():
    """Regression (C audit): self_attention_backward read the forward's kept arrays through
    the saved tuple's borrowed items, and grad_output's conversion could resize them (only
    the tuple held them, so refcheck passed): a segfault. It now holds views of them."""
    net = attnc.SelfAttentionV1(8, rng=np.random.default_rng(4))
    x = np.random.default_rng(5).standard_normal((2, 64, 8)).astype(np.float32)
    out = net(x)
    saved, params, mask, p = net._saved[0]
    grad = np.random.default_rng(6).standard_normal(out.shape).astype(np.float32)
    refused = []

    class ResizesTheKeptQKV:
        def __array__(self, dtype=None, copy=None):
            try:
                saved[1].resize((1,), refcheck=True)
            except ValueError:
                refused.append(True)
            return grad

    def backward(grad_output):
        return attnc._C.self_attention_backward(grad_output, saved, params=params, spec=net._spec,
                                                attention_mask=mask, dtype=net.dtype, dropout_p=p)

    got = backward(ResizesTheKeptQKV())
    assert refused == [True]
    for a, b in zip(got, backward(grad)):
        np.testing.assert_array_equal(a, b)
    reference = attnc.SelfAttentionV1(8, rng=np.random.default_rng(4))
    reference(x)
    np.testing.assert_array_equal(got[0], reference.backward(grad))  # the public backward's bits


def test_a_parameter_that_is_a_view_holds_its_owner_during_the_call():
    """Regression (C audit): a module's parameter used in place was held by itself only; a
    parameter that is a view of another array left that array free to be resized by x's
    __array__ during the call (freed memory read: wrong results, or a segfault)."""
    net = attnc.SelfAttentionV1(64, rng=np.random.default_rng(7)).eval()
    plain = np.random.default_rng(8).standard_normal((2, 16, 64)).astype(np.float32)
    expected = net(plain)
    owner = np.zeros((128, 64), np.float32)
    owner[:64] = net.Q_proj.weight
    net.Q_proj.weight = owner[:64]
    del owner
    assert net.Q_proj.weight.base is not None  # used in place, not converted
    refused = []

    class ResizesTheOwner:
        def __array__(self, dtype=None, copy=None):
            try:
                net.Q_proj.weight.base.resize((1,), refcheck=True)
            except ValueError:
                refused.append(True)
            return plain

    np.testing.assert_array_equal(net(ResizesTheOwner()), expected)
    assert refused == [True]


def test_commit_keeps_its_items_while_copying():
    """Regression (C audit): commit (then commit_sums) read its lists' borrowed items across the copies,
    which can run other code (an object array's __del__ here) that empties the lists: a
    segfault. It now reads tuples of its own."""
    targets, sums = [], []

    class EmptiesTheLists:
        def __del__(self):
            targets.clear()
            sums.clear()

    first, second = np.empty(1, object), np.empty(1, object)
    first[0] = EmptiesTheLists()
    targets += [first, second]
    sums += [np.array([1], object), np.array([2], object)]
    owner = types.SimpleNamespace(_saved="kept")
    attnc._C.commit(targets, sums, [(owner, "_saved", None)])
    assert (first[0], second[0], owner._saved) == (1, 2, None)


def test_result_dtype_reads_its_arguments_as_given():
    """Regression (C audit): result_dtype walked its keyword dict while converting the values
    (user code), and wrote one slot a key into a stack array of 8: an __array__ that grew the
    dict wrote past it (a segfault). It now walks (name, value) pairs of its own."""
    import gc

    class GrowsTheDict:
        def __array__(self, dtype=None, copy=None):
            for found in gc.get_objects():
                if type(found) is dict and "marker_a" in found and len(found) < 40:
                    for k in range(30):
                        found[f"extra{k}"] = np.ones(3, np.float64)
            return np.ones(3, np.float16)

    assert attnc._C.result_dtype(marker_a=GrowsTheDict(), marker_b=np.ones(2, np.float16)) == np.float16


@pytest.mark.parametrize("heads_axis, heads, ok", [(False, 8, False), (False, 1, True), (True, 8, True), (True, 1, True)])
def test_self_attention_spec_without_a_heads_axis_for_several_heads_is_refused(heads_axis, heads, ok):
    """Regression (fuzzing): attnc._C.self_attention took a spec of several heads without a
    heads axis: the weights were allocated without it and the kernel wrote every head's
    (a heap overflow: "double free or corruption", or a segfault). One head without the
    axis, or any count with it, is a description the modules use: the weights against
    float64 NumPy's attention of the same projections."""
    rng = np.random.default_rng(41)
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    w = [rng.standard_normal((16, 16)).astype(np.float32) * 0.2 for _ in range(3)]
    params = (w[0], None, w[1], None, w[2], None)
    spec = (("a", "b", "c", "d", "e", "f"), "p", (16, 16, 16, -1), heads, heads_axis, False)
    call = lambda: attnc._C.self_attention(x, params, spec, None, np.float32, 0.0, False, None, True)  # noqa: E731
    if not ok:
        with pytest.raises(ValueError, match="spec: inconsistent"):
            call()
        return
    out, weights = call()
    q, k = (x.astype(np.float64) @ m.T.astype(np.float64) for m in w[:2])
    split = lambda t: t.reshape(2, 5, heads, 16 // heads).swapaxes(1, 2)  # noqa: E731
    scores = split(q) @ split(k).swapaxes(-1, -2) / np.sqrt(16 // heads)
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(weights, expected if heads_axis else expected[:, 0], rtol=2e-5, atol=2e-6)


def test_a_spec_whose_sizes_wrap_is_refused():
    """Regression (fuzzing under UBSan, 2026-12-01): a fused spec's 3 * qk_dim rows were
    counted without an overflow check: qk_dim (2**64 + 26) // 3 made 26 rows, a (26, 8)
    weight passed, and the row blocks' pointers overflowed (UBSan aborted; the plain build's
    freeze_module packed the nonsense spec). Sizes past a quarter of the address range are
    refused as inconsistent; a real fused spec of the same weight still works (its output
    against float64 NumPy's projection, one head of qk_dim 8 over the (24, 8) weight)."""
    wrapping = (2 ** 64 + 26) // 3
    spec = (("w", "b"), "p", (8, wrapping, wrapping, -1), 1, False, True)
    params = (np.ones((26, 8), np.float32), np.ones(26, np.float32))
    with pytest.raises(ValueError, match="^spec: inconsistent"):
        attnc._C.freeze_module(params, spec, "float32")
    with pytest.raises(ValueError, match="^spec: inconsistent"):
        attnc._C.self_attention(np.ones((1, 2, 8), np.float32), params, spec, None, "float32")
    rng = np.random.default_rng(5)
    w, x = rng.standard_normal((24, 8)).astype(np.float32), rng.standard_normal((1, 3, 8)).astype(np.float32)
    out = attnc._C.self_attention(x, (w, None), (("w", "b"), "p", (8, 8, 8, -1), 1, False, True), None, "float32")
    q, k, v = np.split(x.astype(np.float64) @ w.astype(np.float64).T, 3, axis=-1)
    s = q @ k.swapaxes(-1, -2) / np.sqrt(8)
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(out, p / p.sum(-1, keepdims=True) @ v, rtol=2e-5, atol=2e-6)


C_ARGUMENTS = [  # (the argument the error names, a call with it wrong)
    ("training", lambda C, x, params, spec: C.self_attention(x, params, spec, None, "float32", 0.0, np.array([1, 2]))),
    ("save", lambda C, x, params, spec: C.self_attention(x, params, spec, None, "float32", save=np.array([]))),
    ("params", lambda C, x, params, spec: C.self_attention(x, list(params), spec, None, "float32")),
    ("spec", lambda C, x, params, spec: C.self_attention(x, params, ((1,) * 6,) + spec[1:], None, "float32")),
    ("spec", lambda C, x, params, spec: C.freeze_module(params, spec[:2] + ("abcd",) + spec[3:], "float32")),
    ("spec", lambda C, x, params, spec: C.freeze_module(params, spec[:3] + (2 ** 63,) + spec[4:], "float32")),
    ("spec", lambda C, x, params, spec: C.freeze_module(params, list(spec), "float32")),
    ("array", lambda C, x, params, spec: C.copy([1.0])),
    ("dtype", lambda C, x, params, spec: C.read_only_copy(x, None)),
    ("dtype", lambda C, x, params, spec: C.read_only_copy(x, "int8")),
    ("bias_k", lambda C, x, params, spec: C.read_only_copy(np.array([object()]), "float32", "bias_k")),
    ("bias_k", lambda C, x, params, spec: C.read_only_copy(np.array(["1"]), "float32", "bias_k")),
    ("saved", lambda C, x, params, spec: C.self_attention_backward(x, [x], params, spec)),
    ("saved", lambda C, x, params, spec: C.self_attention_backward(x, (x,), params, spec)),
    ("ways", lambda C, x, params, spec: C.set_l1d_ways(2 ** 31)),
    ("ways", lambda C, x, params, spec: C.set_l1d_ways(1.5)),
    ("n", lambda C, x, params, spec: C.fail_alloc_after(2 ** 63)),
]


@pytest.mark.parametrize("name, call", C_ARGUMENTS, ids=[f"{name}-{i}" for i, (name, _) in enumerate(C_ARGUMENTS)])
def test_the_c_calls_name_every_bad_argument(name, call):
    """Regression (fuzzing, 2026-12-01): attnc._C's module calls raised errors that named no
    argument for an unclear truth value of training= or save= ("The truth value of an array
    ... is ambiguous"), a spec whose fields had the wrong types ("bad argument type for
    built-in operation", "Python int too large to convert to C ssize_t"), a params, spec or
    saved that was no tuple ("argument 2 must be tuple"), and the test hooks' integers."""
    x = np.ones((1, 2, 4), np.float32)
    spec = (("wq", "bq", "wk", "bk", "wv", "bv"), "dropout", (4, 4, 4, -1), 1, False, False)
    params = tuple(np.ones(s, np.float32) for s in [(4, 4), (4,)] * 3)
    with pytest.raises((TypeError, ValueError, OverflowError), match=rf"^{name}: "):
        call(attnc._C, x, params, spec)
    assert attnc._C.l1d_ways() > 0  # the hooks' refusals changed nothing


@pytest.mark.parametrize("name", DROPOUT_IDS)
def test_the_dropout_probability_is_read_once_for_forward_and_backward(name):
    """Regression (a mutation audit, 2026-12-02): the attention modules kept the dropout's `p`
    object for the backward, which converted it again: a p whose value changed between the
    two (an object whose __float__ gives 0.5 and then 0.1; a 0-d array edited in place)
    gave the forward p = 0.5's mask and the backward p = 0.1's (gradients off by 0.62, no
    error). p is a number once, at the forward; checked against the module run with 0.5."""
    class ChangingP:
        calls = 0

        def __float__(self):
            ChangingP.calls += 1
            return 0.5 if ChangingP.calls == 1 else 0.1

    def run(p):
        m = make_module(name, 8, dtype=np.float64)
        m.train()
        dropout = next(sub for sub in m._modules.values() if isinstance(sub, attnc.Dropout))
        dropout.p = p
        m.rng = np.random.default_rng(0)
        x = np.random.default_rng(1).normal(size=(2, 5, 8))
        out = m(x)
        if isinstance(p, np.ndarray):
            p[()] = 0.1  # edited in place between forward and backward
        return out, m.backward(np.ones_like(out))

    expected_out, expected_grad = run(0.5)
    for p in (ChangingP(), np.array(0.5)):
        out, grad = run(p)
        np.testing.assert_array_equal(out, expected_out)
        np.testing.assert_array_equal(grad, expected_grad)


@pytest.mark.parametrize("copier", ["pickle", "deepcopy"])
def test_a_module_with_a_deleted_parameter_copies_with_it_deleted(copier):
    """Regression (a mutation audit, 2026-12-02): pickle.dumps of a module with a deleted
    parameter succeeded and pickle.loads raised a bare KeyError ('weight'); copy.deepcopy
    too. The copy now has the parameter deleted, and registered, as the original: its
    state_dict names it, and assigning it again restores it."""
    m = attnc.SelfAttentionV1(4, rng=np.random.default_rng(0))
    weight = m.Q_proj.weight.copy()
    del m.Q_proj.weight
    copied = pickle.loads(pickle.dumps(m)) if copier == "pickle" else copy.deepcopy(m)
    with pytest.raises(AttributeError, match=r"^Q_proj\.weight: the parameter was deleted"):
        copied.state_dict()
    copied.Q_proj.weight = weight
    m.Q_proj.weight = weight
    x = _x()
    np.testing.assert_array_equal(copied(x), m(x))


def test_load_state_dict_of_a_parameter_reshaped_while_it_runs():
    """Regression (a mutation audit, 2026-12-02): a parameter reshaped in place after
    load_state_dict checked it (by a value's __array__ here, or another thread) was planned
    as a copy target of the old shape, and the one C call refused the plan with "commit:
    item 0 is not a writable array and a source of its shape and dtype", naming nothing.
    Such a parameter is replaced by the value loaded, as one that cannot take a copy is."""
    net = attnc.Linear(3, 2)

    class ReshapesTheWeight:
        def __array__(self, dtype=None, copy=None):
            net.weight.shape = (3, 2)
            return np.zeros(2)

    net.load_state_dict({"weight": np.arange(6.0).reshape(2, 3), "bias": ReshapesTheWeight()})
    np.testing.assert_array_equal(net.weight, np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(net.bias, np.zeros(2))


# What each child below runs inside the package's gradient locks, at a C call made in the
# block (as a signal handler runs at a Ctrl-C poll or between two lines): sys.setprofile
# stands in for the signal, once. grad_y.T @ x and grad_y.sum(0) are a Linear's gradients.
_INSIDE_A_GRADIENT_LOCK = """
import sys, numpy as np, attnc
rng = np.random.default_rng(0)
x, grad_y = rng.standard_normal((5, 4)), rng.standard_normal((5, 3))
a, b = attnc.Linear(4, 3, dtype=np.float64), attnc.Linear(4, 3, dtype=np.float64)
def grads_are(module, scale):
    got = dict(module.named_grads())
    return np.allclose(got["weight"], scale * grad_y.T @ x) and np.allclose(got["bias"], scale * grad_y.sum(0))
def once_inside(function, code_name, work):
    def hook(frame, event, arg):
        if event == "c_call" and arg is function and frame.f_code.co_name == code_name:
            sys.setprofile(None)
            work()
    sys.setprofile(hook)
{scenario}
print("ok")
"""

_GRADIENT_LOCK_SCENARIOS = {
    # A handler reading the gradients while the backward's sums make the buffers (a logger of
    # gradient norms): it waited for the lock its own thread held, forever.
    "read_while_a_backward_makes_the_buffers": """
read = []
once_inside(np.zeros, "_grad", lambda: read.append({name: g.copy() for name, g in a.named_grads()}))
a(x); a.backward(grad_y)
assert read and all(np.array_equal(g, np.zeros_like(g)) for g in read[0].values())
assert grads_are(a, 1)
""",
    # A handler running a forward and backward while named_grads() makes the first buffer: the
    # buffer the handler's backward added into stands (not a second, empty one made over it).
    "a_backward_while_named_grads_makes_a_buffer": """
once_inside(np.zeros, "_grad", lambda: (a(x), a.backward(grad_y)))
assert grads_are(a, 1)
""",
    # A handler running another module's backward while this thread adds a backward's
    # gradients: refused with RuntimeError (nothing added, its forward kept), never waiting.
    "a_backward_while_another_adds_its_gradients": """
refused = []
def other_backward():
    b(x)
    try:
        b.backward(grad_y)
    except RuntimeError as error:
        refused.append(str(error))
once_inside(getattr, "_additions_of_grads", other_backward)
a(x); a.backward(grad_y)
assert grads_are(a, 1) and len(refused) == 1 and "called by a signal handler" in refused[0], refused
assert all(not g.any() for _, g in b.named_grads())
b.backward(grad_y)
assert grads_are(b, 1)
a(x); a.backward(grad_y)
assert grads_are(a, 2)
""",
}


@pytest.mark.parametrize("scenario", sorted(_GRADIENT_LOCK_SCENARIOS))
def test_gradients_touched_by_a_handler_inside_the_gradient_locks(scenario, tmp_path):
    """Regression (a hostile-use audit, 2026-12-05): a signal handler that ran inside the locks
    guarding the gradient buffers (plain locks then) and read the gradients, stepped an
    optimizer or ran a backward waited for its own thread forever. In a child, so that a hang
    fails this test (by its timeout) instead of stopping the run."""
    import os
    import subprocess
    import sys
    script = tmp_path / "inside.py"
    script.write_text(_INSIDE_A_GRADIENT_LOCK.replace("{scenario}", _GRADIENT_LOCK_SCENARIOS[scenario]))
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(attnc.__file__)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-2000:])


def test_nn_mha_outputs_share_a_dtype_when_a_mask_changes_the_module_dtype():
    """Regression, a hostile-use audit, 2026-12-06: a key_padding_mask whose __array__
    converted the module to float64 mid-call left a training forward with dropout
    returning float32 output and float64 weights (the dropout read the module's dtype
    again). Both now come in the dtype the call computed in, with the values the same
    call gives without the conversion (same generator, so the same dropout mask)."""
    x = np.random.default_rng(0).standard_normal((5, 2, 8)).astype(np.float32)

    def run(convert):
        nm = attnc.nn.MultiheadAttention(8, 2, dropout=0.25, rng=np.random.default_rng(3)).train()

        class Mask:
            def __array__(self, dtype=None, copy=None):
                if convert:
                    nm.to(np.float64)
                return np.zeros((2, 5), bool)
        return nm(x, x, x, key_padding_mask=Mask(), average_attn_weights=False)

    out, weights = run(True)
    want_out, want_weights = run(False)
    assert out.dtype == weights.dtype == np.float32
    np.testing.assert_array_equal(out, want_out)
    np.testing.assert_array_equal(weights, want_weights)


def test_a_spec_with_an_output_projection_to_no_features_is_refused():
    """Regression (a fuzz of attnc._C, 2026-12-06): a spec whose output projection maps to
    0 features made an empty output, and the call skipped the kernel on its size alone,
    returning the (B, H, T, T) weights unwritten (rows that summed to 8e5) and kept Q, K,
    V and lse of zeros. out_dim is now < 0 (no output projection) or >= 1; the same spec
    without the output projection gives weights whose rows sum to 1."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    w = [rng.standard_normal((8, 8)).astype(np.float32) for _ in range(3)]
    names = ("a", "b", "c", "d", "e", "f")
    params = (w[0], None, w[1], None, w[2], None)
    spec = (names + ("g", "h"), "p", (8, 8, 8, 0), 2, True, False, True)
    for kwargs in ({"return_weights": True}, {"save": True}):
        with pytest.raises(ValueError, match="^spec: inconsistent"):
            attnc._C.self_attention(x, params + (np.zeros((0, 8), np.float32), None), spec, None, np.float32,
                                    **kwargs)
    _, weights = attnc._C.self_attention(x, params, (names, "p", (8, 8, 8, -1), 2, True, False, True), None,
                                         np.float32, return_weights=True)
    np.testing.assert_allclose(weights.astype(np.float64).sum(-1), 1.0, rtol=1e-5)
