"""Odd and bad inputs for every public entry point: each call gives the right
answer (checked against the toolkit's float64 NumPy oracle, written from the
documents' formulas) or raises the exception API.md names, with a message
naming the argument. Nothing may crash, hang or leak, on the error paths too.

The oracle and the registry are the toolkit's (tests/toolkit.py).
"""
import gc
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import attnc
from attnc import functional as F
from toolkit import (MASKED_IDS, MODEL, MODEL_IDS, assert_close, make_module, ref_attend, ref_linear, ref_module,
                     ref_softmax, result_dtype)


DIM = 4  # even: every multi-head class of the registry splits it


def huge_view(shape, dtype=np.float32):
    """A read-only zero-strided view: any shape for the price of one element."""
    return as_strided(np.zeros(1, dtype), shape, (0,) * len(shape), writeable=False)


def raises_naming(exc, name, call):
    with pytest.raises(exc) as info:
        call()
    assert name in str(info.value), f"message {str(info.value)!r} does not name {name!r}"
    return info.value


# ============================================================================
# errors: modules


BAD_DTYPES = {
    "complex": lambda shape: np.ones(shape, np.complex64),
    "object": lambda shape: np.ones(shape, object),
    "str": lambda shape: np.full(shape, "a"),
    "bytes": lambda shape: np.full(shape, b"a"),
    "datetime": lambda shape: np.zeros(shape, "datetime64[s]"),
}


@pytest.mark.parametrize("name", MODEL_IDS)
@pytest.mark.parametrize("shape", [(), (DIM,)], ids=["0d", "1d"])
def test_module_x_too_few_dims(name, shape):
    raises_naming(ValueError, "x", lambda: make_module(name)(np.ones(shape, np.float32)))


@pytest.mark.parametrize("name", MODEL_IDS)
@pytest.mark.parametrize("last", [0, DIM - 1, DIM + 1])
def test_module_wrong_last_dim_names_sizes(name, last):
    err = raises_naming(ValueError, "x", lambda: make_module(name)(np.ones((2, 3, last), np.float32)))
    assert str(DIM) in str(err) and str(last) in str(err), str(err)


@pytest.mark.parametrize("name", MODEL_IDS)
@pytest.mark.parametrize("bad", list(BAD_DTYPES))
def test_module_x_bad_dtype(name, bad):
    raises_naming(TypeError, "x", lambda: make_module(name)(BAD_DTYPES[bad]((2, 3, DIM))))


@pytest.mark.parametrize("name", MODEL_IDS)
def test_module_x_python_objects(name):
    m = make_module(name)
    raises_naming(TypeError, "x", lambda: m([[[1 + 2j] * DIM]]))
    raises_naming(ValueError, "x", lambda: m([[[1.0] * DIM], [[1.0] * (DIM + 1)]]))  # ragged: NumPy's error
    raises_naming(TypeError, "x", lambda: m(None))  # an object array, as docs/API.md says


@pytest.mark.parametrize("name", MASKED_IDS)
@pytest.mark.parametrize("bad", list(BAD_DTYPES))
def test_module_mask_bad_dtype(name, bad):
    mask = BAD_DTYPES[bad]((2, 3, 3) if MODEL[name].heads is None else (2, 1, 3, 3))
    raises_naming(TypeError, "attention_mask", lambda: make_module(name)(np.ones((2, 3, DIM), np.float32), mask))


def _bad_masks(heads):
    if heads:  # scores (2, heads, 3, 3)
        return [(2, 3, 2), (3, 1, 3, 3), (2, heads + 1, 3, 3), (1, 2, 1, 3, 3), (3,) * 5, (4,), (2, 1, 1, 4)]
    return [(2, 3, 4), (3, 3, 3), (4, 3), (1, 2, 3, 3), (2, 2, 3), (3, 2)]


@pytest.mark.parametrize("name", MASKED_IDS)
def test_module_mask_does_not_broadcast(name):
    m = make_module(name)
    x = np.ones((2, 3, DIM), np.float32)
    for shape in _bad_masks(MODEL[name].n_heads(DIM)):
        raises_naming(ValueError, "attention_mask", lambda: m(x, np.ones(shape, bool)))
        raises_naming(ValueError, "attention_mask", lambda: m(x, np.ones(shape, bool), return_weights=True))


@pytest.mark.parametrize("make", [
    lambda: attnc.MultiHeadAttention(8, 0), lambda: attnc.MultiHeadAttention(8, -2),
    lambda: attnc.MultiHeadAttention(8, 3), lambda: attnc.MultiHeadAttention(0, 1),
    lambda: attnc.MultiHeadSelfAttention(4, 8, 8, 0), lambda: attnc.MultiHeadSelfAttention(4, 8, 8, -1),
    lambda: attnc.MultiHeadSelfAttention(4, 8, 6, 4), lambda: attnc.MultiHeadSelfAttention(4, 6, 8, 4),
    lambda: attnc.MultiHeadSelfAttention(4, 8, 8, 16),
], ids=["mha0", "mha-neg", "mha-nodiv", "mha-dim0", "mhsa0", "mhsa-neg", "mhsa-nodiv-v", "mhsa-nodiv-k",
        "mhsa-more-heads"])
def test_bad_head_counts(make):
    with pytest.raises(ValueError) as info:
        make()
    assert any(n in str(info.value) for n in ("head_num", "num_heads", "hidden_dim")), str(info.value)


@pytest.mark.parametrize("make, arg", [
    (lambda: attnc.SelfAttentionV1(0), "hidden_dim"), (lambda: attnc.SelfAttentionV1(-3), "hidden_dim"),
    (lambda: attnc.SelfAttentionV2(0), "dim"), (lambda: attnc.SelfAttentionV3(-1), "dim"),
    (lambda: attnc.SelfAttentionV4(0), "dim"), (lambda: attnc.SelfAttention(0, 2, 2), "dim_in"),
    (lambda: attnc.SelfAttention(2, 0, 2), "dim_k"), (lambda: attnc.SelfAttention(2, 2, -2), "dim_v"),
    (lambda: attnc.MultiHeadSelfAttention(2, 0, 2, 1), "dim_k"), (lambda: attnc.Linear(-1, 2), "in_features"),
    (lambda: attnc.Linear(2, -1), "out_features"),
])
def test_non_positive_sizes(make, arg):
    raises_naming(ValueError, arg, make)


BAD_P = [-0.1, 1.0000001, float("nan"), float("inf"), -float("inf"), 2]


@pytest.mark.parametrize("p", BAD_P)
@pytest.mark.parametrize("make, arg", [
    (lambda p: attnc.Dropout(p), "p"), (lambda p: attnc.SelfAttentionV3(4, p), "dropout_rate"),
    (lambda p: attnc.SelfAttentionV4(4, p), "dropout_rate"), (lambda p: attnc.MultiHeadAttention(4, 2, p), "dropout"),
    (lambda p: F.scaled_dot_product_attention(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), dropout_p=p),
     "dropout_p"),
], ids=["Dropout", "V3", "V4", "MHA", "sdpa"])
def test_bad_dropout_probability(make, arg, p):
    raises_naming(ValueError, arg, lambda: make(p))


@pytest.mark.parametrize("bad", list(BAD_DTYPES))
def test_dropout_bad_input_dtype(bad):
    for d in (attnc.Dropout(0.3), attnc.Dropout(0.3).eval()):
        raises_naming(TypeError, "x", lambda: d(BAD_DTYPES[bad]((3, 4))))


@pytest.mark.parametrize("bad", list(BAD_DTYPES))
def test_linear_module_bad_input_dtype(bad):
    raises_naming(TypeError, "x", lambda: attnc.Linear(4, 3)(BAD_DTYPES[bad]((2, 4))))


def test_linear_module_shape_errors():
    lin = attnc.Linear(4, 3)
    raises_naming(ValueError, "x", lambda: lin(np.ones((2, 5), np.float32)))
    raises_naming(ValueError, "x", lambda: lin(np.float32(1.0)))


# ============================================================================
# errors: functional


@pytest.mark.parametrize("bad", list(BAD_DTYPES))
def test_functional_bad_dtypes(bad):
    ok = np.ones((2, 3, 4), np.float32)
    b = BAD_DTYPES[bad]((2, 3, 4))
    raises_naming(TypeError, "x", lambda: F.linear(b, np.ones((5, 4))))
    raises_naming(TypeError, "weight", lambda: F.linear(ok, BAD_DTYPES[bad]((5, 4))))
    raises_naming(TypeError, "bias", lambda: F.linear(ok, np.ones((5, 4)), BAD_DTYPES[bad]((5,))))
    raises_naming(TypeError, "x", lambda: F.softmax(b))
    raises_naming(TypeError, "query", lambda: F.scaled_dot_product_attention(b, ok, ok))
    raises_naming(TypeError, "key", lambda: F.scaled_dot_product_attention(ok, b, ok))
    raises_naming(TypeError, "value", lambda: F.scaled_dot_product_attention(ok, ok, b))
    raises_naming(TypeError, "attn_mask",
                  lambda: F.scaled_dot_product_attention(ok, ok, ok, attn_mask=BAD_DTYPES[bad]((3, 3))))


def test_functional_linear_shape_errors():
    raises_naming(ValueError, "x", lambda: F.linear(np.float32(2.0), np.ones((3, 1))))
    raises_naming(ValueError, "x", lambda: F.linear(np.ones((2, 5)), np.ones((3, 4))))
    raises_naming(ValueError, "weight", lambda: F.linear(np.ones((2, 4)), np.ones(4)))
    raises_naming(ValueError, "weight", lambda: F.linear(np.ones((2, 4)), np.ones((1, 3, 4))))
    raises_naming(ValueError, "bias", lambda: F.linear(np.ones((2, 4)), np.ones((3, 4)), np.ones(4)))
    raises_naming(ValueError, "bias", lambda: F.linear(np.ones((2, 4)), np.ones((3, 4)), np.ones((1, 3))))


def test_functional_softmax_axis_errors():
    for axis in (2, -3, 100, 2 ** 40, -2 ** 70):
        with pytest.raises((ValueError, IndexError)) as info:
            F.softmax(np.ones((2, 3)), axis=axis)
        assert "axis" in str(info.value)
    with pytest.raises(TypeError):
        F.softmax(np.ones((2, 3)), axis=1.5)


def test_sdpa_shape_errors():
    q = np.ones((2, 3, 4))
    sdpa = F.scaled_dot_product_attention
    raises_naming(ValueError, "query", lambda: sdpa(np.ones(4), q, q))
    raises_naming(ValueError, "key", lambda: sdpa(q, np.ones(4), q))
    raises_naming(ValueError, "value", lambda: sdpa(q, q, np.ones(4)))
    raises_naming(ValueError, "query", lambda: sdpa(np.float64(1), q, q))
    raises_naming(ValueError, "key", lambda: sdpa(q, np.ones((2, 3, 5)), q))           # E mismatch
    raises_naming(ValueError, "value", lambda: sdpa(q, q, np.ones((2, 4, 4))))         # S mismatch
    raises_naming(ValueError, "key", lambda: sdpa(q, np.ones((3, 3, 4)), q))           # batch 2 vs 3
    raises_naming(ValueError, "value", lambda: sdpa(q, q, np.ones((3, 3, 4))))
    raises_naming(ValueError, "key", lambda: sdpa(np.ones((5, 2, 3, 4)), np.ones((4, 2, 3, 4)), q))
    for shape in [(3, 4), (2, 3, 2), (3, 3, 3), (2, 2, 3, 3), (4,)]:
        raises_naming(ValueError, "attn_mask", lambda: sdpa(q, q, q, attn_mask=np.ones(shape, bool)))
        raises_naming(ValueError, "attn_mask",
                      lambda: sdpa(q, q, q, attn_mask=np.ones(shape, bool), return_weights=True))


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf"), np.float32("inf"), 10 ** 400],
                         ids=["nan", "inf", "-inf", "f32-inf", "int-10**400"])
def test_sdpa_non_finite_scale(scale):
    q = np.ones((2, 3))
    raises_naming(ValueError, "scale", lambda: F.scaled_dot_product_attention(q, q, q, scale=scale))


COMPLEX_NUMBERS = {"python": 0.5 + 2j, "numpy_complex128": np.complex128(0.5 + 2j), "numpy_complex64": np.complex64(0.25j),
                   "numpy_0d_array": np.array(0.5 + 0j), "real_part_only": np.complex128(0.5)}


@pytest.mark.parametrize("number", list(COMPLEX_NUMBERS.values()), ids=list(COMPLEX_NUMBERS))
@pytest.mark.parametrize("make, arg", [
    (lambda v: F.scaled_dot_product_attention(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), scale=v), "scale"),
    (lambda v: F.scaled_dot_product_attention(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), dropout_p=v,
                                              seed=0), "dropout_p"),
    (lambda v: attnc.Dropout(v), "p"), (lambda v: attnc.SelfAttentionV3(4, v), "dropout_rate"),
    (lambda v: attnc.MultiHeadAttention(4, 2, v), "dropout"),
], ids=["sdpa_scale", "sdpa_dropout_p", "Dropout", "V3", "MHA"])
def test_complex_numbers_are_refused_by_name(make, arg, number):
    """A NumPy complex number (scalar or 0-d array) was taken as its real
    part with only NumPy's ComplexWarning (scale=np.complex128(0.5+2j) ran
    as 0.5, dropout_p=np.complex64(0.25j) as 0), where Python's complex was
    refused: the docs say a complex number is a TypeError naming the
    argument, even one with no imaginary part."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ComplexWarning on the way either
        raises_naming(TypeError, arg, lambda: make(number))


@pytest.mark.parametrize("number", ["numpy", "torch"])
@pytest.mark.parametrize("make, arg", [
    (lambda v: F.scaled_dot_product_attention(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), scale=v), "scale"),
    (lambda v: F.scaled_dot_product_attention(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), dropout_p=v,
                                              seed=0), "dropout_p"),
    (lambda v: F.scaled_dot_product_attention(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), dropout_p=0.5,
                                              seed=v), "seed"),
    (lambda v: F.scaled_dot_product_attention(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), window=(v, 1)),
     "window"),
    (lambda v: F.softmax(np.ones((2, 2)), axis=v), "axis"),
    (lambda v: attnc.Dropout(v), "p"),
    (lambda v: attnc.Linear(v, 2), "in_features"),
    (lambda v: attnc.Linear(2, v), "out_features"),
    (lambda v: attnc.SelfAttentionV1(v), "hidden_dim"),
    (lambda v: attnc.MultiHeadAttention(4, v), "head_num"),
    (lambda v: attnc.nn.MultiheadAttention(v, 2), "embed_dim"),
    (lambda v: attnc.nn.MultiheadAttention(4, v), "num_heads"),
    (lambda v: attnc.nn.MultiheadAttention(4, 2, kdim=v), "kdim"),
], ids=["sdpa_scale", "sdpa_dropout_p", "sdpa_seed", "sdpa_window", "softmax_axis", "Dropout", "Linear_in",
        "Linear_out", "SelfAttentionV1", "MultiHeadAttention_heads", "nn_embed_dim", "nn_num_heads", "nn_kdim"])
def test_a_number_given_as_an_array_of_one_element_is_refused_by_name(make, arg, number):
    """Regression (a functional audit, 2026-12-02): NumPy refuses an array with an axis as a
    number, even of one element (scale=np.array([0.5]) raised TypeError naming scale), but
    torch's float() and __index__ take a tensor of one element, so scale=torch.tensor([0.5])
    ran as 0.5 and seed=torch.tensor([3]) as 3. Both kinds are refused alike, naming the
    argument; a 0-d array or tensor is still the number it holds. The modules' sizes (a
    docs audit, 2026-12-06) had still taken a torch tensor of one element through __index__:
    Linear(torch.tensor([2]), 2) made a (2, 2) weight."""
    torch = pytest.importorskip("torch")
    sizes = {"in_features": 2, "out_features": 2, "hidden_dim": 4, "head_num": 2, "embed_dim": 4, "num_heads": 2,
             "kdim": 4}
    value = 1 if arg in ("seed", "window", "axis") else sizes.get(arg, 0.5)
    one_element = np.array([value]) if number == "numpy" else torch.tensor([value])
    raises_naming(TypeError, arg, lambda: make(one_element))
    make(np.array(value) if number == "numpy" else torch.tensor(value))  # a 0-d one computes


class _FloatRaisesRuntimeError:
    """A number whose conversion raises RuntimeError, as a torch tensor's can."""

    def __float__(self):
        raise RuntimeError("value cannot be converted")


def test_scale_from_a_tensor_that_does_not_convert_is_named():
    """A number's own conversion error other than TypeError or ValueError (a
    torch complex tensor's RuntimeError, "value cannot be converted to type
    double without overflow") passed through without the argument's name; a
    torch complex tensor is now refused as complex, before any conversion,
    and a real 0-d tensor is the number it holds."""
    torch = pytest.importorskip("torch")
    q = np.ones((2, 3))
    raises_naming(TypeError, "scale", lambda: F.scaled_dot_product_attention(q, q, q, scale=torch.tensor(0.5 + 2j)))
    raises_naming(RuntimeError, "scale", lambda: F.scaled_dot_product_attention(q, q, q,
                                                                                scale=_FloatRaisesRuntimeError()))
    np.testing.assert_array_equal(F.scaled_dot_product_attention(q, q, q, scale=torch.tensor(0.5)),
                                  F.scaled_dot_product_attention(q, q, q, scale=0.5))


@pytest.mark.skipif(os.environ.get("ATTNC_SANITIZER") == "asan",
                    reason="torch raises it as a C++ exception, which aborts under ASan's preloaded runtime (its "
                           "__cxa_throw interceptor is unresolved); test_scale_from_a_tensor_that_does_not_convert_"
                           "is_named runs the same path with a Python number")
def test_scale_from_a_torch_tensor_of_several_elements_is_named():
    torch = pytest.importorskip("torch")
    q = np.ones((2, 3))
    raises_naming(TypeError, "scale", lambda: F.scaled_dot_product_attention(q, q, q, scale=torch.tensor([0.5, 0.25])))


def test_sdpa_bad_scale_and_rng_types():
    q = np.ones((2, 3))
    with pytest.raises(TypeError):
        F.scaled_dot_product_attention(q, q, q, scale="big")
    raises_naming(TypeError, "rng", lambda: F.scaled_dot_product_attention(q, q, q, dropout_p=0.5, rng=42))


# ============================================================================
# errors: sizes that would overflow or cannot be allocated (cheap zero-strided views)

HUGE = 2 ** 40
# Two such axes in one view: NumPy refuses a view of more than 2^63 bytes, zero strides or
# not, so a view of (HUGE, HUGE, 64) never reached attnc; (BIG, BIG, 64) does.
BIG = 2 ** 20


def _huge_calls():
    """(case, call, the argument its error names)."""
    q = np.ones((1, 64), np.float32)
    sdpa = F.scaled_dot_product_attention
    yield "sdpa-batch", lambda: sdpa(huge_view((BIG, BIG, 64)), huge_view((BIG, BIG, 64)),
                                    huge_view((BIG, BIG, 64))), "query"
    yield "sdpa-broadcast-batch", lambda: sdpa(huge_view((HUGE, 1, 1, 64)), huge_view((1, HUGE, 1, 64)),
                                              huge_view((1, 1, 1, 64))), "query"
    yield "sdpa-L", lambda: sdpa(huge_view((HUGE, 64)), q, q), "query"
    yield "sdpa-S", lambda: sdpa(q, huge_view((HUGE, 64)), huge_view((HUGE, 64))), "key"
    yield "sdpa-weights", lambda: sdpa(huge_view((2 ** 31, 1)), huge_view((2 ** 31, 1)), huge_view((2 ** 31, 1)),
                                       return_weights=True), "return_weights"
    yield "sdpa-batch-E1", lambda: sdpa(huge_view((2 ** 58, 1, 1)), huge_view((1, 1)), huge_view((1, 1))), "query"
    yield "sdpa-mask", lambda: sdpa(q, q, q, attn_mask=huge_view((BIG, BIG, 1, 1), bool)), "attn_mask"
    yield "linear-x", lambda: F.linear(huge_view((BIG, BIG, 64)), np.ones((3, 64), np.float32)), "x"
    yield "linear-out", lambda: F.linear(np.ones((4, 1), np.float32), huge_view((2 ** 58, 1))), "x, weight"
    # a 2-D x is read in place (never copied): its rows make the output too large, as in linear-out
    yield "linear-rows", lambda: F.linear(huge_view((2 ** 58, 1)), np.ones((3, 1), np.float32)), "x, weight"
    yield "linear-rows-3d", lambda: F.linear(huge_view((1, 2 ** 58, 1)), np.ones((3, 1), np.float32)), "x"
    yield "softmax", lambda: F.softmax(huge_view((BIG, BIG, 64))), "x"
    yield "softmax-axis0", lambda: F.softmax(huge_view((2 ** 58, 2)), axis=0), "x"
    yield "dropout", lambda: attnc.Dropout(0.5)(huge_view((BIG, BIG, 64))), "x"
    yield "dropout-eval", lambda: attnc.Dropout(0.5).eval()(huge_view((BIG, BIG, 64))), "x"
    yield "Linear", lambda: attnc.Linear(64, 2)(huge_view((BIG, BIG, 64))), "x"
    for name in MODEL_IDS:
        yield name, lambda name=name: make_module(name, 64)(huge_view((BIG, BIG, 64))), "x"
        yield name + "-seq", lambda name=name: make_module(name, 64)(huge_view((2 ** 32, 64)),
                                                                     return_weights=True), "x"
        yield name + "-dim1", lambda name=name: make_module(name, 2)(huge_view((2 ** 58, 2))), "x"
    yield "MHA-mask", lambda: make_module("MHA", 64)(np.ones((1, 2, 64), np.float32),
                                                     huge_view((BIG, BIG, 1, 1, 1), bool)), "attention_mask"
    # torch's name for the weights: their (1, 2, 2^18, 2^18) floats are 512 GiB
    yield "nn-MHA-weights", lambda: attnc.nn.MultiheadAttention(8, 2).eval()(*[huge_view((2 ** 18, 1, 8))] * 3), \
        "need_weights"
    # no item, and weights of more elements than NumPy's sizes hold (a hostile-use audit, 2026-12-06:
    # the ValueError named the kernels' return_weights, which this forward does not take)
    yield "nn-MHA-weights-no-item", lambda: attnc.nn.MultiheadAttention(8, 2).eval()(
        *[huge_view((2 ** 40, 0, 8))] * 3), "need_weights"
    # a parameter too large to copy into the module's layout: assigned, or put in place
    # behind the module's back and read by its forward (NumPy's MemoryError, named)
    yield "param-assigned", lambda: setattr(attnc.SelfAttentionV1(4).Q_proj, "weight", huge_view((HUGE, 4))), "weight"

    def read_by_forward(module, path, shape, *inputs):
        owner = module
        for part in path.split(".")[:-1]:
            owner = getattr(owner, part)
        owner.__dict__[path.split(".")[-1]] = huge_view(shape)
        return module(*inputs)

    x8 = np.ones((1, 2, 8), np.float32)
    yield "param-V1", lambda: read_by_forward(attnc.SelfAttentionV1(4), "Q_proj.weight", (HUGE, 4),
                                              np.ones((2, 4), np.float32)), "Q_proj.weight"
    yield "param-MHA", lambda: read_by_forward(attnc.MultiHeadAttention(8, 2), "query_linear.weight", (HUGE, 8),
                                               x8), "query_linear.weight"
    yield "param-nn-MHA", lambda: read_by_forward(attnc.nn.MultiheadAttention(8, 2), "in_proj_weight", (HUGE, 8),
                                                  x8, x8, x8), "in_proj_weight"


HUGE_CALLS = {name: (call, argument) for name, call, argument in _huge_calls()}

_HUGE_SCRIPT = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {tests!r})
    import test_bad_inputs as t
    for name, (call, _) in t.HUGE_CALLS.items():
        print(json.dumps({{"started": name}}), flush=True)
        start = time.time()
        try:
            call()
        except (MemoryError, ValueError) as e:
            result = {{"raised": type(e).__name__, "message": str(e)}}
        else:
            result = {{"raised": None}}
        print(json.dumps({{"name": name, "seconds": time.time() - start, **result}}), flush=True)
""")
HUGE_CHILD_TIMEOUT = 120


@pytest.fixture(scope="module")
def huge_call_outcomes():
    """Every HUGE_CALLS call, one after the other in one child (one interpreter start,
    which under ASan took a second a call), with a memory cap and a timeout, so that a
    wrong size computation cannot take the test run down: {name: outcome}, and the
    child's exit status, stderr and the call it was in when it stopped."""
    import json
    import os
    script = _HUGE_SCRIPT.format(tests=os.path.dirname(__file__))
    # 4 GB of address space: a wrongly sized allocation fails instead of
    # swapping (not under ASan, whose shadow memory needs terabytes of it)
    cap = "" if "asan" in os.environ.get("LD_PRELOAD", "") else "ulimit -v 4000000; "
    argv = ["bash", "-c", cap + f'exec "{sys.executable}" -c "$0"', script]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=HUGE_CHILD_TIMEOUT)
        stdout, ended = proc.stdout, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    except subprocess.TimeoutExpired as e:
        stdout, ended = (e.stdout or b"").decode(), f"still running after {HUGE_CHILD_TIMEOUT} s"
    outcomes, last_started = {}, None
    for line in stdout.splitlines():
        if not line.startswith("{"):  # (not one of the child's records)
            continue
        record = json.loads(line)
        if "started" in record:
            last_started = record["started"]
        else:
            outcomes[record["name"]] = record
    return outcomes, f"the child stopped ({ended}) in {last_started!r}"


@pytest.mark.parametrize("name", list(HUGE_CALLS))
def test_huge_shapes_raise_before_any_work(name, huge_call_outcomes):
    """MemoryError or ValueError naming the argument, at once (NumPy's own
    MemoryError named too: a broadcast view too large to copy, an output too
    large to allocate)."""
    outcomes, how_the_child_stopped = huge_call_outcomes
    assert name in outcomes, f"{name}: no outcome; {how_the_child_stopped}"
    outcome = outcomes[name]
    assert outcome["raised"], f"{name}: returned a result"
    argument = HUGE_CALLS[name][1]
    assert outcome["message"].startswith(argument + ":"), \
        f"{name}: the {outcome['raised']} does not name {argument!r}: {outcome['message']}"
    assert outcome["seconds"] < 5, f"{name}: took {outcome['seconds']:.1f} s before raising"


def test_empty_result_with_huge_work_returns_at_once():
    """value with Ev = 0: the result (2**50, 0) is empty; there is nothing to compute."""
    script = textwrap.dedent("""
        import numpy as np
        from numpy.lib.stride_tricks import as_strided
        from attnc import functional as F
        q = as_strided(np.zeros(1, np.float32), (2 ** 50, 1), (0, 0))
        out = F.scaled_dot_product_attention(q, np.zeros((1, 1), np.float32), np.zeros((1, 0), np.float32))
        assert out.shape == (2 ** 50, 0), out.shape
        print("OK")
    """)
    try:
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("scaled_dot_product_attention with an empty (2**50, 0) result ran for > 20 s")
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


# ============================================================================
# right answers: zero sizes, seq 1, NaN/inf, masks, strides, byte order


@pytest.mark.parametrize("name", MODEL_IDS)
@pytest.mark.parametrize("shape", [(0, 3), (2, 0), (0, 0), (3, 0, 2), (0, 1, 1), (1, 1), (3, 1)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_module_zero_sizes_and_seq_one(name, shape, dtype):
    m = make_module(name, dtype=dtype)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape + (DIM,))
    out, w = m(x, return_weights=True)
    ref_out, ref_w = ref_module(m, x)
    assert_close(out, ref_out, dtype, "out")
    assert_close(w, ref_w, dtype, "weights")
    assert_close(m(x), ref_out, dtype, "out without weights")


@pytest.mark.parametrize("shapes", [
    ((0, 3, 4), (0, 5, 4), (0, 5, 2)), ((2, 0, 4), (2, 5, 4), (2, 5, 2)), ((2, 3, 4), (2, 0, 4), (2, 0, 2)),
    ((2, 3, 0), (2, 5, 0), (2, 5, 2)), ((2, 3, 4), (2, 5, 4), (2, 5, 0)), ((1, 4), (1, 4), (1, 3)),
    ((0, 1, 1, 4), (3, 1, 4), (1, 4)), ((5, 1, 2), (1, 2), (1, 1)),
], ids=lambda s: "_".join("x".join(map(str, t)) for t in s))
def test_sdpa_zero_sizes(shapes):
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal(s) for s in shapes)
    for causal in (False, True):
        out, w = F.scaled_dot_product_attention(q, k, v, is_causal=causal, return_weights=True)
        scale = 1 / math.sqrt(q.shape[-1]) if q.shape[-1] else 1.0
        ref_out, ref_w = ref_attend(q, k, v, scale, causal=causal)
        assert_close(out, ref_out, np.float64, "out")
        assert_close(w, ref_w, np.float64, "weights")


def test_functional_zero_sizes():
    assert_close(F.linear(np.ones((0, 3)), np.ones((2, 3))), np.ones((0, 2)), np.float64)
    assert_close(F.linear(np.ones((2, 0)), np.ones((3, 0)), np.ones(3)), np.ones((2, 3)), np.float64)
    assert_close(F.linear(np.ones((2, 3)), np.ones((0, 3))), np.ones((2, 0)), np.float64)
    assert_close(F.linear(np.ones(3), np.ones((2, 3))), np.full(2, 3.0), np.float64)
    assert_close(F.softmax(np.ones((0, 5), np.float32)), np.ones((0, 5)), np.float32)
    assert_close(F.softmax(np.ones((5, 0), np.float32)), np.ones((5, 0)), np.float32)
    assert_close(F.softmax(np.ones((2, 0, 3), np.int8), axis=0), np.ones((2, 0, 3)), np.float32)
    assert_close(F.softmax(np.float64(3.0)), np.float64(1.0), np.float64)
    assert_close(F.softmax(np.ones(1)), np.ones(1), np.float64)
    assert_close(attnc.Dropout(0.5)(np.ones((0, 3))), np.ones((0, 3)), np.float32)
    assert_close(F.softmax(np.ones((3, 1), np.int16), axis=0), np.full((3, 1), 1 / 3), np.float32)
    assert_close(attnc.Linear(0, 3)(np.ones((2, 0))), ref_linear(np.ones((2, 0)), np.ones((3, 0)),
                                                                    attnc.Linear(0, 3).bias), np.float32)


def _torch_nan_positions(module, x, mask):
    """NaN positions of the documents' math (masked_fill, softmax) in torch, float64."""
    import torch
    sd = {k: torch.tensor(np.asarray(v, np.float64)) for k, v in module.state_dict().items()}
    xt = torch.tensor(np.asarray(x, np.float64))
    mt = None if mask is None else torch.tensor(np.asarray(mask))

    def lin(prefix, t=xt):
        return torch.nn.functional.linear(t, sd[prefix + ".weight"], sd.get(prefix + ".bias"))

    def attend(q, k, v, scale):
        s = q @ k.transpose(-1, -2) * scale
        if mt is not None:
            s = s.masked_fill(mt == 0, -1e20)
        return torch.softmax(s, -1) @ v, torch.softmax(s, -1)

    def split(t, h):
        return t.reshape(t.shape[:-1] + (h, t.shape[-1] // h)).transpose(-2, -3)

    def merge(t):
        t = t.transpose(-2, -3)
        return t.reshape(t.shape[:-2] + (-1,))

    kind = type(module).__name__
    if kind == "SelfAttentionV1":
        out, w = attend(lin("Q_proj"), lin("K_proj"), lin("V_proj"), 1 / math.sqrt(module.hidden_dim))
    elif kind in ("SelfAttentionV2", "SelfAttentionV3"):
        q, k, v = lin("proj").split(module.dim, -1)
        out, w = attend(q, k, v, 1 / math.sqrt(module.dim))
        if kind == "SelfAttentionV3":
            out = lin("output_proj", out)
    elif kind == "SelfAttentionV4":
        out, w = attend(lin("query"), lin("key"), lin("value"), 1 / math.sqrt(module.dim))
    elif kind == "SelfAttention":
        out, w = attend(lin("linear_q"), lin("linear_k"), lin("linear_v"), 1 / math.sqrt(module.dim_k))
    elif kind == "MultiHeadAttention":
        h = module.head_num
        out, w = attend(*(split(lin(p), h) for p in ("query_linear", "key_linear", "value_linear")),
                        1 / math.sqrt(module.head_dim))
        out = lin("output_linear", merge(out))
    else:
        h = module.num_heads
        out, w = attend(*(split(lin(p), h) for p in ("linear_q", "linear_k", "linear_v")),
                        1 / math.sqrt(module.dim_k // h))
        out = merge(out)
    return torch.isnan(out).numpy(), torch.isnan(w).numpy()


NON_FINITE = {
    "nan": lambda x: x.__setitem__((0, 1, 2), np.nan),
    "inf": lambda x: x.__setitem__((1, 0, 0), np.inf),
    "-inf": lambda x: x.__setitem__((1, 2, 3), -np.inf),
    "all-nan-row": lambda x: x.__setitem__((0, 2), np.nan),
    "huge": lambda x: x.__setitem__((1, 1), 3e38),
}


@pytest.mark.parametrize("name", MODEL_IDS)
@pytest.mark.parametrize("kind", list(NON_FINITE))
def test_module_non_finite_inputs_propagate_as_torch(name, kind):
    m = make_module(name, dtype=np.float64)
    x = np.random.default_rng(3).standard_normal((2, 3, DIM))
    NON_FINITE[kind](x)
    mask = None
    if MODEL[name].masked:
        mask = np.array([[1, 1, 0], [1, 0, 0]])[:, None, None, :] if MODEL[name].heads is not None else \
            np.array([[1, 1, 0], [1, 0, 0]])[:, None, :]
    with np.errstate(all="ignore"):
        out, w = m(x, mask, return_weights=True) if mask is not None else m(x, return_weights=True)
    nan_out, nan_w = _torch_nan_positions(m, x, mask)
    np.testing.assert_array_equal(np.isnan(out), nan_out, err_msg="output NaN positions differ from torch")
    np.testing.assert_array_equal(np.isnan(w), nan_w, err_msg="weights NaN positions differ from torch")
    ref_out, ref_w = ref_module(m, x, mask)
    fin = ~nan_out & np.isfinite(ref_out)
    np.testing.assert_allclose(out[fin], ref_out[fin], rtol=1e-9, atol=1e-9)
    infinite = ~nan_out & np.isinf(ref_out)
    np.testing.assert_array_equal(out[infinite], ref_out[infinite])


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", ["query", "key", "value"])
def test_sdpa_non_finite_propagate_as_torch(value, where):
    import torch
    rng = np.random.default_rng(4)
    arrays = {n: rng.standard_normal((2, 3, 4)) for n in ("query", "key", "value")}
    arrays[where][1, 1, 2] = value
    mask = np.array([[1, 0, 1], [1, 1, 0], [0, 0, 0]], bool)
    with np.errstate(all="ignore"):
        out, w = F.scaled_dot_product_attention(*arrays.values(), attn_mask=mask, return_weights=True)
    q, k, v = (torch.tensor(a) for a in arrays.values())
    s = (q @ k.transpose(-1, -2) * 0.5).masked_fill(torch.tensor(mask) == 0, -1e20)
    tw = torch.softmax(s, -1)
    np.testing.assert_array_equal(np.isnan(w), torch.isnan(tw).numpy())
    np.testing.assert_array_equal(np.isnan(out), torch.isnan(tw @ v).numpy())
    # and every other element's value, infinities included (float64: to rounding)
    np.testing.assert_allclose(w, tw.numpy(), rtol=1e-12, atol=1e-15, equal_nan=True)
    np.testing.assert_allclose(out, (tw @ v).numpy(), rtol=1e-12, atol=1e-15, equal_nan=True)


def test_softmax_non_finite():
    x = np.array([[0.0, np.inf, 1.0], [np.nan, 0, 0], [-np.inf, -np.inf, -np.inf], [-np.inf, 0, 1],
                  [3e38, 3e38, -3e38]], np.float32)
    import torch
    expected = torch.softmax(torch.tensor(x), -1).numpy()
    got = F.softmax(x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    fin = ~np.isnan(expected)
    np.testing.assert_allclose(got[fin], expected[fin], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", MASKED_IDS)
@pytest.mark.parametrize("mask_kind", ["float", "float-nan", "int", "uint8", "neg-zero", "all-masked", "float16"])
def test_module_mask_values(name, mask_kind):
    multi = MODEL[name].heads is not None
    rng = np.random.default_rng(5)
    base = rng.integers(0, 2, (2, 3, 3))
    mask = {
        "float": base * rng.uniform(-2, 2, base.shape),
        "float-nan": np.where(base == 1, np.nan, 0.0),
        "int": base * -7,
        "uint8": base.astype(np.uint8) * 255,
        "neg-zero": np.where(base == 1, 0.5, -0.0),
        "all-masked": np.zeros_like(base),
        "float16": base.astype(np.float16) * np.float16(1e-4),
    }[mask_kind]
    if multi:
        mask = mask[:, None]
    m = make_module(name, dtype=np.float64)
    x = rng.standard_normal((2, 3, DIM))
    out, w = m(x, mask, return_weights=True)
    ref_out, ref_w = ref_module(m, x, mask)
    assert_close(out, ref_out, np.float64, "out")
    assert_close(w, ref_w, np.float64, "weights")


@pytest.mark.parametrize("mask_shape", [(3, 5), (1, 5), (3, 1), (2, 1, 5), (1, 1, 1), (5,), (), (2, 3, 5)])
@pytest.mark.parametrize("mask_dtype", [bool, np.int64, np.float32, np.float64])
def test_sdpa_mask_broadcast_shapes(mask_shape, mask_dtype):
    rng = np.random.default_rng(6)
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 3))
    mask = rng.integers(0, 2, mask_shape).astype(mask_dtype) * (3 if mask_dtype != bool else 1)
    for causal in (False, True):
        out, w = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, return_weights=True)
        ref_out, ref_w = ref_attend(q, k, v, 0.5, mask, causal)
        assert_close(out, ref_out, np.float64)
        assert_close(w, ref_w, np.float64)


def test_sdpa_scale_zero_gives_uniform_weights():
    rng = np.random.default_rng(7)
    q, k, v = rng.standard_normal((2, 3, 4)) * 100, rng.standard_normal((2, 6, 4)), rng.standard_normal((2, 6, 2))
    out, w = F.scaled_dot_product_attention(q, k, v, scale=0.0, return_weights=True)
    assert_close(w, np.full((2, 3, 6), 1 / 6), np.float64)
    assert_close(out, np.broadcast_to(v.mean(-2, keepdims=True), (2, 3, 2)), np.float64)
    out, w = F.scaled_dot_product_attention(q, k, v, scale=-0.0, is_causal=True, return_weights=True)
    ref_out, ref_w = ref_attend(q, k, v, 0.0, causal=True)
    assert_close(w, ref_w, np.float64)
    assert_close(out, ref_out, np.float64)


def _layouts(x):
    """name -> an array in an odd memory layout, equal to x except for the
    broadcasts "zero-stride-seq" (every row is x's first row),
    "zero-stride-features" (every row repeats its first element) and
    "one-value" (every element is x's first)."""
    rng = np.random.default_rng(8)
    yield "fortran", np.asfortranarray(x)
    yield "reversed", np.ascontiguousarray(x[::-1, ::-1, ::-1])[::-1, ::-1, ::-1]
    yield "step2", np.repeat(x, 2, axis=-1)[..., ::2]
    yield "transposed", np.ascontiguousarray(np.swapaxes(x, -1, -2)).swapaxes(-1, -2)
    ro = x.copy()
    ro.flags.writeable = False
    yield "read-only", ro
    buf = np.zeros(x.nbytes + 1, np.uint8)
    unaligned = np.frombuffer(buf[1:].data, x.dtype).reshape(x.shape)
    unaligned[...] = x
    yield "unaligned", unaligned
    yield "byteswapped", x.astype(x.dtype.newbyteorder())
    yield "big-endian-f64", x.astype(">f8")
    if x.shape[0] == 1:
        yield "broadcast-batch", np.broadcast_to(x, (1,) + x.shape[1:])
    yield "zero-stride-seq", np.broadcast_to(x[:, :1], x.shape)
    yield "zero-stride-features", np.broadcast_to(x[..., :1], x.shape)
    yield "one-value", np.broadcast_to(x.flat[0], x.shape)
    del rng


@pytest.mark.parametrize("name", MODEL_IDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_module_layouts(name, dtype):
    m = make_module(name, dtype=dtype)
    x = np.random.default_rng(9).standard_normal((2, 5, DIM)).astype(dtype)
    mask = None
    if MODEL[name].masked:
        mask = np.broadcast_to(np.array([1, 0, 1, 1, 0], bool), (2, 5, 5))
        if MODEL[name].heads is not None:
            h = MODEL[name].n_heads(DIM)
            mask = np.broadcast_to(np.array([1, 0, 1, 1, 0], bool), (2, h, 5, 5))[:, ::-1]
    for layout, xv in _layouts(x):
        before = np.array(xv, copy=True)
        got = m(xv, mask, return_weights=True) if mask is not None else m(xv, return_weights=True)
        ref = ref_module(m, np.asarray(xv, np.float64), mask)
        assert_close(got[0], ref[0], dtype, layout)
        assert_close(got[1], ref[1], dtype, layout)
        for result in got:  # fresh, C-contiguous, writeable results, whatever the input's layout
            assert result.flags.c_contiguous and result.flags.writeable, layout
            assert not np.shares_memory(result, xv), layout
        np.testing.assert_array_equal(np.asarray(xv), before, err_msg=f"{layout}: input modified")


def test_functional_layouts():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((2, 5, 4))
    w = rng.standard_normal((3, 4))
    b = rng.standard_normal(3)
    mask = np.array([[1, 0, 1, 1, 0]] * 5, bool)
    for layout, xv in _layouts(x):
        x64 = np.asarray(xv, np.float64)
        for _, wv in _layouts(w[None]):
            assert_close(F.linear(xv, wv[0], b[::-1][::-1]), ref_linear(x64, np.asarray(wv[0], np.float64), b),
                           np.float64, "linear " + layout)
        assert_close(F.softmax(xv, axis=1), ref_softmax(x64, axis=1), np.float64, "softmax " + layout)
        for _, mv in _layouts(mask[None].astype(np.int16)):
            out, wts = F.scaled_dot_product_attention(xv, xv[:, ::-1], xv, attn_mask=mv, return_weights=True)
            ref = ref_attend(x64, x64[:, ::-1], x64, 0.5, mv)
            assert_close(out, ref[0], np.float64, "sdpa " + layout)
            assert_close(wts, ref[1], np.float64, "sdpa weights " + layout)
        d = attnc.Dropout(0.5, dtype=np.float64).eval()(xv)
        assert_close(d, x64, np.float64, "dropout " + layout)
        assert not np.shares_memory(d, xv)


@pytest.mark.parametrize("in_dtype", [np.int8, np.int64, np.uint16, bool, np.float16, ">f4", "<f8"])
def test_non_float_inputs_convert(in_dtype):
    x = np.random.default_rng(11).integers(-3, 4, (2, 3, DIM)).astype(in_dtype)
    for name in MODEL_IDS:
        m = make_module(name)
        assert_close(m(x), ref_module(m, x)[0], np.float32, name)
    assert_close(F.softmax(x), ref_softmax(np.asarray(x, np.float64)), result_dtype(in_dtype))
    x64 = np.asarray(x, np.float64)
    assert_close(F.scaled_dot_product_attention(x, x, x), ref_attend(x64, x64, x64, 1 / math.sqrt(DIM))[0],
                 result_dtype(in_dtype))


# ============================================================================
# error paths do not leak (10,000 rejected calls)


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _rejected_calls():
    """Calls that each raise; each converts or allocates something before
    being rejected (inputs, masks, offset tables), so a leak would show.
    Every array is made here, once: on Python 3.11 NumPy 2.4's np.empty/zeros/
    ones with the default dtype add a reference to float64 at each call,
    which would hide (or fake) a leak of attnc's."""
    x = np.ones((2, 64, 32), np.float32)
    x64 = x.astype(np.float64)
    sdpa = F.scaled_dot_product_attention
    mha, v4, mhsa = make_module("MHA", 32), make_module("V4", 32), make_module("MHSA-bias", 32)
    lin = attnc.Linear(32, 4)
    drop = attnc.Dropout(0.2)
    mask_63 = x64[..., :1].repeat(63, -1)            # (2, 64, 63) float64
    mask_c = x64[:, None, :, :1].repeat(64, -1).astype(complex)  # (2, 1, 64, 64)
    mask_3 = np.concatenate([x64[..., :1].repeat(64, -1)] * 2)[:3]  # (3, 64, 64)
    mask_o = x64[0, :, :1].repeat(64, -1).astype(object)
    x_c = x64.astype(complex)
    w31, w32 = x64[0, :8, :31].copy(), x64[0, :8, :].copy()
    b7, b8c = x64[0, 0, :7].copy(), x64[0, 0, :8].astype(complex)
    key3 = x64[:1].repeat(3, 0)
    v_short = x64[:, :63]
    huge_q = huge_view((HUGE, 64))
    huge_x = huge_view((HUGE, 2, 32))
    nan = float("nan")
    return [
        (ValueError, lambda: v4(x64, mask_63)),                       # after converting x to float32
        (ValueError, lambda: mha(x64[..., :31])),
        (TypeError, lambda: mhsa(x64, mask_c)),
        (ValueError, lambda: mhsa(x64, mask_63)),
        (TypeError, lambda: v4(x_c)),
        (ValueError, lambda: sdpa(x64, x64, v_short)),
        (ValueError, lambda: sdpa(x64, x64, x64, attn_mask=mask_3)),   # after the offset tables
        (ValueError, lambda: sdpa(x, x, x, scale=nan)),
        (ValueError, lambda: sdpa(x, x, x, dropout_p=2.0)),
        (ValueError, lambda: sdpa(x64, key3, x64)),
        (TypeError, lambda: sdpa(x, x, x, attn_mask=mask_o)),
        (ValueError, lambda: F.linear(x64, w31)),
        (ValueError, lambda: F.linear(x64, w32, b7)),
        (TypeError, lambda: F.linear(x64, w32, b8c)),
        (ValueError, lambda: F.softmax(x64, axis=5)),
        (TypeError, lambda: drop(x_c)),
        (ValueError, lambda: lin(x64[..., :3])),
        ((MemoryError, ValueError), lambda: sdpa(huge_q, x, x)),
        ((MemoryError, ValueError), lambda: mha(huge_x)),
    ]


def test_rejected_calls_do_not_leak():
    calls = _rejected_calls()

    def run_all():
        for exc, call in calls:
            try:
                call()
            except exc:
                pass
            else:
                raise AssertionError("no error")

    for _ in range(30):
        run_all()
    gc.collect()
    watched = [None, True, False, np.dtype(np.float32), np.dtype(np.float64), np.float32, np.float64,
               np.ndarray, np.bool_, complex, object]
    refs = [sys.getrefcount(o) for o in watched]
    n_objects = len(gc.get_objects())
    rss = _rss_bytes()
    rounds = 10_000 // len(calls) + 1  # >= 10,000 rejected calls
    for _ in range(rounds):
        run_all()
    gc.collect()
    for o, r0 in zip(watched, refs):
        assert abs(sys.getrefcount(o) - r0) < 50, f"refcount of {o!r}: {r0} -> {sys.getrefcount(o)}"
    assert len(gc.get_objects()) - n_objects < 200
    grown = _rss_bytes() - rss
    assert grown < 8 * 1024 * 1024, f"RSS grew {grown} bytes over {rounds * len(calls)} rejected calls"
