"""attnc.from_torch: each document class under each of its spellings
(tests/doc_models.py), torch.nn.Linear and
torch.nn.MultiheadAttention become their attnc twins with the same weights,
outputs and mode; unknown classes raise TypeError; attnc never imports torch."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn as nn

import attnc
from attnc import functional as F
from toolkit import MODEL_IDS, MODELS, assert_close, make_module, random_keep_mask, torch_dtype
from toolkit import doc_models as dm

B, T = 3, 5


# ----------------------------------------------------------------------------
# (id, torch module factory, attnc class, mask shape (None: takes no mask))

D = 6
CASES = [
    ("000-SelfAttentionv1", lambda: dm.SelfAttentionv1(D), attnc.SelfAttentionV1, None),
    ("000-SelfAttentionv2", lambda: dm.SelfAttentionv2(D), attnc.SelfAttentionV2, None),
    ("000-SelfAttentionv3", lambda: dm.SelfAttentionv3(D, 0.2), attnc.SelfAttentionV3, (B, T, T)),
    ("000-SelfAttentionInterview", lambda: dm.SelfAttentionInterview(D, 0.3), attnc.SelfAttentionV4, (B, T, T)),
    ("001-EasyAttentionModule", lambda: dm.EasyAttentionModule(D), attnc.SelfAttentionV1, None),
    ("001-AttentionModule", lambda: dm.AttentionModule(D), attnc.SelfAttentionV2, None),
    ("001-Attention", lambda: dm.Attention(D, 0.01), attnc.SelfAttentionV3, (B, T, T)),
    ("001-MuitiHeadAttention", lambda: dm.MuitiHeadAttention(D, 3, 0.2), attnc.MultiHeadAttention, (B, 1, 1, T)),
    ("002-SelfattentionV1", lambda: dm.SelfattentionV1(D), attnc.SelfAttentionV1, None),
    ("002-SelfattentionV2", lambda: dm.SelfattentionV2(D), attnc.SelfAttentionV2, None),
    ("002-slefattentionV3", lambda: dm.slefattentionV3(D, 0.4), attnc.SelfAttentionV3, (B, T, T)),
    ("003-SelfAttention", lambda: type("SelfAttention", (dm.SelfAttention003,), {})(D, 4, 7), attnc.SelfAttention,
     None),
    ("004-SelfAttention", lambda: dm.SelfAttention(D, 4, 7), attnc.SelfAttention, (B, T, T)),
    ("004-SelfAttention-bias", lambda: dm.SelfAttention(D, 4, 7, bias=True), attnc.SelfAttention, (B, T, T)),
    ("004-MultiHeadSelfAttention", lambda: dm.MultiHeadSelfAttention(D, 6, 9, 3), attnc.MultiHeadSelfAttention,
     (B, 3, T, T)),
    ("004-MultiHeadSelfAttention-bias", lambda: dm.MultiHeadSelfAttention(D, 4, 6, 2, bias=True),
     attnc.MultiHeadSelfAttention, (B, 1, 1, T)),
]
IDS = [case[0] for case in CASES]


def _make(factory, dtype, training=False, seed=0):
    torch.manual_seed(seed)
    return factory().to(torch_dtype(dtype)).train(training)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_document_classes(case, dtype):
    _, factory, cls, mask_shape = case
    tm = _make(factory, dtype)
    twin = attnc.from_torch(tm)
    assert type(twin) is cls and twin.dtype == dtype and twin.training is False
    rng = np.random.default_rng(1)
    x = rng.standard_normal((B, T, D)).astype(dtype)
    with torch.no_grad():
        assert_close(twin(x), tm(torch.from_numpy(x)), dtype, "no mask")
        if mask_shape:
            mask = random_keep_mask(rng, mask_shape)
            assert_close(twin(x, mask), tm(torch.from_numpy(x), torch.from_numpy(mask)), dtype, "mask")
    for (key, value), tensor in zip(twin.state_dict().items(), tm.state_dict().values()):
        np.testing.assert_array_equal(value, tensor.numpy(), err_msg=key)


def test_hyper_parameters_recovered():
    t = attnc.from_torch(dm.MuitiHeadAttention(12, 4, 0.25))
    assert (t.hidden_dim, t.head_num, t.dropout.p) == (12, 4, 0.25)
    assert attnc.from_torch(dm.SelfAttentionv3(4, 0.3)).attention_dropout.p == 0.3
    assert attnc.from_torch(dm.Attention(4, 0.01)).attention_dropout.p == 0.01
    assert attnc.from_torch(dm.slefattentionV3(4, 0.4)).attention_dropout.p == 0.4
    assert attnc.from_torch(dm.SelfAttentionInterview(4, 0.2)).attention_dropout.p == 0.2
    t = attnc.from_torch(dm.MultiHeadSelfAttention(5, 6, 9, 3))
    assert (t.dim_in, t.dim_k, t.dim_v, t.num_heads, t.linear_q.bias) == (5, 6, 9, 3, None)
    t = attnc.from_torch(type("SelfAttention", (dm.SelfAttention003,), {})(5, 4, 7))
    assert (t.dim_in, t.dim_k, t.dim_v) == (5, 4, 7) and t.linear_q.bias is not None
    assert attnc.from_torch(dm.SelfattentionV2(7)).dim == 7


def test_003_multihead_is_converted_to_the_intent():
    """003's MultiHeadSelfAttention (q, k, v, nums_head) becomes the corrected
    class: its twin equals the errata-fixed torch class with the same weights,
    not 003's code (which attends over feature channels)."""
    doc003 = type("MultiHeadSelfAttention", (dm.MultiHeadSelfAttention003,), {})   # the document's name
    torch.manual_seed(2)
    tm = doc003(6, 6, 6, 2).double().eval()
    twin = attnc.from_torch(tm)
    assert type(twin) is attnc.MultiHeadSelfAttention and twin.num_heads == 2
    fixed = dm.MultiHeadSelfAttention(6, 6, 6, 2, bias=True).double().eval()
    fixed.load_state_dict({f"linear_{key}": value for key, value in tm.state_dict().items()})
    x = np.random.default_rng(3).standard_normal((B, T, 6))
    with torch.no_grad():
        assert_close(twin(x), fixed(torch.from_numpy(x)), np.float64, "intent")
        assert np.abs(twin(x) - tm(torch.from_numpy(x)).numpy()).max() > 1e-3


@pytest.mark.parametrize("case", CASES[:8], ids=IDS[:8])
def test_mode_is_carried_over(case):
    tm = _make(case[1], np.float32, training=True)
    twin = attnc.from_torch(tm)
    assert twin.training is True
    assert all(child.training for child in twin._modules.values())
    assert attnc.from_torch(tm.eval()).training is False


def test_weights_are_copies_and_dtypes():
    tm = dm.SelfAttentionv1(4)
    twin = attnc.from_torch(tm)
    before = twin.Q_proj.weight.copy()
    with torch.no_grad():
        tm.Q_proj.weight.add_(1.0)
    np.testing.assert_array_equal(twin.Q_proj.weight, before)
    assert attnc.from_torch(tm.double()).dtype == np.float64
    assert attnc.from_torch(tm, dtype=np.float32).dtype == np.float32
    for torch_dtype_, expected in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16")):
        half = dm.SelfAttentionv1(4).to(torch_dtype_)   # a 16-bit model: a 16-bit twin, the same values
        twin = attnc.from_torch(half)
        assert twin.dtype.name == expected
        np.testing.assert_array_equal(twin.K_proj.weight.astype(np.float32),
                                      half.K_proj.weight.detach().float().numpy())
    mixed = dm.SelfAttentionv1(4).to(torch.float16)
    mixed.K_proj.to(torch.bfloat16)   # float16 with bfloat16: neither holds the other
    assert attnc.from_torch(mixed).dtype == np.float32


def test_torch_bfloat16_tensors_are_read_widened():
    """Regression (a modules audit, 2026-12-02): NumPy refuses torch's bfloat16 tensors, so a
    bfloat16 model's state_dict did not load into attnc's bfloat16 twin ("in_proj_weight: Got
    unsupported ScalarType BFloat16"), where from_torch took the same model. A torch bfloat16
    tensor is now read widened to float32 (exactly) wherever an array is taken: loaded, its
    values are the model's own, and an input gives the widened array's result."""
    pytest.importorskip("ml_dtypes")
    torch.manual_seed(0)
    tm = nn.MultiheadAttention(8, 2).bfloat16()
    loaded = attnc.nn.MultiheadAttention(8, 2, dtype="bfloat16")
    loaded.load_state_dict(tm.state_dict())
    for key, value in tm.state_dict().items():
        np.testing.assert_array_equal(loaded.state_dict()[key].astype(np.float32), value.float().numpy(), err_msg=key)
    x = torch.randn(2, 3, 8).bfloat16().requires_grad_()
    widened = x.detach().float().numpy()
    linear = attnc.Linear(8, 4, rng=np.random.default_rng(1))
    np.testing.assert_array_equal(linear(x), linear(widened))
    np.testing.assert_array_equal(F.scaled_dot_product_attention(x, x, x), F.scaled_dot_product_attention(
        widened, widened, widened))
    assert F.scaled_dot_product_attention(x, x, x).dtype == np.float32


@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias, dtype):
    torch.manual_seed(4)
    tm = nn.Linear(5, 3, bias=bias).to(torch_dtype(dtype))
    twin = attnc.from_torch(tm)
    assert type(twin) is attnc.Linear and (twin.bias is None) == (not bias) and twin.training is True
    x = np.random.default_rng(5).standard_normal((2, 4, 5)).astype(dtype)
    with torch.no_grad():
        assert_close(twin(x), tm(torch.from_numpy(x)), dtype)


MHA_OPTIONS = [
    {}, dict(bias=False), dict(add_bias_kv=True, add_zero_attn=True), dict(kdim=3, vdim=5, dropout=0.2),
    dict(batch_first=True, add_bias_kv=True),
]


@pytest.mark.parametrize("options", MHA_OPTIONS, ids=[str(sorted(o)) for o in MHA_OPTIONS])
def test_multihead_attention(options, dtype):
    torch.manual_seed(6)
    tm = nn.MultiheadAttention(8, 2, **options).to(torch_dtype(dtype)).eval()
    twin = attnc.from_torch(tm)
    assert type(twin) is attnc.nn.MultiheadAttention and twin.training is False and twin.dtype == dtype
    for attr in ("embed_dim", "num_heads", "dropout", "kdim", "vdim", "batch_first", "add_zero_attn"):
        assert getattr(twin, attr) == getattr(tm, attr), attr
    assert list(twin.state_dict()) == list(tm.state_dict())
    rng = np.random.default_rng(7)

    def sequence(length, features):
        shape = (2, length, features) if options.get("batch_first") else (length, 2, features)
        return rng.standard_normal(shape).astype(dtype)

    q, k, v = sequence(4, 8), sequence(5, options.get("kdim", 8)), sequence(5, options.get("vdim", 8))
    tensors = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]   # torch's documented (slow) path
    t_out, t_w = tm(*tensors)
    out, w = twin(q, k, v)
    assert_close(out, t_out, dtype, "attn_output")
    assert_close(w, t_w, dtype, "attn_weights")


def test_unknown_classes_raise_type_error():
    with pytest.raises(TypeError, match="Conv1d"):
        attnc.from_torch(nn.Conv1d(2, 2, 1))
    with pytest.raises(TypeError, match="no attnc twin for object"):   # not even a module (was AttributeError)
        attnc.from_torch(object())
    with pytest.raises(TypeError, match="MultiHeadSelfAttention003"):
        attnc.from_torch(dm.MultiHeadSelfAttention003(4, 4, 4, 2))   # a test name, not a document's

    class SelfAttentionV1(nn.Module):   # attnc's name, not a document's
        pass

    with pytest.raises(TypeError, match="SelfAttentionV1"):
        attnc.from_torch(SelfAttentionV1())

    class Attention(nn.Module):           # a document's name with other layers
        def __init__(self):
            super().__init__()
            self.to_qkv = nn.Linear(4, 12)

    with pytest.raises(TypeError, match="Attention.*to_qkv"):
        attnc.from_torch(Attention())
    no_bias = dm.SelfAttentionv1(4)
    no_bias.Q_proj = nn.Linear(4, 4, bias=False)
    with pytest.raises(TypeError, match="SelfAttentionv1.*Q_proj.bias"):
        attnc.from_torch(no_bias)

    # a user's own class named as torch's (tutorials often write a MultiheadAttention):
    # AttributeError from reading torch's attributes it lacks (a review helper, 2026-11-24)
    class MultiheadAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(8, 24)

    class Linear(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(2, 3))

    for own in (MultiheadAttention(), Linear()):
        name = type(own).__name__
        with pytest.raises(TypeError, match=rf"^from_torch: this {name} is not torch.nn.{name}"):
            attnc.from_torch(own)


def test_attnc_never_imports_torch():
    code = ("import sys, numpy as np, attnc, attnc.nn; from attnc import from_torch; "
            "m = attnc.nn.MultiheadAttention(4, 2); x = np.ones((3, 2, 4)); out, w = m(x, x, x); "
            "m.backward(np.ones_like(out)); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 0, result.stderr


# ----------------------------------------------------------------------------
# tensors that require grad: taken as their values everywhere


def _grad_tensor(a):
    """a as a tensor that requires grad (a float one; torch refuses it for others)."""
    return torch.tensor(a, requires_grad=np.asarray(a).dtype.kind == "f")


def test_functional_takes_tensors_that_require_grad():
    """NumPy refuses to convert a torch tensor that requires grad (torch's RuntimeError, naming
    no argument): the functional layer and the modules' forwards raised it while
    nn.MultiheadAttention and parameter assignment took the tensor's values (a review
    helper, 2026-11-24). Every entry point now takes them: results equal the arrays'."""
    F = attnc.functional
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 4, 5, 8)) for _ in range(3))
    kv = rng.standard_normal((2, 2, 5, 8))
    w, b, x = rng.standard_normal((3, 8)), rng.standard_normal(3), rng.standard_normal((2, 5, 8))
    keep = random_keep_mask(rng, (5, 5))
    out, lse = F.scaled_dot_product_attention(q, k, v, return_lse=True)
    calls = [
        (F.linear, (x, w, b), {}),
        (F.softmax, (x,), {}),
        (F.scaled_dot_product_attention, (q, k, v), {"attn_mask": keep, "attn_bias": x[0, :, :5]}),
        (F.scaled_dot_product_attention, (q, kv, kv), {"enable_gqa": True}),
        (F.linear_backward, (rng.standard_normal((2, 5, 3)), x, w), {}),
        (F.softmax_backward, (x, F.softmax(x)), {}),
        (F.scaled_dot_product_attention_backward, (out, q, k, v, out, lse), {}),
    ]
    for function, args, kwargs in calls:
        expected = function(*args, **kwargs)
        got = function(*map(_grad_tensor, args), **{key: _grad_tensor(a) for key, a in kwargs.items()
                                                      if not isinstance(a, bool)},
                       **{key: a for key, a in kwargs.items() if isinstance(a, bool)})
        for e, g in zip(expected if isinstance(expected, tuple) else (expected,),
                        got if isinstance(got, tuple) else (got,)):
            if e is not None:
                np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_modules_take_tensors_that_require_grad(case):
    """A module's input, mask and grad_output as tensors that require grad, in eval and in
    training mode (forward and backward): the same results as from arrays."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    mask = random_keep_mask(rng, (2, 1, 5, 5) if case.n_heads(8) else (2, 5, 5)) if case.masked else None
    args = (x,) if mask is None else (x, mask)
    m = make_module(case.name, 8)
    np.testing.assert_array_equal(m(*map(_grad_tensor, args)), m(*args))
    # training mode: two modules made alike draw the same dropout masks
    arrays, tensors = make_module(case.name, 8, seed=3).train(), make_module(case.name, 8, seed=3).train()
    expected_out = arrays(*args)
    np.testing.assert_array_equal(tensors(*map(_grad_tensor, args)), expected_out)
    grad = rng.standard_normal(expected_out.shape).astype(np.float32)
    np.testing.assert_array_equal(tensors.backward(_grad_tensor(grad)), arrays.backward(grad))
    expected_grads, got_grads = dict(arrays.named_grads()), dict(tensors.named_grads())
    assert got_grads.keys() == expected_grads.keys()
    for name in got_grads:
        np.testing.assert_array_equal(got_grads[name], expected_grads[name])


def test_nn_multihead_takes_tensors_that_require_grad():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    padding = np.zeros((2, 5), np.float32)
    padding[:, -1] = -np.inf
    m = attnc.nn.MultiheadAttention(8, 2, batch_first=True).train()
    expected, _ = m(x, x, x, key_padding_mask=padding)
    grad = rng.standard_normal(expected.shape).astype(np.float32)
    expected_grads = m.backward(grad)
    t = _grad_tensor(x)
    got, _ = m(t, t, t, key_padding_mask=_grad_tensor(padding))
    np.testing.assert_array_equal(got, expected)
    for g, e in zip(m.backward(_grad_tensor(grad)), expected_grads):
        np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_a_tensor_inputs_gradient_comes_in_its_own_dtype(dtype):
    """A module's input gradient comes in the input's dtype when it is floating
    (torch's x.grad); a torch tensor's dtype was not recognised, so a float64
    tensor got a float32 gradient from a float32 module where the same values
    as an array got float64 (an API review, 2026-11-24). The oracle: the array."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 8)).astype(dtype)
    for make in (lambda: attnc.Linear(8, 3, rng=np.random.default_rng(4)),
                 lambda: make_module("V1", 8, seed=4).train()):
        grads = []
        for given in (x, torch.from_numpy(x)):
            m = make()
            out = m(given)
            grads.append(m.backward(np.ones_like(out)))
        assert grads[0].dtype == grads[1].dtype == dtype
        np.testing.assert_array_equal(grads[1], grads[0])
    mha = attnc.nn.MultiheadAttention(8, 2, batch_first=True)
    t = torch.from_numpy(x)
    out, _ = mha(t, t, t)
    assert [g.dtype for g in mha.backward(np.ones_like(out))] == [dtype] * 3


def test_a_bfloat16_tensors_gradient_is_bfloat16_before_ml_dtypes_is_imported():
    """Regression (a 16-bit audit, 2026-12-06): a torch bfloat16 input's gradient came
    in the module's dtype until the process had imported ml_dtypes (NumPy knows the
    name "bfloat16" only then), and in bfloat16 after. Run in a fresh interpreter
    (this one has imported it). The oracle: the same values as an ml_dtypes array."""
    code = textwrap.dedent("""
        import sys
        import numpy as np, torch, attnc
        assert "ml_dtypes" not in sys.modules
        x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
        def grads(given):
            results = []
            for m in (attnc.Linear(8, 3, rng=np.random.default_rng(4)),
                      attnc.SelfAttentionV1(8, rng=np.random.default_rng(4)).train()):
                out = m(given)
                results.append(m.backward(np.ones_like(out)))
            mha = attnc.nn.MultiheadAttention(8, 2, batch_first=True, rng=np.random.default_rng(4))
            out, _ = mha(given, given, given)
            return results + list(mha.backward(np.ones_like(out)))
        from_tensor = grads(x)
        import ml_dtypes
        from_array = grads(x.float().numpy().astype(ml_dtypes.bfloat16))
        for tensor_grad, array_grad in zip(from_tensor, from_array):
            assert tensor_grad.dtype == array_grad.dtype == ml_dtypes.bfloat16, (tensor_grad.dtype, array_grad.dtype)
            assert tensor_grad.tobytes() == array_grad.tobytes()
        print("ok", len(from_tensor))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["ok", "5"], done.stdout + done.stderr


DROPOUT_CASES = [case for case in CASES if case[0] in ("000-SelfAttentionv3", "000-SelfAttentionInterview",
                                                        "001-Attention", "001-MuitiHeadAttention")]


@pytest.mark.parametrize("case", DROPOUT_CASES, ids=[case[0] for case in DROPOUT_CASES])
def test_a_dropouts_own_mode_is_torchs(case):
    """torch decides dropout by the Dropout submodule's own mode: after
    ``train(); dropout.eval()`` it trains without dropout, after ``eval();
    dropout.train()`` it drops in an eval-mode forward. attnc read the parent's
    mode only, and from_torch did not carry the submodule's (a training review,
    2026-11-24): outputs up to 0.5 off torch's. The oracle: torch's forward."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    tm = _make(case[1], np.float32, training=True)
    dropout_name = next(name for name, sub in tm.named_children() if isinstance(sub, nn.Dropout))
    getattr(tm, dropout_name).eval()
    twin = attnc.from_torch(tm)
    assert twin.training and not any(isinstance(sub, attnc.Dropout) and sub.training for sub in twin._modules.values())
    with torch.no_grad():
        expected = tm(torch.from_numpy(x)).numpy()
    out = twin(x)
    assert_close(out, expected, np.float32)
    grad_x = twin.backward(np.ones_like(out))  # a training-mode forward: the backward works, without dropout
    plain = attnc.from_torch(tm.eval()).train()
    plain_dropout = next(sub for sub in plain._modules.values() if isinstance(sub, attnc.Dropout))
    plain_dropout.p = 0.0
    np.testing.assert_array_equal(plain(x), out)
    np.testing.assert_array_equal(plain.backward(np.ones_like(out)), grad_x)
    # the other way round: an eval-mode module whose dropout trains drops as the training one does
    dropping = attnc.from_torch(tm, rng=np.random.default_rng(5)).eval()
    training = attnc.from_torch(tm, rng=np.random.default_rng(5)).train()
    for module in (dropping, training):
        dropout = next(sub for sub in module._modules.values() if isinstance(sub, attnc.Dropout))
        dropout.p = 0.5  # (001's Attention drops 1 %: none of 75 weights, half the time)
        dropout.train()
    np.testing.assert_array_equal(dropping(x), training(x))
    assert not np.allclose(dropping(x), expected)


@pytest.mark.parametrize("make", [
    lambda: nn.Linear(2, 3, dtype=torch.complex64),
    lambda: nn.MultiheadAttention(4, 2, dtype=torch.complex64),
    lambda: torch.ao.nn.qat.Linear(2, 3, qconfig=torch.ao.quantization.get_default_qat_qconfig()),
], ids=["complex Linear", "complex MultiheadAttention", "quantization-aware Linear"])
def test_a_module_with_parameters_that_are_not_real_floats_is_refused(make):
    """A complex module's twin dropped the imaginary parts silently; a quantized
    Linear's raised AttributeError (a robustness review, 2026-11-24)."""
    module = make()
    with pytest.raises(TypeError, match=r"^from_torch: \w+'s \S+ is torch\.(complex64|int64)"):
        attnc.from_torch(module)


def test_a_dropout_subclass_gives_its_p_and_mode():
    """from_torch read the Dropout's p by attribute name but looked for its mode
    among submodules whose class is named exactly Dropout: a subclass's mode was
    lost (a review, 2026-11-24). The oracle: torch's forward."""
    class LoggedDropout(nn.Dropout):
        pass

    torch.manual_seed(0)
    tm = dm.SelfAttentionv3(D, 0.5)
    tm.attention_dropout = LoggedDropout(0.5)
    tm.train()
    tm.attention_dropout.eval()
    twin = attnc.from_torch(tm)
    assert twin.training and not twin.attention_dropout.training and twin.attention_dropout.p == 0.5
    x = np.random.default_rng(0).standard_normal((B, T, D)).astype(np.float32)
    with torch.no_grad():
        assert_close(twin(x), tm(torch.from_numpy(x)).numpy(), np.float32)


@pytest.mark.parametrize("replace", [lambda: nn.AlphaDropout(0.5), lambda: nn.Dropout1d(0.5), lambda: nn.Identity()],
                         ids=["AlphaDropout", "Dropout1d", "Identity"])
def test_a_dropout_that_is_not_torchs_dropout_is_refused(replace):
    """AlphaDropout (and the channel dropouts) became the twin's element-wise
    Dropout: in training mode the twin's outputs had another distribution than
    torch's; an Identity raised AttributeError (a review helper, 2026-12-01)."""
    tm = dm.SelfAttentionv3(D, 0.5)
    tm.attention_dropout = replace()
    with pytest.raises(TypeError, match=r"^from_torch: SelfAttentionv3's attention_dropout is not torch.nn.Dropout"):
        attnc.from_torch(tm)


def test_a_subclass_that_overrides_forward_is_refused():
    """A subclass of torch.nn.MultiheadAttention, Linear or Dropout under the
    recognised name but with a forward of its own was converted as torch's class
    (its outputs silently not the module's: a review helper, 2026-12-01); one
    that keeps torch's forward is converted, and matches torch."""
    class MultiheadAttention(nn.MultiheadAttention):
        def forward(self, *args, **kwargs):
            out, weights = super().forward(*args, **kwargs)
            return 2 * out, weights

    class Linear(nn.Linear):
        def forward(self, x):
            return torch.relu(super().forward(x))

    class Dropout(nn.Dropout):
        def forward(self, x):
            return x

    for module in (MultiheadAttention(8, 2), Linear(3, 4)):
        name = type(module).__name__
        with pytest.raises(TypeError, match=rf"^from_torch: this {name} is not torch.nn.{name}: its class "):
            attnc.from_torch(module)
    tm = dm.SelfAttentionv3(D, 0.5)
    tm.attention_dropout = Dropout(0.5)
    with pytest.raises(TypeError, match=r"^from_torch: SelfAttentionv3's attention_dropout is not torch.nn.Dropout: "):
        attnc.from_torch(tm)

    class Plain(nn.Linear):  # torch's forward
        pass

    plain = type("Linear", (Plain,), {})(3, 4)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    with torch.no_grad():
        assert_close(attnc.from_torch(plain)(x), plain(torch.from_numpy(x)).numpy(), np.float32)


def test_a_document_layer_or_a_call_the_twin_would_not_compute_is_refused():
    """Regression (a robustness helper, 2026-12-02): a document class's projection
    layers were not checked: a Linear subclass with its own forward, or any module
    holding a weight and a bias, became a plain Linear in the twin (its outputs off by
    0.08-0.3 from the torch module's), and so did a forward set on an instance or a
    hook. Each is refused now, naming it. torch's MultiheadAttention never calls its
    out_proj, so a hook there is taken, and its twin matches torch's output."""
    class Scaled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    class Tanh(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight, self.bias = nn.Parameter(torch.ones(D, D)), nn.Parameter(torch.zeros(D))

        def forward(self, x):
            return torch.tanh(x @ self.weight)

    def hook(tm):
        return tm.V_proj.register_forward_hook(lambda module, inputs, output: 2 * output)

    changes = [(lambda tm: setattr(tm, "Q_proj", Scaled(D, D)), "SelfAttentionv1's Q_proj is not torch.nn.Linear: its"),
               (lambda tm: setattr(tm, "Q_proj", Tanh()), r"SelfAttentionv1's Q_proj is not torch.nn.Linear \(a "),
               (lambda tm: setattr(tm.K_proj, "forward", lambda x: x),
                "SelfAttentionv1's K_proj has a forward set on the instance"),
               (hook, "SelfAttentionv1's V_proj has forward hooks"),
               (lambda tm: tm.register_forward_pre_hook(lambda module, inputs: inputs),
                "this SelfAttentionv1 has forward pre hooks"),
               (lambda tm: tm.Q_proj.register_full_backward_hook(lambda module, gin, gout: gin),
                "SelfAttentionv1's Q_proj has backward hooks")]
    x = np.random.default_rng(0).standard_normal((2, 3, D)).astype(np.float32)
    for change, message in changes:
        tm = dm.SelfAttentionv1(D).eval()
        change(tm)
        with pytest.raises(TypeError, match="^from_torch: " + message):
            attnc.from_torch(tm)
    tm = dm.SelfAttentionv1(D).eval()
    hook(tm).remove()
    with torch.no_grad():
        assert_close(attnc.from_torch(tm)(x), tm(torch.from_numpy(x)).numpy(), np.float32)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    mha.register_forward_hook(lambda module, inputs, output: output)
    with pytest.raises(TypeError, match="^from_torch: this MultiheadAttention has forward hooks"):
        attnc.from_torch(mha)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    mha.out_proj.register_forward_hook(lambda module, inputs, output: 2 * output)
    q = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)
    with torch.no_grad():
        expected = mha(*[torch.from_numpy(q)] * 3)[0].numpy()
    assert_close(attnc.from_torch(mha)(q, q, q)[0], expected, np.float32)


def test_a_module_on_the_meta_device_is_refused():
    """Its tensors have no values: torch's NotImplementedError came through (a
    review helper, 2026-12-01)."""
    for module, key in ((nn.Linear(3, 4, device="meta"), "weight"),
                        (nn.MultiheadAttention(8, 2, device="meta"), "in_proj_weight")):
        with pytest.raises(TypeError, match=rf"^from_torch: {type(module).__name__}'s {key} is on the meta device"):
            attnc.from_torch(module)


def test_a_document_class_without_its_attributes_is_refused():
    """A document's class lacking the head count or dropout its twin reads
    raised AttributeError (a review helper, 2026-12-01)."""
    tm = dm.MuitiHeadAttention(D, 3, 0.2)
    del tm.dropout
    with pytest.raises(TypeError, match=r"^from_torch: this MuitiHeadAttention lacks an attribute .*dropout"):
        attnc.from_torch(tm)
    tm = dm.MultiHeadSelfAttention(D, 6, 9, 3)
    del tm.num_heads
    with pytest.raises(TypeError, match=r"^from_torch: this MultiHeadSelfAttention lacks an attribute .*num_heads"):
        attnc.from_torch(tm)


@pytest.mark.parametrize("make, attribute", [
    (lambda: dm.MuitiHeadAttention(D, 3, 0.2), "head_num"),
    (lambda: type("MultiHeadSelfAttention", (dm.MultiHeadSelfAttention003,), {})(D, 6, 6, 2), "nums_head"),
    (lambda: dm.MultiHeadSelfAttention(D, 6, 6, 2), "num_heads")])
@pytest.mark.parametrize("heads", [2.7, True, "3"])
def test_a_head_count_that_is_not_an_integer_is_refused_naming_it(make, attribute, heads):
    """Regression (fuzzing): from_torch read a document module's head count with int(), so
    2.7 made a twin of 2 heads and True one of 1, where the attnc constructors refuse both."""
    module = make()
    setattr(module, attribute, heads)
    with pytest.raises(TypeError, match=f"^{attribute}: expected an integer"):
        attnc.from_torch(module)


def test_linear_sizes_come_from_the_weight():
    """Regression (API audit): the docs say a torch Linear's sizes come from its weight's
    shape, and torch's forward reads only the weight; from_torch read in_features and
    out_features, so a weight legally replaced by one of another shape (or an attribute
    edited) failed to convert. The twin now has the weight's sizes and torch's outputs."""
    torch.manual_seed(6)
    reference = nn.Linear(4, 3)
    reference.weight = nn.Parameter(torch.randn(3, 5))
    twin = attnc.from_torch(reference)
    assert (twin.in_features, twin.out_features) == (5, 3)
    x = np.random.default_rng(2).standard_normal((2, 5)).astype(np.float32)
    with torch.no_grad():
        assert_close(twin(x), reference(torch.from_numpy(x)), np.float32)
    edited = nn.Linear(4, 3)
    edited.in_features = 7
    assert attnc.from_torch(edited).in_features == 4
    flat = nn.Linear(4, 3)
    flat.weight = nn.Parameter(torch.randn(12))
    with pytest.raises(ValueError, match=r"weight: expected 2 dims"):
        attnc.from_torch(flat)


@pytest.mark.parametrize("tie", ["submodule", "weight", "renamed_layers"])
def test_ties_are_kept_and_train_as_torch(tie):
    """A torch module holding one tensor under two state_dict keys (a
    submodule or a parameter assigned twice) got a twin with two arrays: its
    forward matched, but training moved them apart (0.63 from torch's weights
    after 3 SGD steps). The twin holds one array under both keys, and
    SGD with momentum steps as torch.optim does."""
    torch.manual_seed(7)
    if tie == "renamed_layers":  # 002's querry_proj / key_proj: keys renamed on the way
        module = dm.SelfattentionV1(D).double()
        module.key_proj = module.querry_proj
        pairs = [("Q_proj.weight", "K_proj.weight"), ("Q_proj.bias", "K_proj.bias")]
    else:
        module = dm.SelfAttentionv1(D).double()
        if tie == "submodule":
            module.K_proj = module.Q_proj
            pairs = [("Q_proj.weight", "K_proj.weight"), ("Q_proj.bias", "K_proj.bias")]
        else:
            module.V_proj.weight = module.Q_proj.weight
            pairs = [("Q_proj.weight", "V_proj.weight")]
    twin = attnc.from_torch(module)
    slots = dict(twin.named_parameters(remove_duplicate=False))
    for first, second in pairs:
        assert slots[first] is slots[second], (first, second)
    assert len(list(twin.named_parameters())) == len(list(module.parameters()))
    x = np.random.default_rng(8).standard_normal((B, T, D))
    optimizer = attnc.optim.SGD(twin, lr=0.1, momentum=0.9)
    torch_optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9, foreach=False)
    for step in range(3):
        out = twin(x)
        twin.backward(np.cos(out))
        optimizer.step()
        twin.zero_grad()
        expected = module(torch.from_numpy(x))
        expected.backward(torch.cos(expected.detach()))
        torch_optimizer.step()
        torch_optimizer.zero_grad()
        assert_close(out, expected.detach().numpy(), np.float64, f"step {step} output")
    assert_close(twin(x), module(torch.from_numpy(x)).detach().numpy(), np.float64, "after 3 steps")


def _003(name, *args):
    """003's class of that name (tests/doc_models.py holds it under another)."""
    base = dm.SelfAttention003 if name == "SelfAttention" else dm.MultiHeadSelfAttention003
    return type(name, (base,), {})(*args)


@pytest.mark.parametrize("name, args, last_axis", [("SelfAttention", (D, 4, 7), 2),
                                                   ("MultiHeadSelfAttention", (D, 6, 6, 2), 3)])
def test_003s_softmax_replaced_is_refused(name, args, last_axis):
    """Regression (a from_torch audit, 2026-12-06): 003's classes call their
    nn.Softmax submodule, which from_torch never looked at: one over dim=1, or an
    Identity, in its place gave a twin off by 0.2-2.3 from the module's outputs.
    Either is refused now, naming it; a Softmax over the scores' last axis by its
    positive index is converted, and its twin matches torch's outputs."""
    x = np.random.default_rng(3).standard_normal((B, T, D))
    for softmax, error, message in ((nn.Softmax(dim=1), TypeError, "is over dim=1, not the scores' last axis"),
                                    (nn.Softmax(dim=None), TypeError, "is over dim=None"),
                                    (nn.Identity(), TypeError, r"is not torch.nn.Softmax \(a ")):
        tm = _003(name, *args).double().eval()
        tm.softmax = softmax
        with pytest.raises(error, match=f"^from_torch: {name}'s softmax {message}"):
            attnc.from_torch(tm)
    tm = _003(name, *args).double().eval()
    expected = attnc.from_torch(tm)(x)
    tm.softmax = nn.Softmax(dim=last_axis)
    np.testing.assert_array_equal(attnc.from_torch(tm)(x), expected)
    if name == "SelfAttention":  # (003's MultiHeadSelfAttention attends over channels: its twin does not)
        with torch.no_grad():
            assert_close(expected, tm(torch.from_numpy(x)).numpy(), np.float64)


# each document class's attributes its forward reads (beyond its head count), with a wrong value for each
SIZE_ATTRIBUTES = {
    "000-SelfAttentionv1": ["hidden_dim"], "000-SelfAttentionv2": ["dim"], "000-SelfAttentionv3": ["dim"],
    "000-SelfAttentionInterview": ["dim"], "001-EasyAttentionModule": ["hidden_dim"],
    "001-AttentionModule": ["dim"], "001-Attention": ["dim"], "001-MuitiHeadAttention": ["head_dim"],
    "002-SelfattentionV1": ["hidden_dim"], "002-SelfattentionV2": ["hidden_dim"], "002-slefattentionV3": ["dim"],
    "003-SelfAttention": ["dim_k"], "004-SelfAttention": ["dim_in", "_norm_fact"],
    "004-SelfAttention-bias": ["dim_in", "_norm_fact"],
    "004-MultiHeadSelfAttention": ["dim_in", "dim_k", "dim_v", "_norm_fact"],
    "004-MultiHeadSelfAttention-bias": ["dim_in", "dim_k", "dim_v", "_norm_fact"],
}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_size_attribute_that_disagrees_with_the_weights_is_refused(case):
    """Regression (a from_torch audit, 2026-12-06): a document module's forward
    splits, views or scales by attributes its constructor set (hidden_dim, dim,
    head_dim, dim_k, 004's _norm_fact); the twin computes from the weights, so a
    module whose attribute was edited got a twin whose outputs were not the
    module's (torch's forward scales by the edited value). Refused now, naming it;
    an attribute given as a NumPy integer of the same value is taken."""
    attributes = SIZE_ATTRIBUTES[case[0]]
    for attribute in attributes:
        tm = case[1]()
        value = getattr(tm, attribute)
        wrong = value * 0.5 if attribute == "_norm_fact" else value + 2
        setattr(tm, attribute, wrong)
        with pytest.raises(ValueError, match=rf"^from_torch: {type(tm).__name__}'s {attribute} is {wrong!r} where "
                                             rf"its weights make it {value!r}"):
            attnc.from_torch(tm)
        setattr(tm, attribute, np.int64(value) if isinstance(value, int) else np.float64(value))
        attnc.from_torch(tm)
    tm = case[1]()
    setattr(tm, attributes[0], True)
    with pytest.raises(TypeError, match=rf"^from_torch: {type(tm).__name__}'s {attributes[0]}: expected an"):
        attnc.from_torch(tm)


def test_003s_multihead_size_attributes_are_checked():
    """003's MultiHeadSelfAttention views by dim_k and dim_v: the same check as
    above (that class is not among CASES: its twin attends over positions)."""
    for attribute in ("dim_k", "dim_v"):
        tm = _003("MultiHeadSelfAttention", D, 6, 6, 2)
        setattr(tm, attribute, 4)
        with pytest.raises(ValueError, match=f"^from_torch: MultiHeadSelfAttention's {attribute} is 4 where its "
                                             "weights make it 6"):
            attnc.from_torch(tm)


def test_a_dropout_rate_or_mode_that_is_not_a_number_or_a_flag_is_refused_naming_it():
    """Regression (a from_torch audit, 2026-12-06): a document's Dropout p was read
    with float(), so p=True made a twin that drops every weight in training and a
    one-element tensor was taken, where the constructors refuse both; a mode that
    has no truth value (an array of two flags) raised NumPy's error without the
    attribute's name."""
    for p in (True, torch.tensor([0.2]), np.array([0.2])):
        tm = dm.Attention(D, 0.1)
        tm.dropout.p = p
        with pytest.raises(TypeError, match=r"^from_torch: Attention's dropout.p: expected a number in \[0, 1\]"):
            attnc.from_torch(tm)
    tm = dm.Attention(D, 0.1)
    tm.dropout.p = 1.5
    with pytest.raises(ValueError, match=r"^from_torch: Attention's dropout.p: expected a probability in \[0, 1\]"):
        attnc.from_torch(tm)
    tm = dm.MuitiHeadAttention(D, 3, 0.2)
    tm.dropout.training = np.array([True, False])
    with pytest.raises(ValueError, match="^from_torch: MuitiHeadAttention's dropout.training: The truth value"):
        attnc.from_torch(tm)
    tm = dm.MuitiHeadAttention(D, 3, 0.2)
    tm.training = np.array([True, False])
    with pytest.raises(ValueError, match="^from_torch: MuitiHeadAttention's training: The truth value"):
        attnc.from_torch(tm)


def test_an_attnc_module_or_a_linear_without_a_weight_is_refused_by_what_it_is():
    """Regression (a from_torch audit, 2026-12-06): an attnc module raised torch-free
    code's TypeError about state_dict's keep_vars, and a torch Linear whose weight
    was set to None was called "not torch.nn.Linear"."""
    for module in (attnc.Linear(3, 3), attnc.SelfAttention(4, 4, 4), attnc.nn.MultiheadAttention(4, 2)):
        with pytest.raises(TypeError, match=f"^from_torch: this {type(module).__name__} is an attnc module already"):
            attnc.from_torch(module)
    linear = nn.Linear(4, 3)
    linear.weight = None
    with pytest.raises(TypeError, match="^from_torch: weight: expected a tensor, got None"):
        attnc.from_torch(linear)


def test_a_sparse_parameter_is_refused_and_a_negative_view_is_read_by_its_values():
    """Regression (a from_torch audit, 2026-12-06): a sparse weight raised torch's
    own TypeError and a weight with torch's negative bit set (a lazy -x view) its
    RuntimeError, neither naming the parameter. The sparse one is refused naming
    it; the negative view's values are read (the oracle: torch's forward)."""
    sparse = nn.Linear(4, 3)
    sparse.weight = nn.Parameter(sparse.weight.detach().to_sparse())
    with pytest.raises(TypeError, match=r"^from_torch: Linear's weight is a torch.sparse_coo tensor"):
        attnc.from_torch(sparse)
    torch.manual_seed(4)
    negative = nn.Linear(4, 3).double()
    negative.weight = nn.Parameter(torch.randn(3, 4, dtype=torch.float64)._neg_view(), requires_grad=False)
    x = np.random.default_rng(4).standard_normal((2, 4))
    with torch.no_grad():
        expected = negative(torch.from_numpy(x)).numpy()
    assert_close(attnc.from_torch(negative)(x), expected, np.float64)


def test_a_tied_modules_mode_error_names_the_module():
    """The loop over tied keys rebound the name the mode's error uses: a tied module
    whose mode has no truth value was named by a key ("Q_proj.bias's training")."""
    tm = dm.SelfAttentionv1(D)
    tm.K_proj = tm.Q_proj
    tm.training = np.array([True, False])
    with pytest.raises(ValueError, match="^from_torch: SelfAttentionv1's training: The truth value"):
        attnc.from_torch(tm)
