"""attnc.optim against torch.optim: SGD and AdamW step by step on torch leaf
tensors twinning each parameter (same values, same gradients), zero_grad,
in-place updates, argument validation and replaced parameters."""
import ml_dtypes
import numpy as np
import pytest
import torch

import attnc

STEPS = 20
TOL = {np.dtype(np.float32): 1e-6, np.dtype(np.float64): 1e-12}

MODULES = {
    "MHA": lambda dtype: attnc.MultiHeadAttention(16, 4, dtype=dtype, rng=np.random.default_rng(1)),
    "V2": lambda dtype: attnc.SelfAttentionV2(8, dtype=dtype, rng=np.random.default_rng(2)),
}

# (attnc class name, attnc arguments): torch.optim takes the same ones
CASES = {
    "SGD": ("SGD", {"lr": 0.1}),
    "SGD-momentum-decay": ("SGD", {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}),
    "AdamW": ("AdamW", {}),
    # beta1 < 0.5: torch.lerp's other formula for the first moment
    "AdamW-custom": ("AdamW", {"lr": 0.02, "betas": (0.3, 0.8), "eps": 1e-6, "weight_decay": 0.1}),
    # boundary values, an int, a list and a NumPy scalar, all accepted by both
    "SGD-bounds": ("SGD", {"lr": 0, "momentum": np.float64(1.0), "weight_decay": 0}),
    "AdamW-bounds": ("AdamW", {"lr": 1, "betas": [0.0, 0.0], "eps": 0, "weight_decay": 0.5}),
}


def make_pair(module, name, kwargs, attnc_kwargs=None):
    """The attnc optimizer over `module` (with `attnc_kwargs` when given: the same
    numbers in other forms), the torch one (foreach=False, the single-tensor code)
    over leaf twins of its parameters, and the twins."""
    twins = [torch.tensor(p.copy(), requires_grad=True) for _, p in module.named_parameters()]
    torch_kwargs = {k: tuple(float(b) for b in v) if k == "betas" else float(v) for k, v in kwargs.items()}
    topt = getattr(torch.optim, name)(twins, foreach=False, **torch_kwargs)
    return getattr(attnc.optim, name)(module, **(kwargs if attnc_kwargs is None else attnc_kwargs)), topt, twins


def set_grads(module, twins, rng, zero=False):
    """A random gradient per parameter (or zeros), into attnc's buffers and the twins' .grad."""
    grads = []
    for (_, buf), twin in zip(module.named_grads(), twins):
        g = np.zeros(buf.shape, buf.dtype) if zero else rng.standard_normal(buf.shape).astype(buf.dtype)
        buf[...] = g
        twin.grad = torch.from_numpy(g.copy())
        grads.append(g)
    return grads


def assert_params_match(module, twins, what):
    for (name, p), twin in zip(module.named_parameters(), twins):
        expected = twin.detach().numpy()
        assert p.dtype == expected.dtype, (what, name)
        err = np.max(np.abs(p.astype(np.float64) - expected) / np.maximum(1.0, np.abs(expected)))
        assert err <= TOL[p.dtype], f"{what} {name}: relative error {err:.3e} > {TOL[p.dtype]:.0e}"


def run(module, name, kwargs, seed=0, zero=False, attnc_kwargs=None):
    """STEPS steps of both optimizers, parameters compared after each; the
    gradient buffers must come out of each step untouched."""
    opt, topt, twins = make_pair(module, name, kwargs, attnc_kwargs)
    rng = np.random.default_rng(seed)
    for step in range(STEPS):
        grads = set_grads(module, twins, rng, zero)
        opt.step()
        topt.step()
        assert_params_match(module, twins, f"step {step}")
        for (gname, buf), g in zip(module.named_grads(), grads):
            np.testing.assert_array_equal(buf, g, err_msg=f"step {step}: {gname}'s gradient changed")
    return opt


@pytest.mark.parametrize("module_name", list(MODULES))
@pytest.mark.parametrize("case", list(CASES))
def test_steps_match_torch(case, module_name, dtype):
    name, kwargs = CASES[case]
    module = MODULES[module_name](dtype)
    before = module.state_dict()
    run(module, name, kwargs)
    if kwargs.get("lr") != 0:   # the comparison compared something that moved
        assert any(not np.array_equal(p, before[n]) for n, p in module.named_parameters())


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sgd_zero_gradients_without_decay_leave_parameters_as_torch_does(momentum, dtype):
    module = MODULES["MHA"](dtype)
    before = module.state_dict()
    run(module, "SGD", {"lr": 0.1, "momentum": momentum}, zero=True)
    for name, p in module.named_parameters():
        np.testing.assert_array_equal(p, before[name], err_msg=name)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64],
                         ids=["f16", "bf16", "f32", "f64"])
@pytest.mark.parametrize("name", ["SGD", "AdamW"])
def test_zero_grad_zeroes_every_buffer(name, dtype):
    """Every buffer, in place, holds np.zeros's bytes afterwards: +0.0 where it held -0.0,
    nan or inf too, at every float dtype."""
    module = MODULES["MHA"](dtype)
    opt = getattr(attnc.optim, name)(module, lr=0.1)
    buffers = [buf for _, buf in module.named_grads()]
    rng = np.random.default_rng(0)
    for buf in buffers:
        buf[...] = rng.standard_normal(buf.shape)
        buf.reshape(-1)[:3] = [-0.0, np.nan, -np.inf]
    assert opt.zero_grad() is None
    for (gname, buf), before in zip(module.named_grads(), buffers):
        assert buf is before, gname
        assert buf.dtype == np.dtype(dtype) and buf.tobytes() == np.zeros_like(buf).tobytes(), gname


def test_zero_grad_zeroes_empty_and_tied_parameters_buffers():
    """An empty parameter's buffer, and both buffers of a parameter tied into two modules
    (named_grads gives their sum), after each module's backward filled them: zeros after
    zero_grad."""
    class Pair(attnc.Module):
        def __init__(self):
            super().__init__()
            self.first = attnc.Linear(3, 3, rng=np.random.default_rng(0))
            self.second = attnc.Linear(3, 3, rng=np.random.default_rng(1))
            self.empty = attnc.Linear(0, 2, rng=np.random.default_rng(2))

    pair = Pair()
    pair.second.weight = pair.first.weight
    x = np.random.default_rng(3).standard_normal((4, 3))
    for layer in (pair.first, pair.second):
        layer(x)
        layer.backward(np.ones((4, 3)))
    pair.empty(np.zeros((4, 0)))
    pair.empty.backward(np.ones((4, 2)))
    grads = dict(pair.named_grads())
    assert grads["first.weight"].any() and grads["empty.bias"].any() and grads["empty.weight"].shape == (2, 0)
    pair.zero_grad()
    for name, grad in pair.named_grads():
        assert grad.tobytes() == np.zeros_like(grad).tobytes(), name
    for layer in (pair.first, pair.second):  # each module's own buffer, in place
        assert not dict(layer.named_grads())["weight"].any()


@pytest.mark.parametrize("value", [np.full((2, 2), 1.5, object), np.full((), 1.5, np.float32),
                                   np.full((2, 2), "ab", "<U2")], ids=["object", "0-d", "str"])
def test_zero_grad_of_a_parameter_placed_past_assignment(value):
    """A parameter placed past assignment, of object dtype (its buffer holds pointers), 0-d,
    or of a string dtype: zero_grad leaves in its buffer, in place, what np.zeros makes (int
    zeros for objects, not null pointers; empty strings, where fill(0) wrote '0')."""
    m = attnc.Linear(2, 2, rng=np.random.default_rng(0))
    m.__dict__["weight"] = value
    m.zero_grad()
    buffer = dict(m.named_grads())["weight"]
    buffer[...] = "xy" if value.dtype.kind == "U" else 2.5
    m.zero_grad()
    assert dict(m.named_grads())["weight"] is buffer
    expected = np.zeros(value.shape, value.dtype)
    assert buffer.dtype == value.dtype and buffer.shape == value.shape
    assert buffer.tolist() == expected.tolist() and type(buffer.ravel()[0]) is type(expected.ravel()[0])


@pytest.mark.parametrize("case", ["SGD-momentum-decay", "AdamW"])
def test_step_updates_in_place(case, dtype):
    name, kwargs = CASES[case]
    module = MODULES["V2"](dtype)
    opt, topt, twins = make_pair(module, name, kwargs)
    arrays = [p for _, p in module.named_parameters()]
    views = [p.reshape(-1)[::2] for p in arrays]
    rng = np.random.default_rng(3)
    for step in range(3):
        set_grads(module, twins, rng)
        opt.step()
        topt.step()
        assert_params_match(module, twins, f"step {step}")
        for (pname, p), array, view, twin in zip(module.named_parameters(), arrays, views, twins):
            assert p is array, pname
            expected = twin.detach().numpy().reshape(-1)[::2]
            atol = TOL[p.dtype] * max(1.0, float(np.max(np.abs(expected))))
            np.testing.assert_allclose(view, expected, rtol=0, atol=atol, err_msg=pname)


BAD_ARGUMENTS = [
    ("SGD", {"lr": -0.1}, ValueError, "lr"),
    ("SGD", {"lr": float("nan")}, ValueError, "lr"),
    ("SGD", {"lr": float("inf")}, ValueError, "lr"),
    ("SGD", {"lr": True}, TypeError, "lr"),
    ("SGD", {"lr": "0.1"}, TypeError, "lr"),
    ("SGD", {"lr": None}, TypeError, "lr"),
    ("SGD", {"lr": 0.1, "momentum": -0.5}, ValueError, "momentum"),
    ("SGD", {"lr": 0.1, "momentum": False}, TypeError, "momentum"),
    ("SGD", {"lr": 0.1, "weight_decay": float("-inf")}, ValueError, "weight_decay"),
    ("SGD", {"lr": 0.1, "weight_decay": "0"}, TypeError, "weight_decay"),
    ("AdamW", {"lr": -1e-3}, ValueError, "lr"),
    ("AdamW", {"eps": -1e-8}, ValueError, "eps"),
    ("AdamW", {"eps": float("nan")}, ValueError, "eps"),
    ("AdamW", {"weight_decay": -0.01}, ValueError, "weight_decay"),
    ("AdamW", {"weight_decay": True}, TypeError, "weight_decay"),
    ("AdamW", {"betas": (1.0, 0.999)}, ValueError, "betas"),
    ("AdamW", {"betas": (0.9, 1.0)}, ValueError, "betas"),
    ("AdamW", {"betas": (-0.1, 0.999)}, ValueError, "betas"),
    ("AdamW", {"betas": (0.9, float("nan"))}, ValueError, "betas"),
    ("AdamW", {"betas": (0.9,)}, ValueError, "betas"),
    ("AdamW", {"betas": (0.9, 0.99, 0.999)}, ValueError, "betas"),
    ("AdamW", {"betas": 0.9}, TypeError, "betas"),
    ("AdamW", {"betas": "ab"}, TypeError, "betas"),
    ("AdamW", {"betas": (0.9, "0.999")}, TypeError, "betas"),
    ("AdamW", {"betas": (True, 0.999)}, TypeError, "betas"),
    # past any float (regression, fuzzing: a bare OverflowError naming nothing)
    ("SGD", {"lr": 2 ** 1024}, ValueError, "lr"),
    ("SGD", {"lr": 0.1, "momentum": 10 ** 400}, ValueError, "momentum"),
    ("AdamW", {"betas": (0.9, 2 ** 1024)}, ValueError, "betas"),
    ("AdamW", {"eps": 2 ** 1024}, ValueError, "eps"),
]


@pytest.mark.parametrize("name, kwargs, error, argument", BAD_ARGUMENTS,
                         ids=[f"{n}-{a}-{i}" for i, (n, _, _, a) in enumerate(BAD_ARGUMENTS)])
def test_bad_arguments_raise_naming_the_argument(name, kwargs, error, argument):
    with pytest.raises(error) as info:
        getattr(attnc.optim, name)(MODULES["V2"](np.float32), **kwargs)
    assert str(info.value).startswith(argument + ":"), str(info.value)


@pytest.mark.parametrize("name", ["SGD", "AdamW"])
@pytest.mark.parametrize("module", [torch.nn.Linear(2, 2), {"w": np.zeros(2)}, [np.zeros(2)], None],
                         ids=["torch-module", "dict", "list", "None"])
def test_module_must_be_an_attnc_module(name, module):
    with pytest.raises(TypeError) as info:
        getattr(attnc.optim, name)(module, lr=0.1)
    assert str(info.value).startswith("module:"), str(info.value)


@pytest.mark.parametrize("case", ["SGD", "SGD-momentum-decay", "AdamW"])
@pytest.mark.parametrize("replace", ["shape", "dtype"])
def test_replaced_parameter_raises_before_any_update(case, replace):
    name, kwargs = CASES[case]
    module = MODULES["V2"](np.float32)
    opt, topt, twins = make_pair(module, name, kwargs)
    set_grads(module, twins, np.random.default_rng(4))
    opt.step()
    topt.step()
    if replace == "shape":
        module.proj.bias = np.zeros(5)
        bad = "proj.bias"
    else:
        module.to(np.float64)
        bad = "proj.weight"
    before = module.state_dict()
    with pytest.raises(ValueError) as info:
        opt.step()
    assert str(info.value).startswith(bad + ":"), str(info.value)
    for pname, p in module.named_parameters():
        np.testing.assert_array_equal(p, before[pname], err_msg=pname)


# An entry of `state` (a public dict) edited into something the update rule cannot use:
# (optimizer case, entry, value, error). A wrong kind is a TypeError, a wrong shape, dtype,
# layout or value a ValueError; None is SGD's "no buffer yet" (not AdamW's).
BAD_STATE = [
    ("SGD-momentum-decay", "momentum_buffer", lambda p: np.zeros(3, p.dtype), ValueError),
    ("SGD-momentum-decay", "momentum_buffer", lambda p: np.zeros(p.shape, np.float64), ValueError),
    ("SGD-momentum-decay", "momentum_buffer", lambda p: np.zeros(p.shape, p.dtype).tolist(), TypeError),
    ("SGD-momentum-decay", "momentum_buffer", lambda p: np.broadcast_to(np.zeros(1, p.dtype), p.shape), ValueError),
    ("SGD-momentum-decay", "momentum_buffer", lambda p: np.lib.stride_tricks.as_strided(
        np.zeros(p.shape, p.dtype), strides=(0,) * p.ndim), ValueError),
    ("AdamW", "step", lambda p: "a", TypeError),
    ("AdamW", "step", lambda p: True, TypeError),
    ("AdamW", "step", lambda p: -1, ValueError),
    ("AdamW", "exp_avg", lambda p: None, TypeError),
    ("AdamW", "exp_avg_sq", lambda p: np.zeros(p.shape[::-1] + (1,), p.dtype), ValueError),
    ("AdamW", "exp_avg", lambda p: np.zeros(p.shape, np.float16), ValueError),
    # (regression, a modules audit, 2026-12-02: a masked array's masked elements were skipped by the update)
    ("AdamW", "exp_avg", lambda p: np.ma.masked_array(np.zeros(p.shape, p.dtype), mask=np.ones(p.shape, bool)),
     ValueError),
    ("SGD-momentum-decay", "momentum_buffer", lambda p: np.ma.masked_array(np.zeros(p.shape, p.dtype),
                                                                          mask=np.ones(p.shape, bool)), ValueError),
    ("AdamW", "exp_avg_sq", lambda p: np.zeros(p.shape, p.dtype).view(np.matrix) if p.ndim == 2
     else np.ma.masked_array(np.zeros(p.shape, p.dtype)), TypeError),
]


def stepped_once(case, seed):
    """The V2 module, its optimizer after one step (the state exists) and its last parameter's
    name and array (every other parameter comes before it in a step)."""
    name, kwargs = CASES[case]
    module = MODULES["V2"](np.float32)
    opt, _, twins = make_pair(module, name, kwargs)
    set_grads(module, twins, np.random.default_rng(seed))
    opt.step()
    return module, opt, *list(module.named_parameters())[-1]


def assert_step_refused(module, opt, error, prefix):
    """step() raises `error` whose message starts with `prefix`, no parameter changed."""
    before = {pname: p.copy() for pname, p in module.named_parameters()}
    with pytest.raises(error) as info:
        opt.step()
    assert str(info.value).startswith(prefix), str(info.value)
    for pname, p in module.named_parameters():
        np.testing.assert_array_equal(p, before[pname], err_msg=pname)


@pytest.mark.parametrize("case, entry, make, error", BAD_STATE,
                         ids=[f"{c}-{e}-{i}" for i, (c, e, _, _) in enumerate(BAD_STATE)])
def test_a_bad_state_entry_raises_naming_it_before_any_update(case, entry, make, error):
    module, opt, last, param = stepped_once(case, 5)
    opt.state[last][entry] = make(param)
    assert_step_refused(module, opt, error, f"state[{last!r}][{entry!r}]:")


@pytest.mark.parametrize("case, edit, error", [
    ("AdamW", "not-a-dict", TypeError), ("AdamW", "None", TypeError), ("AdamW", "missing-step", ValueError),
    ("SGD-momentum-decay", "not-a-dict", TypeError), ("SGD-momentum-decay", "None", TypeError)])
def test_a_bad_state_dict_raises_naming_it_before_any_update(case, edit, error):
    """(None had been taken for an absent state: the update then failed on it with an
    AttributeError after updating the parameters before it.)"""
    module, opt, last, _ = stepped_once(case, 6)
    if edit == "missing-step":
        del opt.state[last]["step"]
    else:
        opt.state[last] = 3 if edit == "not-a-dict" else None
    assert_step_refused(module, opt, error, f"state[{last!r}]:")


@pytest.mark.parametrize("case", ["SGD-momentum-decay", "AdamW"])
@pytest.mark.parametrize("emptied", [True, False], ids=["emptied", "kept"])
def test_one_state_dict_under_two_parameters_raises_naming_both_before_any_update(case, emptied):
    """Regression (a modules audit, 2026-12-02): ``dict.fromkeys(names, {})`` puts one dict under
    every name; step() accepted it, and each parameter after the first was updated with the
    moments and count the ones before it had just written (AdamW's weights off by 0.016, no
    error). A dict under two names is refused, naming both, before any update (a dict each:
    test_a_state_edited_between_steps_steps_as_torch's "all-emptied")."""
    module, opt, _, _ = stepped_once(case, 8)
    names = list(opt.state)
    shared = {} if emptied else opt.state[names[0]]
    opt.state[names[0]] = opt.state[names[-1]] = shared
    assert_step_refused(module, opt, ValueError, f"state[{names[-1]!r}]: the same dict as state[{names[0]!r}]")


@pytest.mark.parametrize("attribute, value", [("state", None), ("state", []), ("state", "abc"), ("module", None)])
def test_the_optimizers_attributes_replaced_raise_naming_them(attribute, value):
    module, opt, _, _ = stepped_once("AdamW", 7)
    setattr(opt, attribute, value)
    with pytest.raises(TypeError, match=f"^{attribute}: "):
        opt.step()
    for pname, p in module.named_parameters():  # nothing updated
        np.testing.assert_array_equal(p, dict(stepped_once("AdamW", 7)[0].named_parameters())[pname], err_msg=pname)


@pytest.mark.parametrize("edit", ["replaced", "emptied", "all-emptied"])
@pytest.mark.parametrize("case", ["SGD-momentum-decay", "AdamW"])
def test_a_state_edited_between_steps_steps_as_torch(case, edit):
    """State entries replaced by fresh arrays of the right kind (as a checkpoint restores
    them) are accepted and used; a parameter's state emptied ({}: none of its entries, which
    the state check accepts) starts again, as torch's does (regression, a docs audit,
    2026-12-02: AdamW's step raised a bare KeyError 'step'). Either way the steps match
    torch's."""
    name, kwargs = CASES[case]
    module = MODULES["V2"](np.float32)
    opt, topt, twins = make_pair(module, name, kwargs)
    rng = np.random.default_rng(7)
    for step in range(3):
        set_grads(module, twins, rng)
        opt.step()
        topt.step()
        if edit == "emptied" and step == 0:
            opt.state[list(opt.state)[-1]], topt.state[twins[-1]] = {}, {}
        if edit == "all-emptied" and step == 0:  # a dict each, as a reset of every state makes them
            opt.state = {name: {} for name in opt.state}
            topt.state.clear()
        for entries in opt.state.values() if edit == "replaced" else ():
            for key, value in entries.items():
                entries[key] = value.copy() if isinstance(value, np.ndarray) else int(value)
    assert_params_match(module, twins, case)


class _TorchV1(torch.nn.Module):
    """Document 000's SelfAttentionV1 in torch, with K tied to Q as `tie` says."""

    def __init__(self, dim, tie):
        super().__init__()
        self.Q_proj, self.K_proj, self.V_proj = (torch.nn.Linear(dim, dim).double() for _ in range(3))
        if tie == "submodule":
            self.K_proj = self.Q_proj
        else:
            self.K_proj.weight = self.Q_proj.weight

    def forward(self, x):
        q, k, v = self.Q_proj(x), self.K_proj(x), self.V_proj(x)
        return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v


def _tied_pair(dim, tie, rng):
    """attnc's SelfAttentionV1 in float64 with K tied to Q as `tie` says, and its torch twin with the same values."""
    net = attnc.SelfAttentionV1(dim, dtype=np.float64, rng=rng)
    if tie == "submodule":
        net.K_proj = net.Q_proj
    else:
        net.K_proj.weight = net.Q_proj.weight
    twin = _TorchV1(dim, tie)
    twin.load_state_dict({key: torch.from_numpy(value) for key, value in net.state_dict().items()})
    return net, twin


@pytest.mark.parametrize("tie", ["submodule", "array"])
@pytest.mark.parametrize("case", ["SGD-momentum-decay", "AdamW-custom"])
def test_a_tied_parameter_is_listed_and_updated_once_as_in_torch(tie, case):
    """Weight tying (one submodule under two names, or one array as two
    modules' parameters): named_parameters listed the shared parameter under
    both names and the optimizers updated it once per name, a doubled step
    (a robustness review, 2026-11-24). Now named once, as torch lists it,
    and updated once from the gradient of every use; state_dict keeps every
    name, as torch's does."""
    dim, rng = 4, np.random.default_rng(0)
    net, twin = _tied_pair(dim, tie, rng)
    assert list(net.state_dict()) == list(twin.state_dict())
    assert [name for name, _ in net.named_parameters()] == [name for name, _ in twin.named_parameters()]
    class_name, kwargs = CASES[case]
    opt = getattr(attnc.optim, class_name)(net, **kwargs)
    torch_kwargs = {"foreach": False, **kwargs}
    if class_name == "SGD":
        torch_opt = torch.optim.SGD(twin.parameters(), **torch_kwargs)
    else:
        torch_opt = torch.optim.AdamW(twin.parameters(), **{"lr": 1e-3, **torch_kwargs})
    x = rng.standard_normal((2, 3, dim))
    for _ in range(3):
        out = net(x)
        net.backward(np.ones_like(out))
        opt.step()
        opt.zero_grad()
        twin(torch.from_numpy(x)).sum().backward()
        torch_opt.step()
        torch_opt.zero_grad()
    for (name, ours), (_, theirs) in zip(net.named_parameters(), twin.named_parameters()):
        if name != "K_proj.bias":  # its exact gradient is 0: Adam scales each side's rounding noise to a step
            np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=0, atol=1e-12, err_msg=name)
    assert all(not grad.any() for _, grad in net.named_grads(remove_duplicate=False))


@pytest.mark.parametrize("tie", ["submodule", "array"])
def test_a_tied_parameters_gradient_and_conversions_keep_the_tie(tie):
    """named_grads gave an array-tied weight the first use's buffer only (a partial
    gradient), and `to()` or a load_state_dict that replaces a read-only parameter
    made two arrays of one (a review of the tying change, 2026-11-24). The oracle:
    torch's .grad of the tied parameter, and torch's to() and load_state_dict."""
    dim, rng = 4, np.random.default_rng(0)
    net, twin = _tied_pair(dim, tie, rng)
    x = rng.standard_normal((2, 3, dim))
    out = net(x)
    net.backward(np.ones_like(out))
    twin(torch.from_numpy(x)).sum().backward()
    grads = dict(net.named_grads())
    assert list(grads) == [name for name, _ in twin.named_parameters()]
    for name, param in twin.named_parameters():
        np.testing.assert_allclose(grads[name], param.grad.numpy(), rtol=1e-12, atol=1e-14, err_msg=name)

    net.to(np.float32)
    assert net.K_proj.weight is net.Q_proj.weight and net.K_proj.weight.dtype == np.float32
    assert len(list(net.named_parameters())) == len(list(twin.named_parameters()))
    net.Q_proj.weight.flags.writeable = False  # load_state_dict must replace it: one replacement for both names
    values = {key: np.full(value.shape, 0.5) for key, value in net.state_dict().items()}
    values["K_proj.weight"] = np.full((dim, dim), 2.0)  # torch: the last key copied into the tied weight wins
    net.load_state_dict(values)
    twin.load_state_dict({key: torch.from_numpy(value) for key, value in values.items()})
    assert net.K_proj.weight is net.Q_proj.weight
    np.testing.assert_array_equal(net.Q_proj.weight, twin.Q_proj.weight.detach().numpy())


BAD_SETTINGS = [
    ("SGD", "lr", float("nan"), ValueError),
    ("SGD", "lr", -5, ValueError),
    ("SGD", "momentum", "0.9", TypeError),
    ("SGD", "weight_decay", float("inf"), ValueError),
    ("AdamW", "lr", None, TypeError),
    ("AdamW", "betas", (2.0, 0.5), ValueError),
    ("AdamW", "betas", 0.9, TypeError),
    ("AdamW", "eps", -1e-8, ValueError),
]


@pytest.mark.parametrize("name, setting, value, error", BAD_SETTINGS,
                         ids=[f"{n}-{s}-{i}" for i, (n, s, _, _) in enumerate(BAD_SETTINGS)])
def test_a_hyperparameter_set_after_construction_is_checked_at_every_step(name, setting, value, error):
    """opt.lr = nan turned every parameter into NaN at the next step, silently (a
    fuzzing review, 2026-11-25): each step now checks the settings as the
    constructor does, before any parameter moves."""
    module = MODULES["V2"](np.float32)
    opt, topt, twins = make_pair(module, name, CASES[name][1])
    set_grads(module, twins, np.random.default_rng(6))
    before = module.state_dict()
    setattr(opt, setting, value)
    with pytest.raises(error) as info:
        opt.step()
    assert str(info.value).startswith(setting + ":"), str(info.value)
    for pname, p in module.named_parameters():
        np.testing.assert_array_equal(p, before[pname], err_msg=pname)


@pytest.mark.parametrize("case", ["SGD-momentum-decay", "AdamW-custom"])
def test_a_learning_rate_changed_between_steps_is_used_as_torch_uses_it(case):
    """A schedule sets opt.lr between steps (torch: param_groups[0]["lr"])."""
    name, kwargs = CASES[case]
    module = MODULES["MHA"](np.float64)
    opt, topt, twins = make_pair(module, name, kwargs)
    rng = np.random.default_rng(7)
    for step, lr in enumerate([0.05, 0.01, 0.002]):
        opt.lr = np.float64(lr)
        topt.param_groups[0]["lr"] = lr
        set_grads(module, twins, rng)
        opt.step()
        topt.step()
        assert_params_match(module, twins, f"step {step}")


def test_a_narrow_integer_step_count_keeps_counting():
    """Regression (fuzzing): AdamW's "step" restored as np.int8(127) wrapped to -128 on the
    next step (`state["step"] += 1` in NumPy's arithmetic) and every weight became NaN. The
    count is now a Python int: the step is the one an int count of 127 gives."""
    results = []
    for count in (np.int8(127), 127):
        module = MODULES["V2"](np.float32)
        opt = attnc.optim.AdamW(module)
        rng = np.random.default_rng(11)
        for restored in (False, True):
            if restored:
                for entries in opt.state.values():
                    entries["step"] = count
            for _, buf in module.named_grads():
                buf[...] = rng.standard_normal(buf.shape).astype(buf.dtype)
            opt.step()
        results.append([p.copy() for p in module.parameters()])
        assert all(type(entries["step"]) is int for entries in opt.state.values())
    for narrow, wide in zip(*results):
        assert np.isfinite(narrow).all()
        np.testing.assert_array_equal(narrow, wide)


def test_betas_are_read_once_as_given():
    """Regression (fuzzing): a betas list whose element's __float__ appended to it was
    stored as three values (read while it grew); it is read once, as the pair given."""
    betas = [0.9]

    class Grows(float):
        def __float__(self):
            betas.append(0.5)
            return 0.99

    betas.append(Grows(0.99))
    opt = attnc.optim.AdamW(MODULES["V2"](np.float32), betas=betas)
    assert opt.betas == (0.9, 0.99) and len(betas) == 3


# A state entry made a view of another array the step reads or writes: (optimizer case,
# entry, that array from (module, optimizer, last parameter's name), the other's label).
ALIASED_STATE = [
    ("AdamW", "exp_avg_sq", lambda m, opt, last: opt.state[last]["exp_avg"], "state[{last!r}]['exp_avg']"),
    ("AdamW", "exp_avg", lambda m, opt, last: dict(m.named_parameters())[last], "{last}"),
    ("SGD-momentum-decay", "momentum_buffer", lambda m, opt, last: dict(m.named_grads())[last],
     "the gradient buffer of {last}"),
]


@pytest.mark.parametrize("case, entry, other, label", ALIASED_STATE,
                         ids=[f"{c}-{e}-{i}" for i, (c, e, _, _) in enumerate(ALIASED_STATE)])
def test_a_state_entry_sharing_memory_raises_naming_both_before_any_update(case, entry, other, label):
    """Regression (fuzzing): entries were checked one by one, not against each other: two
    AdamW moments one array stepped to other values than torch's (0.08 off), and a
    momentum buffer that was the gradient buffer had the step write the gradient, which
    steps only read."""
    module, opt, last, _ = stepped_once(case, 7)
    opt.state[last][entry] = other(module, opt, last)[...]  # a view of it
    assert_step_refused(module, opt, ValueError,
                        f"state[{last!r}][{entry!r}]: shares memory with {label.format(last=last)}")


@pytest.mark.parametrize("count", [2 ** 63, 10 ** 400])
def test_a_step_count_past_int64_raises_naming_it_before_any_update(count):
    """Regression (fuzzing): a count too large for a float reached AdamW's 1 - beta ** step
    as an OverflowError naming nothing, after the parameters before it were updated."""
    module, opt, last, _ = stepped_once("AdamW", 8)
    opt.state[last]["step"] = count
    assert_step_refused(module, opt, ValueError, f"state[{last!r}]['step']: expected an int >= 0 and below 2**63")


@pytest.mark.parametrize("case", ["SGD-momentum-decay", "AdamW-custom"])
def test_hyperparameters_as_0d_arrays_and_tensors_step_as_torch(case):
    """Regression (API audit): lr, momentum, eps, weight_decay and betas refused a 0-d
    array or a tensor (torch takes a tensor lr; attnc's other numeric arguments take
    them). Each is taken as its number: the steps match torch's with the floats; a bool
    of any kind, a complex number, a string array and an array of one element but one dim
    raise naming the argument (a complex NumPy scalar and a string array had been taken)."""
    name, kwargs = CASES[case]
    wrapped = {key: (tuple(torch.tensor(b, dtype=torch.float64) for b in value) if key == "betas" else
                     np.array(value) if index % 2 else torch.tensor(value, dtype=torch.float64))
               for index, (key, value) in enumerate(kwargs.items())}
    module = MODULES["MHA"](np.float64)
    run(module, name, kwargs, seed=8, attnc_kwargs=wrapped)
    for bad in (np.array(True), torch.tensor(True), np.array([0.1]), np.complex128(0.1 + 2j),
                torch.tensor(0.1 + 2j), np.array("0.1")):
        with pytest.raises(TypeError, match="^lr: expected a real number"):
            getattr(attnc.optim, name)(module, lr=bad)


class _ZeroD(attnc.Module):
    """A module whose one parameter is 0-d (a learned scale), possibly shared."""

    def __init__(self, value, dtype=np.float64):
        super().__init__(dtype=dtype)
        self.register_parameter("s", value)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_0d_parameter_steps_as_torch(case, dtype):
    """SGD with weight decay computed d = grad + wd * param, a NumPy scalar for
    0-d arrays, and kept it as the momentum buffer: the next step refused the
    optimizer's own state (TypeError: expected a writable array of shape ())."""
    name, kwargs = CASES[case]
    run(_ZeroD(np.array(1.5, dtype), dtype), name, kwargs)


@pytest.mark.parametrize("case", ["SGD-momentum-decay", "AdamW"])
def test_a_0d_parameter_tied_into_two_modules_steps_as_torch(case):
    """named_grads gave a tied 0-d parameter's summed gradient as a NumPy scalar,
    not the array the API promises, and SGD with momentum failed at its second
    step. torch: one leaf, the two uses' gradients summed."""
    shared = np.array(1.5)
    module = attnc.Module(dtype=np.float64)
    module.a, module.b = _ZeroD(shared), _ZeroD(shared)
    name, kwargs = CASES[case]
    twin = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    topt = getattr(torch.optim, name)([twin], foreach=False,
                                      **{k: tuple(map(float, v)) if k == "betas" else float(v) for k, v in kwargs.items()})
    opt = getattr(attnc.optim, name)(module, **kwargs)
    rng = np.random.default_rng(5)
    for step in range(STEPS):
        uses = rng.standard_normal(2)
        for (_, buf), g in zip(module.named_grads(remove_duplicate=False), uses):
            buf[...] = g
        (summed,) = [g for _, g in module.named_grads()]
        assert isinstance(summed, np.ndarray) and summed.shape == () and summed == uses[0] + uses[1]
        twin.grad = torch.tensor(uses[0] + uses[1], dtype=torch.float64)
        opt.step()
        topt.step()
        assert module.a.s is module.b.s
        np.testing.assert_allclose(module.a.s, twin.item(), rtol=1e-12, err_msg=f"step {step}")


def test_a_step_refused_by_its_checks_records_nothing():
    """A step that failed its checks (a read-only bias) updated nothing but had
    recorded every parameter's shape and dtype, so after module.to(float64) the
    next step said the parameters were "replaced since the previous step",
    though no step had run: it now steps as a fresh optimizer does (torch)."""
    module = attnc.Linear(3, 2, rng=np.random.default_rng(6))
    opt = attnc.optim.SGD(module, lr=0.1, momentum=0.9)
    module.bias.flags.writeable = False
    with pytest.raises(ValueError, match="^bias:"):
        opt.step()
    assert opt.state == {}
    module.to(np.float64)
    twins = [torch.tensor(p.copy(), requires_grad=True) for _, p in module.named_parameters()]
    topt = torch.optim.SGD(twins, lr=0.1, momentum=0.9, foreach=False)
    for step in range(3):
        set_grads(module, twins, np.random.default_rng(step))
        opt.step()
        topt.step()
        assert_params_match(module, twins, f"step {step}")


def _copied(entries):
    """A parameter's state dict with its arrays copied (counts as they are)."""
    return {key: value.copy() if isinstance(value, np.ndarray) else value for key, value in entries.items()}


def _snapshot(module, opt):
    """Each parameter's values and its state (_copied), by name."""
    return {name: (p.copy(), _copied(opt.state.get(name, {}))) for name, p in module.named_parameters()}


def _assert_each_parameter_whole(now, before, after, what):
    """Every parameter with its state is as `before` or as `after` (a clean step), never a mix."""
    for name, (param, state) in now.items():
        matches = [ref for ref in (before, after) if np.array_equal(param, ref[name][0])
                   and state.keys() == ref[name][1].keys()
                   and all(np.array_equal(state[key], ref[name][1][key]) for key in state)]
        assert matches, f"{what}: {name} and its state are neither as before the step nor as after it"


@pytest.mark.parametrize("fresh", [True, False], ids=["first-step", "kept-state"])
@pytest.mark.parametrize("case", ["SGD-momentum-decay", "AdamW"])
def test_a_step_interrupted_at_any_line_leaves_each_parameter_stepped_whole_or_untouched(case, fresh):
    # Ctrl-C raises KeyboardInterrupt between any two lines of Python: the
    # update was NumPy's operations one by one, and one between two left a
    # parameter decayed with its first moment moved and its step counted but
    # not its second moment (a resources review, 2026-12-02); a retried
    # step counted it twice. Each parameter's update is now one C call with
    # its state's new entries. A trace function raises the KeyboardInterrupt
    # at each line of the package's Python in turn, until a step runs through.
    from test_hostile_use import _interrupted_at_line

    def setup():
        module = attnc.MultiHeadAttention(8, 2, rng=np.random.default_rng(3))
        opt = getattr(attnc.optim, CASES[case][0])(module, **CASES[case][1])
        rng = np.random.default_rng(4)
        for _ in range(0 if fresh else 2):
            for _, buf in module.named_grads():
                buf[...] = rng.standard_normal(buf.shape)
            opt.step()
        for _, buf in module.named_grads():
            buf[...] = rng.standard_normal(buf.shape)
        return module, opt

    module, opt = setup()
    before = _snapshot(module, opt)
    opt.step()
    after = _snapshot(module, opt)
    assert all(not np.array_equal(after[name][0], before[name][0]) for name in before)
    for line in range(1, 10_000):
        module, opt = setup()
        if not _interrupted_at_line(line, opt.step):
            break
        _assert_each_parameter_whole(_snapshot(module, opt), before, after, f"interrupted at line {line}")
    assert line > 20, "the step ran through before the trace reached the updates"


def test_a_signal_during_steps_leaves_each_parameter_stepped_whole_or_untouched():
    # as above, with real signals: a timer's handler raises KeyboardInterrupt
    # wherever the step is when it fires (a parameter of 2^22 elements takes
    # milliseconds; the update's C call does not stop for it)
    import signal

    module = attnc.Linear(2048, 2048, rng=np.random.default_rng(5))
    opt = attnc.optim.AdamW(module, lr=0.01)
    rng = np.random.default_rng(6)
    interrupted = 0
    for attempt in range(8):
        for _, buf in module.named_grads():
            buf[...] = rng.standard_normal(buf.shape)
        before = _snapshot(module, opt)

        def interrupt(signum, frame):
            signal.setitimer(signal.ITIMER_REAL, 0)
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGALRM, interrupt)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.0003 * 2 ** attempt)  # 0.3 to 38 ms
            opt.step()
            signal.setitimer(signal.ITIMER_REAL, 0)  # here: a KeyboardInterrupt in `finally` would escape
        except KeyboardInterrupt:
            interrupted += 1
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        now = _snapshot(module, opt)
        again = attnc.Linear(2048, 2048, dtype=np.float32)
        again.load_state_dict({name: value for name, (value, _) in before.items()})
        clean = attnc.optim.AdamW(again, lr=0.01)
        clean.state = {name: _copied(entries) for name, (_, entries) in before.items() if entries}
        for (_, buf), (_, ours) in zip(again.named_grads(), module.named_grads()):
            buf[...] = ours
        clean.step()
        _assert_each_parameter_whole(now, before, _snapshot(again, clean), f"attempt {attempt}")
    assert interrupted, "no timer fired during a step"


@pytest.mark.parametrize("case", ["SGD-momentum-decay", "AdamW"])
def test_steps_are_bit_identical_for_any_thread_count(case):
    # the update splits a parameter into chunks of 2^14 elements among
    # threads; 64 x 4097: sixteen chunks and a part
    from toolkit import real_thread_counts
    results = []
    for threads in (1, 2, 3, 4):
        with real_thread_counts():
            attnc.set_num_threads(threads)
            module = attnc.Linear(64, 4097, rng=np.random.default_rng(7))
            opt = getattr(attnc.optim, CASES[case][0])(module, **CASES[case][1])
            rng = np.random.default_rng(8)
            for _ in range(3):
                for _, buf in module.named_grads():
                    buf[...] = rng.standard_normal(buf.shape)
                opt.step()
        results.append([p.tobytes() for p in module.parameters()])
    assert results[0] == results[1] == results[2] == results[3]


@pytest.mark.parametrize("case", ["SGD-momentum-decay", "AdamW"])
@pytest.mark.parametrize("layout", ["strided", "fortran"])
def test_state_arrays_of_any_layout_step_as_contiguous_ones(case, layout):
    # a state entry that is not C-contiguous is updated in a copy written
    # back within the one call; the memory around a strided view is untouched
    results = []
    for contiguous in (True, False):
        module, opt, _, _ = stepped_once(case, 9)
        holders = []
        for entries in opt.state.values():
            for key, value in entries.items():
                if isinstance(value, np.ndarray) and not contiguous and value.ndim == 2:
                    if layout == "fortran":
                        entries[key] = np.asfortranarray(value)
                    else:
                        holder = np.full((value.shape[0], 2 * value.shape[1]), 7.0, value.dtype)
                        holder[:, ::2] = value
                        entries[key] = holder[:, ::2]
                        holders.append(holder)
        rng = np.random.default_rng(10)
        for _ in range(2):
            for _, buf in module.named_grads():
                buf[...] = rng.standard_normal(buf.shape)
            opt.step()
        results.append(([p.copy() for p in module.parameters()],
                         [value.copy() for entries in opt.state.values() for value in entries.values()
                          if isinstance(value, np.ndarray)]))
        for holder in holders:
            assert (holder[:, 1::2] == 7.0).all()
        assert holders or contiguous or layout == "fortran"
    for ours, theirs in zip(results[0][0] + results[0][1], results[1][0] + results[1][1]):
        np.testing.assert_array_equal(ours, theirs)
    assert results[0][1]


def test_the_base_optimizer_says_it_has_no_update_rule():
    with pytest.raises(NotImplementedError, match="Optimizer has no update rule: use attnc.optim.SGD or AdamW"):
        attnc.optim.Optimizer(attnc.Linear(2, 1)).step()


@pytest.mark.parametrize("call, message", [
    (lambda p, g, m: attnc._C.update(p, g, (m,), "adam", {}, {}), "rule:"),
    (lambda p, g, m: attnc._C.update(p, g, (m,), "adamw", {}, {}), "rule:"),
    (lambda p, g, m: attnc._C.update(p, g, (m, m), "sgd", {}, {}), "rule:"),
    (lambda p, g, m: attnc._C.update(p, g[:1], (), "sgd", {}, {}), "grad:"),
    (lambda p, g, m: attnc._C.update(p, g.astype(np.float64), (), "sgd", {}, {}), "grad:"),
    (lambda p, g, m: attnc._C.update(p, g, (m.astype(np.float16),), "sgd", {}, {}), "state_arrays[0]:"),
    (lambda p, g, m: attnc._C.update(p.astype(np.int32), g, (), "sgd", {}, {}), "param:"),
    (lambda p, g, m: attnc._C.update(np.zeros_like(p), g, (m[:, :1],), "sgd", {}, {}), "state_arrays[0]:"),
])
def test_the_update_call_refuses_operands_it_cannot_update(call, message):
    # the optimizers check everything first; the C call's own checks keep
    # its memory safe when called directly
    p = np.ones((3, 4), np.float32)
    g, m = p.copy(), p.copy()
    with pytest.raises(ValueError, match="^" + message.replace("[", r"\[")):
        call(p, g, m)
    assert (p == 1).all() and (m == 1).all()


@pytest.mark.parametrize("case", ["SGD-momentum-decay", "AdamW"])
def test_a_parameter_in_the_other_byte_order_steps_as_a_native_one(case):
    # regression: a parameter whose dtype was set in place to big-endian
    # (NumPy allows it; so did the NumPy update) made the C update raise a
    # ValueError naming no parameter, after the parameters before it had
    # stepped; it is updated in a native copy written back
    name, kwargs = CASES[case]
    swapped, native = (attnc.Linear(3, 2, rng=np.random.default_rng(0)) for _ in range(2))
    swapped.weight.dtype = swapped.weight.dtype.newbyteorder()
    swapped.weight[...] = native.weight
    optimizers = [getattr(attnc.optim, name)(module, **kwargs) for module in (swapped, native)]
    for step in range(3):
        for (_, ours), (_, theirs) in zip(swapped.named_grads(), native.named_grads()):
            ours[...] = theirs[...] = np.random.default_rng(step).standard_normal(theirs.shape)
        for opt in optimizers:
            opt.step()
    assert swapped.weight.dtype.byteorder == ">"
    np.testing.assert_array_equal(swapped.weight, native.weight)
    np.testing.assert_array_equal(swapped.bias, native.bias)
    assert not np.array_equal(native.weight, attnc.Linear(3, 2, rng=np.random.default_rng(0)).weight)


@pytest.mark.parametrize("dtype", ["longdouble", "float8_e4m3fn"])
def test_a_parameter_of_a_dtype_the_update_lacks_raises_naming_it_before_any_update(dtype):
    # regression (a review, 2026-12-03): a parameter placed past the module's
    # conversion in a floating dtype the C update does not compute (longdouble,
    # ml_dtypes' float8) passed step()'s checks, and the update raised a
    # ValueError naming no parameter after the ones before it had stepped
    if dtype == "longdouble":
        dtype = np.longdouble
    else:
        dtype = getattr(pytest.importorskip("ml_dtypes"), dtype)
    module = attnc.Linear(3, 2, rng=np.random.default_rng(0))
    object.__setattr__(module, "bias", np.zeros(2, dtype))
    for _, buf in module.named_grads():
        buf[...] = 1
    opt = attnc.optim.SGD(module, lr=0.5)
    assert_step_refused(module, opt, ValueError, "bias: step() updates parameters in place: expected a writable "
                        "float16, bfloat16, float32 or float64 array")
    assert opt.state == {}


def test_a_state_array_made_read_only_during_a_step_changes_nothing_of_that_parameter():
    # regression (a review, 2026-12-03): a misaligned state array over 8 MB is
    # copied by blocks, with Python's signal handlers run between them; one that
    # made it read-only let the update step the parameter and the first moment
    # in place, then fail to write the second back (a parameter half stepped).
    # Now all of a parameter's written arrays are copies once one is, and none
    # is written back unless all can be.
    import signal

    hits = 0
    for attempt in range(8):
        module = attnc.Linear(1024, 3000, bias=False, rng=np.random.default_rng(1))
        for _, buf in module.named_grads():
            buf[...] = 1
        opt = attnc.optim.AdamW(module, lr=0.1)
        opt.step()
        state = opt.state["weight"]
        raw = bytearray(state["exp_avg_sq"].nbytes + 1)
        misaligned = np.frombuffer(raw, np.float32, state["exp_avg_sq"].size, offset=1).reshape(module.weight.shape)
        misaligned[...] = state["exp_avg_sq"]
        state["exp_avg_sq"] = misaligned
        before = _snapshot(module, opt)

        def freeze(signum, frame):
            misaligned.flags.writeable = False

        previous = signal.signal(signal.SIGALRM, freeze)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.0002 * 2 ** attempt)  # 0.2 to 25.6 ms
            opt.step()
            stepped = True
        except ValueError as error:  # read-only before the update began: refused by step()'s or the call's checks
            assert str(error).startswith(("state['weight']['exp_avg_sq']: ", "weight: state_arrays[1]: ")), str(error)
            stepped = False
            hits += "made read-only during the update" in str(error)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        now = _snapshot(module, opt)
        if stepped:
            assert now["weight"][1]["step"] == 2
        else:
            np.testing.assert_array_equal(now["weight"][0], before["weight"][0])
            assert all(np.array_equal(now["weight"][1][key], before["weight"][1][key]) for key in before["weight"][1])
    assert hits, "no handler ran during the update's copies"
