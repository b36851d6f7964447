"""os.fork() after the pool has been used (and while another Python thread
is inside a kernel): the child computes the right answer and exits 0. The
parent waits with a timeout and kills a hung child, so a hang fails the test
instead of blocking CI."""
import os
import pickle
import signal
import threading
import time

import numpy as np
import pytest

import attnc
from attnc import functional as F
from toolkit import assert_close, make_module, ref_module

TIMEOUT = 60


def _wait(pid):
    deadline = time.time() + TIMEOUT
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child hung for {TIMEOUT} s")


def _fork_and_check(child_work):
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 3
        try:
            code = 0 if child_work() else 2
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    assert _wait(pid) == 0


def _problem():
    m = make_module("MHA", 64, dtype=np.float64)
    x = np.random.default_rng(0).standard_normal((4, 128, 64))
    expected = ref_module(m, x)[0]
    return m, x, expected


@pytest.mark.parametrize("child_threads", [1, 2, 4])
def test_child_of_a_parent_that_used_the_pool(child_threads, restore_threads):
    attnc.set_num_threads(2)
    m, x, expected = _problem()
    parent = m(x)  # the pool's workers exist in the parent now
    assert_close(parent, expected, np.float64)

    def child():
        attnc.set_num_threads(child_threads)
        out = m(x)
        assert_close(out, expected, np.float64)
        return np.array_equal(out, parent) and np.array_equal(F.linear(x, x[0]), F.linear(x, x[0]))

    _fork_and_check(child)
    np.testing.assert_array_equal(m(x), parent)  # and the parent's pool still works


@pytest.mark.skipif(os.environ.get("ATTNC_SANITIZER") == "asan" or "asan" in os.environ.get("LD_PRELOAD", ""),
                    reason="GCC 12's ASan allocator is not fork-safe: a child forked while another thread is "
                           "inside ASan's malloc inherits its lock held and hangs (seen in .ci/sanitize.sh)")
def test_fork_while_another_thread_is_in_a_kernel(restore_threads):
    """The fork happens while a worker thread of the parent holds the pool."""
    attnc.set_num_threads(2)
    m, x, expected = _problem()
    parent = m(x)
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            m(x)

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    try:
        for _ in range(5):
            time.sleep(0.01)
            _fork_and_check(lambda: np.array_equal(m(x), parent))
    finally:
        stop.set()
        thread.join(timeout=TIMEOUT)
    assert not thread.is_alive()


def test_nested_fork(restore_threads):
    attnc.set_num_threads(2)
    m, x, expected = _problem()
    parent = m(x)

    def child():
        ok = np.array_equal(m(x), parent)
        _fork_and_check(lambda: np.array_equal(m(x), parent))
        return ok

    _fork_and_check(child)


@pytest.mark.skipif(os.environ.get("ATTNC_SANITIZER") == "asan" or "asan" in os.environ.get("LD_PRELOAD", ""),
                    reason="GCC 12's ASan allocator is not fork-safe: a child forked while another thread is "
                           "inside ASan's malloc inherits its lock held and hangs (seen in .ci/sanitize.sh)")
def test_fork_in_a_signal_handler_run_mid_call(restore_threads):
    """os.fork() in a Python signal handler, which the call's Ctrl-C poll runs
    between tasks: the child returns into the call without the parent's
    workers. It had cleared the job's task counters and then read them: a
    segfault in 18 of 20 children (a review helper, 2026-11-29). Now the
    child's call raises RuntimeError (the workers' tasks are not done there),
    or returns the right result when the fork came outside a pool job, and
    the next call works; the parent's call is unaffected."""
    attnc.set_num_threads(2)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 8, 1024, 64)).astype(np.float32) for _ in range(3))
    start = time.perf_counter()
    expected = F.scaled_dot_product_attention(q, k, v)
    call_seconds = time.perf_counter() - start
    forked, in_call, mid_call_forks = {}, [False], []

    def handler(signum, frame):
        pid = os.fork()
        forked["child" if pid == 0 else "pid"] = pid
        if pid:
            mid_call_forks.append(in_call[0])

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        for fraction in (0.1, 0.4, 0.7):  # of a call's time on this machine: the forks land inside calls
            forked.clear()
            signal.setitimer(signal.ITIMER_REAL, fraction * call_seconds)
            in_call[0] = True
            try:
                out, error = F.scaled_dot_product_attention(q, k, v), None
            except RuntimeError as raised:
                out, error = None, str(raised)
            in_call[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            if "child" in forked:  # never return into pytest
                ok = (error or "").startswith("the process forked during this call") or np.array_equal(out, expected)
                again = np.array_equal(F.scaled_dot_product_attention(q, k, v), expected)
                os._exit(0 if ok and again else 2)
            assert error is None and np.array_equal(out, expected)
            if "pid" in forked:
                assert _wait(forked["pid"]) == 0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert any(mid_call_forks), f"no fork landed inside a call ({mid_call_forks}): the test tested nothing"


@pytest.mark.parametrize("lock_name", ["_FINISH_LOCK", "_UNPICKLED_LOCK"])
def test_fork_while_another_thread_holds_a_module_lock(lock_name):
    """Another thread of the parent is inside a backward's last step (which
    adds the gradients under a lock, while NumPy lets other threads run) or
    an unpickling at the fork: the child's backward and unpickling work (its
    copy of the lock was held forever: the child hung in its first backward)."""
    from attnc import module
    holding, release = threading.Event(), threading.Event()

    def hold():
        with getattr(module, lock_name):
            holding.set()
            release.wait(TIMEOUT)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert holding.wait(TIMEOUT)
    rng = np.random.default_rng(0)
    x, grad_y = rng.standard_normal((3, 4)), rng.standard_normal((3, 2))

    def child_work():
        layer = pickle.loads(pickle.dumps(attnc.Linear(4, 2, dtype=np.float64)))
        layer(x)
        layer.backward(grad_y)
        grads = dict(layer.named_grads())
        return np.allclose(grads["weight"], grad_y.T @ x) and np.allclose(grads["bias"], grad_y.sum(axis=0))

    try:
        _fork_and_check(child_work)
    finally:
        release.set()
        thread.join(timeout=TIMEOUT)
