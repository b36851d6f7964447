"""Every attnc class against its document's torch class (eval mode), weights moved with
load_state_dict, plus torch.nn.MultiheadAttention for the multi-head classes and the
hand-derived example of document 003."""
import math

import numpy as np
import pytest
import torch

import attnc
from toolkit import (MODEL, MODEL_IDS, MODELS, assert_close, assert_grad_close, make_pair, np_sd, random_keep_mask,
                     ref_forward, scores_shape, torch_dtype, torch_forward)
from toolkit import doc_models as dm


def _x(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


# ----------------------------------------------------------------------------
# the documents' own examples


def _check(am, tm, kind, x, mask, dtype, heads=None, case=None):
    xt = torch.from_numpy(x)
    with torch.no_grad():
        if mask is None:
            expected = tm(xt).numpy()
        else:
            expected = tm(xt, torch.from_numpy(np.ascontiguousarray(mask))).numpy()
    out = am(x) if mask is None else am(x, mask)
    assert out.dtype == dtype
    assert_close(out, expected, dtype, "vs torch")
    ref_out, ref_w = ref_forward(kind, np_sd(tm), x, mask, heads)
    out2, w = am(x, return_weights=True) if mask is None else am(x, mask, return_weights=True)
    assert_close(out2, ref_out, dtype, "vs numpy")
    assert_close(w, ref_w, dtype, "weights vs numpy")
    assert w.dtype == dtype
    assert_close(out2, out, dtype, "return_weights=True vs False")


def test_doc000_v1_example(dtype, simd_mode):
    torch.manual_seed(0)
    tm = dm.SelfAttentionv1(hidden_dim=4).eval().to(torch_dtype(dtype))
    am = attnc.SelfAttentionV1(hidden_dim=4, dtype=dtype)
    am.load_state_dict({k: v.detach() for k, v in tm.state_dict().items()})
    x = torch.randn(3, 2, 4, dtype=torch_dtype(dtype)).numpy()
    _check(am, tm, "SelfAttentionV1", x, None, dtype)
    assert am(x).shape == (3, 2, 4)


def test_doc000_v2_example(dtype, simd_mode):
    torch.manual_seed(1)
    tm = dm.SelfAttentionv2(4).eval().to(torch_dtype(dtype))
    am = attnc.SelfAttentionV2(4, dtype=dtype).eval()
    am.load_state_dict(tm.state_dict())
    x = torch.randn(3, 2, 4, dtype=torch_dtype(dtype)).numpy()
    _check(am, tm, "SelfAttentionV2", x, None, dtype)


DOC000_V3_MASK = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]])
DOC000_V4_MASK = np.array([[1, 0, 1], [1, 0, 0], [0, 0, 1]])


def test_doc000_v3_example(dtype, simd_mode):
    torch.manual_seed(2)
    tm = dm.SelfAttentionv3(2).eval().to(torch_dtype(dtype))
    am = attnc.SelfAttentionV3(2, dtype=dtype).eval()
    am.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    x = torch.randn(3, 4, 2, dtype=torch_dtype(dtype)).numpy()
    mask = torch.from_numpy(DOC000_V3_MASK).unsqueeze(1).repeat(1, 4, 1).numpy()
    assert mask.shape == (3, 4, 4)
    _check(am, tm, "SelfAttentionV3", x, mask, dtype)
    # the document's printed weights: batch 2 attends only to key 0 (weight exactly 1)
    _, w = am(x, mask, return_weights=True)
    np.testing.assert_array_equal(w[2], np.tile([1.0, 0, 0, 0], (4, 1)))
    np.testing.assert_array_equal(w[1][:, 2:], 0)


def test_doc000_v4_example(dtype, simd_mode):
    torch.manual_seed(3)
    tm = dm.SelfAttentionInterview(4).eval().to(torch_dtype(dtype))
    am = attnc.SelfAttentionInterview(4, dtype=dtype).eval()
    am.load_state_dict(tm.state_dict())
    x = torch.randn(3, 3, 4, dtype=torch_dtype(dtype)).numpy()
    mask = torch.from_numpy(DOC000_V4_MASK).unsqueeze(1).repeat(1, 3, 1).numpy()
    _check(am, tm, "SelfAttentionV4", x, mask, dtype)
    out, w = am(x, mask, return_weights=True)
    # as printed in the document: batch 1 keeps key 0 only, batch 2 key 2 only,
    # so all rows of those batches are the same V row
    np.testing.assert_array_equal(w[1], np.tile([1.0, 0, 0], (3, 1)))
    np.testing.assert_array_equal(w[2], np.tile([0, 0, 1.0], (3, 1)))
    np.testing.assert_array_equal(w[0][:, 1], 0)
    v = x @ tm.value.weight.detach().numpy().T + tm.value.bias.detach().numpy()
    assert_close(out[1], np.tile(v[1, 0], (3, 1)), dtype)
    assert_close(out[2], np.tile(v[2, 2], (3, 1)), dtype)


def test_doc001_multihead_example(dtype, simd_mode):
    torch.manual_seed(4)
    tm = dm.MuitiHeadAttention(128, 8).eval().to(torch_dtype(dtype))
    am = attnc.MultiHeadAttention(128, 8, dtype=dtype).eval()
    am.load_state_dict({k: v.detach() for k, v in tm.state_dict().items()})
    x = torch.randn(3, 2, 128, dtype=torch_dtype(dtype)).numpy()
    mask1 = torch.tensor([[0, 1], [0, 0], [1, 0]]).unsqueeze(1).unsqueeze(2).expand(3, 8, 2, 2).numpy()
    assert mask1.shape == (3, 8, 2, 2)
    _check(am, tm, "MultiHeadAttention", x, mask1, dtype, heads=8)
    _, w = am(x, mask1, return_weights=True)
    assert w.shape == (3, 8, 2, 2)
    np.testing.assert_allclose(w[1], 0.5, rtol=1e-6)   # fully masked batch: uniform, no NaN
    # the same mask given as (3, 1, 1, 2) broadcasts to the same result
    np.testing.assert_array_equal(am(x, mask1[:, :1, :1, :]), am(x, mask1))


@pytest.mark.parametrize("bias", [True, False], ids=["003-bias", "004-nobias"])
def test_doc003_004_selfattention(dtype, simd_mode, bias):
    torch.manual_seed(5)
    tm = dm.SelfAttention(4, 6, 5, bias=bias).eval().to(torch_dtype(dtype))
    am = attnc.SelfAttention(4, 6, 5, bias=bias, dtype=dtype).eval()
    am.load_state_dict(tm.state_dict())
    x = torch.randn(3, 5, 4, dtype=torch_dtype(dtype)).numpy()
    _check(am, tm, "SelfAttention", x, None, dtype)
    mask = random_keep_mask(np.random.default_rng(5), (3, 5, 5))
    _check(am, tm, "SelfAttention", x, mask, dtype)


@pytest.mark.parametrize("bias", [True, False], ids=["003-bias", "004-nobias"])
def test_doc003_004_multihead_selfattention(dtype, simd_mode, bias):
    torch.manual_seed(6)
    tm = dm.MultiHeadSelfAttention(16, 16, 8, num_heads=4, bias=bias).eval().to(torch_dtype(dtype))
    am = attnc.MultiHeadSelfAttention(16, 16, 8, 4, bias=bias, dtype=dtype).eval()
    am.load_state_dict(tm.state_dict())
    x = torch.randn(3, 5, 16, dtype=torch_dtype(dtype)).numpy()
    _check(am, tm, "MultiHeadSelfAttention", x, None, dtype, heads=4)
    mask = random_keep_mask(np.random.default_rng(6), (3, 1, 1, 5))
    _check(am, tm, "MultiHeadSelfAttention", x, mask, dtype, heads=4)
    assert am(x, return_weights=True)[1].shape == (3, 4, 5, 5)


def test_doc004_default_heads_is_8():
    am = attnc.MultiHeadSelfAttention(16, 16, 16)
    torch.manual_seed(7)
    tm = dm.MultiHeadSelfAttention(16, 16, 16).eval()
    am.load_state_dict(tm.state_dict())
    x = torch.randn(2, 3, 16).numpy()
    with torch.no_grad():
        assert_close(am.eval()(x), tm(torch.from_numpy(x)), np.float32)
    assert am(x, return_weights=True)[1].shape == (2, 8, 3, 3)


def test_attnc_differs_from_003_multihead():
    """003's MultiHeadSelfAttention attends over channels (Errata): attnc must not match it."""
    torch.manual_seed(8)
    t003 = dm.MultiHeadSelfAttention003(8, 8, 8, 2).eval()
    t004 = dm.MultiHeadSelfAttention(8, 8, 8, num_heads=2, bias=True).eval()
    t004.load_state_dict({k.replace("q.", "linear_q.").replace("k.", "linear_k.").replace("v.", "linear_v."): v
                          for k, v in t003.state_dict().items()})
    am = attnc.MultiHeadSelfAttention(8, 8, 8, 2, bias=True).eval()
    am.load_state_dict(t004.state_dict())
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        out003, out004 = t003(x).numpy(), t004(x).numpy()
    out = am(x.numpy())
    assert_close(out, out004, np.float32)
    assert np.max(np.abs(out - out003)) > 1e-3


def test_v1_default_hidden_dim_728(simd_mode):
    torch.manual_seed(9)
    tm = dm.SelfAttentionv1().eval()
    am = attnc.SelfAttentionV1()
    assert am.Q_proj.weight.shape == (728, 728)
    am.load_state_dict(tm.state_dict())
    x = torch.randn(2, 3, 728).numpy()
    with torch.no_grad():
        assert_close(am(x), tm(torch.from_numpy(x)), np.float32)


def test_default_dims_are_728():
    assert attnc.SelfAttentionV2().state_dict()["proj.weight"].shape == (3 * 728, 728)
    assert attnc.SelfAttentionV3().state_dict()["output_proj.weight"].shape == (728, 728)
    assert attnc.SelfAttentionV4().state_dict()["query.weight"].shape == (728, 728)


# ----------------------------------------------------------------------------
# every class on odd shapes, against torch and the float64 NumPy reference

ODD_SHAPES = [(2, 1, 5), (3, 7, 13), (2, 3, 5, 6), (5, 6), (1, 1, 3), (2, 2, 1, 4)]


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_odd_shapes_vs_torch(case, shape, dtype):
    dim = shape[-1]
    tm, am = make_pair(case, dim, dtype, seed=sum(shape))
    rng = np.random.default_rng(sum(shape))
    x = _x(rng, shape, dtype)
    mask = None
    if case.masked:
        mask = random_keep_mask(rng, scores_shape(case, dim, shape))
    out = am(x) if mask is None else am(x, mask)
    assert out.dtype == dtype and out.flags.c_contiguous
    assert_close(out, torch_forward(case, tm, x, mask), dtype, "vs torch")
    ref, ref_w = ref_forward(case.kind, np_sd(tm), x, mask, case.n_heads(dim))
    assert_close(out, ref, dtype, "vs numpy")
    out2, w = am(x, return_weights=True) if mask is None else am(x, mask, return_weights=True)
    assert_close(out2, out, dtype, "return_weights=True vs False")
    assert_close(w, ref_w, dtype, "weights")


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_portable_kernels_vs_torch(case, simd_mode):
    dim = 16 if case.kind == "MultiHeadAttention" else 13
    shape = (2, 9, dim)
    for dtype in (np.float32, np.float64):
        tm, am = make_pair(case, dim, dtype, seed=11)
        rng = np.random.default_rng(11)
        x = _x(rng, shape, dtype)
        mask = random_keep_mask(rng, scores_shape(case, dim, shape)) if case.masked else None
        out = am(x) if mask is None else am(x, mask)
        assert_close(out, torch_forward(case, tm, x, mask), dtype, f"simd={simd_mode}")


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_state_dict_into_torch(case, dtype):
    """The other direction: attnc's own init loaded into the torch class."""
    dim = 6
    am = case.make(dim, dtype=dtype, rng=np.random.default_rng(12)).eval()
    tm = case.make_torch(dim).eval().to(torch_dtype(dtype))
    sd = am.state_dict()
    assert all(isinstance(v, np.ndarray) and v.dtype == dtype for v in sd.values())
    tm.load_state_dict({k: torch.tensor(v) for k, v in sd.items()}, strict=True)
    x = _x(np.random.default_rng(12), (2, 4, dim), dtype)
    mask = random_keep_mask(np.random.default_rng(13), scores_shape(case, dim, x.shape)) if case.masked else None
    out = am(x) if mask is None else am(x, mask)
    assert_close(out, torch_forward(case, tm, x, mask), dtype)


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_load_from_numpy_float64_into_float32(case):
    dim = 5
    torch.manual_seed(14)
    tm = case.make_torch(dim).eval().double()
    am = case.make(dim).eval()
    am.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
    for k, v in am.state_dict().items():
        assert v.dtype == np.float32
        np.testing.assert_array_equal(v, tm.state_dict()[k].numpy().astype(np.float32))


def test_nan_propagates_like_torch():
    torch.manual_seed(15)
    tm = dm.SelfAttentionv1(4).eval()
    am = attnc.SelfAttentionV1(4)
    am.load_state_dict(tm.state_dict())
    x = np.random.default_rng(15).standard_normal((3, 3, 4)).astype(np.float32)
    x[1, 2, 0] = np.nan
    with torch.no_grad():
        expected = tm(torch.from_numpy(x)).numpy()
    out = am(x)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    assert np.isnan(out[1]).all()
    assert_close(out[[0, 2]], expected[[0, 2]], np.float32)


def _minus_inf_row_pair(model, dtype, T=4, dim=6):
    """A document model and its twin whose query 1 of item 0 scores -inf against every
    key, with every parameter and input finite: Q's first column is x[..., 0] times the
    dtype's near-largest value (so x[0, 1, 0] = -10 overflows it to -inf, 0 elsewhere),
    K's first column x[..., 1] = 1 (through the weight, its bias 0)."""
    tm, am = make_pair(model, dim, dtype)
    names, _, (_, qk_dim, _, _), _, _, fused, _ = am._spec
    sd = {key: np.array(value) for key, value in am.state_dict().items()}
    q_weight, q_row, k_weight, k_row = (names[0], 0, names[0], qk_dim) if fused else (names[0], 0, names[2], 0)
    sd[q_weight][q_row] = 0
    sd[q_weight][q_row, 0] = np.finfo(dtype).max / 4
    sd[k_weight][k_row] = 0
    sd[k_weight][k_row, 1] = 1
    for weight, bias, row in ((q_weight, names[1], q_row), (k_weight, names[1] if fused else names[3], k_row)):
        if bias in sd:
            sd[bias][row] = 0
    am.load_state_dict(sd)
    tm.load_state_dict({key: torch.from_numpy(value) for key, value in sd.items()})
    x = np.random.default_rng(3).standard_normal((2, T, dim)).astype(dtype)
    x[..., 0], x[..., 1] = 0, 1
    x[0, 1, 0] = -10
    return tm, am, x


@pytest.mark.parametrize("T", [4, 300])  # (the kernels' rows path and its tiles)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", [m for m in MODELS if not m.name.startswith("MHSA")],
                         ids=[m.name for m in MODELS if not m.name.startswith("MHSA")])
def test_a_row_of_minus_inf_scores_is_nan_as_torch_softmax_gives(case, dtype, T, simd_mode):
    """Regression (a robustness helper, 2026-12-02): a query whose every score is -inf
    (its projection overflowed to -inf against positive keys) got weights and output 0,
    the rule of PyTorch's SDPA math path; the documents' modules take torch.softmax,
    which gives NaN there. Now NaN where torch's module gives it (that query's output,
    and its weights), the other rows as torch's, frozen too. (The 003 classes' torch code
    attends over channels, so their twins are left out here.)"""
    tm, am, x = _minus_inf_row_pair(case, dtype, T)
    expected = torch_forward(case, tm, x)
    nan = np.zeros(expected.shape, bool)
    nan[0, 1] = True
    np.testing.assert_array_equal(np.isnan(expected), nan)  # (the premise: torch's NaN row)
    out, weights = am(x, return_weights=True)
    np.testing.assert_array_equal(np.isnan(out), nan)
    assert_close(out[~nan], expected[~nan], dtype)
    np.testing.assert_array_equal(am.freeze()(x), out)
    rows = np.isnan(weights).any(axis=-1)
    assert np.isnan(weights[rows]).all()
    assert rows.reshape(-1, T).any(axis=0).tolist() == [False, True] + [False] * (T - 2)


@pytest.mark.parametrize("case", [MODEL["V1"], MODEL["SA-bias"]], ids=["V1", "SA-bias"])
def test_a_row_of_minus_inf_scores_gives_nan_gradients_as_torch(case):
    """The backward of that row: torch's autograd of softmax turns its NaN weights into
    NaN gradients (every key's and value's, so every input row's and parameter's); the
    twin's backward, which recomputes weights from each row's log-sum-exp, had taken the
    row as one of no key (weights 0) and left them finite."""
    tm, am, x = _minus_inf_row_pair(case, np.float64)
    xt = torch.from_numpy(x.copy()).requires_grad_(True)
    out_t = tm.train()(xt)
    out_t.backward(torch.ones_like(out_t))
    out = am.train()(x)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(out_t.detach().numpy()))
    grad_x = am.backward(np.ones_like(out))
    np.testing.assert_array_equal(np.isnan(grad_x), np.isnan(xt.grad.numpy()))
    # the finite values too, as torch's (an audit: the NaN pattern alone was compared); of
    # grad_x, item 1's but for feature 0, whose gradient sums terms of 1e291 (through Q's
    # near-largest weight), in an order that decides it
    assert_close(out[~np.isnan(out)], out_t.detach().numpy()[~np.isnan(out)], np.float64, "out")
    assert_grad_close(grad_x[1, :, 1:], xt.grad.numpy()[1, :, 1:], np.float64, "grad_x")
    torch_grads = {name: param.grad.numpy() for name, param in tm.named_parameters()}
    for name, grad in am.named_grads():
        np.testing.assert_array_equal(np.isnan(grad), np.isnan(torch_grads[name]), err_msg=name)


# ----------------------------------------------------------------------------
# the multi-head classes against torch.nn.MultiheadAttention


def _torch_mha_from(am, dim, heads, bias):
    sd = am.state_dict()
    mha = torch.nn.MultiheadAttention(dim, heads, bias=bias, batch_first=True).eval()
    mha = mha.to(torch_dtype(am.dtype))
    names = ("query_linear", "key_linear", "value_linear") if "query_linear.weight" in sd else \
        ("linear_q", "linear_k", "linear_v")
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.from_numpy(np.concatenate([sd[n + ".weight"] for n in names])))
        if bias:
            mha.in_proj_bias.copy_(torch.from_numpy(np.concatenate([sd[n + ".bias"] for n in names])))
        if "output_linear.weight" in sd:
            mha.out_proj.weight.copy_(torch.from_numpy(sd["output_linear.weight"]))
            mha.out_proj.bias.copy_(torch.from_numpy(sd["output_linear.bias"]))
        else:   # no output projection in MultiHeadSelfAttention: identity
            mha.out_proj.weight.copy_(torch.eye(dim, dtype=mha.out_proj.weight.dtype))
            if bias:
                mha.out_proj.bias.zero_()
    return mha


@pytest.mark.parametrize("kind", ["MHA", "MHSA-bias", "MHSA-nobias"])
def test_multihead_vs_torch_multiheadattention(kind, dtype, simd_mode):
    dim, heads, b, s = 12, 3, 2, 6
    rng = np.random.default_rng(16)
    if kind == "MHA":
        am = attnc.MultiHeadAttention(dim, heads, dtype=dtype, rng=rng).eval()
        bias = True
    else:
        bias = kind == "MHSA-bias"
        am = attnc.MultiHeadSelfAttention(dim, dim, dim, heads, bias=bias, dtype=dtype, rng=rng).eval()
    mha = _torch_mha_from(am, dim, heads, bias)
    x = rng.standard_normal((b, s, dim)).astype(dtype)
    xt = torch.from_numpy(x)
    with torch.no_grad():
        expected, expected_w = mha(xt, xt, xt, need_weights=True, average_attn_weights=False)
    out, w = am(x, return_weights=True)
    assert_close(out, expected, dtype)
    assert_close(w, expected_w, dtype)
    # key padding: attnc keep-mask (b, 1, 1, s) == torch key_padding_mask True = ignore
    keep = random_keep_mask(rng, (b, s)).astype(bool)
    with torch.no_grad():
        expected = mha(xt, xt, xt, key_padding_mask=torch.from_numpy(~keep), need_weights=False)[0]
    assert_close(am(x, keep[:, None, None, :]), expected, dtype)
    # a (s, s) causal keep-mask == torch attn_mask True = masked
    causal = np.tril(np.ones((s, s), dtype=bool))
    with torch.no_grad():
        expected = mha(xt, xt, xt, attn_mask=torch.from_numpy(~causal), need_weights=False)[0]
    assert_close(am(x, causal), expected, dtype)


# ----------------------------------------------------------------------------
# document 003's hand-derived example


X003 = np.array([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]], dtype=np.float32)
W_KEY = np.array([[0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 1, 0]], dtype=np.float32)
W_QUERY = np.array([[1, 0, 1], [1, 0, 0], [0, 0, 1], [0, 1, 1]], dtype=np.float32)
W_VALUE = np.array([[0, 2, 0], [0, 3, 0], [1, 0, 3], [1, 1, 0]], dtype=np.float32)
KEYS = [[0, 1, 1], [4, 4, 0], [2, 3, 1]]
QUERYS = [[1, 0, 2], [2, 2, 2], [2, 1, 3]]
VALUES = [[1, 2, 3], [2, 8, 0], [2, 6, 3]]
SCORES = np.array([[2, 4, 4], [4, 16, 12], [4, 12, 10]], dtype=np.float64)
PRINTED_SOFTMAX = np.array([[6.3379e-02, 4.6831e-01, 4.6831e-01],
                            [6.0337e-06, 9.8201e-01, 1.7986e-02],
                            [2.9539e-04, 8.8054e-01, 1.1917e-01]])


def test_doc003_hand_derived_projections(simd_mode):
    F_ = attnc.functional
    np.testing.assert_array_equal(F_.linear(X003, W_KEY.T), KEYS)
    np.testing.assert_array_equal(F_.linear(X003, W_QUERY.T), QUERYS)
    np.testing.assert_array_equal(F_.linear(X003, W_VALUE.T), VALUES)


def test_doc003_hand_derived_softmax(simd_mode):
    q, k, v = (np.array(a, dtype=np.float32) for a in (QUERYS, KEYS, VALUES))
    out, w = attnc.functional.scaled_dot_product_attention(q, k, v, scale=1.0, return_weights=True)
    np.testing.assert_allclose(w, PRINTED_SOFTMAX, rtol=1e-4)   # the document prints 5 digits
    np.testing.assert_allclose(attnc.functional.softmax(SCORES.astype(np.float32)), PRINTED_SOFTMAX, rtol=1e-4)
    exact_w = np.exp(SCORES - SCORES.max(1, keepdims=True))
    exact_w /= exact_w.sum(1, keepdims=True)
    assert_close(w, exact_w, np.float32)
    assert_close(out, exact_w @ np.array(VALUES, dtype=np.float64), np.float32)


@pytest.mark.parametrize("dtype_", [np.float32, np.float64])
def test_doc003_example_through_selfattention(dtype_, simd_mode):
    am = attnc.SelfAttention(4, 3, 3, dtype=dtype_)
    am.load_state_dict({"linear_q.weight": W_QUERY.T, "linear_k.weight": W_KEY.T, "linear_v.weight": W_VALUE.T})
    out, w = am(X003[None], return_weights=True)
    expected_w = np.exp(SCORES / math.sqrt(3))
    expected_w /= expected_w.sum(1, keepdims=True)
    assert_close(w[0], expected_w, dtype_)
    assert_close(out[0], expected_w @ np.array(VALUES, dtype=np.float64), dtype_)
    # 2-D input (seq, dim) is the same as a batch of one
    assert_close(am(X003), out[0], dtype_)
