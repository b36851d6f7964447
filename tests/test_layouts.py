"""Input layouts: strided, Fortran, negative strides, read-only, broadcast, unaligned and
byte-swapped arrays give the plain copy's answer bit for bit and are never modified;
integer / bool / float16 inputs; outputs are fresh C-contiguous arrays; empty batches."""
import numpy as np
import pytest

import attnc
from attnc import functional as F
from toolkit import MODEL, MODEL_IDS, MODELS, assert_close, ref_attend, ref_module, scores_shape


def _strided(a):
    buf = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    buf[..., ::2] = a
    return buf[..., ::2]


def _strided_rows(a):
    if a.ndim < 2:
        return _strided(a)
    buf = np.zeros(a.shape[:-2] + (3 * a.shape[-2], a.shape[-1]), a.dtype)
    buf[..., ::3, :] = a
    return buf[..., ::3, :]


def _negative(a):
    if a.ndim < 2:
        return a[::-1].copy()[::-1]
    return a[..., ::-1, ::-1].copy()[..., ::-1, ::-1]


def _readonly(a):
    b = a.copy()
    b.setflags(write=False)
    return b


def _unaligned(a):
    buf = bytearray(a.nbytes + 1)
    b = np.ndarray(a.shape, dtype=a.dtype, buffer=buf, offset=1)
    b[...] = a
    if a.size and a.dtype.itemsize > 1:
        assert not b.flags.aligned
    return b


def _byteswapped(a):
    if a.dtype.kind == "b" or a.dtype.itemsize == 1:
        return a.copy()
    b = a.astype(a.dtype.newbyteorder(">" if a.dtype.byteorder in "=<|" else "<"))
    assert not b.dtype.isnative
    return b


def _fortran(a):
    b = np.asfortranarray(a)
    if a.ndim >= 2 and a.size > 1:
        assert not b.flags.c_contiguous
    return b


def _swapped_view(a):
    return np.swapaxes(np.swapaxes(a, 0, -1).copy(), 0, -1) if a.ndim >= 2 else a.copy()


LAYOUTS = {"strided": _strided, "strided_rows": _strided_rows, "fortran": _fortran, "negative": _negative,
           "readonly": _readonly, "unaligned": _unaligned, "byteswapped": _byteswapped, "swapped": _swapped_view}


def _check_same(fn, plain_args, layout):
    """fn(*variant_args) == fn(*plain_args) bit for bit; variants unchanged; output fresh."""
    expected = fn(*plain_args)
    variants = [None if a is None else LAYOUTS[layout](a) for a in plain_args]
    before = [None if v is None else v.copy() for v in variants]
    got = fn(*variants)
    exp_t = expected if isinstance(expected, tuple) else (expected,)
    got_t = got if isinstance(got, tuple) else (got,)
    for g, e in zip(got_t, exp_t):
        assert g.dtype == e.dtype and g.flags.c_contiguous and g.flags.writeable
        np.testing.assert_array_equal(g, e)
        for v in variants:
            if v is not None:
                assert not np.shares_memory(g, v)
    for v, b in zip(variants, before):
        if v is not None:
            np.testing.assert_array_equal(v, b)
            assert v.dtype == b.dtype


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_module_layouts(case, layout):
    dim = 6
    m = case.make(dim, rng=np.random.default_rng(0)).eval()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, dim)).astype(np.float32)
    _check_same(lambda a: m(a), [x], layout)
    _check_same(lambda a: m(a, return_weights=True), [x], layout)
    x64 = x.astype(np.float64)
    _check_same(lambda a: m(a), [x64], layout)
    if case.masked:
        mask = (rng.random(scores_shape(case, dim, x.shape)) < 0.6).astype(np.int32)
        _check_same(lambda a, k: m(a, k), [x, mask], layout)
        _check_same(lambda a, k: m(a, k), [x, mask.astype(bool)], layout)
        _check_same(lambda a, k: m(a, k), [x, mask.astype(np.float64)], layout)


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_module_broadcast_input_and_mask(case):
    dim = 4
    m = case.make(dim, rng=np.random.default_rng(2)).eval()
    row = np.random.default_rng(2).standard_normal((1, 3, dim)).astype(np.float32)
    xb = np.broadcast_to(row, (4, 3, dim))
    assert xb.strides[0] == 0 and not xb.flags.writeable
    np.testing.assert_array_equal(m(xb), m(xb.copy()))
    if case.masked:
        h = case.n_heads(dim)
        key_mask = np.array([1, 0, 1], bool)
        full = np.broadcast_to(key_mask, (4,) + ((h,) if h else ()) + (3, 3))
        np.testing.assert_array_equal(m(xb, full), m(xb, full.copy()))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_functional_layouts(layout):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    w = rng.standard_normal((6, 5)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    _check_same(lambda a, ww, bb: F.linear(a, ww, bb), [x, w, b], layout)
    _check_same(lambda a, ww: F.linear(a, ww), [x.astype(np.float64), w.astype(np.float64)], layout)
    _check_same(lambda a: F.softmax(a), [x], layout)
    _check_same(lambda a: F.softmax(a, axis=1), [x.astype(np.float64)], layout)
    q, k, v = (rng.standard_normal((2, 4, 3)).astype(np.float32) for _ in range(3))
    mask = rng.random((2, 4, 4)) < 0.7
    _check_same(lambda *a: F.scaled_dot_product_attention(*a), [q, k, v], layout)
    _check_same(lambda *a: F.scaled_dot_product_attention(a[0], a[1], a[2], attn_mask=a[3], return_weights=True),
                [q, k, v, mask.astype(np.int16)], layout)
    _check_same(lambda *a: F.scaled_dot_product_attention(*a, is_causal=True), [q, k, v], layout)
    _check_same(lambda a: attnc.Dropout(0.5).eval()(a), [x], layout)
    _check_same(lambda a: attnc.Dropout(0.5, rng=np.random.default_rng(4))(a), [x], layout)
    _check_same(lambda *a: F.scaled_dot_product_attention(*a, dropout_p=0.3, rng=np.random.default_rng(5)),
                [q, k, v], layout)


# The attention kernel's tiles: BLOCK_Q = 96 queries, BLOCK_K = 192 keys (csrc/attention_tiles.h).
# 200 queries and 400 keys cross two query tiles and two key tiles (a partial third of each).


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sdpa_layouts_across_tiles(layout):
    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 200, 8)).astype(np.float32)
    k = rng.standard_normal((2, 400, 8)).astype(np.float32)
    v = rng.standard_normal((2, 400, 5)).astype(np.float32)
    mask = rng.random((200, 400)) < 0.7
    _check_same(lambda *a: F.scaled_dot_product_attention(*a), [q, k, v], layout)
    _check_same(lambda *a: F.scaled_dot_product_attention(a[0], a[1], a[2], attn_mask=a[3]),
                [q, k, v, mask.astype(np.int16)], layout)
    _check_same(lambda *a: F.scaled_dot_product_attention(a[0], a[1], a[2], attn_mask=a[3], return_weights=True),
                [q, k, v, mask], layout)
    _check_same(lambda *a: F.scaled_dot_product_attention(*a, is_causal=True), [q, k, v], layout)
    ref_out, _ = ref_attend(q, k, v, 1 / np.sqrt(8), mask)
    assert_close(F.scaled_dot_product_attention(*(LAYOUTS[layout](a) for a in (q, k, v)), attn_mask=mask),
                 ref_out, np.float32, layout)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", ["V4", "MHA"])
def test_module_layouts_across_tiles(name, layout):
    dim = 8
    m = MODEL[name].make(dim, rng=np.random.default_rng(12)).eval()
    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, 400, dim)).astype(np.float32)
    mask = (rng.random(scores_shape(MODEL[name], dim, x.shape)) < 0.7).astype(np.int32)
    _check_same(lambda a: m(a), [x], layout)
    _check_same(lambda a, k: m(a, k, return_weights=True), [x, mask], layout)
    assert_close(m(LAYOUTS[layout](x), mask), ref_module(m, x, mask)[0], np.float32, layout)


@pytest.mark.parametrize("in_dtype", [np.int8, np.int32, np.int64, np.uint16, bool, np.float16, ">i8", ">f2"],
                         ids=str)
@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_integer_bool_float16_inputs(case, in_dtype):
    dim = 4
    m = case.make(dim, rng=np.random.default_rng(6)).eval()
    x = np.random.default_rng(6).integers(0, 3, (2, 3, dim)).astype(in_dtype)
    out = m(x)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, m(x.astype(np.float32)))
    m.to(np.float64)
    assert m(x).dtype == np.float64
    np.testing.assert_array_equal(m(x), m(x.astype(np.float64)))


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_outputs_are_fresh(case):
    dim = 4
    m = case.make(dim, rng=np.random.default_rng(7)).eval()
    x = np.random.default_rng(7).standard_normal((2, 3, dim)).astype(np.float32)
    out, w = m(x, return_weights=True)
    params = [p for _, p in m.named_parameters()]
    for o in (out, w):
        assert o.flags.c_contiguous and o.flags.writeable and o.dtype == np.float32
        assert not np.shares_memory(o, x)
        assert not any(np.shares_memory(o, p) for p in params)
    assert not np.shares_memory(out, w)
    out2 = m(x)
    saved = out2.copy()
    assert not np.shares_memory(out, out2)
    out2[...] = 0     # writing into a result changes nothing else
    np.testing.assert_array_equal(m(x), saved)


def test_functional_outputs_are_fresh():
    x = np.ones((3, 4), np.float32)
    for out in (F.softmax(x), F.linear(x, np.eye(4, dtype=np.float32)), attnc.Dropout(0.0)(x),
                attnc.Dropout(0.3).eval()(x), F.scaled_dot_product_attention(x, x, x)):
        assert not np.shares_memory(out, x) and out.flags.c_contiguous
    lin = attnc.Linear(0, 3)
    out = lin(np.ones((2, 0), np.float32))
    assert not np.shares_memory(out, lin.bias) and out.flags.c_contiguous and out.flags.writeable
    b = np.arange(3, dtype=np.float32)
    out = F.linear(np.ones((2, 0), np.float32), np.ones((3, 0), np.float32), b)
    assert not np.shares_memory(out, b)
    x1 = np.ones((1, 1), np.float32)
    assert not np.shares_memory(F.softmax(x1), x1)
    assert not np.shares_memory(F.linear(x1, x1), x1)


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
@pytest.mark.parametrize("shape", [(0, 3), (2, 0, 3), (2, 0), (0, 0, 3)], ids=str)
def test_empty_inputs(case, shape):
    dim = 4
    m = case.make(dim, rng=np.random.default_rng(8)).eval()
    x = np.zeros(shape + (dim,), np.float32)
    out_dim = m(np.zeros((1, 1, dim), np.float32)).shape[-1]
    out, w = m(x, return_weights=True)
    assert out.shape == shape + (out_dim,) and out.dtype == np.float32
    h = case.n_heads(dim)
    assert w.shape == shape[:-1] + ((h,) if h else ()) + (shape[-1], shape[-1])
    if case.masked:
        mask = np.ones(scores_shape(case, dim, x.shape), bool)
        assert m(x, mask).shape == out.shape


def test_functional_empty():
    assert F.linear(np.zeros((0, 4), np.float32), np.ones((3, 4), np.float32)).shape == (0, 3)
    assert F.softmax(np.zeros((0, 4), np.float32)).shape == (0, 4)
    assert F.softmax(np.zeros((3, 0), np.float32)).shape == (3, 0)
    q = np.zeros((0, 1, 5, 4), np.float32)
    k = np.zeros((3, 7, 4), np.float32)
    v = np.zeros((3, 7, 6), np.float32)
    out, w = F.scaled_dot_product_attention(q, k, v, return_weights=True)
    assert out.shape == (0, 3, 5, 6) and w.shape == (0, 3, 5, 7)
    assert attnc.Dropout(0.5)(np.zeros((0, 3), np.float32)).shape == (0, 3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("L, Ev", [(17, 32), (50, 64), (96, 16), (97, 64), (300, 128)])
def test_broadcast_value_rows_give_the_copy_bits(simd_mode, dtype, L, Ev):
    """Regression (fuzzing): value rows one row apart by a zero stride (np.broadcast_to,
    v[None]) were read in place as if they were a packed sliver (whose step the kernels
    mark with a zero stride): past the row's end, a segfault or the next rows' values.
    Bits of the contiguous copy, and every query's output that row (float64 NumPy)."""
    rng = np.random.default_rng(31)
    q = rng.standard_normal((2, L, 8)).astype(dtype)
    k = rng.standard_normal((2, 5, 8)).astype(dtype)
    block = np.full((4, Ev), 1000, dtype)  # the row, then rows a wrong read would find
    block[0] = rng.standard_normal(Ev)
    v = np.broadcast_to(block[:1], (2, 5, Ev))
    out = F.scaled_dot_product_attention(q, k, v)
    np.testing.assert_array_equal(out, F.scaled_dot_product_attention(q, k, v.copy()))
    assert_close(out, np.broadcast_to(block[0].astype(np.float64), out.shape), dtype)


@pytest.mark.parametrize("make", [
    lambda rng: rng.standard_normal((1200, 2600)).astype(np.float32).T,          # transposed: 12 MB
    lambda rng: rng.standard_normal((1, 1, 2600, 1200)).astype(">f8"),           # byte-swapped, first axes 1
    lambda rng: rng.standard_normal((3, 2600, 1200))[:, ::2],                    # strided float64
    lambda rng: np.broadcast_to(rng.standard_normal((1, 1200)), (2600, 1200))],  # a broadcast
    ids=["transposed", "byte-swapped", "strided", "broadcast"])
def test_large_inputs_copied_block_by_block_give_the_copy_bits(make):
    """Inputs of more than 8 MB in another layout or byte order are copied 8 MB at a time
    along their first axis longer than 1 (so that Ctrl-C can stop the copy): the results
    of the plain C-contiguous copy, bit for bit, and the inputs unchanged. softmax's against
    float64 NumPy's."""
    x = make(np.random.default_rng(33))
    before = x.copy()
    plain = np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("="))
    got = F.softmax(x, axis=-1)
    np.testing.assert_array_equal(got, F.softmax(plain, axis=-1))
    wide = plain.astype(np.float64)
    expected = np.exp(wide - wide.max(-1, keepdims=True))
    assert_close(got, expected / expected.sum(-1, keepdims=True), got.dtype)
    w = np.random.default_rng(34).standard_normal((8, x.shape[-1])).astype(got.dtype)
    np.testing.assert_array_equal(F.linear(x, w), F.linear(plain, w))
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("order", [">", "<"], ids=["big", "little"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=["f16", "f32", "f64"])
def test_gradients_of_byte_swapped_inputs_come_in_native_order(order, dtype):
    """Regression (a review helper, 2026-12-01): a module's backward returned the gradient of a
    byte-swapped x in x's byte order ('>f4'), though every other result is native. Now the
    native dtype of x's width, with the bits of the native input's gradient; so for
    nn.MultiheadAttention's key and value gradients."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 5, 8)).astype(dtype)
    swapped = x.astype(x.dtype.newbyteorder(order))
    m = attnc.MultiHeadAttention(8, 2, dropout=0.0).train()
    g = rng.standard_normal((2, 5, 8))
    m(x)
    expected = m.backward(g)
    m(swapped)
    got = m.backward(g)
    assert got.dtype == np.dtype(dtype) and got.dtype.isnative
    np.testing.assert_array_equal(got, expected)
    nn = attnc.nn.MultiheadAttention(8, 2, batch_first=True).train()
    nn(x, x, x)
    expected = nn.backward(g)
    nn(swapped, x.copy(), swapped)
    got = nn.backward(g)
    for e, a in zip(expected, got):
        assert a.dtype == np.dtype(dtype) and a.dtype.isnative
        np.testing.assert_array_equal(a, e)
