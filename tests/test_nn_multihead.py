"""attnc.nn.MultiheadAttention against torch.nn.MultiheadAttention loaded with
the same state_dict: parameters and their order, initialisation, every
constructor option and forward argument, outputs and weights, backward
(input and parameter gradients against torch autograd, dropout included),
the backward protocol, and the errors. attnc.nn's exports."""
import copy
import math

import numpy as np
import pytest
import torch

import attnc
from attnc.nn import MultiheadAttention

E, HEADS, L, S, N = 6, 2, 4, 5, 3
TOL = {np.float32: 1e-5, np.float64: 1e-11}        # outputs and weights, of the values' scale (toolkit.tolerance)
GRAD_TOL = {np.float32: 1e-4, np.float64: 1e-9}    # gradients

CONFIGS = {
    "default": {},
    "nobias": dict(bias=False),
    "bias_kv": dict(add_bias_kv=True),
    "zero_attn": dict(add_zero_attn=True),
    "bias_kv+zero_attn+nobias": dict(add_bias_kv=True, add_zero_attn=True, bias=False),
    "kdim_vdim": dict(kdim=3, vdim=5),
    "kdim_vdim+bias_kv+zero_attn": dict(kdim=3, vdim=5, add_bias_kv=True, add_zero_attn=True),
    "batch_first": dict(batch_first=True),
    "batch_first+kdim_vdim+nobias": dict(batch_first=True, kdim=4, vdim=2, bias=False),
}
MASKS = ["none", "attn_bool_2d", "attn_float_2d", "attn_bool_3d", "attn_float_3d", "kpm_bool", "kpm_float",
         "attn_bool_2d+kpm_bool", "attn_float_3d+kpm_float"]


def _close(actual, expected, dtype, what, tol=None):
    """Same shape, the dtype, and max |actual - expected| <= tol * max(1, max |expected|)."""
    if hasattr(expected, "detach"):
        expected = expected.detach().numpy()
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    assert actual.dtype == np.dtype(dtype), (what, actual.dtype, dtype)
    if expected.size == 0:
        return
    bound = (tol or TOL[np.dtype(dtype).type]) * max(1.0, float(np.abs(expected).max()))
    err = float(np.abs(actual.astype(np.float64) - expected).max())
    assert err <= bound, f"{what}: max abs err {err:.3e} > {bound:.3e}"


def _tdtype(dtype):
    return torch.float32 if np.dtype(dtype) == np.float32 else torch.float64


def _pair(dtype, seed=0, embed_dim=E, heads=HEADS, **options):
    """torch's module (train mode, dtype) and attnc's loaded with its state_dict."""
    torch.manual_seed(seed)
    tm = torch.nn.MultiheadAttention(embed_dim, heads, **options).to(_tdtype(dtype))
    am = MultiheadAttention(embed_dim, heads, **options, dtype=dtype, rng=np.random.default_rng(seed))
    am.load_state_dict(tm.state_dict())
    return tm, am


def _layout(shape_lne, options, batched=True):
    """(T, N, features) in the module's layout: batch first swaps, unbatched drops N."""
    t, n, f = shape_lne
    if not batched:
        return (t, f)
    return (n, t, f) if options.get("batch_first") else (t, n, f)


def _qkv(rng, dtype, options, batched=True, self_attention=False):
    q = rng.standard_normal(_layout((L, N, E), options, batched)).astype(dtype)
    if self_attention:
        return q, q, q
    k = rng.standard_normal(_layout((S, N, options.get("kdim") or E), options, batched)).astype(dtype)
    v = rng.standard_normal(_layout((S, N, options.get("vdim") or E), options, batched)).astype(dtype)
    return q, k, v


def _masks(rng, kind, dtype, batched=True, tgt=L, src=S, heads=HEADS):
    """{key_padding_mask, attn_mask} of `kind`, torch conventions; key 0 is
    always allowed, so no row is masked everywhere (torch's weights path
    would give NaN there)."""
    n = N if batched else 1
    masks = {}
    for part in kind.split("+"):
        if part == "none":
            continue
        name, kind_, *dims = part.split("_")
        if name == "attn":
            shape = (tgt, src) if dims == ["2d"] else ((n * heads, tgt, src) if batched else (heads, tgt, src))
            key = "attn_mask"
        else:
            shape = (n, src) if batched else (src,)
            key = "key_padding_mask"
        if kind_ == "bool":
            mask = rng.random(shape) < 0.4
            mask[..., 0] = False
        else:
            mask = rng.standard_normal(shape).astype(dtype)
            mask[rng.random(shape) < 0.2] = -np.inf
            mask[..., 0] = 0.5
        masks[key] = mask
    return masks


def _torch_run(tm, q, k, v, masks, **kwargs):
    """torch's (out, weights, (tq, tk, tv)) with gradients enabled (its slow
    path, the one multi_head_attention_forward documents); an input given
    as the same array as another is the same tensor."""
    tensors = {}
    for a in (q, k, v):
        if id(a) not in tensors:
            tensors[id(a)] = torch.tensor(a, requires_grad=True)
    tq, tk, tv = (tensors[id(a)] for a in (q, k, v))
    tmasks = {name: torch.from_numpy(np.array(m)) for name, m in masks.items()}
    out, weights = tm(tq, tk, tv, **tmasks, **kwargs)
    return out, weights, (tq, tk, tv)


# ----------------------------------------------------------------------------
# parameters


@pytest.mark.parametrize("config", CONFIGS, ids=list(CONFIGS))
def test_parameters_match_torch(config):
    options = CONFIGS[config]
    tm = torch.nn.MultiheadAttention(E, HEADS, **options)
    am = MultiheadAttention(E, HEADS, **options)
    assert list(am.state_dict()) == list(tm.state_dict())
    assert [n for n, _ in am.named_parameters()] == [n for n, _ in tm.named_parameters()]
    for (name, p), (_, tp) in zip(am.named_parameters(), tm.named_parameters()):
        assert p.shape == tuple(tp.shape) and p.dtype == np.float32, name
    for name in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias", "bias_k",
                 "bias_v"):
        assert (getattr(am, name) is None) == (getattr(tm, name) is None), name
    for attr in ("embed_dim", "num_heads", "head_dim", "kdim", "vdim", "batch_first", "add_zero_attn",
                 "_qkv_same_embed_dim"):
        assert getattr(am, attr) == getattr(tm, attr), attr
    assert am.dropout == tm.dropout
    assert "(out_proj): Linear(in_features=6, out_features=6" in repr(am)


def test_init_distributions():
    e, kdim = 128, 64
    am = MultiheadAttention(e, 4, add_bias_kv=True, rng=np.random.default_rng(3), dtype=np.float64)
    bound = math.sqrt(6 / (e + 3 * e))       # xavier_uniform_ of (3E, E)
    w = am.in_proj_weight
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.03 * bound
    assert abs(w.mean()) < 0.01 * bound
    np.testing.assert_array_equal(am.in_proj_bias, 0)
    np.testing.assert_array_equal(am.out_proj.bias, 0)
    out_bound = 1 / math.sqrt(e)            # torch.nn.Linear's
    assert out_bound * 0.98 < np.abs(am.out_proj.weight).max() <= out_bound
    both = np.concatenate([am.bias_k.ravel(), am.bias_v.ravel()])   # xavier_normal_ of (1, 1, E): std sqrt(1/E)
    assert abs(both.std() - math.sqrt(1 / e)) < 0.15 * math.sqrt(1 / e)
    assert not np.array_equal(am.bias_k, am.bias_v)
    sep = MultiheadAttention(e, 4, kdim=kdim, vdim=3 * kdim, rng=np.random.default_rng(4))
    for name, fan_in in (("q_proj_weight", e), ("k_proj_weight", kdim), ("v_proj_weight", 3 * kdim)):
        b = math.sqrt(6 / (e + fan_in))
        w = getattr(sep, name)
        assert np.abs(w).max() <= b * (1 + 1e-6) and np.abs(w).max() > 0.98 * b, name
    np.testing.assert_array_equal(
        MultiheadAttention(e, 4, rng=np.random.default_rng(5)).in_proj_weight,
        MultiheadAttention(e, 4, rng=np.random.default_rng(5)).in_proj_weight)
    attnc.manual_seed(7)
    a = MultiheadAttention(8, 2).state_dict()
    attnc.manual_seed(7)
    b = MultiheadAttention(8, 2).state_dict()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])


# ----------------------------------------------------------------------------
# forward against torch


@pytest.mark.parametrize("weights", ["average", "per_head", "none"])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("config", CONFIGS, ids=list(CONFIGS))
def test_forward_matches_torch(config, mask, weights, dtype):
    options = CONFIGS[config]
    tm, am = _pair(dtype, seed=1, **options)
    tm.eval(), am.eval()
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, dtype, options)
    masks = _masks(rng, mask, dtype)
    kwargs = dict(need_weights=weights != "none", average_attn_weights=weights == "average")
    t_out, t_w, _ = _torch_run(tm, q, k, v, masks, **kwargs)
    out, w = am(q, k, v, **masks, **kwargs)
    _close(out, t_out, dtype, "attn_output")
    if weights == "none":
        assert w is None and t_w is None
    else:
        _close(w, t_w, dtype, "attn_weights")
    assert out.flags.c_contiguous and not np.shares_memory(out, q)


@pytest.mark.parametrize("mask", [m for m in MASKS if m != "none"])
@pytest.mark.parametrize("config", ["default", "bias_kv+zero_attn+nobias"])
def test_a_score_bias_made_by_blocks_matches_torch(config, mask, dtype, monkeypatch):
    """The masks' score bias is made by blocks of rows when it passes
    _blocks._FILL_BLOCK elements (Ctrl-C taken between them), in one call
    below: here blocks of 7 elements, a block a row of keys (with the
    appended bias_k and zero keys), against torch."""
    monkeypatch.setattr(attnc._blocks, "_FILL_BLOCK", 7)
    options = CONFIGS[config]
    tm, am = _pair(dtype, seed=1, **options)
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, dtype, options)
    masks = _masks(rng, mask, dtype)
    t_out, t_w, _ = _torch_run(tm.eval(), q, k, v, masks, average_attn_weights=False)
    out, w = am.eval()(q, k, v, **masks, average_attn_weights=False)
    _close(out, t_out, dtype, "attn_output")
    _close(w, t_w, dtype, "attn_weights")


@pytest.mark.parametrize("mask", ["none", "attn_bool_2d", "attn_float_3d", "kpm_bool", "attn_bool_3d+kpm_bool"])
@pytest.mark.parametrize("config", ["default", "bias_kv+zero_attn+nobias", "kdim_vdim", "batch_first"])
def test_unbatched_matches_torch(config, mask, dtype):
    options = CONFIGS[config]
    tm, am = _pair(dtype, seed=3, **options)
    rng = np.random.default_rng(4)
    q, k, v = _qkv(rng, dtype, options, batched=False)
    masks = _masks(rng, mask, dtype, batched=False)
    for average in (True, False):
        t_out, t_w, _ = _torch_run(tm.eval(), q, k, v, masks, average_attn_weights=average)
        out, w = am.eval()(q, k, v, **masks, average_attn_weights=average)
        _close(out, t_out, dtype, "attn_output")
        _close(w, t_w, dtype, "attn_weights")
    assert out.shape == (L, E) and w.shape == (HEADS, L, S + ("bias_kv" in config) + ("zero_attn" in config))


@pytest.mark.parametrize("sizes", [(0, S, N), (L, 0, N), (L, S, 0)], ids=["L=0", "S=0", "N=0"])
@pytest.mark.parametrize("config", ["default", "zero_attn"])
def test_zero_sizes_match_torch(config, sizes):
    options, (tgt, src, n) = CONFIGS[config], sizes
    tm, am = _pair(np.float64, seed=30, **options)
    rng = np.random.default_rng(31)
    q, k = rng.standard_normal((tgt, n, E)), rng.standard_normal((src, n, E))
    v = k.copy()  # (its own tensor: torch sums one tensor's key and value gradients)
    t_out, t_w, tensors = _torch_run(tm, q, k, v, {})
    out, w = am(q, k, v)
    _close(out, t_out, np.float64, "attn_output")
    _close(w, t_w, np.float64, "attn_weights")
    _check_grads(tm, am, t_out, tensors, np.dtype(np.float64))  # (an audit: the shapes alone were checked)


@pytest.mark.filterwarnings("ignore:Support for mismatched")
def test_mixed_mask_types_match_torch(dtype):
    tm, am = _pair(dtype, seed=5)
    rng = np.random.default_rng(6)
    q, k, v = _qkv(rng, dtype, {})
    masks = {**_masks(rng, "attn_float_2d", dtype), **_masks(rng, "kpm_bool", dtype)}
    t_out, t_w, _ = _torch_run(tm.eval(), q, k, v, masks)
    out, w = am.eval()(q, k, v, **masks)
    _close(out, t_out, dtype, "attn_output")
    _close(w, t_w, dtype, "attn_weights")


@pytest.mark.parametrize("config", ["default", "bias_kv", "zero_attn", "batch_first"])
def test_self_attention_same_array(config, dtype):
    """query is key is value: torch's packed projection path; the same values."""
    options = CONFIGS[config]
    tm, am = _pair(dtype, seed=7, **options)
    (x, _, _) = _qkv(np.random.default_rng(8), dtype, options, self_attention=True)
    t_out, t_w, _ = _torch_run(tm.eval(), x, x, x, {})
    out, w = am.eval()(x, x, x)
    _close(out, t_out, dtype, "attn_output")
    _close(w, t_w, dtype, "attn_weights")


@pytest.mark.parametrize("shared", ["query_key_value", "key_value"])
@pytest.mark.parametrize("sizes", [(E, HEADS, L, S, N), (64, 4, 77, 50, 2)], ids=["tiny", "77_rows"])
@pytest.mark.parametrize("config", ["default", "nobias", "bias_kv+zero_attn+nobias", "batch_first"])
def test_one_input_projected_once_has_the_bits_of_equal_copies(config, sizes, shared, dtype):
    """The projections of one input object run as one stacked product: the
    same bits as the separate products of equal, distinct copies, forward
    (outputs and weights) and backward (every gradient), and torch's values."""
    options = CONFIGS[config]
    embed_dim, heads, tgt, src, n = sizes
    tm, am = _pair(dtype, seed=11, embed_dim=embed_dim, heads=heads, **options)
    rng = np.random.default_rng(12)
    shape = _layout((tgt if shared == "query_key_value" else src, n, embed_dim), options)
    x = rng.standard_normal(shape).astype(dtype)
    q = x if shared == "query_key_value" else rng.standard_normal(_layout((tgt, n, embed_dim), options)).astype(dtype)
    runs = {}
    for name, (query, key, value) in {"one": (q, x, x), "copies": (q.copy(), x.copy(), x.copy())}.items():
        am.zero_grad()
        out, weights = am.train()(query, key, value, need_weights=True)  # dropout 0: the eval values
        grads = am.backward(np.cos(np.arange(out.size)).reshape(out.shape).astype(dtype))
        runs[name] = (out, weights, *grads, *(g.copy() for _, g in am.named_grads()))
    for one, copies in zip(runs["one"], runs["copies"]):
        assert one.dtype == copies.dtype and np.array_equal(one, copies), config
    t_out, t_weights, _ = _torch_run(tm.eval(), q, x, x, {})
    _close(runs["one"][0], t_out, dtype, "attn_output")
    _close(runs["one"][1], t_weights, dtype, "attn_weights")


SELF_ATTENTION_SIZES = {"tiny": (E, HEADS, L, N), "77_rows": (64, 4, 77, 2), "decode": (48, 3, 1, 5),
                        "no_rows": (E, HEADS, 0, N), "no_items": (E, HEADS, L, 0)}


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("weights", ["average", "per_head", "none"])
@pytest.mark.parametrize("config,sizes", [(config, sizes)
                                          for config in ("default", "nobias", "batch_first", "unbatched")
                                          for sizes in SELF_ATTENTION_SIZES
                                          if not (config == "unbatched" and sizes == "no_items")])  # (no batch axis)
def test_eval_self_attention_in_one_call_has_the_bits_of_the_general_path(config, sizes, weights, threads, dtype,
                                                                         monkeypatch, restore_threads):
    """An eval-mode call with query, key and value one array and no masks is
    one C call (the document modules' forward over the fused in_proj_weight):
    the same bits as the general path (projections, attention and output
    projection in turn, taken for distinct copies), for any thread count,
    and torch's values. The one call is what runs: with the general path's
    attention made to fail, it still gives them."""
    attnc.set_num_threads(threads)
    options = {} if config in ("default", "unbatched") else CONFIGS[config]
    embed_dim, heads, tgt, n = SELF_ATTENTION_SIZES[sizes]
    tm, am = _pair(dtype, seed=13, embed_dim=embed_dim, heads=heads, **options)
    am.eval()
    if am.in_proj_bias is not None:  # torch starts the biases at 0: make them count
        am.in_proj_bias[...] = np.linspace(-1, 1, 3 * embed_dim)
        am.out_proj.bias[...] = np.linspace(1, -1, embed_dim)
        tm.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in am.state_dict().items()})
    x = np.random.default_rng(14).standard_normal(_layout((tgt, n, embed_dim), options, config != "unbatched"))
    x = x.astype(dtype)
    kwargs = dict(need_weights=weights != "none", average_attn_weights=weights == "average")
    general = am(x, x.copy(), x.copy(), **kwargs)

    def general_path_fails(*args, **kwargs):
        raise AssertionError("the general path's attention ran")

    monkeypatch.setattr(attnc.multihead, "scaled_dot_product_attention", general_path_fails)
    one_call = am(x, x, x, **kwargs)
    with pytest.raises(AssertionError, match="general path"):  # (the patch holds)
        am(x, x.copy(), x.copy(), **kwargs)
    assert one_call[0].dtype == general[0].dtype and np.array_equal(one_call[0], general[0]), "attn_output"
    if weights == "none":
        assert one_call[1] is None and general[1] is None
    else:
        assert one_call[1].dtype == general[1].dtype and np.array_equal(one_call[1], general[1]), "attn_weights"
    monkeypatch.undo()
    t_out, t_weights, _ = _torch_run(tm.eval(), x, x, x, {}, **kwargs)
    _close(one_call[0], t_out, dtype, "attn_output")
    if weights != "none":
        _close(one_call[1], t_weights, dtype, "attn_weights")


def test_eval_self_attention_names_need_weights_when_the_weights_do_not_fit():
    """Weights too large to allocate raise MemoryError naming need_weights,
    through the one C call (query, key, value one array) as through the
    general path."""
    am = MultiheadAttention(8, 2, batch_first=True).eval()
    x = np.zeros((1, 300_000, 8), np.float32)  # weights (1, 2, 3e5, 3e5): 720 GB
    for key, value in ((x, x), (x.copy(), x.copy())):
        with pytest.raises(MemoryError, match="^need_weights: "):
            am(x, key, value, average_attn_weights=False)


@pytest.mark.filterwarnings("ignore:Support for mismatched")   # a float attn_mask with a bool key_padding_mask
@pytest.mark.parametrize("config", ["default", "bias_kv", "zero_attn", "batch_first"])
@pytest.mark.parametrize("extra", ["none", "kpm_bool"])
def test_is_causal_as_torch(config, extra, dtype):
    """is_causal is torch's hint: with need_weights=False and no
    key_padding_mask the causal mask replaces attn_mask (even one that is not
    causal), else attn_mask is used as given."""
    options = CONFIGS[config]
    tm, am = _pair(dtype, seed=9, **options)
    rng = np.random.default_rng(10)
    q, k, v = _qkv(rng, dtype, options)
    causal = np.triu(np.ones((L, S), bool), 1)
    other = rng.standard_normal((L, S)).astype(dtype)   # not causal: torch drops it when the hint applies
    for attn_mask in (causal, other):
        for need_weights in (False, True):
            masks = {"attn_mask": attn_mask, **_masks(rng, extra, dtype)}
            t_out, _, _ = _torch_run(tm.eval(), q, k, v, masks, is_causal=True, need_weights=need_weights)
            out, _ = am.eval()(q, k, v, **masks, is_causal=True, need_weights=need_weights)
            _close(out, t_out, dtype, f"is_causal need_weights={need_weights}")
    with pytest.raises(RuntimeError):
        tm(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), is_causal=True)
    with pytest.raises(ValueError, match="is_causal"):
        am(q, k, v, is_causal=True)


def test_fully_masked_row_gives_zero_not_nan(dtype):
    """A row with every key masked: attention output 0 before out_proj and
    weights 0, as torch's need_weights=False path (its weights path gives NaN)."""
    tm, am = _pair(dtype, seed=11)
    with torch.no_grad():
        tm.out_proj.bias.uniform_(-1, 1)
    am.load_state_dict(tm.state_dict())
    rng = np.random.default_rng(12)
    q, k, v = _qkv(rng, dtype, {})
    kpm = np.zeros((N, S), bool)
    kpm[0] = True
    t_out, _, _ = _torch_run(tm.eval(), q, k, v, {"key_padding_mask": kpm}, need_weights=False)
    t_out_w, _, _ = _torch_run(tm, q, k, v, {"key_padding_mask": kpm})
    assert torch.isnan(t_out_w[:, 0]).all()
    out, w = am.eval()(q, k, v, key_padding_mask=kpm)
    _close(out, t_out, dtype, "attn_output")
    _close(out[:, 0], np.broadcast_to(tm.out_proj.bias.detach().numpy(), (L, E)), dtype, "out_proj(0)")
    np.testing.assert_array_equal(w[0], 0)
    # the gradients, as torch's need_weights=False path's (an audit: only their finiteness was checked)
    t_out, _, tensors = _torch_run(tm.train(), q, k, v, {"key_padding_mask": kpm}, need_weights=False)
    am.train()(q, k, v, key_padding_mask=kpm, need_weights=False)
    _check_grads(tm, am, t_out, tensors, np.dtype(dtype))


# ----------------------------------------------------------------------------
# backward against torch autograd


def _check_grads(tm, am, t_out, tensors, dtype):
    g = np.random.default_rng(99).standard_normal(t_out.shape).astype(dtype)
    t_out.backward(torch.from_numpy(g))
    result = am.backward(g)
    assert isinstance(result, tuple) and len(result) == 3
    tq, tk, tv = tensors
    if tq is tk is tv:   # torch sums the three gradients into x.grad
        _close(result[0] + result[1] + result[2], tq.grad, dtype, "grad x", GRAD_TOL[dtype.type])
    else:
        for name, got, t in zip(("query", "key", "value"), result, tensors):
            _close(got, t.grad, dtype, f"grad {name}", GRAD_TOL[dtype.type])
    torch_grads = {name: p.grad for name, p in tm.named_parameters()}
    names = [name for name, _ in am.named_grads()]
    assert names == list(torch_grads)
    for name, grad in am.named_grads():
        _close(grad, torch_grads[name], dtype, f"grad {name}", GRAD_TOL[dtype.type])


@pytest.mark.parametrize("mask", ["none", "attn_float_3d", "attn_bool_2d+kpm_bool", "kpm_float"])
@pytest.mark.parametrize("config", CONFIGS, ids=list(CONFIGS))
def test_backward_matches_torch(config, mask, dtype):
    options = CONFIGS[config]
    tm, am = _pair(dtype, seed=13, **options)
    rng = np.random.default_rng(14)
    q, k, v = _qkv(rng, dtype, options)
    masks = _masks(rng, mask, dtype)
    t_out, _, tensors = _torch_run(tm, q, k, v, masks)
    out, _ = am(q, k, v, **masks)
    _close(out, t_out, dtype, "attn_output")
    _check_grads(tm, am, t_out, tensors, dtype)


@pytest.mark.parametrize("config", ["default", "bias_kv+zero_attn+nobias", "batch_first"])
@pytest.mark.parametrize("case", ["self", "unbatched", "causal", "need_weights_false"])
def test_backward_variants_match_torch(config, case, dtype):
    options = CONFIGS[config]
    tm, am = _pair(dtype, seed=15, **options)
    rng = np.random.default_rng(16)
    q, k, v = _qkv(rng, dtype, options, batched=case != "unbatched", self_attention=case == "self")
    masks = _masks(rng, "attn_bool_2d" if case != "causal" else "none", dtype, batched=case != "unbatched",
                   src=L if case == "self" else S)
    kwargs = {}
    if case == "causal":
        masks["attn_mask"] = np.triu(np.ones((L, L), bool), 1)
        kwargs = dict(is_causal=True, need_weights=False)
    if case == "need_weights_false":
        kwargs = dict(need_weights=False)
    t_out, _, tensors = _torch_run(tm, q, k, v, masks, **kwargs)
    am(q, k, v, **masks, **kwargs)
    _check_grads(tm, am, t_out, tensors, dtype)


# ----------------------------------------------------------------------------
# dropout


class _DropoutWith:
    """torch.nn.functional.dropout replaced by multiplication with a given
    keep mask (the one attnc used): torch's own multi_head_attention_forward
    then runs with attnc's mask."""

    def __init__(self, keep):
        self.keep = keep

    def __call__(self, x, p=0.5, training=True, inplace=False):
        return x * self.keep / (1 - p)


@pytest.mark.parametrize("config", ["default", "bias_kv+zero_attn+nobias", "kdim_vdim", "batch_first"])
@pytest.mark.parametrize("mask", ["none", "attn_bool_2d+kpm_bool"])
def test_dropout_forward_and_backward_match_torch_with_attnc_mask(config, mask, dtype, monkeypatch):
    p = 0.3
    options = dict(CONFIGS[config], dropout=p)
    tm, am = _pair(dtype, seed=17, **options)
    rng = np.random.default_rng(18)
    q, k, v = _qkv(rng, dtype, options)
    masks = _masks(rng, mask, dtype)
    eval_w = am.eval()(q, k, v, **masks, average_attn_weights=False)[1]
    out, dropped = am.train()(q, k, v, **masks, average_attn_weights=False)
    # the returned weights are the eval weights, each dropped (0) or scaled by 1 / (1 - p)
    keep = dropped != 0
    assert 0.4 < keep[eval_w > 0].mean() < 0.95
    _close(dropped, np.where(keep, eval_w / (1 - p), 0.0), dtype, "dropped weights")
    keep_torch = torch.from_numpy(keep).reshape(-1, *keep.shape[2:])   # torch's (N * heads, L, S')
    monkeypatch.setattr(torch.nn.functional, "dropout", _DropoutWith(keep_torch))
    t_out, t_w, tensors = _torch_run(tm.train(), q, k, v, masks, average_attn_weights=False)
    _close(out, t_out, dtype, "attn_output")
    _close(dropped, t_w, dtype, "attn_weights")
    _check_grads(tm, am, t_out, tensors, dtype)


def test_dropout_weights_need_weights_and_average_agree():
    """Two modules drawing the same dropout seeds: need_weights=False gives the
    same output, and the averaged weights are the per-head ones' mean."""
    p, dtype = 0.5, np.float64
    make = lambda: MultiheadAttention(E, HEADS, dropout=p, dtype=dtype, rng=np.random.default_rng(19))
    a, b, c = make(), make(), make()
    q, k, v = _qkv(np.random.default_rng(20), dtype, {})
    out_a, w_a = a(q, k, v, average_attn_weights=False)
    out_b, none = b(q, k, v, need_weights=False)
    out_c, w_c = c(q, k, v)
    assert none is None
    np.testing.assert_array_equal(out_a, out_b)
    np.testing.assert_array_equal(out_a, out_c)
    _close(w_c, w_a.mean(axis=1), dtype, "averaged weights")
    out_a2, w_a2 = a(q, k, v, average_attn_weights=False)     # a fresh mask at each call
    assert not np.array_equal(w_a, w_a2)
    assert not np.array_equal(out_a, a.eval()(q, k, v)[0])


def test_eval_mode_has_no_dropout(dtype):
    tm, am = _pair(dtype, seed=21, dropout=0.9)
    q, k, v = _qkv(np.random.default_rng(22), dtype, {})
    t_out, t_w, _ = _torch_run(tm.eval(), q, k, v, {})
    out, w = am.eval()(q, k, v)
    _close(out, t_out, dtype, "attn_output")
    _close(w, t_w, dtype, "attn_weights")


# ----------------------------------------------------------------------------
# the backward protocol


def test_backward_protocol():
    am = MultiheadAttention(E, HEADS, dtype=np.float64, rng=np.random.default_rng(23))
    q, k, v = _qkv(np.random.default_rng(24), np.float64, {})
    g = np.ones((L, N, E))
    with pytest.raises(RuntimeError, match="no training-mode forward"):
        am.backward(g)
    am.eval()(q, k, v)
    with pytest.raises(RuntimeError):
        am.backward(g)
    am.train()(q, k, v)
    with pytest.raises(ValueError, match="grad_output"):
        am.backward(np.ones((N, L, E)))
    first = am.backward(g)                       # the failed call kept the state
    with pytest.raises(RuntimeError):
        am.backward(g)
    grads = {name: grad.copy() for name, grad in am.named_grads()}
    q2 = q.copy()
    am(q2, k, v)
    q2[...] = 0                                  # the forward kept a private copy
    second = am.backward(g)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    for name, grad in am.named_grads():           # accumulated, as torch's .grad
        np.testing.assert_allclose(grad, 2 * grads[name], rtol=1e-12, atol=1e-15)
    am.zero_grad()
    am(q, k, v)
    am.in_proj_weight = am.in_proj_weight.copy()
    with pytest.raises(RuntimeError, match="in_proj_weight"):
        am.backward(g)
    am(q, k, v)
    am.out_proj.weight = am.out_proj.weight.copy()
    with pytest.raises(RuntimeError, match="out_proj.weight"):
        am.backward(g)


@pytest.mark.parametrize("change", [{"batch_first": True}, {"num_heads": 1, "head_dim": 4},
                                    {"embed_dim": 6, "head_dim": 3}, {"add_zero_attn": True}],
                         ids=["batch_first", "num_heads", "embed_dim", "add_zero_attn"])
def test_backward_uses_the_forward_sizes_and_layout(change):
    """Sizes and flags changed between a forward and its backward: the backward
    read them again, and with L == N a toggled batch_first read grad_output in
    the other layout, giving wrong gradients silently (grad_query off by 0.58);
    other sizes raised NumPy's reshape error. The backward now computes with
    the forward's, as an untouched twin module does."""
    x = np.random.default_rng(27).standard_normal((3, 3, 4))  # L == N
    grad_output = np.random.default_rng(28).standard_normal((3, 3, 4))
    changed, twin = (MultiheadAttention(4, 2, dtype=np.float64, rng=np.random.default_rng(29)) for _ in range(2))
    changed(x, x, x)
    twin(x, x, x)
    for name, value in change.items():
        setattr(changed, name, value)
    for got, expected in zip(changed.backward(grad_output), twin.backward(grad_output)):
        np.testing.assert_array_equal(got, expected)
    for (name, got), (_, expected) in zip(changed.named_grads(), twin.named_grads()):
        np.testing.assert_array_equal(got, expected, err_msg=name)


@pytest.mark.parametrize("layout", ["clean", "float64_out_proj", "fortran_out_proj", "dtype_set_to_float64"])
def test_backward_uses_parameter_values_at_backward_time(layout):
    """API.md: values edited in place between a forward and its backward are
    used at backward time. The out-projection weight enters the backward only
    through grad_merged = grad_out . W_out, so scaling it by 3 in place scales
    every input gradient by 3 and leaves W_out's own gradient as it was. For a
    parameter that is not a C-contiguous array of the module dtype (a float64
    out_proj in a float32 module, a Fortran-ordered weight put in the instance
    dict, the module's dtype attribute set to float64), the backward used the
    copy converted at forward time and ignored the edit."""
    rng = np.random.default_rng(31)
    x = rng.standard_normal((5, 2, 8)).astype(np.float32)
    grad_output = rng.standard_normal((5, 2, 8)).astype(np.float32)

    def gradients(edit):
        am = MultiheadAttention(8, 2, rng=np.random.default_rng(32))
        if layout == "float64_out_proj":
            wide = attnc.Linear(8, 8, dtype=np.float64)
            wide.load_state_dict(am.out_proj.state_dict())
            am.out_proj = wide
        elif layout == "fortran_out_proj":
            object.__setattr__(am.out_proj, "weight", np.asfortranarray(am.out_proj.weight))  # not converted
        elif layout == "dtype_set_to_float64":
            am.dtype = np.float64
        am(x, x, x, need_weights=False)
        if edit:
            am.out_proj.weight[...] *= 3
        grads = am.backward(grad_output)
        return grads, dict(am.named_grads())

    (plain, plain_params), (edited, edited_params) = gradients(False), gradients(True)
    for name, got, expected in zip(("query", "key", "value"), edited, plain):
        assert not np.array_equal(got, expected), name
        np.testing.assert_allclose(got, 3 * expected, rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(edited_params["out_proj.weight"], plain_params["out_proj.weight"], rtol=1e-6, atol=1e-7)


def test_backward_gradient_dtypes():
    """Each gradient in its input's floating dtype, else the module's."""
    am = MultiheadAttention(E, HEADS, dtype=np.float64, rng=np.random.default_rng(25))
    q, k, v = _qkv(np.random.default_rng(26), np.float32, {})
    out, _ = am(q, k.tolist(), v)
    assert out.dtype == np.float64
    grad_q, grad_k, grad_v = am.backward(np.ones_like(out))
    assert (grad_q.dtype, grad_k.dtype, grad_v.dtype) == (np.float32, np.float64, np.float32)
    assert grad_q.shape == q.shape and grad_k.shape == k.shape and grad_v.shape == v.shape


def test_copies_and_dtype_conversion():
    tm, am = _pair(np.float32, seed=27, add_bias_kv=True)
    q, k, v = _qkv(np.random.default_rng(28), np.float32, {})
    expected = am.eval()(q, k, v)[0]
    np.testing.assert_array_equal(copy.deepcopy(am)(q, k, v)[0], expected)
    wide = copy.deepcopy(am).to(np.float64)
    assert wide.in_proj_weight.dtype == np.float64 and wide.bias_k.dtype == np.float64
    _close(wide(q, k, v)[0].astype(np.float32), expected, np.float32, "float64 twin")


# ----------------------------------------------------------------------------
# errors


def test_errors():
    with pytest.raises(ValueError, match="num_heads"):
        MultiheadAttention(6, 4)
    with pytest.raises(ValueError, match="embed_dim"):
        MultiheadAttention(0, 1)
    with pytest.raises(ValueError, match="dropout"):
        MultiheadAttention(6, 2, dropout=1.5)
    with pytest.raises(TypeError):
        MultiheadAttention(6, 2, dtype=np.int32)
    am = MultiheadAttention(E, HEADS, kdim=3, vdim=5).eval()
    q, k, v = _qkv(np.random.default_rng(29), np.float32, dict(kdim=3, vdim=5))
    with pytest.raises(ValueError, match="query"):
        am(q[..., :-1], k, v)
    with pytest.raises(ValueError, match="key"):
        am(q, v, v)
    with pytest.raises(ValueError, match="value"):
        am(q, k, v[:-1])
    with pytest.raises(ValueError, match="key"):
        am(q, k[:, :-1], v[:, :-1])
    with pytest.raises(ValueError, match="key"):
        am(q, k[0], v[0])
    with pytest.raises(ValueError, match="query"):
        am(q[None], k[None], v[None])
    with pytest.raises(ValueError, match="attn_mask"):
        am(q, k, v, attn_mask=np.zeros((L, S + 1), bool))
    with pytest.raises(ValueError, match="attn_mask"):
        am(q, k, v, attn_mask=np.zeros((N, L, S), bool))
    with pytest.raises(ValueError, match="key_padding_mask"):
        am(q, k, v, key_padding_mask=np.zeros((S, N), bool))
    with pytest.raises(TypeError, match="attn_mask"):
        am(q, k, v, attn_mask=np.zeros((L, S), np.int64))
    with pytest.raises(TypeError, match="query"):
        am(q.astype(complex), k, v)


@pytest.mark.parametrize("size", ["kdim", "vdim"])
@pytest.mark.parametrize("call", ["forward", "freeze"])
def test_kdim_or_vdim_changed_under_the_stacked_weights_is_named(size, call):
    """Regression (fuzzing): kdim or vdim set after construction to another size than
    embed_dim, with the stacked in_proj_weight (which projects embed_dim features of each,
    as torch's): a key of that size raised "x: expected last dimension (in_features)",
    naming no argument of the forward, and freeze() took the module."""
    am = MultiheadAttention(8, 2)
    setattr(am, size, 4)
    rng = np.random.default_rng(30)
    q = rng.standard_normal((3, 1, 8))
    k = rng.standard_normal((5, 1, 4 if size == "kdim" else 8))
    v = rng.standard_normal((5, 1, 4 if size == "vdim" else 8))
    with pytest.raises(ValueError, match=f"^{size}: the stacked in_proj_weight projects embed_dim=8"):
        am(q, k, v) if call == "forward" else am.freeze()


# ----------------------------------------------------------------------------
# attnc.nn


def test_nn_exports():
    expected = {"Module", "Linear", "Dropout", "SelfAttentionV1", "SelfAttentionV2", "SelfAttentionV3",
                "SelfAttentionV4", "SelfAttentionInterview", "SelfAttention", "MultiHeadSelfAttention",
                "MultiheadAttention", "FrozenMultiheadAttention"}
    assert set(attnc.nn.__all__) == expected
    for name in expected - {"MultiheadAttention", "FrozenMultiheadAttention"}:
        assert getattr(attnc.nn, name) is getattr(attnc, name), name
    assert attnc.nn.MultiheadAttention is not attnc.MultiHeadAttention
    assert not hasattr(attnc.nn, "MultiHeadAttention") and not hasattr(attnc, "MultiheadAttention")
    for names in (attnc.__all__, attnc.nn.__all__):   # no two names differ only by case
        assert len({name.lower() for name in names}) == len(names)


@pytest.mark.parametrize("name", ["attn_mask", "key_padding_mask"])
def test_a_huge_broadcast_mask_of_the_wrong_shape_is_named_before_it_is_converted(name):
    # the masks were converted to additive floats before their shapes were
    # checked: a wrong, broadcast (zero-strided) one of 2**42 elements raised
    # NumPy's "Unable to allocate 16.0 TiB" MemoryError, naming nothing, and one
    # of 2**29 took 26 s and 6 GiB before the ValueError (a review helper,
    # 2026-11-29)
    m = attnc.nn.MultiheadAttention(8, 2).eval()
    x = np.zeros((3, 2, 8), np.float32)
    huge = np.broadcast_to(np.bool_(False), (2 ** 40, 4))
    with pytest.raises(ValueError, match=f"^{name}: expected shape"):
        m(x, x, x, **{name: huge})


@pytest.mark.parametrize("dtype_name", ["float8_e4m3fn", "float8_e5m2", "float6_e2m3fn", "bfloat16"])
def test_a_float_mask_of_ml_dtypes_is_a_float_mask(dtype_name):
    """Regression (fuzzing): a float8_e5m2 key_padding_mask (NumPy kind "f") was taken and a
    float8_e4m3fn one (kind "V") refused as "not floating", where the functional layer takes
    both as attn_bias. Every float of ml_dtypes is a float mask: the float32 mask's bits,
    and torch's result for it."""
    ml_dtypes = pytest.importorskip("ml_dtypes")  # (in the test extras)
    tm, am = _pair(np.float32, seed=31)
    tm.eval(), am.eval()
    q, k, v = _qkv(np.random.default_rng(32), np.float32, {})
    padding = np.zeros((N, S), np.float32)
    padding[:, -1] = -2.0  # exact in every one of these formats
    expected = am(q, k, v, key_padding_mask=padding)
    got = am(q, k, v, key_padding_mask=padding.astype(getattr(ml_dtypes, dtype_name)))
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)
    with torch.no_grad():
        reference = tm(*(torch.from_numpy(t) for t in (q, k, v)), key_padding_mask=torch.from_numpy(padding))
    for a, b, what in zip(got, reference, ("output", "weights")):
        _close(a, b, np.float32, what)


@pytest.mark.parametrize("layout", ["unbatched", "seq_first_n1", "seq_first_n2", "batch_first_n1"])
def test_results_own_their_data_in_every_layout(layout):
    """API.md: attnc's results own their data (resize works). Regression, an
    nn audit, 2026-12-06: an unbatched call's output, weights and gradients
    were t[0] views, and a seq-first call with N = 1 returned the swap of
    (1, L, E) as a view. The values: those of the same items given batched
    and batch-first (themselves checked against torch above)."""
    rng = np.random.default_rng(21)
    n = 2 if layout == "seq_first_n2" else 1
    batch_first = layout == "batch_first_n1"
    am = MultiheadAttention(E, HEADS, batch_first=batch_first, dtype=np.float64, rng=rng)
    reference = MultiheadAttention(E, HEADS, batch_first=True, dtype=np.float64)
    reference.load_state_dict(am.state_dict())
    x = rng.standard_normal((n, L, E))                       # batch-first items
    given = x[0] if layout == "unbatched" else x if batch_first else np.ascontiguousarray(x.swapaxes(0, 1))
    to_given = ((lambda t: t[0]) if layout == "unbatched" else (lambda t: t) if batch_first
                else (lambda t: t.swapaxes(0, 1)))
    for average in (True, False):
        out, weights = am.eval()(given, given, given, average_attn_weights=average)
        want_out, want_weights = reference.eval()(x, x, x, average_attn_weights=average)
        np.testing.assert_array_equal(out, to_given(want_out))
        np.testing.assert_array_equal(weights, want_weights[0] if layout == "unbatched" else want_weights)
        for result in (out, weights):
            assert result.flags.owndata and result.base is None
    q = given.copy()
    out, _ = am.train()(q, given, given, need_weights=False)
    want_out, _ = reference.train()(x.copy(), x, x, need_weights=False)
    grads = am.backward(np.ones_like(out))
    want = reference.backward(np.ones_like(want_out))
    for got, expected in zip(grads, want):
        np.testing.assert_array_equal(got, to_given(expected))
        assert got.flags.owndata and got.base is None
        got.resize(got.size, refcheck=False)                 # as for any array that owns its data
