"""Every kernel allocation may fail: attnc._C.fail_alloc_after(n) makes the
(n+1)-th one fail, and every later one too (memory that has run out), or with
once=True that one alone (one large request refused while the small ones
after it go through: a failure must not be lost to a later step's success).
For n = 0, 1, 2, ... each call either succeeds with the right answer or
raises MemoryError, and the next normal call works. The loop stops at the
first n where the call succeeds without a failure made (with n allocations
allowed it needed no more), so every allocation of that call has been made
to fail once (thread scheduling changes which task gets the failure, not
how many allocations a call makes)."""
import numpy as np
import pytest

import attnc
from attnc import functional as F
from toolkit import MODEL, MODEL_IDS, assert_close, make_module, ref_attend, ref_linear, ref_module, ref_softmax

MAX_ALLOCATIONS = 5000  # far above any forward below; reaching it fails the test
INJECTED = {"sweeps": 0, "failed_calls": 0}  # printed by the last test, for the README table


@pytest.fixture(params=[False, True], ids=["then-all-fail", "once"])
def once(request):
    """Each sweep in both modes of the hook: every allocation from the failing one on, or
    that one alone."""
    return request.param


def _sweep(call, check, once=False):
    """Runs call() with its (n+1)-th allocation failing (once: only that one) for n = 0, 1,
    ... until a call needs no more than n; returns the calls that failed, which is the
    allocations the call makes but for failures it got past with the right answer."""
    expected_ok = call()  # warm-up: the pool exists, caches are filled
    check(expected_ok)
    failures = 0
    try:
        for n in range(MAX_ALLOCATIONS):
            attnc._C.fail_alloc_after(n, once=once)
            try:
                result = call()
            except MemoryError as error:
                failures += 1
                INJECTED["failed_calls"] += 1
                # a kernel's workspace, or an output array (NumPy's message: arrays of 64 KiB and
                # more come from the kernels' allocator, so its failures reach them too)
                assert any(word in str(error) for word in ("memory", "workspace", "Unable to allocate")), str(error)
            else:
                left = attnc._C.fail_alloc_after(-1)  # (-1: a once failure was made, and got past)
                check(result)
                if left >= 0:
                    check(call())  # and the next call still works
                    INJECTED["sweeps"] += 1
                    return failures
            finally:
                attnc._C.fail_alloc_after(-1)
            check(call())  # a failed call leaves nothing behind
        pytest.fail(f"still failing after {MAX_ALLOCATIONS} allocations")
    finally:
        attnc._C.fail_alloc_after(-1)


@pytest.mark.parametrize("name,masked", [(name, masked) for name in MODEL_IDS for masked in (False, True)
                                         if MODEL[name].masked or not masked])
@pytest.mark.parametrize("weights", [False, True], ids=["out", "out+weights"])
def test_module_forward_under_allocation_failures(name, weights, masked, once, restore_threads):
    attnc.set_num_threads(2)
    dim = 32
    m = make_module(name, dim, dtype=np.float64)
    x = np.random.default_rng(0).standard_normal((3, 80, dim))
    mask = None
    if masked:
        mask = np.random.default_rng(1).integers(0, 2, (3, 1, 80, 80) if MODEL[name].heads is not None else (3, 80, 80))
    args = (x, mask) if masked else (x,)
    ref_out, ref_w = ref_module(m, x, mask)

    def check(result):
        if weights:
            assert_close(result[0], ref_out, np.float64, "out")
            assert_close(result[1], ref_w, np.float64, "weights")
        else:
            assert_close(result, ref_out, np.float64, "out")

    failures = _sweep(lambda: m(*args, return_weights=weights), check, once)
    assert failures >= 2


def test_module_forward_by_chunks_under_allocation_failures(restore_threads):
    """A forward whose buffers pass 32 MiB goes through chunks of x's first dim (here 2
    indices of 20 items of 210 x 128, float64: 32.8 MiB, a chunk per index): a failure in
    any chunk's allocations raises MemoryError (never an output with a chunk left
    unwritten: each output is filled with NaN once checked, for a later one that reuses
    its memory) and leaves the next call right. Each allocation fails alone (once): a
    chunk's failure then meets later chunks whose allocations succeed, and must not be
    lost to them (a planted loop that went on to the next chunk returned an output with
    a chunk never written; failing every later allocation too, as the other sweeps also
    do, hid it). One head and items of 128 features: 55 allocations to sweep, at 0.39 s a
    call under ASan, where 5 items of 420 x 512 made 40 at 0.97 s (44 s against 78; with
    8 heads, 55 allocations)."""
    attnc.set_num_threads(2)
    m = make_module("MHA", 128, dtype=np.float64, heads=1)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 20, 210, 128))
    mask = rng.integers(0, 2, (2, 20, 1, 210, 210))
    mask[..., 0] = 1
    ref_out, _ = ref_module(m, x, mask)

    def check(result):
        assert_close(result, ref_out, np.float64, "out")
        result.fill(np.nan)  # the next output may get these bytes: not a right answer

    assert _sweep(lambda: m(x, mask), check, once=True) >= 2


@pytest.mark.parametrize("weights", [False, True], ids=["out", "out+weights"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpa_under_allocation_failures(weights, causal, once, restore_threads):
    attnc.set_num_threads(2)
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((2, 3, 70, 16)), rng.standard_normal((3, 90, 16)), rng.standard_normal((3, 90, 24))
    mask = rng.integers(0, 2, (70, 90)).astype(bool)
    ref_out, ref_w = ref_attend(q, k, v, 0.25, mask, causal)

    def check(result):
        if weights:
            assert_close(result[0], ref_out, np.float64, "out")
            assert_close(result[1], ref_w, np.float64, "weights")
        else:
            assert_close(result, ref_out, np.float64, "out")

    failures = _sweep(lambda: F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, return_weights=weights), check, once)
    assert failures >= 1


@pytest.mark.parametrize("shape", [(300, 200), (1, 513), (40, 7, 64)], ids=str)
def test_linear_and_softmax_under_allocation_failures(shape, once, restore_threads):
    attnc.set_num_threads(2)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((150, shape[-1])).astype(np.float32)
    b = rng.standard_normal(150).astype(np.float32)
    lin = attnc.Linear(shape[-1], 150, rng=np.random.default_rng(4))
    for call, check in ((lambda: F.linear(x, w, b), lambda r: assert_close(r, ref_linear(x, w, b), np.float32)),
                        (lambda: lin(x), lambda r: assert_close(r, ref_linear(x, lin.weight, lin.bias), np.float32)),
                        (lambda: F.softmax(x, axis=0), lambda r: assert_close(r, ref_softmax(x, 0), np.float32))):
        failures = _sweep(call, check, once)
        assert failures >= 1  # (each sweep failed something)


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"], ids=["f16", "bf16"])
def test_16_bit_calls_under_allocation_failures(dtype, once, restore_threads):
    """The 16-bit paths' own allocations (the GEMM's float sums, the weights' float rows, the
    row path's parts): each may fail, and the calls still give the same bits after."""
    attnc.set_num_threads(2)
    dtype = attnc.Linear(1, 1, dtype=dtype).dtype
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal(shape).astype(dtype) for shape in ((2, 100, 16), (2, 130, 16), (2, 130, 8)))
    x, w = rng.standard_normal((300, 200)).astype(dtype), rng.standard_normal((150, 200)).astype(dtype)
    out, lse = F.scaled_dot_product_attention(q, k, v, return_lse=True)
    grad = rng.standard_normal(out.shape).astype(dtype)
    for call in (lambda: F.scaled_dot_product_attention(q, k, v, return_weights=True),
                 lambda: F.scaled_dot_product_attention(q[:, :3], k, v, return_weights=True),  # the row path
                 lambda: (F.linear(x, w),),
                 lambda: F.scaled_dot_product_attention_backward(grad, q, k, v, out, lse)):
        failures = _sweep(call, _same_bits(call()), once)
        assert failures >= 1


def _module_for_backward(name):
    """A registry module in training mode with its dropout off (every call then computes the same)."""
    m = MODEL[name].make(16, dtype=np.float64, rng=np.random.default_rng(5))
    for child in ("attention_dropout", "dropout"):
        if child in m._modules:
            m._modules[child].p = 0.0
    return m


def _same_bits(expected):
    def check(result):
        for got, want in zip(result, expected):
            assert np.array_equal(got, want), "a call after injected failures computed other bits"
    return check


@pytest.mark.parametrize("name", ["MHA", "V3", "SA-nobias"])
def test_module_backward_under_allocation_failures(name, once, restore_threads):
    """Forward and backward of a training step: each attempt either fails with
    MemoryError or gives the bits of the step run with no injected failure
    (whose gradients test_backward_attention checks against torch)."""
    attnc.set_num_threads(2)
    m = _module_for_backward(name)
    rng = np.random.default_rng(6)
    x, grad = rng.standard_normal((2, 100, 16)), rng.standard_normal((2, 100, m(np.zeros((1, 1, 16))).shape[-1]))
    mask = rng.integers(0, 2, (2, 1, 100, 100) if MODEL[name].heads is not None else (2, 100, 100))
    args = (x, mask) if MODEL[name].masked else (x,)

    def step():
        m.zero_grad()
        m(*args)
        return [m.backward(grad)] + [g.copy() for _, g in m.named_grads()]

    failures = _sweep(step, _same_bits(step()), once)
    assert failures >= 4


def test_failed_backward_keeps_the_forward_for_a_retry(restore_threads):
    m = _module_for_backward("MHA")
    rng = np.random.default_rng(7)
    x, grad = rng.standard_normal((2, 100, 16)), rng.standard_normal((2, 100, 16))
    m(x)
    expected = m.backward(grad)
    m.zero_grad()
    m(x)
    attnc._C.fail_alloc_after(0)
    try:
        with pytest.raises(MemoryError):
            m.backward(grad)
    finally:
        attnc._C.fail_alloc_after(-1)
    assert np.array_equal(m.backward(grad), expected)  # the same forward, retried
    with pytest.raises(RuntimeError, match="no training-mode forward"):
        m.backward(grad)  # and now it has been used


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpa_backward_under_allocation_failures(causal, once, restore_threads):
    attnc.set_num_threads(2)
    rng = np.random.default_rng(8)
    q, k, v = rng.standard_normal((3, 200, 16)), rng.standard_normal((3, 150, 16)), rng.standard_normal((3, 150, 8))
    out, lse = F.scaled_dot_product_attention(q, k, v, is_causal=causal, return_lse=True)
    grad = rng.standard_normal(out.shape)

    def backward():
        return F.scaled_dot_product_attention_backward(grad, q, k, v, out, lse, is_causal=causal)

    failures = _sweep(backward, _same_bits(backward()), once)
    assert failures >= 1


def test_failure_hook_is_reset_by_minus_one():
    x = np.ones((64, 64))
    attnc._C.fail_alloc_after(0)
    attnc._C.fail_alloc_after(-1)
    assert_close(F.linear(x, x), ref_linear(x, x), np.float64)


@pytest.mark.parametrize("once", [False, True], ids=["then-all-fail", "once"])
def test_failure_hook_fails_the_one_allocation_or_all_from_it(once):
    """n = 0: a call's first allocation (its 128 KiB output) is refused; then the next
    call's are made (once) or refused too; the hook says -1 (a once failure made) or 0
    (failing still). A count not reached says what is left of it."""
    x = np.ones((128, 128))
    attnc._C.fail_alloc_after(0, once=once)
    try:
        with pytest.raises(MemoryError):
            F.linear(x, x)
        if once:
            assert_close(F.linear(x, x), ref_linear(x, x), np.float64)
        else:
            with pytest.raises(MemoryError):
                F.linear(x, x)
    finally:
        left = attnc._C.fail_alloc_after(-1)
    assert left == (-1 if once else 0)
    attnc._C.fail_alloc_after(1000, once=once)
    F.linear(x, x)
    assert 0 <= attnc._C.fail_alloc_after(-1) < 1000
    assert attnc._C.fail_alloc_after(-1) == -1  # (-1 while none is asked for)


def test_injection_counts_report(capsys):
    """Runs last in this file: how many injected failures were survived (for docs)."""
    with capsys.disabled():
        print(f"\n[alloc] {INJECTED['sweeps']} sweeps, {INJECTED['failed_calls']} calls made to fail")
