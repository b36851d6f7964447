"""Python threads (the GIL is released in the kernels): many threads calling
the same and different modules get bit-identical results to serial calls; a
module switched between train/eval or reloaded while other threads use it
never crashes; the thread count of the pool never changes a bit."""
import contextlib
import sys
import threading

import numpy as np
import pytest

import attnc
from attnc import functional as F
from toolkit import K_BLOCK, MODEL, MODEL_IDS, assert_close, make_module, ref_attend

N_THREADS = 8
ROUNDS = 6
JOIN_TIMEOUT = 120


def _run_threads(target, n=N_THREADS):
    errors = []
    barrier = threading.Barrier(n)

    def wrapped(i):
        try:
            barrier.wait(timeout=JOIN_TIMEOUT)
            target(i)
        except BaseException as error:  # re-raised in the main thread
            errors.append(error)

    threads = [threading.Thread(target=wrapped, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=JOIN_TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a thread is still running: deadlock?"
    if errors:
        raise errors[0]


def _workload(seed=0):
    """(name, call) pairs over every entry point, on sizes that use the pool."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 96, 48)).astype(np.float32)
    calls = []
    for name in MODEL_IDS:
        m = make_module(name, 48, seed=hash(name) % 1000)
        mask = rng.integers(0, 2, (2, 1, 96, 96) if MODEL[name].heads is not None else (2, 96, 96)) if MODEL[name].masked else None
        args = (x, mask) if mask is not None else (x,)
        calls.append((name, lambda m=m, args=args: m(*args, return_weights=True)))
    q, k, v = (rng.standard_normal((3, 80, 32)) for _ in range(3))
    w = rng.standard_normal((64, 48)).astype(np.float32)
    # the transposed order (32 rows) over two K blocks: its panels are one a thread
    x_short = rng.standard_normal((32, K_BLOCK + 232)).astype(np.float32)
    w_long = rng.standard_normal((200, K_BLOCK + 232)).astype(np.float32)
    calls += [
        ("linear-transposed", lambda: F.linear(x_short, w_long)),
        ("sdpa", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)),
        ("sdpa-dropout", lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=0.3,
                                                                rng=np.random.default_rng(5))),
        ("linear", lambda: F.linear(x, w)),
        ("softmax", lambda: F.softmax(x, axis=1)),
        ("Dropout", lambda: attnc.Dropout(0.4, rng=np.random.default_rng(6))(x)),
        ("train-mode", lambda: attnc.MultiHeadAttention(48, 4, 0.2, rng=np.random.default_rng(7))(x)),
    ]
    return calls


def _same(a, b, what):
    if isinstance(a, tuple):
        for i, (ai, bi) in enumerate(zip(a, b)):
            np.testing.assert_array_equal(ai, bi, err_msg=f"{what}[{i}]")
    else:
        np.testing.assert_array_equal(a, b, err_msg=what)


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_many_threads_different_entry_points_bit_identical(threads, restore_threads):
    attnc.set_num_threads(threads)
    calls = _workload()
    expected = {name: call() for name, call in calls}

    def target(i):
        for r in range(ROUNDS):
            name, call = calls[(i + r) % len(calls)]
            _same(call(), expected[name], name)

    _run_threads(target)


def test_many_threads_same_module_bit_identical(restore_threads):
    attnc.set_num_threads(2)
    m = make_module("MHA", 64)
    x = np.random.default_rng(1).standard_normal((4, 128, 64)).astype(np.float32)
    mask = np.random.default_rng(2).integers(0, 2, (4, 1, 1, 128))
    expected = m(x, mask, return_weights=True)
    expected_out = m(x, mask)  # the flash path: not bit-equal to expected[0] (not promised)

    def target(i):
        for _ in range(ROUNDS):
            _same(m(x, mask, return_weights=True), expected, "MHA")
            _same(m(x, mask), expected_out, "MHA out")

    _run_threads(target)


def test_thread_count_changes_while_threads_compute(restore_threads):
    calls = _workload(3)
    attnc.set_num_threads(1)
    expected = {name: call() for name, call in calls}
    stop = threading.Event()

    def target(i):
        if i == 0:
            n = 1
            while not stop.is_set():
                attnc.set_num_threads(n % 4 + 1)
                n += 1
            return
        try:
            for r in range(ROUNDS):
                name, call = calls[(i + r) % len(calls)]
                _same(call(), expected[name], name)
        finally:
            if i == 1:
                stop.set()

    _run_threads(target, 4)


def test_set_num_threads_one_vs_two_bit_identical(restore_threads):
    """Sizes above the pool's threshold, so 2 threads really split the work."""
    results = {}
    for n in (1, 2, 1):
        attnc.set_num_threads(n)
        results.setdefault(n, []).append([call() for _, call in _workload(4)])
    for a, b, (name, _) in zip(results[1][0], results[2][0], _workload(4)):
        _same(a, b, f"{name}: 1 vs 2 threads")
    for a, b, (name, _) in zip(results[1][0], results[1][1], _workload(4)):
        _same(a, b, f"{name}: repeat")


@pytest.mark.parametrize("name", ["V3", "MHA", "V4"])
def test_train_eval_switch_while_other_threads_compute(name, restore_threads):
    """Results are either the eval answer or a valid training-mode answer
    (finite, right shape); nothing crashes or deadlocks."""
    attnc.set_num_threads(2)
    m = make_module(name, 32)
    x = np.random.default_rng(8).standard_normal((2, 64, 32)).astype(np.float32)
    m.eval()
    expected = m(x)
    stop = threading.Event()

    def target(i):
        if i == 0:
            while not stop.is_set():
                m.train()
                m.eval()
            return
        try:
            for _ in range(ROUNDS * 3):
                out = m(x)
                assert out.shape == expected.shape and out.dtype == expected.dtype
                assert np.all(np.isfinite(out))
        finally:
            if i == 1:
                stop.set()

    _run_threads(target, 4)
    m.eval()
    _same(m(x), expected, "after the switching")


@pytest.mark.parametrize("name", MODEL_IDS)
def test_load_state_dict_while_other_threads_compute(name, restore_threads):
    """Loading parameters during forwards: each forward sees some mix of the
    two parameter sets (no guarantee is made), but never crashes; once the
    loading stops, results are exact again."""
    attnc.set_num_threads(2)
    m = make_module(name, 32)
    other = make_module(name, 32, seed=99)
    sd_a, sd_b = m.state_dict(), other.state_dict()
    x = np.random.default_rng(9).standard_normal((2, 64, 32)).astype(np.float32)
    expected_a, expected_b = m(x), other(x)
    stop = threading.Event()

    def target(i):
        if i == 0:
            k = 0
            while not stop.is_set():
                m.load_state_dict(sd_b if k % 2 else sd_a)
                k += 1
            m.load_state_dict(sd_a)
            return
        try:
            for _ in range(ROUNDS * 2):
                out = m(x, return_weights=True)
                assert out[0].shape == expected_a.shape
        finally:
            if i == 1:
                stop.set()

    _run_threads(target, 4)
    _same(m(x), expected_a, "after reloading")
    m.load_state_dict(sd_b)
    _same(m(x), expected_b, "with the other parameters")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_many_query_tiles_thread_count_never_changes_a_bit(causal, restore_threads, simd_mode):
    """Long enough for many query tiles per item, which the kernel groups
    into tasks differently for each thread count (fewer items than tasks
    wanted): every grouping gives the same bits, and matches float64 NumPy."""
    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 1000, 40)).astype(np.float32)
    k = rng.standard_normal((2, 1000, 40)).astype(np.float32)
    v = rng.standard_normal((2, 1000, 24)).astype(np.float32)
    mask = rng.random((2, 1, 1000)) > 0.2  # broadcast over queries
    results = []
    for n in (1, 2, 3, 4):
        attnc.set_num_threads(n)
        results.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal))
    for n, result in zip((2, 3, 4), results[1:]):
        np.testing.assert_array_equal(result, results[0], err_msg=f"1 vs {n} threads")
    expected, _ = ref_attend(q, k, v, 1 / np.sqrt(40), mask, causal)
    np.testing.assert_allclose(results[0], expected, rtol=1e-4, atol=1e-5)
    assert_close(results[0], expected, np.float32)


def test_a_training_module_shared_by_threads_fails_clearly():
    """Two threads running forward and backward on one training-mode module: a backward whose
    state another thread's backward took raises RuntimeError saying so (it raised TypeError
    from indexing None) and adds nothing (it had added its gradients first); each backward
    that runs gives the single-thread gradient of x and adds its gradients once."""
    m = attnc.SelfAttentionV2(8, dtype=np.float64, rng=np.random.default_rng(1))
    x = np.random.default_rng(2).standard_normal((2, 6, 8))
    expected = attnc.SelfAttentionV2(8, dtype=np.float64, rng=np.random.default_rng(1))
    expected_grad = expected.backward(np.ones_like(expected(x)))
    errors, grads = [], []

    def worker():
        for _ in range(1000):
            y = m(x)
            try:
                grads.append(m.backward(np.ones_like(y)))
            except Exception as error:  # noqa: BLE001 - every kind is recorded and checked below
                errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert grads and all(np.array_equal(g, expected_grad) for g in grads)
    assert all(isinstance(e, RuntimeError) and "backward" in str(e) for e in errors), errors[:3]
    # each backward that returned added its gradients once, and one that failed added nothing:
    # the buffers hold len(grads) copies of one backward's, added one after another
    for (name, g), (_, one) in zip(m.named_grads(), expected.named_grads()):
        total = np.zeros_like(one)
        for _ in grads:
            total += one
        np.testing.assert_array_equal(g, total, err_msg=name)


def test_lse_written_by_another_thread_mid_backward_cannot_crash(tmp_path):
    # The backward read the caller's lse once to size its per-row statistics
    # (rows of |lse| > 128 take their own max and sum) and again in each pass:
    # another thread (or a signal handler run at the Ctrl-C poll) writing lse
    # in between made a row read a buffer never allocated: a segfault (a
    # review helper, 2026-11-29). Run in a child process, so that a crash
    # fails this test instead of ending the run. The result is the backward
    # of the lse before the write or of the lse after it, bit for bit.
    import os
    import subprocess
    import sys
    script = tmp_path / "race.py"
    script.write_text(
        "import threading, time, numpy as np, attnc\n"
        "F = attnc.functional\n"
        "rng = np.random.default_rng(0)\n"
        "q, k, v = (rng.standard_normal((1, 8, 2048, 64)).astype(np.float32) for _ in range(3))\n"
        "out, lse = F.scaled_dot_product_attention(q, k, v, return_lse=True)\n"
        "go = np.ones_like(out)\n"
        "written = np.full_like(lse, 1e4)\n"
        "start = time.perf_counter()\n"
        "before = F.scaled_dot_product_attention_backward(go, q, k, v, out, lse)\n"
        "call_seconds = time.perf_counter() - start\n"
        "after = F.scaled_dot_product_attention_backward(go, q, k, v, out, written)\n"
        "mid_call = []\n"
        "for fraction in (0.1, 0.4, 0.7):  # of a backward's time here: the writes land inside calls\n"
        "    shared, wrote = lse.copy(), []\n"
        "    def write():\n"
        "        time.sleep(fraction * call_seconds)\n"
        "        shared[...] = 1e4\n"
        "        wrote.append(time.perf_counter())\n"
        "    writer = threading.Thread(target=write)\n"
        "    writer.start()\n"
        "    start = time.perf_counter()\n"
        "    got = F.scaled_dot_product_attention_backward(go, q, k, v, out, shared)\n"
        "    end = time.perf_counter()\n"
        "    writer.join()\n"
        "    mid_call.append(start < wrote[0] < end)\n"
        "    same = lambda ref: all(np.array_equal(g, e, equal_nan=True) for g, e in zip(got, ref))\n"
        "    assert same(before) or same(after)\n"
        "assert any(mid_call), mid_call  # else the test tested nothing\n"
        "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(attnc.__file__)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=JOIN_TIMEOUT, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-2000:])


def test_named_grads_and_zero_grad_use_the_parameters_they_enumerated():
    """named_grads() and zero_grad() read each parameter again to make its
    buffer: another thread setting a parameter to None in between made them
    raise AttributeError ('NoneType' object has no attribute 'shape'). They now
    use the value they enumerated. The race is made certain here: every
    parameter is set to None right after it is enumerated, as another thread
    might. Oracle: each buffer has the shape and dtype of the parameter the
    call saw, and zero_grad leaves zeros."""
    for make_race in (False, True):
        m = attnc.MultiHeadAttention(8, 2, dtype=np.float64)
        seen = {name: (p.shape, p.dtype) for name, p in m.named_parameters()}
        for _, buffer in m.named_grads():
            buffer += 1.5  # a gradient in every buffer
        original = m._every_parameter_slot

        def racing(prefix, original=original):
            for name, value, owner, attribute in original(prefix):
                if make_race:
                    setattr(owner, attribute, None)  # "another thread", between the read and the buffer
                yield name, value, owner, attribute

        m._every_parameter_slot = racing
        m.zero_grad()
        m._every_parameter_slot = original
        if make_race:  # the parameters back, for the next read
            for owner in (m.query_linear, m.key_linear, m.value_linear, m.output_linear):
                owner.weight, owner.bias = np.ones((8, 8)), np.ones(8)
        grads = dict(m.named_grads(remove_duplicate=False))
        assert {name: (g.shape, g.dtype) for name, g in grads.items()} == seen
        assert all(not g.any() for g in grads.values()), "zero_grad left a gradient"


@contextlib.contextmanager
def _switching_often():
    """sys.setswitchinterval(1e-6) for a race test (restored after): the races below were
    found with it, which makes a thread switch between two lines likelier."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _two_at_once(first, second):
    """first() and second() in two threads released together (_run_threads)."""
    _run_threads(lambda i: (first, second)[i](), n=2)


def test_named_grads_beside_a_first_backward_loses_no_gradient():
    """Regression (a mutation audit, 2026-12-02): _grad looked a buffer up and made it in two
    steps; named_grads() in another thread, between them, made a second zeros buffer over the
    one the backward had just filled (72 of 2000 trials, switching every 1e-6 s): the
    gradient was lost and backward had returned normally. Looked up and made under a lock."""
    x = np.random.default_rng(1).normal(size=(2, 5, 4))
    reference = attnc.Linear(4, 4, rng=np.random.default_rng(0))
    reference.backward(np.ones_like(reference(x)))
    expected = dict(reference.named_grads())
    lost = 0
    with _switching_often():
        for _ in range(1000):
            net = attnc.Linear(4, 4, rng=np.random.default_rng(0))

            def train():
                y = net(x)
                net.backward(np.ones_like(y))
            _two_at_once(train, lambda: [list(net.named_grads()) for _ in range(3)])
            lost += any(not np.array_equal(grad, expected[key]) for key, grad in net.named_grads())
    assert lost == 0, f"a gradient lost in {lost} of 1000 trials"


def test_walks_of_the_tree_while_another_thread_adds_and_deletes_a_submodule():
    """Regression (a mutation audit, 2026-12-02): state_dict, train, to and named_grads walked
    _modules itself, so a submodule added or deleted by another thread meanwhile raised
    RuntimeError ('dictionary changed size during iteration'; 3,539 times in 8 s) and could
    leave train() half applied. They walk a snapshot."""
    import time
    net, stop, errors = attnc.SelfAttentionV1(4), threading.Event(), []

    def add_and_delete():
        while not stop.is_set():
            net.extra = attnc.Linear(2, 2)
            del net.extra

    churn = threading.Thread(target=add_and_delete)
    with _switching_often():
        churn.start()
        try:
            end = time.perf_counter() + 1.5
            while time.perf_counter() < end:
                for walk in (net.state_dict, net.train, lambda: net.to(np.float32), lambda: list(net.named_grads()),
                             lambda: repr(net)):
                    try:
                        walk()
                    except AttributeError:  # (named_grads of the extra deleted between its name and value)
                        pass
                    except RuntimeError as error:
                        errors.append(str(error))
        finally:
            stop.set()
            churn.join(timeout=JOIN_TIMEOUT)
    assert not errors, f"{len(errors)} walks failed: {sorted(set(errors))}"


def test_two_threads_assigning_two_modules_into_each_other_make_no_cycle():
    """Regression (a mutation audit, 2026-12-02): __setattr__ checked that the module assigned
    does not contain the owner, then stored it, unlocked: a.child = b and b.child = a in two
    threads made a cycle (3 of 3000 trials), on which state_dict, train, repr and to raised
    RecursionError. Checked and stored under one lock: one of the two raises ValueError."""
    cycles = 0
    with _switching_often():
        for _ in range(4000):
            a, b = attnc.Linear(2, 2), attnc.Linear(2, 2)

            def assign(owner, child):
                try:
                    owner.child = child
                except ValueError:
                    pass
            _two_at_once(lambda: assign(a, b), lambda: assign(b, a))
            cycles += "child" in a._modules and "child" in b._modules
    assert cycles == 0, f"{cycles} cycles in 4000 trials"
