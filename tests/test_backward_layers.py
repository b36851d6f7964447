"""Backward of the layers: attnc.functional.linear_backward and softmax_backward,
Linear.backward and Dropout.backward, each against an independent oracle: torch
autograd on the same values, float64 central differences of the NumPy reference
(toolkit.ref_linear, ref_softmax), or values derived by hand (the dropout mask
read off the forward's output)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnc
from attnc.functional import linear_backward, softmax_backward
from toolkit import assert_grad_close as check
from toolkit import ref_linear, ref_softmax, result_dtype

SIZES = [(1, 3), (3, 1), (17, 33), (33, 65), (65, 17)]   # (in, out) across the GEMM's tile edges
LEADS = [(), (65,), (3, 17), (2, 1, 33), (1, 3, 2, 5)]    # 0 to 4 leading dims


def torch_linear_grads(g, x, w, b=None):
    """(grad_x, grad_weight, grad_bias) of torch.nn.functional.linear by autograd, in float64."""
    X, W = (torch.tensor(np.asarray(a, np.float64), requires_grad=True) for a in (x, w))
    B = None if b is None else torch.tensor(np.asarray(b, np.float64), requires_grad=True)
    torch.nn.functional.linear(X, W, B).backward(torch.tensor(np.asarray(g, np.float64)))
    return X.grad.numpy(), W.grad.numpy(), None if B is None else B.grad.numpy()


def numeric_grad(f, a, h):
    """Central differences of the scalar f at the float64 array a."""
    grad = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        up, down = a.copy(), a.copy()
        up[i] += h
        down[i] -= h
        grad[i] = (f(up) - f(down)) / (2 * h)
    return grad


def normal(rng, shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


# ============================================================================
# linear_backward


@pytest.mark.parametrize("need_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("lead", LEADS, ids=lambda lead: f"lead{len(lead)}")
def test_linear_backward_matches_torch(lead, need_bias, dtype):
    rng = np.random.default_rng(len(lead))
    for n_in, n_out in SIZES:
        x, w, g = (normal(rng, s, dtype) for s in (lead + (n_in,), (n_out, n_in), lead + (n_out,)))
        gx, gw, gb = linear_backward(g, x, w, need_bias_grad=need_bias)
        tx, tw, tb = torch_linear_grads(g, x, w, np.zeros(n_out))
        what = f"lead={lead} in={n_in} out={n_out}"
        check(gx, tx, dtype, "grad_x " + what)
        check(gw, tw, dtype, "grad_weight " + what)
        if need_bias:
            check(gb, tb, dtype, "grad_bias " + what)
        else:
            assert gb is None


@pytest.mark.parametrize("dtypes", [("f4", "f4", "f8"), ("f8", "f4", "f4"), ("f4", "f8", "f2"),
                                    ("f4", "i8", "f4"), ("f2", "?", "i4"), ("i8", "f8", "u1")])
def test_linear_backward_mixed_dtypes(dtypes):
    rng = np.random.default_rng(1)
    shapes = ((2, 3, 33), (2, 3, 17), (33, 17))   # grad_out, x, weight

    def values(dt, shape):
        return (rng.random(shape) < 0.5) if dt == "?" else (rng.standard_normal(shape) * 4).astype(dt)

    g, x, w = (values(dt, shape) for dt, shape in zip(dtypes, shapes))
    expected = result_dtype(*dtypes)
    for got, want, what in zip(linear_backward(g, x, w), torch_linear_grads(g, x, w, np.zeros(33)),
                               ("grad_x", "grad_weight", "grad_bias")):
        check(got, want, expected, what)


@settings(max_examples=40, deadline=None)
@given(lead=st.lists(st.integers(0, 4), max_size=3), n_in=st.integers(0, 9), n_out=st.integers(0, 9),
       seed=st.integers(0, 2**32 - 1))
def test_linear_backward_any_shape_matches_torch(lead, n_in, n_out, seed):
    rng = np.random.default_rng(seed)
    lead = tuple(lead)
    x, w, g = (normal(rng, s) for s in (lead + (n_in,), (n_out, n_in), lead + (n_out,)))
    for got, want in zip(linear_backward(g, x, w), torch_linear_grads(g, x, w, np.zeros(n_out))):
        check(got, want, np.float64)


def test_linear_backward_matches_central_differences():
    """loss = sum(G * (x W^T + b)) is linear in each argument, so central differences
    of the NumPy reference are exact up to rounding: an oracle without torch."""
    rng = np.random.default_rng(2)
    x, w, b, G = normal(rng, (2, 3, 5)), normal(rng, (4, 5)), normal(rng, 4), normal(rng, (2, 3, 4))
    gx, gw, gb = linear_backward(G, x, w)
    check(gx, numeric_grad(lambda a: np.sum(G * ref_linear(a, w, b)), x, 1e-3), np.float64, "grad_x")
    check(gw, numeric_grad(lambda a: np.sum(G * ref_linear(x, a, b)), w, 1e-3), np.float64, "grad_weight")
    check(gb, numeric_grad(lambda a: np.sum(G * ref_linear(x, w, a)), b, 1e-3), np.float64, "grad_bias")


@pytest.mark.parametrize("args, error, name", [
    ((np.ones((2, 4)), np.ones((2, 3)), np.ones(12)), ValueError, "weight"),          # weight not 2-D
    ((np.ones(4), np.float64(1.0), np.ones((4, 3))), ValueError, "x"),                # x 0-d
    ((np.ones((2, 4)), np.ones((2, 5)), np.ones((4, 3))), ValueError, "x"),           # x's last dim != in
    ((np.ones((2, 5)), np.ones((2, 3)), np.ones((4, 3))), ValueError, "grad_out"),    # grad_out's last dim != out
    ((np.ones((3, 4)), np.ones((2, 3)), np.ones((4, 3))), ValueError, "grad_out"),    # leading dims differ
    ((np.ones((1, 2, 4)), np.ones((2, 3)), np.ones((4, 3))), ValueError, "grad_out"),  # ndim differs
    ((np.full((2, 4), "a"), np.ones((2, 3)), np.ones((4, 3))), TypeError, "grad_out"),
    ((np.ones((2, 4)), np.ones((2, 3), complex), np.ones((4, 3))), TypeError, "x"),
    ((np.ones((2, 4)), np.ones((2, 3)), [[None] * 3] * 4), TypeError, "weight"),
], ids=["weight-1d", "x-0d", "x-last", "grad-last", "grad-lead", "grad-ndim", "grad-str", "x-complex",
        "weight-object"])
def test_linear_backward_names_the_bad_argument(args, error, name):
    with pytest.raises(error) as info:
        linear_backward(*args)
    assert str(info.value).startswith(name + ":"), str(info.value)


# ============================================================================
# softmax_backward


@pytest.mark.parametrize("axis", [-3, -2, -1, 0, 1, 2])
def test_softmax_backward_matches_torch(axis, dtype):
    rng = np.random.default_rng(axis + 3)
    x, g = normal(rng, (3, 4, 5)) * 3, normal(rng, (3, 4, 5))
    s = torch.tensor(x, requires_grad=True)
    out = torch.softmax(s, dim=axis)
    out.backward(torch.tensor(g))
    got = softmax_backward(g.astype(dtype), out.detach().numpy().astype(dtype), axis=axis)
    check(got, s.grad, dtype, f"axis={axis}")


@pytest.mark.parametrize("shape, axis", [((600, 1000), -1), ((3, 300, 1000), 0), ((300, 3, 1000), 1),
                                         ((5, 70000), 1), ((3, 1000), 0)])
def test_softmax_backward_in_blocks_of_rows_matches_torch(shape, axis, dtype):
    """softmax_backward takes blocks of whole rows of about 2**18 elements, split
    along the first axis but the softmax's (Ctrl-C is asked about between; the
    temporaries are a block's size): these shapes take several blocks, the last
    one partial, but (3, 1000) along axis 0, computed whole (never split along
    the last axis). Oracle: torch's autograd in float64."""
    rng = np.random.default_rng(sum(shape) + axis)
    x, g = normal(rng, shape) * 3, normal(rng, shape)
    s = torch.tensor(x, requires_grad=True)
    out = torch.softmax(s, dim=axis)
    out.backward(torch.tensor(g))
    got = softmax_backward(g.astype(dtype), out.detach().numpy().astype(dtype), axis=axis)
    assert got.shape == shape and got.dtype == dtype
    check(got, s.grad, dtype, f"shape={shape} axis={axis}")


def test_softmax_backward_matches_central_differences():
    rng = np.random.default_rng(4)
    x, G = normal(rng, (3, 4)), normal(rng, (3, 4))
    for axis in (0, 1, -1):
        got = softmax_backward(G, ref_softmax(x, axis), axis)
        check(got, numeric_grad(lambda a: np.sum(G * ref_softmax(a, axis)), x, 1e-5), np.float64, f"axis={axis}")


@pytest.mark.parametrize("shape, axis", [((0,), 0), ((3, 0), -1), ((0, 4), -1), ((0, 4), 0),
                                         ((100000, 100000, 0), -1), ((100000, 100000, 0), 0)])
def test_softmax_backward_of_empty_arrays_is_empty(shape, axis):
    """Regression (review): an empty out of shape (100000, 100000, 0) asked NumPy for the
    keepdims sum's (100000, 100000, 1) buffer, 37 GiB (MemoryError naming nothing), where
    softmax gives the empty result. Oracle: torch's autograd for the small shapes; the
    empty result of the shape for the others (nothing to compute)."""
    g, out = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    got = softmax_backward(g, out, axis=axis)
    assert got.shape == shape and got.dtype == np.float32
    if np.prod(shape[:-1]) < 100:
        s = torch.zeros(shape, requires_grad=True)
        torch.softmax(s, dim=axis).backward(torch.zeros(shape))
        assert s.grad.shape == got.shape


def test_softmax_backward_dtype_rule_and_errors():
    out = ref_softmax(np.arange(6.0).reshape(2, 3))
    assert softmax_backward(np.ones((2, 3), np.float32), out.astype(np.float32)).dtype == np.float32
    assert softmax_backward(np.ones((2, 3), np.float32), out).dtype == np.float64
    for bad in [np.ones((3, 2)), np.ones(6), np.ones((2, 3, 1))]:
        with pytest.raises(ValueError, match="^grad_out:"):
            softmax_backward(bad, out)
    for axis in (2, -3):
        with pytest.raises(ValueError, match="^axis:"):
            softmax_backward(np.ones((2, 3)), out, axis=axis)
    with pytest.raises(TypeError, match="^axis:"):
        softmax_backward(np.ones((2, 3)), out, axis=1.0)


# ============================================================================
# Linear.backward and Dropout.backward


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_linear_module_backward_matches_torch_and_accumulates(bias, dtype):
    rng = np.random.default_rng(5)
    m = attnc.Linear(17, 33, bias=bias, dtype=dtype, rng=rng)
    W = torch.tensor(m.weight.astype(np.float64), requires_grad=True)
    B = torch.tensor(m.bias.astype(np.float64), requires_grad=True) if bias else None
    names = ["weight", "bias"] if bias else ["weight"]
    for step in range(2):                                   # .grad accumulates over two backwards, as torch's
        x, g = normal(rng, (2, 5, 17)), normal(rng, (2, 5, 33))
        m(x.astype(dtype))
        X = torch.tensor(x.astype(dtype).astype(np.float64), requires_grad=True)
        torch.nn.functional.linear(X, W, B).backward(torch.tensor(g.astype(dtype).astype(np.float64)))
        check(m.backward(g.astype(dtype)), X.grad, dtype, f"grad_x, step {step}")
        grads = dict(m.named_grads())
        assert list(grads) == names
        check(grads["weight"], W.grad, dtype, f"weight.grad, step {step}")
        if bias:
            check(grads["bias"], B.grad, dtype, f"bias.grad, step {step}")
    m.zero_grad()
    assert all(not grad.any() for _, grad in m.named_grads())


@pytest.mark.parametrize("p", [0.3, 0.0])
def test_dropout_backward_applies_the_forward_mask(p, dtype):
    rng = np.random.default_rng(6)
    d = attnc.Dropout(p, dtype=dtype, rng=np.random.default_rng(7))
    for step in range(2):                                   # each backward follows its own forward's mask
        x = (rng.uniform(0.5, 2.0, (7, 33)) * rng.choice([-1, 1], (7, 33))).astype(dtype)
        out = d(x)
        mask = out.astype(np.float64) / x                   # 0 where dropped, 1/(1-p) where kept
        np.testing.assert_allclose(mask[mask != 0], 1 / (1 - p), rtol=1e-6)
        if p:
            assert 0 < np.count_nonzero(mask) < mask.size
        g = normal(rng, (7, 33), dtype)
        got = d.backward(g)
        X = torch.tensor(x.astype(np.float64), requires_grad=True)
        (X * torch.tensor(mask)).backward(torch.tensor(g.astype(np.float64)))
        check(got, g * mask, dtype, f"grad vs grad_output * mask, step {step}")
        check(got, X.grad, dtype, f"grad vs torch, step {step}")
        assert not np.shares_memory(got, g)


def _linear_and_input():
    return attnc.Linear(3, 4, rng=np.random.default_rng(8)), np.ones((2, 3), np.float32), np.ones((2, 4))


def _dropout_and_input():
    return attnc.Dropout(0.5, rng=np.random.default_rng(9)), np.ones((2, 3), np.float32), np.ones((2, 3))


@pytest.mark.parametrize("make", [_linear_and_input, _dropout_and_input], ids=["Linear", "Dropout"])
def test_backward_errors(make):
    m, x, g = make()
    with pytest.raises(RuntimeError, match="no training-mode forward"):
        m.backward(g)                                       # no forward at all
    m.eval()(x)
    with pytest.raises(RuntimeError, match="no training-mode forward"):
        m.backward(g)                                       # an eval-mode forward keeps nothing
    m.train()(x)
    for bad in (g[:1], g.T, g[..., None]):
        with pytest.raises(ValueError, match="^grad_output:"):
            m.backward(bad)
    m.eval()(x)                                             # neither the ValueErrors nor an eval forward
    assert m.backward(g).shape == x.shape                   # released the training forward
    with pytest.raises(RuntimeError, match="no training-mode forward"):
        m.backward(g)                                       # twice for one forward


@pytest.mark.parametrize("name", ["weight", "bias"])
def test_linear_backward_after_a_parameter_is_replaced(name):
    m, x, g = _linear_and_input()
    m(x)
    setattr(m, name, getattr(m, name).copy())
    with pytest.raises(RuntimeError, match=f"^{name} was replaced"):
        m.backward(g)
    assert all(not grad.any() for _, grad in m.named_grads())
    m(x)                                                    # a new forward uses the new parameter
    m.backward(g)


def test_linear_backward_ignores_in_place_edits_of_x(dtype):
    rng = np.random.default_rng(10)
    m = attnc.Linear(5, 3, dtype=dtype, rng=rng)
    x, g = normal(rng, (4, 5), dtype), normal(rng, (4, 3), dtype)
    original = x.copy()
    m(x)
    x[...] = 100.0                                          # the caller reuses its buffer
    m.backward(g)
    _, tw, tb = torch_linear_grads(g, original, m.weight, m.bias)
    grads = dict(m.named_grads())
    check(grads["weight"], tw, dtype, "weight.grad")
    check(grads["bias"], tb, dtype, "bias.grad")


def test_backward_is_bit_identical_for_any_thread_count(restore_threads):
    rng = np.random.default_rng(11)
    x, g = normal(rng, (4, 65, 129), np.float32), normal(rng, (4, 65, 67), np.float32)
    xd, gd = normal(rng, (300, 401)), normal(rng, (300, 401))  # more than one 65536-element dropout task
    results = []
    for n in (1, 2, 3):
        attnc.set_num_threads(n)
        m = attnc.Linear(129, 67, rng=np.random.default_rng(12))
        m(x)
        d = attnc.Dropout(0.3, dtype=np.float64, rng=np.random.default_rng(13))
        d(xd)
        results.append([m.backward(g)] + [grad.copy() for _, grad in m.named_grads()] + [d.backward(gd)])
    for n, other in zip((2, 3), results[1:]):
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b, err_msg=f"{n} threads vs 1")



@pytest.mark.parametrize("shape, axis", [((200, 100), -1), ((3, 40, 50), 1), ((7,), 0), ((), 0)])
def test_softmax_backward_result_owns_its_data(shape, axis, dtype):
    """API.md: attnc's results own their data. Regression, a functional
    audit, 2026-12-06: the float32 and float64 results were reshaped to
    their own shape, a view. Values against torch's autograd."""
    rng = np.random.default_rng(22)
    x, g = normal(rng, shape) * 3, normal(rng, shape)
    s = torch.tensor(x, requires_grad=True)
    out = torch.softmax(s, dim=axis) if shape else torch.softmax(s.reshape(1), dim=0).reshape(())
    out.backward(torch.tensor(g))
    got = softmax_backward(g.astype(dtype), out.detach().numpy().astype(dtype), axis=axis)
    assert got.flags.owndata and got.base is None and got.shape == shape and got.dtype == dtype
    check(got, s.grad, dtype, f"shape={shape}")
