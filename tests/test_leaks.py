"""No reference or memory growth over 10,000 calls of each entry point.

Each call allocates at least ~1 KiB (inputs of 16 x 16), so a leaked result or workspace
would grow the RSS by >= 10 MiB; references are checked on the inputs, the parameters,
the mask, None/True/False and the dtype objects (Python 3.11: not immortal)."""
import gc
import sys
import tracemalloc

import numpy as np
import pytest

import attnc
from attnc import functional as F
from toolkit import MODEL_IDS, MODELS

N_CALLS = 10_000
S, D = 16, 16


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _watched(objs):
    base = [None, True, False, np.dtype(np.float32), np.dtype(np.float64), np.float32, np.float64, np.ndarray]
    return base + list(objs)


def _run_no_leak(call, objs):
    for _ in range(300):          # warm-up: caches, pools, arenas
        call()
    gc.collect()
    watched = _watched(objs)
    refs = [sys.getrefcount(o) for o in watched]
    n_objects = len(gc.get_objects())
    rss = _rss_bytes()
    tracemalloc.start()
    snap0 = tracemalloc.take_snapshot()
    for _ in range(N_CALLS // 2):
        call()
    snap1 = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown_py = sum(s.size_diff for s in snap1.compare_to(snap0, "filename"))
    del snap0, snap1  # the snapshots' own trace tuples are not the calls' objects
    for _ in range(N_CALLS // 2):
        call()
    gc.collect()
    grown_rss = _rss_bytes() - rss
    after = [sys.getrefcount(o) for o in watched]
    for o, r0, r1 in zip(watched, refs, after):
        assert abs(r1 - r0) < 50, f"refcount of {o!r} went {r0} -> {r1}"
    assert len(gc.get_objects()) - n_objects < 200
    assert grown_py < 256 * 1024, f"traced Python allocations grew {grown_py} bytes"
    assert grown_rss < 4 * 1024 * 1024, f"RSS grew {grown_rss} bytes"


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_module_forward_no_leak(case):
    m = case.make(D, rng=np.random.default_rng(0))
    x = np.random.default_rng(0).standard_normal((1, S, D)).astype(np.float32)
    params = [p for _, p in m.named_parameters()]
    if case.masked:
        h = case.n_heads(D)
        mask = np.ones((1,) + ((1,) if h else ()) + (S, S), bool)
        mask[..., 3] = False

        def call():
            m(x, mask)
            m(x, mask, return_weights=True)
        objs = [x, mask, m] + params
    else:
        def call():
            m(x)
            m(x, return_weights=True)
        objs = [x, m] + params
    _run_no_leak(call, objs)


def test_functional_linear_no_leak():
    x = np.ones((S, D), np.float32)
    w = np.ones((D, D), np.float32)
    b = np.ones(D, np.float32)
    xs = x[::-1]            # a non-contiguous input goes through a conversion

    def call():
        F.linear(x, w, b)
        F.linear(xs, w)
    _run_no_leak(call, [x, w, b, xs])


def test_functional_softmax_no_leak():
    x = np.ones((S, D), np.float64)
    xt = x.T

    def call():
        F.softmax(x)
        F.softmax(xt, axis=0)
    _run_no_leak(call, [x, xt])


def test_sdpa_no_leak():
    q = np.ones((2, S, D), np.float32)
    mask = np.tril(np.ones((S, S), np.int8))
    qb = q.astype(">f8")

    def call():
        F.scaled_dot_product_attention(q, q, q)
        F.scaled_dot_product_attention(q, q, q, attn_mask=mask, return_weights=True)
        F.scaled_dot_product_attention(qb, q, q, is_causal=True, dropout_p=0.1, rng=rng)
    rng = np.random.default_rng(1)
    _run_no_leak(call, [q, mask, qb, rng])


def test_dropout_no_leak():
    x = np.ones((S, D), np.float32)
    d = attnc.Dropout(0.5, rng=np.random.default_rng(2))
    e = attnc.Dropout(0.5).eval()

    def call():
        d(x)
        e(x)
    _run_no_leak(call, [x, d, e])


def test_error_paths_no_leak():
    """Rejected calls release what they took."""
    m = attnc.SelfAttentionV4(D)
    x = np.ones((1, S, D), np.float32)
    bad_x = np.ones((1, S, D + 1), np.float32)
    bad_mask = np.ones((3, S, 2), bool)

    def call():
        for args in ((bad_x,), (x, bad_mask)):
            try:
                m(*args)
            except ValueError:
                pass
            else:
                raise AssertionError("no error")
        try:
            F.scaled_dot_product_attention(x, x, x, scale=float("nan"))
        except ValueError:
            pass
        else:
            raise AssertionError("scale=nan: no error")
    _run_no_leak(call, [m, x, bad_x, bad_mask])


def test_module_backward_no_leak():
    """A training-mode forward keeps its state until the backward releases it."""
    m = attnc.MultiHeadAttention(D, 4, dropout=0.1, rng=np.random.default_rng(3))
    x = np.random.default_rng(3).standard_normal((1, S, D)).astype(np.float32)
    g = np.ones((1, S, D), np.float32)
    mask = np.ones((1, 1, S, S), bool)
    mask[..., 3] = False
    params = [p for _, p in m.named_parameters()]
    grads = [b for _, b in m.named_grads()]

    def call():
        m(x, mask)
        m.backward(g)
        m(x)
        m.backward(g)
    _run_no_leak(call, [m, x, g, mask] + params + grads)


def test_functional_backward_no_leak():
    q = np.ones((2, S, D), np.float32)
    k = np.random.default_rng(4).standard_normal((1, S, D))     # float64, broadcast over the batch
    mask = np.tril(np.ones((S, S), np.int8))

    def call():
        out, lse = F.scaled_dot_product_attention(q, k, k, attn_mask=mask, return_lse=True)
        F.scaled_dot_product_attention_backward(out, q, k, k, out, lse, attn_mask=mask)
        out, lse = F.scaled_dot_product_attention(q, q, q, is_causal=True, return_lse=True)
        F.scaled_dot_product_attention_backward(out, q, q, q, out, lse, is_causal=True)
    _run_no_leak(call, [q, k, mask])


def test_kept_work_buffers_are_bounded():
    """attnc keeps freed work buffers for later calls, at most 64 MiB of them.

    Each `linear` below packs x into a buffer of 34 to 64 MiB of a new size
    (more than glibc's 32 MiB mmap threshold: returned to the system when
    freed, unless attnc keeps it). Kept without the bound, the ten buffers
    would hold about 480 MiB."""
    K, N = 768, 16
    rows = [int(mib * 2**20 / (K * 4)) for mib in np.linspace(34, 62, 10)]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows[-1], K), dtype=np.float32)
    w = rng.standard_normal((N, K), dtype=np.float32)
    expected = x[:64].astype(np.float64) @ w.T.astype(np.float64)
    gc.collect()
    rss = _rss_bytes()
    for m in rows:
        out = F.linear(x[:m], w)
        np.testing.assert_allclose(out[:64], expected, rtol=1e-4, atol=1e-4)
        del out
    gc.collect()
    grown = _rss_bytes() - rss
    assert grown < (64 + 16) * 2**20, f"RSS grew {grown / 2**20:.0f} MiB over ten calls"


def _handler_name(array):
    core = np._core if hasattr(np, "_core") else np.core   # NumPy 2, NumPy 1
    return core.multiarray.get_handler_name(array)


def test_outputs_of_64_kib_and_more_come_from_the_kept_blocks():
    """Arrays attnc returns of 64 KiB and more are allocated by attnc's own
    allocator (NumPy's memory handler "attnc_kept_blocks"), so that a freed
    one's block serves a later call instead of fresh pages; smaller ones,
    and NumPy's own arrays, by NumPy's. A kept block is never handed out
    while its array lives: outputs held across calls that free others keep
    their values; `ndarray.resize` (a realloc) keeps the leading values;
    a backward's gradients, made uninitialised (the kernel writes each
    whole), are right in reused blocks poisoned with NaN."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 128), dtype=np.float32)
    w = rng.standard_normal((128, 128), dtype=np.float32)   # output (256, 128) float32: 128 KiB
    expected = x.astype(np.float64) @ w.T.astype(np.float64)
    assert _handler_name(F.linear(x, w)) == "attnc_kept_blocks"
    assert _handler_name(F.linear(x[:8], w)) != "attnc_kept_blocks"   # 4 KiB
    assert _handler_name(np.ones(3)) != "attnc_kept_blocks"           # NumPy's context is left as it was
    held = [F.linear(x, w) for _ in range(4)]
    for _ in range(20):
        out = F.linear(x, w)
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
        out[...] = np.nan      # poisons the block it goes back to
        del out
    for out in held:
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    resized = F.linear(x, w)
    resized.resize((300, 128), refcheck=False)
    np.testing.assert_allclose(resized[:256], expected, rtol=1e-4, atol=1e-4)
    assert not resized[256:].any()
    resized.resize((10, 128), refcheck=False)
    np.testing.assert_allclose(resized, expected[:10], rtol=1e-4, atol=1e-4)
    del resized
    wide = rng.standard_normal((512, 128), dtype=np.float32)
    for net in (attnc.SelfAttentionV2(128, rng=np.random.default_rng(1)),   # no dropout
                attnc.MultiHeadAttention(128, 4, 0.0, rng=np.random.default_rng(1))):
        y = net(x[None])
        grad_x = net.backward(np.ones_like(y))
        grads = {name: g.copy() for name, g in net.named_grads()}
        for _ in range(3):   # NaN-poisoned blocks around: each gradient written whole
            junk = [F.linear(x, wide[:n]) for n in (128, 192, 384, 512) for _ in range(2)]   # 128-512 KiB
            for j in junk:
                j[...] = np.nan
            del junk, j
            net.zero_grad()
            again = net.backward(np.ones_like(net(x[None])))
            np.testing.assert_array_equal(again, grad_x)
            for name, g in net.named_grads():
                np.testing.assert_array_equal(g, grads[name], err_msg=name)


def test_resize_of_an_output_in_a_larger_kept_block():
    """Regression (an audit, under ASan): a kept block serves a request of
    half its size and up, and `ndarray.resize` growing an output that sat
    in a larger block copied the whole block, reading past what was handed
    out (still marked kept: ASan's use-after-poison, valgrind's invalid
    read). The copy is now what the output was given; CI's sanitizer lane
    runs this test."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 64), dtype=np.float32)
    w = rng.standard_normal((512, 64), dtype=np.float32)
    freed = [F.linear(x, w) for _ in range(3)]   # (256, 512): 512 KiB each, kept when freed
    del freed   # the next output's 301 KiB then come from a larger kept block (one of them, or any that fits)
    expected = x.astype(np.float64) @ w[:301].T.astype(np.float64)
    small = F.linear(x, w[:301])
    small.resize((400, 301), refcheck=False)
    np.testing.assert_allclose(small[:256], expected, rtol=1e-4, atol=1e-4)
    assert not small[256:].any()


def _sdpa_grads_float64(q, k, v, grad_out, causal):
    """dQ, dK, dV of softmax(Q K^T / sqrt(E)) V in float64, from the
    formulas (P, dV = P^T dO, dS = P (dO V^T - rowsum(P dO V^T))), with
    K and V broadcast over the batch as the call broadcasts them and
    their gradients summed back over the axes they were broadcast on."""
    q, k, v, grad_out = (np.asarray(t, np.float64) for t in (q, k, v, grad_out))
    kb, vb = np.broadcast_to(k, q.shape[:-2] + k.shape[-2:]), np.broadcast_to(v, q.shape[:-2] + v.shape[-2:])
    scale = 1.0 / np.sqrt(q.shape[-1])
    s = q @ np.swapaxes(kb, -1, -2) * scale
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = grad_out @ np.swapaxes(vb, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq, dk, dv = ds @ kb * scale, np.swapaxes(ds, -1, -2) @ q * scale, np.swapaxes(p, -1, -2) @ grad_out
    def summed(g, like):  # over the axes `like` lacks, then those it has of 1
        g = g.sum(axis=tuple(range(g.ndim - like.ndim)))
        return g.sum(axis=tuple(i for i, n in enumerate(like.shape[:-2]) if n == 1), keepdims=True)
    return dq, summed(dk, k), summed(dv, v)


@pytest.mark.parametrize("case", ["own", "causal", "keys_broadcast", "keys_with_fewer_axes", "no_keys"])
def test_sdpa_backward_gradients_in_reused_blocks(case):
    """The SDPA backward's gradients come from attnc's kept blocks
    uninitialised where the kernel writes each whole, zero-filled where it
    adds into them (K and V broadcast over the batch: their gradients are
    sums over it) or does not run (no keys): in blocks poisoned with NaN,
    the gradients equal float64 ones and the first call's bits. Each is an
    array that owns its data (regression, an SDPA audit, 2026-12-06: they
    were views, reshaped to their own shape or to that of an input with
    fewer axes than the batch, where the docs say attnc's outputs own
    their data)."""
    rng = np.random.default_rng(3)
    keys = 0 if case == "no_keys" else 256
    q = rng.standard_normal((4, 4, 128, 32), dtype=np.float32)   # its gradient: 256 KiB
    kv_batch = (1,) if case == "keys_broadcast" else () if case == "keys_with_fewer_axes" else (4,)
    k, v = (rng.standard_normal(kv_batch + (4, keys, 32), dtype=np.float32) for _ in range(2))
    grad_out = rng.standard_normal(q.shape, dtype=np.float32)
    causal = case == "causal"
    out, lse = F.scaled_dot_product_attention(q, k, v, is_causal=causal, return_lse=True)
    first = [g.copy() for g in F.scaled_dot_product_attention_backward(grad_out, q, k, v, out, lse,
                                                                       is_causal=causal)]
    expected = ([np.zeros(t.shape) for t in (q, k, v)] if keys == 0   # no key: no weight, no gradient
                else _sdpa_grads_float64(q, k, v, grad_out, causal))
    for got, want, name in zip(first, expected, ("q", "k", "v")):
        assert got.shape == want.shape, name
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)
    x = rng.standard_normal((256, 128), dtype=np.float32)
    wide = rng.standard_normal((2048, 128), dtype=np.float32)
    for _ in range(3):
        junk = [F.linear(x, wide[:n]) for n in (256, 512, 1024, 2048) for _ in range(2)]   # 256 KiB - 2 MiB
        for j in junk:
            j[...] = np.nan
        del junk, j
        again = F.scaled_dot_product_attention_backward(grad_out, q, k, v, out, lse, is_causal=causal)
        for got, want, name in zip(again, first, ("q", "k", "v")):
            assert got.flags.owndata and got.base is None, name
            if got.nbytes >= 64 * 1024:
                assert _handler_name(got) == "attnc_kept_blocks", name
            np.testing.assert_array_equal(got, want, err_msg=name)


def test_linear_reads_a_2d_x_by_columns_in_place():
    """`linear` multiplies a 2-D x with its strides (a gradient's dY^T, as
    `linear_backward` passes it), never a C-ordered copy of it first: NumPy
    reports its arrays' allocations to tracemalloc, and the call allocates
    none of x's size (its output comes from attnc's allocator). The same
    x with a leading dim of 1 is copied (rows of other ranks must be
    n_in apart): the measure sees that copy."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((768, 1024), dtype=np.float32).T   # (1024, 768) by columns: 3 MiB
    w = rng.standard_normal((64, 768), dtype=np.float32)

    def peak_of(call):
        call()
        tracemalloc.start()
        try:
            call()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    assert peak_of(lambda: F.linear(x, w)) < x.nbytes // 8
    assert peak_of(lambda: F.linear(x[None], w)) >= x.nbytes   # the oracle sees a copy
    np.testing.assert_array_equal(F.linear(x, w), F.linear(x[None], w)[0])
