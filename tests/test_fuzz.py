"""Property-based fuzzing (hypothesis) of every entry point against the
toolkit's float64 NumPy oracle: shapes (zero sizes included, and sometimes
lengths across one or more attention tiles: up to 250 queries and 450 keys),
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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnc
from attnc import functional as F
from toolkit import MODEL, MODELS, assert_close, ref_attend, ref_linear, ref_module, ref_softmax, result_dtype

EXAMPLES = int(os.environ.get("ATTNC_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="ATTNC_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=list(HealthCheck), database=None)

INPUT_DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int8, np.uint8, bool, ">f4", ">f8"]
MASK_DTYPES = [bool, np.int8, np.int64, np.uint8, np.float32, np.float64, np.float16]
COUNTS = {}  # test name -> examples run (printed by the last test, for the README table)


def _count(name):
    COUNTS[name] = COUNTS.get(name, 0) + 1


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


# The attention kernel works in tiles of BLOCK_Q = 96 queries and BLOCK_K = 192
# keys (csrc/attention_tiles.h). Most examples are small (fast, and where the
# edge cases are); some cross one or more tile boundaries, at them or anywhere.
QUERY_TILE, KEY_TILE = 96, 192


def lengths(tile, most):
    """0..9 mostly; else a length at a tile boundary (+-1) or anywhere up to `most`."""
    edges = sorted({n for t in (tile, 2 * tile) for n in (t - 1, t, t + 1) if n <= most})
    return st.one_of(st.integers(0, 9), st.integers(0, 9), st.integers(0, 9), st.sampled_from(edges),
                     st.integers(10, most))


@st.composite
def batch_shapes(draw, max_dims=2):
    return tuple(draw(st.lists(st.integers(0, 3), max_size=max_dims)))


# ============================================================================


@FUZZ
@given(data=st.data())
def test_fuzz_sdpa(data):
    draw = data.draw
    batch = draw(batch_shapes())
    L, S = draw(lengths(QUERY_TILE, 250)), draw(lengths(KEY_TILE, 450))
    E, Ev = (draw(st.integers(0, 9)) for _ in range(2))

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
    if L > QUERY_TILE and S > KEY_TILE:
        _count("sdpa across query and key tiles")
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
        assert_close(result[0], ref_out, dtype, "out")
        assert_close(result[1], ref_w, dtype, "weights")
    else:
        assert_close(result, ref_out, dtype, "out")


@FUZZ
@given(data=st.data())
def test_fuzz_modules(data):
    draw = data.draw
    model = draw(st.sampled_from(MODELS))
    kind = model.name
    d, heads = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    dim = d * heads if model.kind == "MultiHeadAttention" else d   # MHA: heads split the model dim
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    m = model.make(dim, heads=heads, dtype=dtype, rng=np.random.default_rng(draw(st.integers(0, 99))))
    m.eval()
    batch = draw(batch_shapes())
    seq = draw(lengths(QUERY_TILE, 300))
    x, x64 = draw(arrays(batch + (seq, dim)))
    scores = batch + ((heads,) if model.heads is not None else ())
    mask, _, fits = draw(masks(scores + (seq, seq))) if model.masked else (None, None, True)
    weights = draw(st.booleans())
    _count("modules")
    if seq > KEY_TILE:
        _count("modules across query and key tiles")
    args = (x, mask) if model.masked else (x,)
    if not fits:
        with pytest.raises(ValueError, match="attention_mask"):
            m(*args, return_weights=weights)
        return
    result = m(*args, return_weights=weights)
    ref_out, ref_w = ref_module(m, x64, mask)
    if weights:
        assert_close(result[0], ref_out, dtype, f"{kind} out")
        assert_close(result[1], ref_w, dtype, f"{kind} weights")
    else:
        assert_close(result, ref_out, dtype, f"{kind} out")


@FUZZ
@given(data=st.data())
def test_fuzz_module_wrong_inputs(data):
    """Wrong last dim, too few dims, bad dtypes: the named exception, never a crash."""
    draw = data.draw
    kind = draw(st.sampled_from(list(MODEL)))
    m = MODEL[kind].make(4, rng=np.random.default_rng(0))
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
    assert_close(out, ref_linear(x64, w64, b64), result_dtype(x.dtype, w.dtype, *([b.dtype] if use_bias else [])),
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
    assert_close(out, ref_softmax(x64, axis=axis if shape else -1), result_dtype(x.dtype), "softmax")
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
    if p == 1:
        assert not y.any()
    assert_close(d.eval()(x), x64, dtype, "dropout eval") if np.all(np.isfinite(x64)) else None


def test_fuzz_counts_report(capsys):
    """Runs last in this file: prints the number of examples run per test (for docs), and
    checks that a full (default or longer) run reached lengths across several tiles."""
    with capsys.disabled():
        print(f"\n[fuzz] examples run: {COUNTS} (max_examples={EXAMPLES})")
    if COUNTS.get("sdpa", 0) >= 100:
        assert COUNTS.get("sdpa across query and key tiles", 0) > 0, COUNTS
    if COUNTS.get("modules", 0) >= 100:
        assert COUNTS.get("modules across query and key tiles", 0) > 0, COUNTS
