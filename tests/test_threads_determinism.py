"""set_num_threads never changes a result, not even in the last bit; concurrent Python
threads get the serial answer; repeated calls are deterministic.

Sizes are large enough that the kernels actually split the work across the pool."""
import threading

import numpy as np
import pytest

import attnc
from attnc import functional as F
from toolkit import K_BLOCK, MODEL, MODEL_IDS, MODELS, assert_close, ref_forward, scores_shape

THREADS = (1, 2, 3, 4)


def _over_threads(fn):
    outs = []
    for n in THREADS:
        attnc.set_num_threads(n)
        assert attnc.get_num_threads() == n
        outs.append(fn())
    return outs


def _all_equal(outs):
    for o in outs[1:]:
        if isinstance(o, tuple):
            for a, b in zip(o, outs[0]):
                np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_array_equal(o, outs[0])


@pytest.mark.parametrize("case", MODELS, ids=MODEL_IDS)
def test_modules_same_bits_any_thread_count(case, restore_threads, simd_mode):
    dim = 48
    m = case.make(dim, rng=np.random.default_rng(0))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 96, dim)).astype(np.float32)
    mask = (rng.random(scores_shape(case, dim, x.shape)) < 0.8) if case.masked else None
    args = (x,) if mask is None else (x, mask)
    m.eval()
    outs = _over_threads(lambda: m(*args, return_weights=True))
    _all_equal(outs)
    _all_equal(_over_threads(lambda: m(*args)))
    ref, _ = ref_forward(case.kind, m.state_dict(), x, mask, case.n_heads(dim))
    assert_close(outs[0][0], ref, np.float32)
    if case.kind in ("SelfAttentionV3", "SelfAttentionV4", "MultiHeadAttention"):
        def train_call():
            t = case.make(dim, rng=np.random.default_rng(7))     # training mode, fresh seeded rng
            return t(*args), t(*args)
        outs = _over_threads(train_call)
        _all_equal(outs)
        assert not np.array_equal(outs[0][0], outs[0][1])


def test_functional_same_bits_any_thread_count(restore_threads, dtype, simd_mode):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((300, 257)).astype(dtype)
    w = rng.standard_normal((129, 257)).astype(dtype)
    b = rng.standard_normal(129).astype(dtype)
    _all_equal(_over_threads(lambda: F.linear(x, w, b)))
    _all_equal(_over_threads(lambda: F.softmax(x)))
    _all_equal(_over_threads(lambda: F.softmax(x, axis=0)))
    q = rng.standard_normal((3, 2, 130, 40)).astype(dtype)
    k = rng.standard_normal((3, 2, 150, 40)).astype(dtype)
    v = rng.standard_normal((3, 2, 150, 24)).astype(dtype)
    mask = rng.random((130, 150)) < 0.9
    _all_equal(_over_threads(lambda: F.scaled_dot_product_attention(q, k, v)))
    _all_equal(_over_threads(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True,
                                                                     return_weights=True)))
    _all_equal(_over_threads(lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=0.2,
                                                                     rng=np.random.default_rng(9),
                                                                     return_weights=True)))


@pytest.mark.parametrize("heads", [1, 3, 4, 6])
@pytest.mark.parametrize("items", [1, 2])
@pytest.mark.parametrize("mask_kind", [None, "per head", "per item"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_short_items_heads_in_groups_same_bits(heads, items, mask_kind, dtype, restore_threads, simd_mode):
    """Short items on more threads than items: a task projects and attends each group of an
    item's heads into its own buffer (one thread: one projection buffer for all). Same bits at
    every thread count, the weights too, and the float64 oracle's values."""
    dim, seq = 48, 20
    case = MODEL["MHA"]
    m = case.make(dim, heads=heads, dtype=dtype, rng=np.random.default_rng(0)).eval()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((items, seq, dim)).astype(dtype)
    mask = None
    if mask_kind is not None:
        shape = (items, heads, seq, seq) if mask_kind == "per head" else (items, 1, seq, seq)
        mask = rng.random(shape) < 0.7
        mask[..., 0] = True
    args = (x,) if mask is None else (x, mask)
    outs = _over_threads(lambda: m(*args, return_weights=True))
    _all_equal(outs)
    _all_equal([o[0] for o in outs] + _over_threads(lambda: m(*args)))
    ref, ref_weights = ref_forward(case.kind, m.state_dict(), x, mask, heads)
    assert_close(outs[0][0], ref, dtype)
    assert_close(outs[0][1], ref_weights, dtype)


@pytest.mark.parametrize("items", [2, 3, 4, 6])
@pytest.mark.parametrize("name", ["MHA", "MHSA-nobias", "SA-bias", "V4"])
def test_items_in_groups_per_thread_same_bits(items, name, restore_threads):
    """Items that split evenly among the threads, each share of x at most 256 KB (items of
    130 x 96 floats, 50 KB: too long for a task per item): a task per thread takes its items
    through the projections, the attention and the output projection (where the module has
    one). Items that do not split evenly (3 on 2 threads, 4 on 3, 6 on 4) or are fewer than
    the threads take the shared projection buffer. Same bits at every
    thread count, with a mask per item and the weights asked for, and the float64 oracle's
    values."""
    heads, dim, seq = 4, 96, 130
    case = MODEL[name]
    m = case.make(dim, heads=heads, dtype=np.float32, rng=np.random.default_rng(items)).eval()
    rng = np.random.default_rng(items + 1)
    x = rng.standard_normal((items, seq, dim)).astype(np.float32)
    mask = rng.random((items, 1, seq, seq)) < 0.7
    mask[..., 0] = True
    if not case.kind.startswith("Multi"):
        mask = mask[:, 0]
    other = rng.standard_normal(x.shape).astype(np.float32)

    def after_another(**kwargs):  # an output left unwritten would hold another result, not this one's
        m(other, mask, **kwargs)
        return m(x, mask, **kwargs)

    outs = _over_threads(lambda: after_another(return_weights=True))
    _all_equal(outs)
    _all_equal([o[0] for o in outs] + _over_threads(after_another))
    ref, ref_weights = ref_forward(case.kind, m.state_dict(), x, mask, heads)
    assert_close(outs[0][0], ref, np.float32)
    assert_close(outs[0][1], ref_weights, np.float32)


@pytest.mark.parametrize("items,seq", [(2, 31), (2, 32), (3, 31), (3, 32), (4, 15), (4, 16), (3, 1), (6, 1)])
def test_items_whole_a_task_from_32_rows_same_bits(items, seq, restore_threads):
    """Whole items a task (a task per thread of them, or one per item) only with at least 32
    rows a task (ITEM_TASK_MIN_ROWS: each such task multiplies all of the weights); fewer,
    one product of every row split by columns: 2 and 3 items of 31 and 32 rows (256 wide:
    32 KB of x an item at 32 rows, a task per item for 3 items on 2 threads), 4 items of 15
    and 16 rows (two a thread on 2 threads: 30 and 32 rows a task), decoding steps of 3 and 6
    items. Same bits at every thread count, each item's as when alone (a task per group of
    its heads), and the float64 oracle's values."""
    heads, dim = 4, 256
    case = MODEL["MHA"]
    m = case.make(dim, heads=heads, dtype=np.float32, rng=np.random.default_rng(seq)).eval()
    x = np.random.default_rng(items).standard_normal((items, seq, dim)).astype(np.float32)
    outs = _over_threads(lambda: m(x))
    _all_equal(outs)
    for i in range(items):
        np.testing.assert_array_equal(m(x[i:i + 1])[0], outs[0][i])
    ref, _ = ref_forward(case.kind, m.state_dict(), x, None, heads)
    assert_close(outs[0], ref, np.float32)


@pytest.mark.parametrize("rows", [13, 20, 32])
def test_short_sequence_projections_same_bits_any_thread_count(rows, restore_threads, dtype, simd_mode):
    """A few dozen rows of x: the order where each thread packs x for itself (over two K blocks,
    with weight slivers cut by the bottom edge and, stacked Q/K/V of 100 rows each, by the parts' ends)."""
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, K_BLOCK + 232)).astype(dtype)
    w = rng.standard_normal((700, K_BLOCK + 232)).astype(dtype)
    b = rng.standard_normal(700).astype(dtype)
    outs = _over_threads(lambda: F.linear(x, w, b))
    _all_equal(outs)
    assert_close(outs[0], x.astype(np.float64) @ w.astype(np.float64).T + b, dtype)
    m = attnc.MultiHeadAttention(100, 4, dtype=dtype, rng=np.random.default_rng(3)).eval()
    x = rng.standard_normal((1, rows, 100)).astype(dtype)
    outs = _over_threads(lambda: m(x))
    _all_equal(outs)
    ref, _ = ref_forward("MultiHeadAttention", m.state_dict(), x, None, 4)
    assert_close(outs[0], ref, dtype)


def test_repeated_calls_identical():
    m = attnc.MultiHeadAttention(64, 4, rng=np.random.default_rng(4)).eval()
    x = np.random.default_rng(4).standard_normal((3, 70, 64)).astype(np.float32)
    first = m(x)
    for _ in range(5):
        np.testing.assert_array_equal(m(x), first)


def test_concurrent_python_threads(restore_threads):
    """Several Python threads calling attnc at once get the single-threaded answers."""
    attnc.set_num_threads(2)
    rng = np.random.default_rng(5)
    models = [attnc.SelfAttentionV4(32, rng=np.random.default_rng(i)).eval() for i in range(4)]
    xs = [rng.standard_normal((2, 64, 32)).astype(np.float32) for _ in range(4)]
    expected = [m(x) for m, x in zip(models, xs)]
    w = rng.standard_normal((48, 32)).astype(np.float32)
    expected_lin = [F.linear(x, w) for x in xs]
    errors = []
    barrier = threading.Barrier(4)

    def worker(i):
        try:
            barrier.wait()
            for _ in range(20):
                np.testing.assert_array_equal(models[i](xs[i]), expected[i])
                np.testing.assert_array_equal(F.linear(xs[i], w), expected_lin[i])
        except BaseException as e:   # reported in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert not errors, errors[0]


def test_threads_keep_result_when_changed_between_calls(restore_threads):
    x = np.random.default_rng(6).standard_normal((200, 200)).astype(np.float64)
    attnc.set_num_threads(1)
    a = F.linear(x, x)
    attnc.set_num_threads(4)
    b = F.linear(x, x)
    attnc.set_num_threads(2)
    c = F.linear(x, x)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    assert_close(a, x @ x.T, np.float64)


def test_pool_works_after_fork(restore_threads):
    """A forked child (multiprocessing's default on Linux) can still compute, in parallel."""
    import os
    attnc.set_num_threads(2)
    x = np.random.default_rng(7).standard_normal((256, 256))
    expected = F.linear(x, x)          # the pool exists in the parent before the fork
    pid = os.fork()
    if pid == 0:                       # child: never return into pytest
        code = 1
        try:
            ok = np.array_equal(F.linear(x, x), expected)
            attnc.set_num_threads(3)
            ok = ok and np.array_equal(F.linear(x, x), expected)
            code = 0 if ok else 2
        finally:
            os._exit(code)
    import time
    deadline = time.time() + 60
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("forked child hung (thread pool not rebuilt after fork?)")


def _pool_workers():
    """The native ids of attnc's pool threads (named attnc-worker by threads.c)."""
    import os
    tids = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as comm:
            if comm.read().strip() == "attnc-worker":
                tids.append(int(tid))
    return tids


def test_each_thread_count_runs_that_many_threads(restore_threads):
    """Under restore_threads (conftest) a count of 2 to 4 runs the caller and n - 1 pool
    workers whatever this machine's CPUs, so the tests that compare 1 to 4 threads
    compare four splits of the work (without the hook a 2-CPU machine runs 3 and 4
    threads as 2, and a 1-CPU one everything as 1)."""
    x = np.random.default_rng(8).standard_normal((2, 4, 128, 64)).astype(np.float32)
    attnc.set_num_threads(1)
    expected = F.scaled_dot_product_attention(x, x, x)
    for n in (2, 3, 4):
        attnc.set_num_threads(n)
        np.testing.assert_array_equal(F.scaled_dot_product_attention(x, x, x), expected)
        assert len(_pool_workers()) == n - 1


def test_workers_keep_their_cpu_mask(restore_threads):
    """A worker that finds itself on its caller's CPU steps off it (threads.c) by leaving
    that CPU out of its mask for a moment: afterwards every worker's mask is the
    process's again (none is left pinned), and the results are the serial ones. Each
    round first moves the workers onto the caller's CPU (a mask of that CPU alone, then
    the full mask back, which leaves them there while they poll), so that the step is
    taken; the scheduler has the last word, and with the mask left narrowed this test
    failed in 4 of 5 runs."""
    import os
    allowed = os.sched_getaffinity(0)
    x = np.random.default_rng(8).standard_normal((2, 4, 128, 64)).astype(np.float32)
    attnc.set_num_threads(1)
    expected = F.scaled_dot_product_attention(x, x, x)
    attnc.set_num_threads(2)
    np.testing.assert_array_equal(F.scaled_dot_product_attention(x, x, x), expected)  # the workers start here
    workers = _pool_workers()
    assert len(workers) == 1  # (restore_threads: 2 threads even on one CPU)
    outputs, masks_after = [], []
    try:
        for cpu in sorted(allowed):
            os.sched_setaffinity(0, {cpu})  # this (the calling) thread only
            for _ in range(100):
                for tid in workers:
                    os.sched_setaffinity(tid, {cpu})
                    os.sched_setaffinity(tid, allowed)
                outputs.append(F.scaled_dot_product_attention(x, x, x))
                masks_after.append([os.sched_getaffinity(tid) for tid in workers])
    finally:
        os.sched_setaffinity(0, allowed)
        for tid in workers:
            os.sched_setaffinity(tid, allowed)
    for out in outputs:
        np.testing.assert_array_equal(out, expected)
    for masks in masks_after:
        assert all(mask == allowed for mask in masks), f"a worker was left with a narrowed CPU mask: {masks}"


@pytest.mark.parametrize("name,heads,lead", [("MHA", 4, (1100,)), ("MHSA-nobias", 32, (1100,)), ("SA-bias", None, (1100,)),
                                             ("V4", None, (1100,)), ("MHA", 4, (3, 400))])
def test_forward_by_chunks_of_the_first_dim_same_bits(name, heads, lead, restore_threads):
    """An eval-mode forward whose projections and merged heads take more than 32 MiB
    (WHOLE_FORWARD_MAX_BYTES: here float64 items of 16 x 64, 64 KB of buffers each) goes
    through chunks of x's first dim instead of one buffer for all of them: two chunks of
    550 items, or of 1 and 2 indices of a (3, 400) batch. Same bits at every thread count,
    each item's as when alone, with a mask per item and the weights asked for (their rows
    at each chunk's offset), and the float64 oracle's values."""
    dim, seq = 64, 16
    case = MODEL[name]
    m = case.make(dim, heads=heads, dtype=np.float64, rng=np.random.default_rng(len(lead))).eval()
    rng = np.random.default_rng(7)
    x = rng.standard_normal((*lead, seq, dim))
    mask = rng.random((*lead, 1, seq, seq)) < 0.7
    mask[..., 0] = True
    if not case.kind.startswith("Multi"):
        mask = mask[..., 0, :, :]
    outs = _over_threads(lambda: m(x, mask, return_weights=True))
    _all_equal(outs)
    out, weights = outs[0]
    for index in [(0,) * len(lead), (lead[0] - 1,) + (0,) * (len(lead) - 1), tuple(n // 2 for n in lead)]:
        alone = m(x[index][None], mask[index][None], return_weights=True)
        np.testing.assert_array_equal(alone[0][0], out[index])
        np.testing.assert_array_equal(alone[1][0], weights[index])
    ref, ref_weights = ref_forward(case.kind, m.state_dict(), x, mask, heads)
    assert_close(out, ref, np.float64)
    assert_close(weights, ref_weights, np.float64)
