"""The Module API against torch.nn.Module: training flag, train/eval, named_parameters,
state_dict keys and order, copies, load_state_dict, to(dtype), repr, Linear init, seeding."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import attnc
from toolkit import MODEL_IDS, MODELS, SIMD_LEVELS, assert_close


DIM = 6


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_training_flag_train_eval(case):
    m = case.make(DIM)
    assert m.training is True
    assert m.eval() is m and m.training is False
    assert m.train() is m and m.training is True
    assert m.train(False) is m and m.training is False
    assert m.train(True) is m and m.training is True


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_named_parameters_and_state_dict_match_torch(case):
    m = case.make(DIM)
    tm = case.make_torch(DIM)
    names = [n for n, _ in m.named_parameters()]
    assert names == [n for n, _ in tm.named_parameters()]
    assert list(m.state_dict().keys()) == list(tm.state_dict().keys())
    for (n, p), (tn, tp) in zip(m.named_parameters(), tm.named_parameters()):
        assert isinstance(p, np.ndarray) and p.shape == tuple(tp.shape) and p.dtype == np.float32
    params = list(m.parameters())
    assert len(params) == len(names)
    for p, (_, q) in zip(params, m.named_parameters()):
        assert p is q or np.shares_memory(p, q)


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_state_dict_values_are_copies(case):
    m = case.make(DIM)
    sd = m.state_dict()
    before = {k: v.copy() for k, v in sd.items()}
    for v in sd.values():
        v[...] = 42.0
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    for _, p in m.named_parameters():
        assert not any(np.shares_memory(p, v) for v in sd.values())


def test_load_state_dict_copies_in():
    m = attnc.SelfAttentionV1(3)
    src = {k: np.full(v.shape, 0.5, np.float32) for k, v in m.state_dict().items()}
    m.load_state_dict(src)
    src["Q_proj.weight"][...] = 9.0
    np.testing.assert_array_equal(m.state_dict()["Q_proj.weight"], 0.5)
    np.testing.assert_array_equal(m.Q_proj.weight, 0.5)


def test_load_state_dict_accepts_lists_and_tensors_and_returns_keys():
    m = attnc.SelfAttentionV1(2)
    sd = {"Q_proj.weight": [[1, 2], [3, 4]], "Q_proj.bias": torch.tensor([0.5, -0.5]),
          "K_proj.weight": np.eye(2, dtype=np.int64), "K_proj.bias": (0, 0),
          "V_proj.weight": torch.ones(2, 2, dtype=torch.float64), "V_proj.bias": np.zeros(2, np.float16)}
    result = m.load_state_dict(sd)
    missing, unexpected = result
    assert list(missing) == [] and list(unexpected) == []
    np.testing.assert_array_equal(m.state_dict()["Q_proj.weight"], [[1, 2], [3, 4]])
    assert m.state_dict()["V_proj.weight"].dtype == np.float32


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_to_float64_in_place(case):
    m = case.make(DIM, rng=np.random.default_rng(1))
    assert m.dtype == np.float32 and isinstance(m.dtype, np.dtype)
    before = m.state_dict()
    assert m.to(np.float64) is m
    assert m.dtype == np.float64
    for k, v in m.state_dict().items():
        assert v.dtype == np.float64
        np.testing.assert_array_equal(v, before[k].astype(np.float64))
    for _, p in m.named_parameters():
        assert p.dtype == np.float64
    x = np.random.default_rng(1).standard_normal((2, 3, DIM))
    out = m.eval()(x)
    assert out.dtype == np.float64
    m.to("float32")
    assert m.dtype == np.float32 and m(x).dtype == np.float32


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_to_keeps_every_parameter_already_of_the_dtype(case):
    """API.md: `to(dtype)` keeps a parameter already of that dtype. One made
    read-only in place (still the module's float32 array) was replaced by a
    writable copy: views taken before stopped following it, and a pending
    training-mode forward's backward then raised "replaced after the forward"."""
    m = case.make(DIM, rng=np.random.default_rng(3))
    params = dict(m.named_parameters())
    first_name, first = next(iter(params.items()))
    first.flags.writeable = False
    view = first[:1]
    x = np.random.default_rng(4).standard_normal((2, 3, DIM)).astype(np.float32)
    y = m(x)
    assert m.to(np.float32) is m
    for name, p in m.named_parameters():
        assert p is params[name], name
    assert np.shares_memory(view, dict(m.named_parameters())[first_name])
    grad_x = m.backward(np.ones_like(y))
    assert grad_x.shape == x.shape
    m.to(np.float64)                                        # another dtype: replaced, converted
    for name, p in m.named_parameters():
        assert p is not params[name] and p.dtype == np.float64, name
        np.testing.assert_array_equal(p, params[name].astype(np.float64), err_msg=name)


@pytest.mark.parametrize("spec,expected", [(np.float32, np.float32), ("float64", np.float64), ("f4", np.float32),
                                           (np.dtype("f8"), np.float64), (float, np.float64), ("d", np.float64)])
def test_dtype_argument_forms(spec, expected):
    for m in (attnc.SelfAttentionV1(3, dtype=spec), attnc.Linear(3, 2, dtype=spec),
              attnc.MultiHeadSelfAttention(4, 4, 4, 2, dtype=spec)):
        assert m.dtype == expected
        assert all(p.dtype == expected for _, p in m.named_parameters())


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_repr_matches_torch(case):
    m = case.make(DIM)
    tm = case.make_torch(DIM)
    lines, tlines = repr(m).split("\n"), repr(tm).split("\n")
    assert lines[0] == type(m).__name__ + "("
    assert lines[1:] == tlines[1:]


def test_linear_and_dropout_repr():
    assert repr(attnc.Linear(4, 3)) == repr(torch.nn.Linear(4, 3))
    assert repr(attnc.Linear(4, 3, bias=False)) == repr(torch.nn.Linear(4, 3, bias=False))
    assert repr(attnc.Dropout(0.25)) == repr(torch.nn.Dropout(0.25))


def test_linear_forward_vs_torch(dtype):
    lin = attnc.Linear(5, 3, dtype=dtype, rng=np.random.default_rng(2))
    assert lin.weight.shape == (3, 5) and lin.bias.shape == (3,)
    tl = torch.nn.Linear(5, 3).to(torch.float64)
    tl.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in lin.state_dict().items()})
    x = np.random.default_rng(2).standard_normal((2, 4, 5)).astype(dtype)
    with torch.no_grad():
        assert_close(lin(x), tl(torch.from_numpy(x.astype(np.float64))), dtype)
    nb = attnc.Linear(5, 3, bias=False)
    assert [n for n, _ in nb.named_parameters()] == ["weight"]
    assert list(nb.state_dict()) == ["weight"]


def test_linear_zero_sizes():
    lin = attnc.Linear(0, 3)
    out = lin(np.ones((2, 0), np.float32))
    np.testing.assert_array_equal(out, np.broadcast_to(lin.bias, (2, 3)))
    assert attnc.Linear(3, 0)(np.ones((2, 3))).shape == (2, 0)


@pytest.mark.parametrize("fan_in,fan_out", [(100, 300), (7, 2000), (1, 500)])
def test_linear_init_uniform_like_torch(fan_in, fan_out):
    lin = attnc.Linear(fan_in, fan_out, rng=np.random.default_rng(3))
    bound = 1 / math.sqrt(fan_in)
    for p in (lin.weight, lin.bias):
        assert np.all(np.abs(p) <= bound)
        # spread over the whole interval, centred, roughly flat
        assert p.max() > 0.9 * bound and p.min() < -0.9 * bound
        n = p.size
        assert abs(float(np.mean(p > 0)) - 0.5) < 5 * 0.5 / math.sqrt(n)
        assert abs(float(np.mean(np.abs(p) < bound / 2)) - 0.5) < 5 * 0.5 / math.sqrt(n)
    assert len(np.unique(lin.weight)) > 0.99 * lin.weight.size


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_module_init_bounds(case):
    m = case.make(40, rng=np.random.default_rng(4))
    sd = m.state_dict()
    for name, p in m.named_parameters():
        bound = 1 / math.sqrt(sd[name.rsplit(".", 1)[0] + ".weight"].shape[1])   # 1/sqrt(in_features)
        assert np.all(np.abs(p) <= bound), name
        if p.size >= 40:
            assert p.max() > 0.5 * bound and p.min() < -0.5 * bound, name


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_init_reproducible(case):
    attnc.manual_seed(11)
    a = case.make(DIM).state_dict()
    attnc.manual_seed(11)
    b = case.make(DIM).state_dict()
    c = case.make(DIM).state_dict()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert any(not np.array_equal(a[k], c[k]) for k in a)
    d = case.make(DIM, rng=np.random.default_rng(5)).state_dict()
    e = case.make(DIM, rng=np.random.default_rng(5)).state_dict()
    for k in d:
        np.testing.assert_array_equal(d[k], e[k])
    f = case.make(DIM, dtype=np.float64, rng=np.random.default_rng(6)).state_dict()
    g = case.make(DIM, dtype=np.float64, rng=np.random.default_rng(6)).state_dict()
    for k in f:
        np.testing.assert_array_equal(f[k], g[k])
        assert f[k].dtype == np.float64


def test_layers_of_one_module_are_independent():
    m = attnc.SelfAttentionV1(8, rng=np.random.default_rng(7))
    assert not np.array_equal(m.Q_proj.weight, m.K_proj.weight)
    assert not np.array_equal(m.K_proj.weight, m.V_proj.weight)


def test_alias_and_exports():
    assert attnc.SelfAttentionInterview is attnc.SelfAttentionV4
    assert isinstance(attnc.__version__, str) and attnc.__version__
    for name in ("Module", "Linear", "Dropout", "SelfAttentionV1", "SelfAttentionV2", "SelfAttentionV3",
                 "SelfAttentionV4", "MultiHeadAttention", "SelfAttention", "MultiHeadSelfAttention",
                 "manual_seed", "set_num_threads", "get_num_threads", "functional"):
        assert hasattr(attnc, name), name
    for cls in (attnc.Linear, attnc.Dropout, attnc.SelfAttentionV1, attnc.MultiHeadSelfAttention):
        assert issubclass(cls, attnc.Module)
    for name in ("linear", "softmax", "scaled_dot_product_attention"):
        assert callable(getattr(attnc.functional, name))


def test_call_is_forward():
    m = attnc.SelfAttentionV4(4, rng=np.random.default_rng(8)).eval()
    x = np.random.default_rng(8).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(m(x), m.forward(x))
    np.testing.assert_array_equal(m(x, None), m.forward(x, attention_mask=None))


def test_get_set_num_threads(restore_threads):
    attnc.set_num_threads(1)
    assert attnc.get_num_threads() == 1
    attnc.set_num_threads(3)
    assert attnc.get_num_threads() == 3


def _run(code, affinity=None):
    env = dict(os.environ)
    pre = "" if affinity is None else f"import os; os.sched_setaffinity(0, {affinity!r}); "
    return subprocess.run([sys.executable, "-c", pre + code], capture_output=True, text=True, env=env,
                          cwd=os.path.dirname(os.path.dirname(__file__)), timeout=60)


def test_default_num_threads_is_affinity():
    r = _run("import os, attnc; print(attnc.get_num_threads(), len(os.sched_getaffinity(0)))")
    assert r.returncode == 0, r.stderr
    a, b = r.stdout.split()
    assert a == b
    r = _run("import attnc; print(attnc.get_num_threads())", affinity={sorted(os.sched_getaffinity(0))[0]})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"


def test_import_needs_no_torch():
    r = _run("import sys, attnc, attnc.functional; m = attnc.SelfAttentionV1(4); "
             "import numpy as np; m(np.ones((1, 2, 4))); assert 'torch' not in sys.modules, 'torch imported'")
    assert r.returncode == 0, r.stderr


def test_simd_switch():
    """The portable level can always be chosen; the best level is AVX2 or above exactly when
    the CPU has AVX2 and FMA."""
    cpu_flags = open("/proc/cpuinfo").read().split()
    has_avx2 = "avx2" in cpu_flags and "fma" in cpu_flags
    best = SIMD_LEVELS[-1]
    try:
        attnc._C.set_simd_level("portable")
        assert attnc._C.simd_level() == "portable"
        attnc._C.set_simd_level(best)
        assert attnc._C.simd_level() == best
        assert (best != "portable") == has_avx2
    finally:
        attnc._C.set_simd_level(best)


def test_register_parameter_refused_value_leaves_no_name():
    """A value as_parameter refuses (complex) raises TypeError naming the parameter and leaves the
    module as it was: no name registered without its array (state_dict used to fail after)."""
    net = attnc.Linear(2, 3)
    before = [name for name, _ in net.named_parameters()]
    with pytest.raises(TypeError, match="scale"):
        net.register_parameter("scale", np.ones(3, np.complex64))
    assert [name for name, _ in net.named_parameters()] == before
    assert list(net.state_dict()) == before
    net.register_parameter("scale", [1, 2, 3])
    np.testing.assert_array_equal(net.state_dict()["scale"], np.array([1, 2, 3], np.float32))


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (1.5, TypeError), ("seed", TypeError), (True, TypeError),
                                        (np.array(3), TypeError)])  # docs/API.md: what default_rng takes
def test_manual_seed_errors_name_n(bad, error):
    with pytest.raises(error, match=r"manual_seed: n="):
        attnc.manual_seed(bad)


def test_a_shallow_copy_has_registries_of_its_own():
    """Regression (fuzzing): copy.copy shared the registries, so a submodule assigned to the
    copy went into the original's too: the original's forward then used the copy's layer
    while its attribute named its own (an edit of it was ignored)."""
    import copy
    m = attnc.SelfAttentionV2(4, rng=np.random.default_rng(12)).eval()
    x = np.random.default_rng(13).standard_normal((1, 3, 4)).astype(np.float32)
    before = m(x)
    c = copy.copy(m)
    c.proj = attnc.Linear(4, 12, rng=np.random.default_rng(14))
    assert m.proj is not c.proj and m._modules["proj"] is m.proj and c._modules["proj"] is c.proj
    np.testing.assert_array_equal(m(x), before)
    fresh = attnc.SelfAttentionV2(4, rng=np.random.default_rng(12)).eval()
    fresh.proj = attnc.Linear(4, 12, rng=np.random.default_rng(14))
    np.testing.assert_array_equal(c(x), fresh(x))  # the copy runs its own layer
    m.proj.weight[...] = 0  # an edit of the original's layer is the original's forward's
    assert not np.array_equal(m(x), before)
    np.testing.assert_array_equal(c(x), fresh(x))


@pytest.mark.parametrize("kind", ["Linear", "nn.MultiheadAttention"])
def test_a_shallow_copy_made_before_any_backward_shares_its_gradients(kind):
    """Regression (audit): gradient buffers were made on first use, each module its own, so
    a copy made before any backward kept zeros after the original's backward, and an
    optimizer of the copy stepped with them. torch's copy shares `.grad` (it lives on the
    shared parameter): the oracle here, copied and stepped the same way."""
    import copy
    torch.manual_seed(0)
    if kind == "Linear":
        reference = torch.nn.Linear(4, 3).double()
        module = attnc.Linear(4, 3, dtype=np.float64)
        x = np.random.default_rng(22).standard_normal((2, 4))
    else:
        reference = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
        module = attnc.nn.MultiheadAttention(8, 2, batch_first=True, dtype=np.float64)
        x = np.random.default_rng(22).standard_normal((2, 3, 8))
    module.load_state_dict({k: v.detach().numpy() for k, v in reference.state_dict().items()})
    copied, reference_copy = copy.copy(module), copy.copy(reference)
    grad_out = np.random.default_rng(23).standard_normal((2, 3) if kind == "Linear" else (2, 3, 8))
    tx = torch.from_numpy(x)
    if kind == "Linear":
        module(x)
        module.backward(grad_out)
        reference(tx).backward(torch.from_numpy(grad_out))
    else:
        module(x, x, x, need_weights=False)
        module.backward(grad_out)
        reference(tx, tx, tx, need_weights=False)[0].backward(torch.from_numpy(grad_out))
    expected = {name: p.grad.numpy() for name, p in reference_copy.named_parameters()}
    grads = dict(copied.named_grads())
    assert sorted(grads) == sorted(expected)
    for name, grad in dict(module.named_grads()).items():
        assert grads[name] is grad, name  # one buffer, as torch's one .grad
        assert_close(grads[name], expected[name], np.float64, name)
    attnc.optim.SGD(copied, lr=0.1).step()
    torch.optim.SGD(reference_copy.parameters(), lr=0.1).step()
    for name, value in module.state_dict().items():  # the copy's step moved the shared parameters
        assert_close(value, reference.state_dict()[name], np.float64, name)


def test_a_module_assigned_into_its_own_tree_is_refused_naming_the_attribute():
    """Regression (fuzzing): `lin.me = lin` (or a cycle through two modules) was taken, and
    then state_dict, named_parameters, train and repr raised RecursionError naming nothing.
    The assignment is refused, the module left as it was; a submodule shared by two
    attributes (no cycle) is still taken, its parameters listed once, as torch lists them."""
    lin = attnc.Linear(2, 2, rng=np.random.default_rng(1))
    with pytest.raises(ValueError, match="^me: the Linear assigned contains this module"):
        lin.me = lin
    assert not hasattr(lin, "me") and lin._modules == {}
    outer, inner = (attnc.SelfAttentionV2(4, rng=np.random.default_rng(s)) for s in (2, 3))
    outer.inner = inner
    deeper = attnc.SelfAttentionV2(4, rng=np.random.default_rng(4))
    inner.deeper = deeper
    with pytest.raises(ValueError, match="^back: the SelfAttentionV2 assigned contains this module"):
        deeper.back = outer
    assert list(deeper.state_dict()) == ["proj.weight", "proj.bias"]
    outer.again = inner  # shared, not a cycle
    keys = ["proj.weight", "proj.bias", "inner.proj.weight", "inner.proj.bias", "inner.deeper.proj.weight",
            "inner.deeper.proj.bias"]
    assert [name for name, _ in outer.named_parameters()] == keys
    assert "again" in repr(outer.train())


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_a_projection_replaced_by_another_kind_of_module_is_refused(case):
    """Regression (API audit): the forward reads a projection's weight and bias and never
    calls it, so a Linear subclass with its own forward (an adapter) or any module with a
    weight and a bias was computed as a plain Linear, silently; torch's document classes
    would call it. Assigning one is now refused, naming the projection, and the module
    left as it was (also after `del`); a subclass that keeps Linear's forward computes as
    Linear does, bit for bit, frozen too."""
    module = case.make(DIM, rng=np.random.default_rng(0)).eval()
    x = np.random.default_rng(1).standard_normal((2, 5, DIM)).astype(np.float32)
    before = module(x)
    name = module._spec[0][0].split(".")[0]  # the first projection
    original = getattr(module, name)

    class Doubled(attnc.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    class OwnCall(attnc.Linear):
        def __call__(self, x):
            return 2 * super().__call__(x)

    class SameForward(attnc.Linear):
        pass

    class Affine(attnc.Module):
        def __init__(self, weight, bias):
            super().__init__()
            self.register_parameter("weight", weight)
            self.register_parameter("bias", bias)

        def forward(self, x):
            return np.tanh(x)

    sizes, bias = original.weight.shape[::-1], original.bias is not None
    for replacement, message in ((Doubled(*sizes, bias=bias), "Doubled overrides forward"),
                                 (OwnCall(*sizes, bias=bias), "OwnCall overrides __call__"),
                                 (Affine(original.weight, original.bias), "expected a Linear, got Affine")):
        with pytest.raises(TypeError, match=f"^{name}: {message}"):
            setattr(module, name, replacement)
        assert getattr(module, name) is original
    np.testing.assert_array_equal(module(x), before)
    delattr(module, name)
    with pytest.raises(TypeError, match=f"^{name}: Doubled overrides forward"):
        setattr(module, name, Doubled(*sizes, bias=bias))
    same = SameForward(*sizes, bias=bias)
    same.load_state_dict(original.state_dict())
    setattr(module, name, same)
    np.testing.assert_array_equal(module(x), before)
    np.testing.assert_array_equal(module.freeze()(x), before)


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_a_method_set_on_a_projection_or_overriding_backward_is_refused(case):
    """Regression (a robustness helper, 2026-12-02): a forward set on a projection's
    instance after it was assigned (which torch's document classes would call) was
    ignored, silently, by the module's forward and by freeze(), and so was a forward set
    on the module's instance by freeze(); a Linear subclass's own backward was taken and
    never called. Each now raises TypeError naming it; once the method is deleted the
    module computes as before, bit for bit."""
    module = case.make(DIM, rng=np.random.default_rng(0)).eval()
    x = np.random.default_rng(1).standard_normal((2, 5, DIM)).astype(np.float32)
    before = module(x)
    name = module._spec[0][0].split(".")[0]  # the first projection
    projection = getattr(module, name)
    for method in ("forward", "backward"):
        setattr(projection, method, lambda *args: np.zeros(1, np.float32))
        for call in (lambda: module(x), module.freeze):
            with pytest.raises(TypeError, match=f"^{name}: this Linear has a {method} set on the instance"):
                call()
        delattr(projection, method)
        np.testing.assert_array_equal(module(x), before)

    class OwnBackward(attnc.Linear):
        def backward(self, grad_output):
            return grad_output

    with pytest.raises(TypeError, match=f"^{name}: OwnBackward overrides backward"):
        setattr(module, name, OwnBackward(*projection.weight.shape[::-1], bias=projection.bias is not None))
    assert getattr(module, name) is projection
    module.forward = lambda x: np.zeros_like(x)
    with pytest.raises(TypeError, match=f"^module: this {type(module).__name__} has a forward set on the instance"):
        module.freeze()
    del module.forward
    np.testing.assert_array_equal(module.freeze()(x), before)


@pytest.mark.parametrize("make, child", [(lambda: attnc.SelfAttentionV3(8, 0.5), "attention_dropout"),
                                         (lambda: attnc.SelfAttentionV4(8, 0.5), "attention_dropout"),
                                         (lambda: attnc.MultiHeadAttention(8, 2, 0.5), "dropout")],
                         ids=["V3", "V4", "MultiHeadAttention"])
def test_a_dropout_that_would_not_be_called_is_refused(make, child):
    """Regression (a robustness helper, 2026-12-02): a Dropout subclass overriding
    forward, or a forward or backward set on the module's Dropout, was taken and never
    called (the module reads only p and the mode), silently. The forward now raises
    TypeError naming the submodule; a plain Dropout again gives the dropout of the
    module's own mask (its training output differs from eval's at p 0.5)."""
    module = make()
    x = np.random.default_rng(1).standard_normal((2, 5, 8)).astype(np.float32)

    class Identity(attnc.Dropout):
        def forward(self, x):
            return np.array(x)

    setattr(module, child, Identity(0.5))
    with pytest.raises(TypeError, match=f"^{child}: Identity overrides forward"):
        module(x)
    for method in ("forward", "backward"):
        dropout = attnc.Dropout(0.5)
        setattr(dropout, method, lambda x: x)
        setattr(module, child, dropout)
        with pytest.raises(TypeError, match=f"^{child}: this Dropout has a {method} set on the instance"):
            module(x)
    setattr(module, child, attnc.Dropout(0.5))
    trained = module(x)
    assert not np.array_equal(trained, module.eval()(x))


@pytest.mark.parametrize("placed", ["list", "tensor"])
def test_load_state_dict_repairs_a_parameter_placed_past_assignment(placed):
    """Regression (API audit): a list or tensor put in a parameter's place past the
    assignment (object.__setattr__) made load_state_dict, the natural repair, raise a bare
    AttributeError ('list' object has no attribute 'shape'). It now loads the state (the
    parameter an array again), and a state of another shape than the placed value's names
    the key."""
    lin = attnc.Linear(3, 2, rng=np.random.default_rng(0))
    state = lin.state_dict()
    value = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    object.__setattr__(lin, "weight", value if placed == "list" else torch.tensor(value))
    assert lin.load_state_dict(state) == ([], [])
    assert type(lin.weight) is np.ndarray
    np.testing.assert_array_equal(lin.weight, state["weight"])
    wrong = [[1.0] * 4] * 2
    object.__setattr__(lin, "weight", wrong if placed == "list" else torch.tensor(wrong))
    with pytest.raises(ValueError, match=r"^weight: expected shape \(2, 4\), got \(2, 3\)"):
        lin.load_state_dict(state)


def test_dtype_takes_data_types_only():
    """Regression (API audit): a module assigned to `dtype` was registered as a submodule
    named dtype (in repr and state_dict), and np.dtype read its .dtype: a float64 module
    then computed in float32. `dtype` is checked before the submodule rule, and objects
    that merely carry a .dtype (a module, an array) are refused as NumPy refuses an
    array; a NumPy scalar still stands for its type."""
    module = attnc.SelfAttentionV1(4, dtype=np.float64)
    with pytest.raises(TypeError, match="^dtype: expected a data-type, got a Linear"):
        module.dtype = attnc.Linear(2, 2)
    assert module.dtype == np.float64 and "dtype" not in module._modules
    with pytest.raises(TypeError, match="^dtype: expected a data-type, got a Dropout"):
        attnc.SelfAttentionV1(4, dtype=attnc.Dropout())
    assert attnc.SelfAttentionV1(4, dtype=np.float64(1.0)).dtype == np.float64
    with pytest.raises(ValueError, match="^training: "):  # (no truth value: named, not registered)
        module.training = np.ones(2)


def test_an_assignment_before_module_init_says_so():
    """Regression (API audit): a subclass that assigns before super().__init__() got
    "'M' object has no attribute '_parameters'"; the error now names the attribute and
    the missing call, as torch's does."""
    class Early(attnc.Module):
        def __init__(self):
            self.lin = attnc.Linear(2, 2)
            super().__init__()

    with pytest.raises(AttributeError, match=r"^lin: assigned before Module.__init__ ran; call super\(\).__init__"):
        Early()


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_named_parameters_prefix_as_torch(case):
    """Regression (API audit): `prefix` was prepended as it is ("modelQ_proj.weight");
    torch joins it with a dot. Against torch's document class, and named_grads alike."""
    module = case.make(DIM, rng=np.random.default_rng(0))
    reference = case.make_torch(DIM)
    for prefix in ("", "model", "encoder.layer"):
        expected = [name for name, _ in reference.named_parameters(prefix=prefix)]
        assert [name for name, _ in module.named_parameters(prefix=prefix)] == expected
        assert [name for name, _ in module.named_grads(prefix=prefix)] == expected
    with pytest.raises(TypeError, match="^prefix: expected a str, got int"):
        next(module.named_parameters(prefix=1))


def test_to_changes_nothing_when_it_fails():
    """Regression (API audit): to() converted parameter by parameter, so a deleted (or
    unconvertible) later one left the earlier ones converted and `dtype` not: a module of
    mixed dtypes. Every parameter is now converted before any is replaced."""
    for spoil, error in ((lambda m: delattr(m.V_proj, "weight"), AttributeError),
                         (lambda m: object.__setattr__(m.V_proj, "weight", "text"), TypeError)):
        module = attnc.SelfAttentionV1(4, rng=np.random.default_rng(0))
        before = {name: value.copy() for name, value in module.state_dict().items() if name != "V_proj.weight"}
        spoil(module)
        with pytest.raises(error, match="^V_proj.weight: "):
            module.to(np.float64)
        assert module.dtype == np.float32
        for name, value in before.items():
            current = module._owner_of(name)
            array = getattr(current[0], current[1])
            assert array.dtype == np.float32, name
            np.testing.assert_array_equal(array, value)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_initial_values_drawn_in_blocks_are_the_whole_shapes_draws(dtype):
    """Parameters of more than 2**20 elements are drawn and converted a block of
    rows at a time (so that Ctrl-C stops a large constructor). The values must be
    NumPy's draws of the whole shape from the same generator, in the same order,
    converted to the module dtype once: torch's init formulas, Linear's uniform
    in +-1/sqrt(in_features) and nn.MultiheadAttention's xavier uniform (its
    bias_k and bias_v xavier normal, drawn after out_proj's)."""
    target = np.dtype(dtype) if dtype != "bfloat16" else np.dtype(__import__("ml_dtypes").bfloat16)
    layer = attnc.Linear(1100, 1000, dtype=dtype, rng=np.random.default_rng(3))  # 1.1 M weights: 2 blocks
    draws = np.random.default_rng(3)
    bound = 1 / math.sqrt(1100)
    np.testing.assert_array_equal(layer.weight, draws.uniform(-bound, bound, (1000, 1100)).astype(target))
    np.testing.assert_array_equal(layer.bias, draws.uniform(-bound, bound, 1000).astype(target))
    mha = attnc.nn.MultiheadAttention(600, 2, add_bias_kv=True, dtype=dtype, rng=np.random.default_rng(4))
    draws = np.random.default_rng(4)
    in_proj = draws.uniform(-math.sqrt(6 / 2400), math.sqrt(6 / 2400), (1800, 600))  # 1.08 M: 2 blocks
    out_weight = draws.uniform(-1 / math.sqrt(600), 1 / math.sqrt(600), (600, 600))
    draws.uniform(-1 / math.sqrt(600), 1 / math.sqrt(600), 600)  # out_proj's bias, drawn then zeroed
    bias_k, bias_v = (draws.normal(0.0, math.sqrt(2 / 1200), (1, 1, 600)) for _ in range(2))  # fans 600, 600
    for got, expected in ((mha.in_proj_weight, in_proj), (mha.out_proj.weight, out_weight), (mha.bias_k, bias_k),
                          (mha.bias_v, bias_v)):
        assert got.dtype == target
        np.testing.assert_array_equal(got, expected.astype(target))
