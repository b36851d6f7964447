"""Property-based fuzzing (hypothesis) of every entry point against the
float64 NumPy oracle of test_bad_inputs.py: shapes (zero sizes included),
input dtypes (float32/float64/int/bool/float16), memory layouts (slices,
transposes, negative steps, broadcast views), masks (bool/int/float, any
broadcast shape, or not broadcastable), scale, is_causal and head counts.
Each example gives the oracle's answer within float tolerances, or a clean
exception of the type API.md names.

CI runs a bounded, derandomized budget; a longer run:
    ATTNC_FUZZ_EXAMPLES=20000 python -m pytest tests/test_fuzz.py
"""
import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import attnc
from attnc import functional as F
from test_bad_inputs import MODULES, ref_attend, ref_linear, ref_module, ref_softmax

EXAMPLES = int(os.environ.get("ATTNC_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="ATTNC_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=list(HealthCheck), database=None)

INPUT_DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int8, np.uint8, bool, ">f4", ">f8"]
MASK_DTYPES = [bool, np.int8, np.int64, np.uint8, np.float32, np.float64, np.float16]
COUNTS = {}  # test name -> examples run (printed by the last test, for the README table)


def _count(name):
    COUNTS[name] = COUNTS.get(name, 0) + 1


def result_dtype(*dtypes):
    return np.float64 if any(np.dtype(d).kind == "f" and np.dtype(d).itemsize == 8 for d in dtypes) \
        else np.float32


def tol(dtype, *in_dtypes):
    if any(np.dtype(d) == np.float16 for d in in_dtypes):
        pass  # float16 inputs are exact in float32/float64
    return 5e-5 if np.dtype(dtype) == np.float32 else 1e-10


@st.composite
def arrays(draw, shape, dtype=None, elements=None):
    """A real array of `shape` in a drawn dtype and memory layout; returns (view, float64 values)."""
    dtype = np.dtype(draw(st.sampled_from(INPUT_DTYPES)) if dtype is None else dtype)
    seed = draw(st.integers(0, 2 ** 32 - 1))
    rng = np.random.default_rng(seed)
    if dtype.kind == "b":
        values = rng.integers(0, 2, shape).astype(bool)
    elif dtype.kind in "iu":
        values = rng.integers(0 if dtype.kind == "u" else -3, 4, shape).astype(dtype)
    elif dtype.itemsize == 2:
        values = (rng.integers(-8, 9, shape) / 4).astype(dtype)  # exact in float16
    else:
        values = (rng.standard_normal(shape) * draw(st.sampled_from([0.1, 1.0, 4.0]))).astype(dtype)
    layout = draw(st.sampled_from(["c", "f", "reversed", "step", "transposed", "broadcast", "unaligned"]))
    view = values
    if layout == "f":
        view = np.asfortranarray(values)
    elif layout == "reversed" and values.ndim:
        flip = tuple(slice(None, None, -1) for _ in shape)
        view = np.ascontiguousarray(values[flip])[flip]
    elif layout == "step" and values.ndim:
        view = np.repeat(values, 2, axis=-1)[..., ::2]
    elif layout == "transposed" and values.ndim >= 2:
        view = np.ascontiguousarray(np.swapaxes(values, -1, -2)).swapaxes(-1, -2)
    elif layout == "broadcast" and values.ndim:
        view = np.broadcast_to(values[:1], shape) if shape[0] > 0 else values
    elif layout == "unaligned" and values.size:
        buf = np.zeros(values.nbytes + 1, np.uint8)
        view = np.frombuffer(buf[1:].data, values.dtype).reshape(values.shape)
        view[...] = values
    return view, np.asarray(view, np.float64)


def _broadcast_shape_of(target, draw):
    """A shape that broadcasts to target (dims dropped from the left, some set to 1)."""
    n = draw(st.integers(0, len(target)))
    return tuple(1 if draw(st.booleans()) else s for s in target[len(target) - n:])


@st.composite
def masks(draw, scores_shape):
    """None, a mask broadcasting to scores_shape, or (rarely) one that does not."""
    kind = draw(st.sampled_from(["none", "fits", "fits", "fits", "bad"]))
    if kind == "none":
        return None, None, True
    shape = _broadcast_shape_of(scores_shape, draw)
    fits = True
    if kind == "bad" and shape:
        axis = draw(st.integers(0, len(shape) - 1))
        shape = shape[:axis] + (shape[axis] + draw(st.integers(1, 3)),) + shape[axis + 1:]
        fits = all(s == 1 or s == t for s, t in zip(shape[::-1], scores_shape[::-1]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    dtype = np.dtype(draw(st.sampled_from(MASK_DTYPES)))
    keep = rng.random(shape) < draw(st.sampled_from([0.0, 0.5, 0.9, 1.0]))
    if dtype.kind == "f":
        mask = np.where(keep, rng.choice([1.0, -2.5, 0.25, np.nan], shape), rng.choice([0.0, -0.0], shape))
        mask = mask.astype(dtype)
    else:
        mask = keep.astype(dtype)
    if draw(st.booleans()) and mask.ndim:
        mask = np.ascontiguousarray(mask[..., ::-1])[..., ::-1]
    return mask, mask, fits


def _close(actual, expected, dtype, what):
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    assert actual.dtype == np.dtype(dtype), (what, actual.dtype, dtype)
    if expected.size == 0:
        return
    assert np.all(np.isfinite(actual)), what
    scale = max(1.0, float(np.max(np.abs(expected))))
    err = float(np.max(np.abs(actual.astype(np.float64) - expected)))
    assert err <= tol(dtype) * scale, f"{what}: max abs err {err:.3e} (scale {scale:.3g})"


@st.composite
def batch_shapes(draw, max_dims=2):
    return tuple(draw(st.lists(st.integers(0, 3), max_size=max_dims)))


# ============================================================================


@FUZZ
@given(data=st.data())
def test_fuzz_sdpa(data):
    draw = data.draw
    batch = draw(batch_shapes())
    L, S, E, Ev = (draw(st.integers(0, 9)) for _ in range(4))

    def sub(b):  # a batch shape that broadcasts with `batch`
        return tuple(1 if draw(st.booleans()) else s for s in b[len(b) - draw(st.integers(0, len(b))):])

    q, q64 = draw(arrays(sub(batch) + (L, E)))
    k, k64 = draw(arrays(sub(batch) + (S, E)))
    v, v64 = draw(arrays(sub(batch) + (S, Ev)))
    out_batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    mask, _, fits = draw(masks(out_batch + (L, S)))
    causal = draw(st.booleans())
    scale = draw(st.sampled_from([None, 0.0, 0.3, -1.0, 2.0, 1e-3]))
    weights = draw(st.booleans())
    _count("sdpa")
    if not fits:
        with pytest.raises(ValueError, match="attn_mask"):
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                           return_weights=weights)
        return
    result = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                            return_weights=weights)
    s = (1 / math.sqrt(E) if E else 1.0) if scale is None else scale
    ref_out, ref_w = ref_attend(q64, k64, v64, s, mask, causal)
    dtype = result_dtype(q.dtype, k.dtype, v.dtype)
    if weights:
        _close(result[0], ref_out, dtype, "out")
        _close(result[1], ref_w, dtype, "weights")
    else:
        _close(result, ref_out, dtype, "out")


MODULE_BUILDERS = {
    "V1": lambda d, h, r: attnc.SelfAttentionV1(d, **r),
    "V2": lambda d, h, r: attnc.SelfAttentionV2(d, **r),
    "V3": lambda d, h, r: attnc.SelfAttentionV3(d, 0.3, **r),
    "V4": lambda d, h, r: attnc.SelfAttentionV4(d, 0.3, **r),
    "MHA": lambda d, h, r: attnc.MultiHeadAttention(d * h, h, 0.3, **r),
    "SA": lambda d, h, r: attnc.SelfAttention(d, d + h, 2 * h + 1, bias=bool(h % 2), **r),
    "MHSA": lambda d, h, r: attnc.MultiHeadSelfAttention(d, 2 * h, 3 * h, h, bias=bool(h % 2), **r),
}


@FUZZ
@given(data=st.data())
def test_fuzz_modules(data):
    draw = data.draw
    kind = draw(st.sampled_from(list(MODULE_BUILDERS)))
    dim, heads = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    m = MODULE_BUILDERS[kind](dim, heads, dict(dtype=dtype, rng=np.random.default_rng(draw(st.integers(0, 99)))))
    m.eval()
    in_dim = m.Q_proj.in_features if kind == "V1" else (
        m.hidden_dim if kind == "MHA" else getattr(m, "dim", getattr(m, "dim_in", None)))
    batch = draw(batch_shapes())
    seq = draw(st.integers(0, 8))
    x, x64 = draw(arrays(batch + (seq, in_dim)))
    masked = kind not in ("V1", "V2")
    multi = kind in ("MHA", "MHSA")
    scores = batch + ((m.head_num if kind == "MHA" else m.num_heads),) if multi else batch
    mask, _, fits = draw(masks(scores + (seq, seq))) if masked else (None, None, True)
    weights = draw(st.booleans())
    _count("modules")
    args = (x, mask) if masked else (x,)
    if not fits:
        with pytest.raises(ValueError, match="attention_mask"):
            m(*args, return_weights=weights)
        return
    result = m(*args, return_weights=weights)
    ref_out, ref_w = ref_module(m, x64, mask)
    if weights:
        _close(result[0], ref_out, dtype, f"{kind} out")
        _close(result[1], ref_w, dtype, f"{kind} weights")
    else:
        _close(result, ref_out, dtype, f"{kind} out")


@FUZZ
@given(data=st.data())
def test_fuzz_module_wrong_inputs(data):
    """Wrong last dim, too few dims, bad dtypes: the named exception, never a crash."""
    draw = data.draw
    kind = draw(st.sampled_from(list(MODULES)))
    m = MODULES[kind][0](4, rng=np.random.default_rng(0))
    bad = draw(st.sampled_from(["ndim", "last", "complex", "object", "str"]))
    _count("module-errors")
    shape = tuple(draw(st.lists(st.integers(0, 3), min_size=0, max_size=1))) if bad == "ndim" else \
        tuple(draw(st.lists(st.integers(0, 3), min_size=2, max_size=4)))
    if bad == "last":
        shape = shape[:-1] + (draw(st.integers(0, 9).filter(lambda n: n != 4)),)
    elif bad != "ndim":
        shape = shape[:-1] + (4,)
    x = np.zeros(shape, {"ndim": np.float32, "last": np.float64, "complex": np.complex128, "object": object,
                         "str": "U3"}[bad])
    with pytest.raises(TypeError if bad in ("complex", "object", "str") else ValueError, match="x"):
        m(x)


@FUZZ
@given(data=st.data())
def test_fuzz_linear(data):
    draw = data.draw
    batch = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    n_in, n_out = draw(st.integers(0, 40)), draw(st.integers(0, 40))
    x, x64 = draw(arrays(batch + (n_in,)))
    w, w64 = draw(arrays((n_out, n_in)))
    use_bias = draw(st.booleans())
    b, b64 = draw(arrays((n_out,))) if use_bias else (None, None)
    _count("linear")
    out = F.linear(x, w, b)
    _close(out, ref_linear(x64, w64, b64), result_dtype(x.dtype, w.dtype, *([b.dtype] if use_bias else [])),
           "linear")


@FUZZ
@given(data=st.data())
def test_fuzz_softmax_and_dropout(data):
    draw = data.draw
    shape = tuple(draw(st.lists(st.integers(0, 6), max_size=4)))
    x, x64 = draw(arrays(shape))
    axis = draw(st.integers(-max(1, len(shape)), max(1, len(shape)) - 1))
    _count("softmax")
    out = F.softmax(x, axis=axis)
    _close(out, ref_softmax(x64, axis=axis if shape else -1), result_dtype(x.dtype), "softmax")
    p = draw(st.sampled_from([0.0, 0.25, 0.5, 1.0]))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    d = attnc.Dropout(p, dtype=dtype, rng=np.random.default_rng(draw(st.integers(0, 99))))
    y = d(x)
    assert y.shape == x.shape and y.dtype == dtype
    kept = y != 0
    expected = x64 / (1 - p) if p < 1 else np.zeros_like(x64)
    np.testing.assert_allclose(y[kept], expected[kept], rtol=1e-6 if dtype == np.float32 else 1e-12)
    if p == 0:
        np.testing.assert_allclose(y, x64, rtol=1e-6)
    _close(d.eval()(x), x64, dtype, "dropout eval") if np.all(np.isfinite(x64)) else None


def test_fuzz_counts_report(capsys):
    """Runs last in this file: prints the number of examples run per test (for docs)."""
    with capsys.disabled():
        print(f"\n[fuzz] examples run: {COUNTS} (max_examples={EXAMPLES})")
