"""scaled_dot_product_attention's score options (attn_bias, enable_gqa,
causal_alignment, window, seed) and its backward, against torch in float64:
a hand-built reference (scores = scale q k^T + bias, masked_fill(mask == 0,
-1e20), -inf outside each query's band, softmax with rows of -inf giving 0;
autograd for the gradients, torch.logsumexp for lse), cross-checked with
torch's SDPA math path (float attn_mask, enable_gqa) where there is no
attn_mask. Sizes cross the kernel's tiles (BLOCK_Q = 96 queries, BLOCK_K =
192 keys) at every ISA level."""
import math
import os
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnc
from attnc import functional as F
from toolkit import MASKED_FILL, assert_close, tolerance


pytestmark = pytest.mark.usefixtures("serial_torch")


def check(actual, expected, dtype, what="", elementwise=False):
    """Same shape, `dtype`, the same infinities at the same places, and the finite
    values within the suite's tolerance (toolkit.tolerance; for gradients, `what`
    "grad_...", assert_grad_close's 1e-9 / 1e-4) of max(1, max|expected|), or of
    max(1, |expected|) per element (elementwise: lse, whose masked rows are -1e20)."""
    expected = np.asarray(expected.detach().numpy() if hasattr(expected, "detach") else expected, np.float64)
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    assert actual.dtype == np.dtype(dtype), (what, actual.dtype, dtype)
    assert not np.isnan(expected).any(), f"{what}: the oracle has NaN"
    inf = np.isinf(expected)
    np.testing.assert_array_equal(actual[inf], expected[inf], err_msg=f"{what}: infinities")
    a, e = actual[~inf].astype(np.float64), expected[~inf]
    if e.size == 0:
        return
    assert np.isfinite(a).all(), f"{what}: non-finite values where the oracle's are finite"
    gradient = what.startswith("grad")
    tol = (1e-9 if np.dtype(dtype) == np.float64 else 1e-4) if gradient else tolerance(dtype)
    bound = tol * (np.maximum(1.0, np.abs(e)) if elementwise else max(1.0, float(np.abs(e).max())))
    err = np.abs(a - e)
    assert np.all(err <= bound), f"{what}: max abs err {err.max():.3e} (worst excess {(err - bound).max():.3e})"


def visible(L, S, causal=False, align="top_left", window=None):
    """(L, S) bool: key j is in query i's band, built from the definition."""
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    c = i + (S - L if align == "bottom_right" else 0)
    vis = np.ones((L, S), bool)
    if causal:
        vis &= j <= c
    if window is not None:
        left, right = window
        if left is not None:
            vis &= j >= c - left
        if right is not None:
            vis &= j <= c + right
    return vis


def t64(a, grad=False):
    return torch.tensor(np.asarray(a, np.float64), requires_grad=grad)


def reference(q, k, v, mask=None, bias=None, causal=False, align="top_left", window=None, scale=None,
              gqa=False, drop=None, grad_out=None):
    """float64 torch: (out, weights, lse) and, given grad_out, (grad_q, grad_k, grad_v) by autograd.
    drop: the dropout factors (0 or 1/(1-p)) applied to the weights before P V."""
    qt, kt, vt = (t64(a, True) for a in (q, k, v))
    kk, vv = kt, vt
    if gqa:
        group = q.shape[-3] // k.shape[-3]
        kk, vv = kt.repeat_interleave(group, dim=-3), vt.repeat_interleave(group, dim=-3)
    L, S = q.shape[-2], k.shape[-2]
    s = qt @ kk.transpose(-1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if bias is not None:
        s = s + t64(bias)
    if mask is not None:
        s = s.masked_fill(torch.from_numpy(np.asarray(mask) == 0), MASKED_FILL)
    s = s.masked_fill(torch.from_numpy(~visible(L, S, causal, align, window)), -math.inf)
    dead = (s == -math.inf).all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)   # a row of -inf: 0
    lse = torch.logsumexp(s, -1)
    out = (p if drop is None else p * t64(drop)) @ vv
    if grad_out is None:
        return out, p, lse
    out.backward(t64(grad_out))
    return out, p, lse, (qt.grad, kt.grad, vt.grad)


def torch_sdpa(q, k, v, bias=None, causal=False, align="top_left", window=None, gqa=False):
    """torch's SDPA math path with a float attn_mask = bias + (-inf outside the band)."""
    L, S = q.shape[-2], k.shape[-2]
    float_mask = np.where(visible(L, S, causal, align, window), 0.0, -np.inf)
    if bias is not None:
        float_mask = float_mask + np.asarray(bias, np.float64)
    batch = q.shape[:-3] if gqa else q.shape[:-2]
    k, v = (np.broadcast_to(a, batch + a.shape[-3 if gqa else -2:]) for a in (k, v))
    with sdpa_kernel(SDPBackend.MATH), torch.no_grad():
        return TF.scaled_dot_product_attention(t64(q), t64(k), t64(v), attn_mask=t64(float_mask),
                                               enable_gqa=gqa)


def normal(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def with_holes(rng, shape, dtype, frac=0.3, dead_rows=()):
    """A random bias with -inf entries (and whole rows of -inf)."""
    b = normal(rng, shape, dtype)
    b[rng.random(shape) < frac] = -np.inf
    for r in dead_rows:
        b[..., r, :] = -np.inf
    return b


def keep_mask(rng, shape, dead_rows=()):
    m = rng.random(shape) < 0.6
    for r in dead_rows:
        m[..., r, :] = False      # masked everywhere: uniform over its band
    return m


# name: (q batch, kv batch, L, S, gqa, bias(rng, dtype, L, S), mask(rng, L, S), options)
CASES = {
    "bias": ((2, 3), (2, 3), 5, 193, False, lambda r, d, L, S: normal(r, (2, 3, L, S), d), None, {}),
    "bias-inf-rows": ((2,), (2,), 97, 4, False,
                      lambda r, d, L, S: with_holes(r, (L, S), d, dead_rows=(3, 96)), None, {}),
    "mask+bias": ((2,), (2,), 95, 191, False, lambda r, d, L, S: with_holes(r, (L, S), d, 0.1),
                  lambda r, L, S: keep_mask(r, (1, L, S), dead_rows=(0, 50)), {}),
    "gqa8/2-biasH-maskH": ((2, 8), (2, 2), 4, 300, True, lambda r, d, L, S: with_holes(r, (2, 8, L, S), d, 0.2),
                           lambda r, L, S: keep_mask(r, (8, L, S), dead_rows=(1,)), {}),
    "gqa6/3-mask1-bias1-causal": ((2, 6), (2, 3), 97, 95, True, lambda r, d, L, S: normal(r, (2, 1, L, S), d),
                                  lambda r, L, S: keep_mask(r, (2, 1, L, S), dead_rows=(7,)), {"is_causal": True}),
    "gqa8/1-bias2d-br": ((8,), (1,), 5, 193, True, lambda r, d, L, S: normal(r, (L, S), d), None,
                         {"is_causal": True, "causal_alignment": "bottom_right"}),
    "gqa4/2-kv-broadcast": ((2, 4), (2,), 97, 5, True, lambda r, d, L, S: normal(r, (4, 1, S), d),
                            lambda r, L, S: keep_mask(r, (L, S)), {"window": (3, 3)}),
    "br-causal-L<S": ((3,), (3,), 5, 300, False, None, None,
                      {"is_causal": True, "causal_alignment": "bottom_right"}),
    "br-causal-L>S": ((2,), (2,), 193, 97, False, None, None,
                      {"is_causal": True, "causal_alignment": "bottom_right"}),
    "window-left": ((2,), (2,), 300, 193, False, None, None, {"window": (7, None)}),
    "window-right": ((2,), (2,), 97, 191, False, lambda r, d, L, S: normal(r, (L, S), d), None,
                     {"window": (None, 3)}),
    "window-both-br": ((2,), (2,), 191, 300, False, None, None,
                       {"window": (40, 5), "causal_alignment": "bottom_right"}),
    "window+causal": ((2,), (2,), 193, 193, False, None, None, {"window": (50, 9), "is_causal": True}),
    "window+causal-br-mask": ((2,), (2,), 95, 300, False, None,
                              lambda r, L, S: keep_mask(r, (L, S), dead_rows=(0, 94)),
                              {"window": (20, 4), "is_causal": True, "causal_alignment": "bottom_right"}),
    "tiny-1x1": ((1,), (1,), 1, 1, False, lambda r, d, L, S: normal(r, (L, S), d), None,
                 {"window": (0, 0)}),
    # a second query tile of 35 queries: its last score sliver one vector wide at AVX2 and AVX-512
    "mask-second-tile-35": ((2,), (2,), 131, 200, False, None,
                            lambda r, L, S: keep_mask(r, (1, L, S), dead_rows=(0, 130)), {}),
}


def build(name, dtype, E=8, Ev=6):
    qb, kb, L, S, gqa, bias_fn, mask_fn, opts = CASES[name]
    rng = np.random.default_rng(sorted(CASES).index(name))
    q, k, v = normal(rng, qb + (L, E), dtype), normal(rng, kb + (S, E), dtype), normal(rng, kb + (S, Ev), dtype)
    bias = None if bias_fn is None else bias_fn(rng, dtype, L, S)
    mask = None if mask_fn is None else mask_fn(rng, L, S)
    return q, k, v, mask, bias, dict(opts, enable_gqa=gqa), rng


def ref_kwargs(opts):
    return dict(causal=opts.get("is_causal", False), align=opts.get("causal_alignment", "top_left"),
                window=opts.get("window"), gqa=opts.get("enable_gqa", False))


def forward_backward(q, k, v, mask, bias, opts, g, **extra):
    out, w, lse = F.scaled_dot_product_attention(q, k, v, mask, attn_bias=bias, return_weights=True,
                                                 return_lse=True, **opts, **extra)
    grads = F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, mask, attn_bias=bias, **opts, **extra)
    return out, w, lse, grads


def check_all(got, ref, dtype):
    (out, w, lse, grads), (r_out, r_w, r_lse, r_grads) = got, ref
    check(out, r_out, dtype, "out")
    check(w, r_w.expand(out.shape[:-1] + (w.shape[-1],)), dtype, "weights")
    check(lse, r_lse, dtype, "lse", elementwise=True)
    for name, a, e in zip("qkv", grads, r_grads):
        check(a, e, dtype, "grad_" + name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", list(CASES))
def test_forward_backward_vs_torch(name, dtype, simd_mode):
    q, k, v, mask, bias, opts, rng = build(name, dtype)
    g = normal(rng, q.shape[:-1] + (v.shape[-1],), dtype)
    got = forward_backward(q, k, v, mask, bias, opts, g)
    ref = reference(q, k, v, mask, bias, grad_out=g, **ref_kwargs(opts))
    check_all(got, ref, dtype)
    if mask is None:   # the hand-built reference agrees with torch's own SDPA
        check(got[0], torch_sdpa(q, k, v, bias, **ref_kwargs(opts)), dtype, "out vs torch sdpa")


def test_dead_rows_give_zero_output_and_minus_inf_lse():
    """Rows with no key (a bias row of -inf; bottom-right causal with L > S) are 0 with lse -inf,
    and pass no gradient; torch's math path gives 0 there too (checked, not assumed)."""
    q, k, v, _, bias, opts, rng = build("bias-inf-rows", np.float64)
    out, lse = F.scaled_dot_product_attention(q, k, v, attn_bias=bias, return_lse=True)
    t_out = torch_sdpa(q, k, v, bias).numpy()
    for row in (3, 96):
        assert np.all(t_out[:, row] == 0)
        np.testing.assert_array_equal(out[:, row], t_out[:, row])
        assert np.all(lse[:, row] == -np.inf)
    L, S = 7, 4   # bottom-right: query i sees keys j <= i - 3
    q, k, v = (normal(rng, (L if n == "q" else S, 5), np.float64) for n in "qkv")
    out, lse = F.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom_right",
                                              return_lse=True)
    gq, gk, gv = F.scaled_dot_product_attention_backward(np.ones_like(out), q, k, v, out, lse, is_causal=True,
                                                         causal_alignment="bottom_right")
    assert np.all(out[:3] == 0) and np.all(lse[:3] == -np.inf) and np.all(gq[:3] == 0)
    check(out, torch_sdpa(q, k, v, causal=True, align="bottom_right"), np.float64)


def test_bottom_right_causal_is_the_explicit_bias():
    """is_causal + bottom_right == an explicit -inf bias above the diagonal shifted by S - L."""
    rng = np.random.default_rng(5)
    for L, S in ((5, 97), (97, 5), (193, 300)):
        q, k, v = normal(rng, (2, L, 8), np.float64), normal(rng, (2, S, 8), np.float64), normal(rng, (2, S, 3),
                                                                                              np.float64)
        bias = np.where(np.tril(np.ones((L, S), bool), S - L), 0.0, -np.inf)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom_right",
                                           return_weights=True, return_lse=True)
        b = F.scaled_dot_product_attention(q, k, v, attn_bias=bias, return_weights=True, return_lse=True)
        for x, y, what in zip(a, b, ("out", "weights", "lse")):
            check(x, y, np.float64, what, elementwise=what == "lse")
        check(a[0], torch_sdpa(q, k, v, bias), np.float64, "out vs torch")


@pytest.mark.parametrize("huge", [2 ** 62, 2 ** 63 - 1, 2 ** 64, 2 ** 200])
def test_huge_window_sides_are_unbounded(huge):
    """A side past any sequence length (even past a C long) is None, with and without causal."""
    rng = np.random.default_rng(8)
    q, k, v = normal(rng, (2, 97, 4), np.float64), normal(rng, (2, 193, 4), np.float64), \
        normal(rng, (2, 193, 3), np.float64)
    for opts in ({"window": (huge, huge)}, {"window": (huge, 2), "is_causal": True,
                                            "causal_alignment": "bottom_right"}):
        out, lse = F.scaled_dot_product_attention(q, k, v, return_lse=True, **opts)
        none = tuple(None if side == huge else side for side in opts["window"])
        r_out, _, r_lse = reference(q, k, v, **ref_kwargs(dict(opts, window=none)))
        check(out, r_out, np.float64, "out")
        check(lse, r_lse, np.float64, "lse", elementwise=True)


@pytest.mark.parametrize("call", ["forward", "backward", "gqa"])
def test_window_list_changed_by_its_own_side_is_read_as_given(call):
    """Regression (fuzzing): a window list was read through borrowed items, so a side whose
    __index__ emptied the list (or replaced the other side) freed the item being read: a
    segfault. The sides are now read from a tuple of their own: as given at the call."""
    rng = np.random.default_rng(9)
    q, k, v = normal(rng, (1, 6, 4), np.float64), normal(rng, (1, 7, 4), np.float64), normal(rng, (1, 7, 3), np.float64)

    def run(window):
        if call == "gqa":
            return F.scaled_dot_product_attention(q[None], k[None], v[None], window=window, enable_gqa=True)[0]
        out, lse = F.scaled_dot_product_attention(q, k, v, return_lse=True, window=(1, 2))
        if call == "backward":
            return F.scaled_dot_product_attention_backward(np.ones_like(out), q, k, v, out, lse, window=window)[0]
        return F.scaled_dot_product_attention(q, k, v, window=window)

    window = []

    class Empties:
        def __index__(self):
            window.clear()
            return 1

    window += [Empties(), 2]
    np.testing.assert_array_equal(run(window), run((1, 2)))
    r_out, _, _ = reference(q, k, v, **ref_kwargs({"window": (1, 2)}))
    if call == "forward":
        check(run((1, 2)), r_out, np.float64, "out")

    class Replaces:
        def __index__(self):
            window[0] = None
            return -1

    window[:] = [Replaces(), 2]
    with pytest.raises(ValueError, match="^window: each side must be None or an integer >= 0"):
        run(window)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("window", [None, (300, None)], ids=["nowindow", "window300"])
@pytest.mark.parametrize("L", [1, 4, 16])
def test_decode_shapes_bottom_right_gqa(L, window, dtype, simd_mode):
    """Decoding with a KV cache: a few queries, S = 4096 keys, 8 query heads on 2 kv heads."""
    rng = np.random.default_rng(L)
    S, E = 4096, 16
    q, k, v = normal(rng, (1, 8, L, E), dtype), normal(rng, (1, 2, S, E), dtype), normal(rng, (1, 2, S, E), dtype)
    opts = {"is_causal": True, "causal_alignment": "bottom_right", "window": window, "enable_gqa": True}
    g = normal(rng, q.shape, dtype)
    got = forward_backward(q, k, v, None, None, opts, g)
    check_all(got, reference(q, k, v, grad_out=g, **ref_kwargs(opts)), dtype)
    check(got[0], torch_sdpa(q, k, v, **ref_kwargs(opts)), dtype, "out vs torch sdpa")


def test_same_bits_any_thread_count(restore_threads, simd_mode):
    """A windowed + bias + GQA case across tiles: forward and backward bits for 1, 2 and 3 threads."""
    rng = np.random.default_rng(21)
    L, S, E = 200, 300, 16
    q, k, v = normal(rng, (2, 6, L, E), np.float32), normal(rng, (2, 2, S, E), np.float32), \
        normal(rng, (2, 2, S, E), np.float32)
    bias = with_holes(rng, (6, L, S), np.float32, 0.05)
    opts = {"window": (30, 10), "enable_gqa": True, "causal_alignment": "bottom_right"}
    g = normal(rng, q.shape, np.float32)
    runs = []
    for n in (1, 2, 3):
        attnc.set_num_threads(n)
        runs.append(forward_backward(q, k, v, None, bias, opts, g))
    first = runs[0]
    for other in runs[1:]:
        for a, b in zip(first[:3] + tuple(first[3]), other[:3] + tuple(other[3])):
            np.testing.assert_array_equal(a, b)
    check_all(first, reference(q, k, v, None, bias, grad_out=g, **ref_kwargs(opts)), np.float32)


def dropout_factors(q_shape, k_shape, p, seed, gqa):
    """attnc's own dropout factors (0 or 1/(1-p)) for these shapes: zero q and k make every
    weight 1/S, and value = I makes out * S each key's factor (same seed, same item layout)."""
    S = k_shape[-2]
    eye = np.broadcast_to(np.eye(S), k_shape[:-1] + (S,))
    out = F.scaled_dot_product_attention(np.zeros(q_shape), np.zeros(k_shape), eye, dropout_p=p, seed=seed,
                                         enable_gqa=gqa)
    keep = out > 0
    check(out[keep] * S, np.full(keep.sum(), 1 / (1 - p)), np.float64, "kept factors")
    return np.where(keep, 1 / (1 - p), 0.0)


@pytest.mark.parametrize("L", [97, 131])  # 131: a second query tile of 35 (a one-vector last score sliver)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_dropout_with_seed(dtype, L, simd_mode):
    rng = np.random.default_rng(31)
    p, seed, S = 0.3, 2 ** 63 + 12345, 193
    q, k, v = normal(rng, (2, 4, L, 8), dtype), normal(rng, (2, 2, S, 8), dtype), normal(rng, (2, 2, S, 5), dtype)
    bias = normal(rng, (4, L, S), dtype)
    opts = {"window": (20, None), "is_causal": True, "enable_gqa": True}
    run = lambda s: F.scaled_dot_product_attention(q, k, v, attn_bias=bias, dropout_p=p, seed=s,  # noqa: E731
                                                   return_weights=True, return_lse=True, **opts)
    out, w, lse = run(seed)
    again = run(seed)
    for a, b in zip((out, w, lse), again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(out, run(seed + 1)[0])
    drop = dropout_factors(q.shape, k.shape, p, seed, True)
    assert 0.2 < (drop == 0).mean() < 0.4
    g = normal(rng, out.shape, dtype)
    grads = F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, attn_bias=bias, dropout_p=p, seed=seed,
                                                    **opts)
    ref = reference(q, k, v, None, bias, drop=drop, grad_out=g, **ref_kwargs(opts))
    check_all((out, w, lse, grads), ref, dtype)


ERRORS = [
    ({"causal_alignment": "diagonal"}, ValueError, "causal_alignment"),
    ({"causal_alignment": None}, ValueError, "causal_alignment"),  # was taken as "top_left"
    ({"causal_alignment": "bottom_right\x00junk"}, ValueError, "causal_alignment"),  # was cut at the NUL
    ({"causal_alignment": "TOP_LEFT"}, ValueError, "causal_alignment"),
    ({"window": (-1, 2)}, ValueError, "window"),
    ({"window": (1,)}, (ValueError, TypeError), "window"),
    ({"window": "ab"}, (ValueError, TypeError), "window"),
    ({"window": (True, 1)}, (ValueError, TypeError), "window"),
    ({"enable_gqa": True, "kv_heads": 3}, ValueError, "key"),
    ({"attn_bias": np.zeros((3, 5))}, ValueError, "attn_bias"),
    ({"enable_gqa": True, "attn_bias": np.zeros((3, 5, 7))}, ValueError, "attn_bias"),
]


@pytest.mark.parametrize("name, shape", [("attn_mask", (2, 8, 5, 6)), ("attn_bias", (8, 5, 6)),
                                         ("attn_mask", (3, 2, 8, 5, 7))])
def test_gqa_names_a_mask_that_does_not_fit_by_the_callers_shapes(name, shape):
    """A mask or bias that does not broadcast to the scores, with enable_gqa, was named by
    the grouped views' shapes ("(2, 2, 4, 5, 6) does not broadcast to ... (2, 2, 4, 5, 7)",
    a review): now by the caller's, the message the same call gives without grouping."""
    rng = np.random.default_rng(0)
    q, k = normal(rng, (2, 8, 5, 16), np.float32), normal(rng, (2, 2, 7, 16), np.float32)
    mask = np.ones(shape, bool) if name == "attn_mask" else np.zeros(shape, np.float32)
    with pytest.raises(ValueError) as ungrouped:
        F.scaled_dot_product_attention(q, np.repeat(k, 4, axis=1), np.repeat(k, 4, axis=1), **{name: mask})
    with pytest.raises(ValueError) as grouped:
        F.scaled_dot_product_attention(q, k, k, enable_gqa=True, **{name: mask})
    assert str(grouped.value) == str(ungrouped.value)
    assert str(grouped.value).startswith(f"{name}: shape {shape} does not broadcast to the scores' shape (2, 8, 5, 7)")


@pytest.mark.parametrize("wrong", ["query", "grad_out", "lse"])
def test_gqa_names_an_object_input_with_a_type_error(wrong):
    """Regression (review): with enable_gqa, a None (object) query, grad_out or lse raised
    ValueError from the heads' checks ("needs a heads axis", "expected shape ... got ()");
    without it, TypeError naming the argument, as docs/API.md gives for object inputs."""
    rng = np.random.default_rng(0)
    q, k = normal(rng, (2, 4, 5, 8), np.float64), normal(rng, (2, 2, 7, 8), np.float64)
    out, lse = F.scaled_dot_product_attention(q, k, k, enable_gqa=True, return_lse=True)
    args = {"query": q, "grad_out": out, "lse": lse}
    args[wrong] = None
    for enable_gqa in (False, True):
        keys = k if enable_gqa else np.broadcast_to(k[:, :1], (2, 4, 7, 8))
        with pytest.raises(TypeError, match="^" + wrong):
            if wrong == "query":
                F.scaled_dot_product_attention(args["query"], keys, keys, enable_gqa=enable_gqa)
            else:
                F.scaled_dot_product_attention_backward(args["grad_out"], q, keys, keys, out, args["lse"],
                                                        enable_gqa=enable_gqa)


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("kwargs, exc, prefix", ERRORS, ids=[f"{e[2]}{i}" for i, e in enumerate(ERRORS)])
def test_errors_name_the_argument(kwargs, exc, prefix, backward):
    rng = np.random.default_rng(0)
    kwargs = dict(kwargs)
    kv = kwargs.pop("kv_heads", 2 if kwargs.get("enable_gqa") else 4)
    q, k, v = normal(rng, (2, 4, 5, 8), np.float64), normal(rng, (2, kv, 7, 8), np.float64), \
        normal(rng, (2, kv, 7, 8), np.float64)
    with pytest.raises(exc, match="^" + prefix):
        if backward:
            out = np.zeros((2, 4, 5, 8))
            F.scaled_dot_product_attention_backward(out, q, k, v, out, np.zeros((2, 4, 5)), **kwargs)
        else:
            F.scaled_dot_product_attention(q, k, v, **kwargs)


def test_backward_of_dropout_needs_the_seed():
    rng = np.random.default_rng(1)
    q = normal(rng, (2, 5, 4), np.float64)
    out, lse = F.scaled_dot_product_attention(q, q, q, dropout_p=0.3, seed=9, return_lse=True)
    with pytest.raises(ValueError, match="^dropout_p"):
        F.scaled_dot_product_attention_backward(out, q, q, q, out, lse, dropout_p=0.3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_rows_of_large_scores_recover_their_weights(dtype, simd_mode):
    """Regression (a review of the backward): P = exp(s - lse) cannot be recomputed for a row
    whose |lse| is large. A padding bias of -2^100 makes lse round to the row's max, so every P
    came out 1 instead of 1/S (gradients S times too large), and a mask-filled row combined with
    such keys spread its weight over the wrong keys; a +300 bias costs 300 ulps. Those rows'
    max and sum are now recomputed exactly."""
    rng = np.random.default_rng(41)
    q, k, v = normal(rng, (2, 3, 30, 8), dtype), normal(rng, (2, 3, 40, 8), dtype), normal(rng, (2, 3, 40, 6), dtype)
    g = normal(rng, (2, 3, 30, 6), dtype)
    bias = np.zeros((2, 1, 30, 40), dtype)
    bias[0, 0, 3, :] = -2.0 ** 100      # padding: every key equally far below
    bias[1, 0, 5, :] = 300.0            # large scores, |lse| beyond the limit
    bias[1, 0, 6, :7] = -2.0 ** 100
    if dtype == np.float64:             # float32 drops the scores under -1e9, its float64 oracle does not
        bias[0, 0, 9, ::2] = -1e9
    mask = keep_mask(rng, (2, 1, 30, 40), dead_rows=(6,))
    for m in (None, mask):
        check_all(forward_backward(q, k, v, m, bias, {}, g), reference(q, k, v, m, bias, grad_out=g), dtype)


@pytest.mark.parametrize("dtype, magnitude", [(np.float32, 1e3), (np.float64, 1e7), (np.float64, 1e9)],
                         ids=["f32", "f64", "f64-huge"])
def test_rows_of_large_scores_take_their_max_from_the_scores_they_exponentiate(dtype, magnitude, simd_mode):
    """Regression (two reviews): a row whose |lse| is beyond the backward's limit took its
    max and sum from the row path's scores, summed in another order than the tiles' scores
    that P = exp(s - max) / sum exponentiates; at scores near 1e18 the two differed by ~100,
    so the top weight was e^100 off (grad_value 6e27 where it is 1), and at float32 scores
    near 1e4 grad_value was 47 % off (torch's float32 flash backward: 6e-8). Queries and
    keys large enough for every row to take that path, over several query tiles and key
    blocks (300 > BLOCK_Q, BLOCK_K). grad_query and grad_key are not compared: at such
    scores a rounding of one score moves them by more than the tolerance (torch's float32
    paths alike), where out, lse and grad_value (P^T dO, P nearly one-hot) are well
    conditioned."""
    rng = np.random.default_rng(57)
    q, k = (normal(rng, (1, 2, 300, 16), np.float64) * magnitude for _ in range(2))
    q, k = q.astype(dtype), k.astype(dtype)
    v, g = normal(rng, (1, 2, 300, 6), dtype), normal(rng, (1, 2, 300, 6), dtype)
    out, _, lse, grads = forward_backward(q, k, v, None, None, {}, g)
    r_out, _, r_lse, r_grads = reference(q, k, v, grad_out=g)
    assert np.abs(lse).min() > 2 ** 16      # beyond the limit of both dtypes: the exact path
    check(out, r_out, dtype, "out")
    check(lse, r_lse, dtype, "lse", elementwise=True)
    check(grads[2], r_grads[2], dtype, "grad_v")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("L", [1, 16, 17, 300])
def test_a_key_holding_a_rows_whole_weight_passes_grad_out_on_exactly(L, dtype, simd_mode):
    """Regression (a review): up to 16 queries the forward takes the rows path, whose scores
    are summed in another order than the backward's tiles; P = exp(s - lse) then gave a key
    holding a query's whole weight 1.0000091 instead of 1 (float32, scores near 100; float64
    1e5 ulps off), 10-25x torch's float32 error on peaked rows. Such rows now take their
    own max and sum from the tiles' scores. Oracle, hand-derived: with window (0, 0) query
    i sees key i alone, its weight is exactly 1, so grad_value[i] is grad_out[i] exactly
    (torch's default SDPA gives exactly that too); L = 17 and 300 run the tiles both ways.
    And dS = P (dP - D) is exactly 0 for such a row, so grad_query and grad_key are exactly 0
    (torch's too): D = dO . O was summed by multiplies then adds, dP by fused multiply-adds,
    which left them 2e-5 to 3e-4 off (another review)."""
    rng = np.random.default_rng(58)
    q = np.repeat(normal(rng, (1, 256), np.float64) * 10, L, axis=0).astype(dtype)
    k, v = normal(rng, (max(L, 192), 256), np.float64).astype(dtype) * 10, normal(rng, (max(L, 192), 4), dtype)
    g = normal(rng, (L, 4), dtype)
    out, lse = F.scaled_dot_product_attention(q, k, v, return_lse=True, window=(0, 0))
    grad_q, grad_k, grad_v = F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, window=(0, 0))
    np.testing.assert_array_equal(grad_v[:L], g)
    assert not grad_v[L:].any() and not grad_q.any() and not grad_k.any()


def test_bool_bias_is_refused_and_numpy_seeds_are_taken():
    """Regressions (review): a bool attn_bias was added as 0/1 (a torch-style bool mask passed as
    a bias gave a silently wrong answer); a NumPy integer seed was refused."""
    rng = np.random.default_rng(42)
    q = normal(rng, (2, 5, 4), np.float64)
    with pytest.raises(TypeError) as info:
        F.scaled_dot_product_attention(q, q, q, attn_bias=np.ones((5, 5), bool))
    assert str(info.value).startswith("attn_bias"), str(info.value)
    plain = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5, seed=7)
    np.testing.assert_array_equal(F.scaled_dot_product_attention(q, q, q, dropout_p=0.5, seed=np.uint64(7)), plain)


@pytest.mark.parametrize("form", ["torch", "torch_strided", "list", "python_true", "numpy_scalar"])
def test_bool_bias_is_refused_however_it_is_given(form):
    """Regression (docs audit): only a NumPy bool array was refused as attn_bias; a torch bool
    tensor, a list of bools or True was converted to 0/1 and added to the scores, so a key
    marked False stayed attended (a silently wrong answer). Forward and backward."""
    rng = np.random.default_rng(43)
    q = normal(rng, (2, 5, 4), np.float64)
    keep = np.ones((5, 5), bool)
    keep[:, -1] = False
    bias = {"torch": torch.from_numpy(keep), "torch_strided": torch.from_numpy(np.ascontiguousarray(keep.T)).T,
            "list": keep.tolist(), "python_true": True, "numpy_scalar": np.bool_(True)}[form]
    with pytest.raises(TypeError) as info:
        F.scaled_dot_product_attention(q, q, q, attn_bias=bias)
    assert str(info.value).startswith("attn_bias"), str(info.value)
    out, lse = F.scaled_dot_product_attention(q, q, q, return_lse=True)
    with pytest.raises(TypeError) as info:
        F.scaled_dot_product_attention_backward(np.ones_like(out), q, q, q, out, lse, attn_bias=bias)
    assert str(info.value).startswith("attn_bias"), str(info.value)
    # the same values as floats are a bias: the oracle is torch's float attn_mask
    floats = keep.astype(np.float64)
    expected = TF.scaled_dot_product_attention(*(torch.from_numpy(q),) * 3, attn_mask=torch.from_numpy(floats))
    assert_close(F.scaled_dot_product_attention(q, q, q, attn_bias=floats), expected.numpy(), np.float64)


class _AmbiguousLikeTorch:
    """Truth raises RuntimeError, as a torch tensor of several elements does (from Python)."""

    def __bool__(self):
        raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")


@pytest.mark.parametrize("kind", [
    "python",
    pytest.param("torch", marks=pytest.mark.skipif(
        os.environ.get("ATTNC_SANITIZER") == "asan",
        reason="torch raises it as a C++ exception, which aborts under ASan's preloaded runtime (its "
               "__cxa_throw interceptor is unresolved); the python case runs the same path")),
])
def test_flag_given_a_torch_tensor_of_several_elements_names_the_argument(kind):
    """Regression (docs audit): torch raises RuntimeError for the truth of a tensor of several
    elements, and that error passed through without the argument's name (TypeError and
    ValueError were named)."""
    q = np.ones((3, 4))
    two = torch.tensor([True, False]) if kind == "torch" else _AmbiguousLikeTorch()
    for call, name in ((lambda: F.scaled_dot_product_attention(q, q, q, is_causal=two), "is_causal"),
                       (lambda: F.scaled_dot_product_attention(q, q, q, return_weights=two), "return_weights"),
                       (lambda: attnc.SelfAttentionV1(4).train(two), "mode")):
        with pytest.raises(RuntimeError) as info:
            call()
        assert str(info.value).startswith(name + ":"), str(info.value)
        assert "ambiguous" in str(info.value)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64], ids=["f32", "f16", "f64"])
def test_scale_beyond_float32_is_refused_where_the_kernels_compute_in_float32(dtype):
    """scale=1e39 passed the finite check and became inf in the float32 kernels: every score
    0 * inf = NaN. Refused there; float64 computes with it (scores 0: uniform weights)."""
    z = np.zeros((4, 8), dtype)
    v = np.arange(12.0).reshape(4, 3).astype(dtype)
    out, lse = (np.zeros((4, 3), dtype), np.zeros(4, np.float32 if dtype != np.float64 else np.float64))
    for scale in (1e39, -1e39):
        if dtype == np.float64:
            assert_close(F.scaled_dot_product_attention(z, z, v, scale=scale), np.tile(v.mean(0), (4, 1)), dtype)
            continue
        with pytest.raises(ValueError, match="^scale: expected 0 or a number that is normal in float32"):
            F.scaled_dot_product_attention(z, z, v, scale=scale)
        with pytest.raises(ValueError, match="^scale: expected 0 or a number that is normal in float32"):
            F.scaled_dot_product_attention_backward(out, z, z, v, out, lse, scale=scale)
    F.scaled_dot_product_attention(z, z, v, scale=3.4e38)  # the largest finite floats are fine


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64], ids=["f32", "f16", "f64"])
def test_a_scale_below_the_normal_range_is_refused_where_it_would_be_lost(dtype):
    """Regression (a numerics helper, 2026-12-02): a scale below float32's smallest normal
    number (1e-60) became 0 in the float32 kernels, so every weight came out uniform, and
    the gradients of query and key 0, where torch (multiplying q and k each by the scale's
    square root) gave the scores of rows of 1e30; a subnormal one (1e-44) kept a digit. Such
    a scale is now refused, naming it (float64 from below its own smallest normal, 2.2e-308);
    0 and the smallest normal scale compute, against torch's float64 math path."""
    rng = np.random.default_rng(0)
    size = 1 if dtype == np.float16 else 1e18  # (rows whose scores at the least normal scale are about 1)
    q, k = (rng.standard_normal((3, 4)) * size).astype(dtype), (rng.standard_normal((6, 4)) * size).astype(dtype)
    v = np.arange(6.0).reshape(6, 1).astype(dtype)
    out, lse = np.zeros((3, 1), dtype), np.zeros(3, np.float64 if dtype == np.float64 else np.float32)
    least = np.finfo(np.float64 if dtype == np.float64 else np.float32).tiny
    for scale in (1e-60 if dtype != np.float64 else 1e-310, least / 2, -least / 2):
        # the bounds and the value written out (regression, two audits, 2026-12-02: the message
        # showed "%g" and "%s", PyErr_Format having no %g)
        expected_message = "^scale: expected 0 or a " + (
            re.escape(f"normal float64 (magnitude at least {least:g}), got {scale:g}") if dtype == np.float64 else
            re.escape(f"number that is normal in float32 (magnitude {least:g} to {np.finfo(np.float32).max:g}; ")
            + ".*" + re.escape(f"), got {scale:g}")) + "$"
        with pytest.raises(ValueError, match=expected_message):
            F.scaled_dot_product_attention(q, k, v, scale=scale)
        with pytest.raises(ValueError, match=expected_message):
            F.scaled_dot_product_attention_backward(out, q, k, v, out, lse, scale=scale)
    for scale in (0.0, least, -least):
        tq, tk, tv = (torch.from_numpy(a.astype(np.float64)) for a in (q, k, v))
        with sdpa_kernel(SDPBackend.MATH):
            expected = TF.scaled_dot_product_attention(tq, tk, tv, scale=float(scale)).numpy()
        assert_close(F.scaled_dot_product_attention(q, k, v, scale=scale), expected, dtype)


@pytest.mark.parametrize("wrong", ["grad_out", "out", "lse"])
def test_gqa_backward_names_a_result_argument_with_the_wrong_heads(wrong):
    """With enable_gqa, grad_out, out or lse with other than the query's heads failed in
    NumPy's reshape ("cannot reshape array of size ..."), naming nothing."""
    rng = np.random.default_rng(0)
    q, k, v = normal(rng, (2, 4, 5, 8), np.float64), normal(rng, (2, 2, 7, 8), np.float64), \
        normal(rng, (2, 2, 7, 8), np.float64)
    out, lse = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, return_lse=True)
    args = {"grad_out": np.ones_like(out), "out": out, "lse": lse}
    args[wrong] = args[wrong][:, :3]
    with pytest.raises(ValueError, match=f"^{wrong}: expected the query's 4 heads"):
        F.scaled_dot_product_attention_backward(args["grad_out"], q, k, v, args["out"], args["lse"], enable_gqa=True)


@pytest.mark.parametrize("wrong", ["grad_out", "out", "lse"])
def test_gqa_backward_names_the_forwards_shape(wrong):
    """With enable_gqa, a result argument missing the batch axis that key and value broadcast
    the query to was refused with the grouped view's shape, (1, 2, 2, 6, 3), which the caller
    never made; the message now gives the forward's shape (a review helper, 2026-11-24)."""
    rng = np.random.default_rng(0)
    q, k, v = normal(rng, (4, 6, 5), np.float64), normal(rng, (1, 2, 6, 5), np.float64), \
        normal(rng, (1, 2, 6, 3), np.float64)
    out, lse = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, return_lse=True)
    assert out.shape == (1, 4, 6, 3)
    args = {"grad_out": np.ones_like(out), "out": out, "lse": lse}
    expected = args[wrong].shape
    args[wrong] = args[wrong][0]
    with pytest.raises(ValueError, match=rf"^{wrong}: expected shape {re.escape(str(expected))}"):
        F.scaled_dot_product_attention_backward(args["grad_out"], q, k, v, args["out"], args["lse"], enable_gqa=True)


@pytest.mark.parametrize("heads, kv_heads", [(0, 0), (0, 2)])
def test_gqa_with_no_heads_is_a_zero_size_batch(heads, kv_heads):
    """Regression (a review helper, 2026-12-01): enable_gqa refused a query and key with no
    heads at all ("0 key/value heads do not divide the query's 0 heads"); without grouping,
    and in torch with it, that is a zero-size batch with an empty result (docs/API.md). Shapes
    and the backward's against torch's SDPA; heads without key/value heads stay refused."""
    q, k, v = np.zeros((1, heads, 3, 4)), np.zeros((1, kv_heads, 5, 4)), np.zeros((1, kv_heads, 5, 2))
    expected = TF.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), enable_gqa=True).shape
    out, lse = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, return_lse=True)
    assert out.shape == tuple(expected) == (1, 0, 3, 2) and lse.shape == (1, 0, 3)
    grads = F.scaled_dot_product_attention_backward(np.zeros_like(out), q, k, v, out, lse, enable_gqa=True)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    with pytest.raises(ValueError, match="^key: 0 key/value heads do not divide the query's 4 heads"):
        F.scaled_dot_product_attention(np.zeros((1, 4, 3, 4)), k[:, :0], v[:, :0], enable_gqa=True)
