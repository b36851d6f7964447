"""Every kernel ISA level this CPU has (portable, AVX2, AVX-512) against float64 NumPy.

The simd_mode fixture runs each test once per level. Odd sizes
exercise the edge tiles of every micro-kernel shape (MR in 4, 6, 12; NR in
8, 16), transposed operands the strided packing, and the attention sizes
partial query and key tiles.
"""
import subprocess
import sys

import numpy as np
import pytest

import attnc
from attnc import functional as F
from toolkit import K_BLOCK, SIMD_LEVELS, assert_close, assert_grad_close, ref_attend, ref_module


def _r(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (13, 11, 300), (300, 37, 9), (97, 299, 131), (255, 17, 257),
                                   (25, 300, K_BLOCK + 1), (9, 35, 2 * K_BLOCK + 14), (7, 5, 3)])
@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed"])
def test_linear_every_level(m, n, k, transposed, dtype, simd_mode):
    rng = np.random.default_rng(m + 7 * n + 13 * k)
    if transposed:  # x and weight are views of (k, m) and (k, n) arrays: column strides, not row
        x, w = _r(rng, (k, m), dtype).T, _r(rng, (k, n), dtype).T
    else:
        x, w = _r(rng, (m, k), dtype), _r(rng, (n, k), dtype)
    b = _r(rng, (n,), dtype)
    expected = x.astype(np.float64) @ w.astype(np.float64).T + b
    assert_close(F.linear(x, w, b), expected, dtype, f"{simd_mode} {m}x{n}x{k}")


def _far_x_order():
    """Whether products of an x far beyond L2 stream it by weight blocks at the current
    level on this CPU: on Intel at AVX-512's vector width (GEMM_FAR_A_BY_B_BLOCKS; the
    portable level has it in .ci/wide_vectors.sh's 64-byte build)."""
    return attnc._C.cpu_is_intel() and attnc._C.simd_vector_bytes() == 64


def _order_of(x, w):
    """The order the GEMM takes for x (M, K) times w (N, K)^T at the current level."""
    F.linear(x, w)
    return attnc._C.last_gemm_order()


def _rows_taking(order, k, n, dtype, candidates):
    """The first of `candidates` (rows of x) whose product by an (n, k) weight takes
    `order` at the current level on this CPU, at the current thread count (the streamed
    order needs two weight slivers a thread): the orders' thresholds differ by level
    and vendor (Intel's AVX-512 streams x only up to 1.25 MB, and takes the far-x order
    past 3 MB), and a test written for an order must reach it on every machine."""
    for m in candidates:
        if _order_of(np.ones((m, k), dtype), np.ones((n, k), dtype)) == order:
            return m
    raise AssertionError(f"none of {candidates} rows takes the {order} order at {attnc._C.simd_level()}")


@pytest.mark.parametrize("order", ["streamed", "blocked"])
@pytest.mark.parametrize("k", [K_BLOCK + steps for steps in (8, 9, 10, 16, 17, 18)])
def test_linear_last_k_block_every_level(k, order, dtype, simd_mode, restore_threads):
    """The packed orders (x too large to pack alone), with a last K block of 8 to 18
    steps: around one vector's worth of steps (8 or 16 floats, 4 or 8 doubles), where
    packing the rows of x in register blocks stops (a block's last store runs into the
    next step); each row's bits as when alone. The rows for each order are found at each
    level on this CPU (_rows_taking): 90 rows are streamed everywhere; the blocked order
    takes 300 to 1000 rows by vendor and dtype (60 rows, once the streamed case, are
    transposed on Intel at AVX-512; 1000 streamed by weight blocks there)."""
    attnc.set_num_threads(2)  # (the orders split 130 outputs for the threads that run)
    rng = np.random.default_rng(k)
    m = _rows_taking(order, k, 130, dtype, (90, 300, 500, 1000))
    x, w, b = _r(rng, (m, k), dtype), _r(rng, (130, k), dtype), _r(rng, (130,), dtype)
    out = F.linear(x, w, b)
    assert attnc._C.last_gemm_order() == order
    assert_close(out, x.astype(np.float64) @ w.astype(np.float64).T + b, dtype, f"{simd_mode} K={k}")
    for i in (0, 5, 6, m - 1):
        np.testing.assert_array_equal(F.linear(x[i:i + 1], w, b)[0], out[i])


@pytest.mark.parametrize("m", [1, 3, 8, 32, 60, 1000])
def test_linear_k_blocks_are_k_block_long(m, dtype, simd_mode, restore_threads):
    """Each element sums its K blocks of K_BLOCK steps in order, each from
    zero, in every order of the GEMM (few rows, transposed, streamed,
    blocked), on 1 and 2 threads. Hand-derived: x all ones and each weight
    row 2^p (float's 24, double's 53) then ones, so that in one sum every
    later 1 is lost to rounding (2^p + 1 rounds to 2^p) while a later block
    counts its ones exactly from zero: K = K_BLOCK gives 2^p, K_BLOCK + 2
    gives 2^p + 2, 2 K_BLOCK + 4 gives 2^p + K_BLOCK + 4."""
    big = 2.0 ** (np.finfo(dtype).nmant + 1)  # 2^p, where the spacing is 2
    for k, expected in ((K_BLOCK, big), (K_BLOCK + 2, big + 2), (2 * K_BLOCK + 4, big + K_BLOCK + 4)):
        x, w = np.ones((m, k), dtype), np.ones((130, k), dtype)
        w[:, 0] = big
        for threads in (1, 2):
            attnc.set_num_threads(threads)
            np.testing.assert_array_equal(F.linear(x, w), np.full((m, 130), expected, dtype), f"K={k}")


def _linear_on_threads_and_alone(x, w, b, rows, label, order=None):
    """F.linear(x, w, b) on 1 thread against float64, the same bits on 2,
    and the bits of each of `rows` as when alone (the few-rows order); the
    product's order `order` when given (_order_of)."""
    outs = []
    for threads in (1, 2):
        attnc.set_num_threads(threads)
        outs.append(F.linear(x, w, b))
        if order is not None:
            assert attnc._C.last_gemm_order() == order, (label, attnc._C.last_gemm_order())
    assert_close(outs[0], x.astype(np.float64) @ w.astype(np.float64).T + b, x.dtype, label)
    np.testing.assert_array_equal(outs[0], outs[1])
    for i in rows:
        np.testing.assert_array_equal(F.linear(x[i:i + 1], w, b)[0], outs[0][i])
    return outs[0]


EACH_ORDER_ROWS = [12, 32, 64, 77, 90, 96, 97, 400, 1000, 1500, 3000]


@pytest.mark.parametrize("m", EACH_ORDER_ROWS)
def test_linear_each_order_every_level(m, dtype, simd_mode, restore_threads):
    """Three of the GEMM's orders, by the size of x (K = 300): 32 rows
    transposed at every level (the weights read in place; x's rows the
    tiles' columns), 12 rows transposed where the tiles' columns pad them
    little (16 columns of AVX-512's double; 12 at the 16-byte level, the
    last tile one vector of 4 lanes) and streamed where padding would cost
    more than packing the weights (16 columns of AVX-512's float, one
    vector; of AVX2's float, two), 64 and 96 float rows on either
    side of the cap on the transposed order at AVX2 and on Intel at AVX-512
    (64 transposed, 96 streamed; both transposed at the 16-byte level), 96
    and 97 on either side of it at AVX-512's float elsewhere (96
    transposed, 97 streamed; 77 and 90 rows, whose last slivers are cut
    short, transposed there too), 400
    streamed (the weights a sliver at a time, x read in place but for a last
    partial sliver at AVX2 and AVX-512, packed whole at the 16-byte level;
    130 outputs are at least two slivers a thread at every level), 3000 the
    blocked order (x over 3 MB, a task packing its own rows of it: 130
    outputs are one column block, which the far-x order leaves to the blocked
    one; 1000 rows of float, 1.2 MB, were streamed), as on Intel at AVX-512
    1500 rows of float (1.8 MB) are (streamed elsewhere): each against float64, on 1 and 2
    threads, and each row's bits as when alone (one row takes the few-rows
    order)."""
    rng = np.random.default_rng(m)
    x, w, b = _r(rng, (m, 300), dtype), _r(rng, (130, 300), dtype), _r(rng, (130,), dtype)
    _linear_on_threads_and_alone(x, w, b, (0, 11, m // 2, m - 1), f"{simd_mode} M={m}")


@pytest.mark.parametrize("m", [64, 77, 96, 97])
def test_transposed_order_cap_every_level(m, simd_mode, restore_threads):
    """The rows up to which float products take the transposed order (K =
    300, 130 outputs; a cut-short sliver of x at 77): 96 at AVX-512's width
    on AMD and other non-Intel CPUs, 64 at AVX2's and on Intel's cores at
    AVX-512 (GEMM_TRANSPOSED_MAX_ROWS); each product against float64 and its
    rows' bits as when alone. (The 16-byte level has no cap: its order
    follows the padding rule alone, and is not asserted here.)"""
    wide, intel = attnc._C.simd_vector_bytes(), attnc._C.cpu_is_intel()
    cap = {32: 64, 64: 64 if intel else 96}.get(wide)
    rng = np.random.default_rng(m)
    x, w, b = (_r(rng, (m, 300), np.float32), _r(rng, (130, 300), np.float32),
               _r(rng, (130,), np.float32))
    _linear_on_threads_and_alone(x, w, b, (0, m - 1), f"{simd_mode} M={m}",
                                 None if cap is None else "transposed" if m <= cap else "streamed")


_ELEMS = {"f32": np.float32, "f64": np.float64, "f16": np.float16}


@pytest.mark.parametrize("m,n,elem", [pytest.param(m, 130, elem, id=f"{name}-{m}")
                                      for m in (12, 97, 400, 1000) for name, elem in _ELEMS.items()] +
                         [pytest.param(1000, 530, _ELEMS[name], id=f"{name}-1000x530") for name in ("f32", "f16")])
@pytest.mark.parametrize("layout", ["weight by columns", "x by columns", "both by columns", "x rows repeated",
                                    "x rows reversed"])
def test_linear_operands_by_columns_every_level(m, n, layout, elem, simd_mode, restore_threads):
    """A weight, or a 2-D x, given as the transpose of a C-ordered array
    (row stride 1: the layout of dY^T and of W in a gradient's products) is
    read in place, each step's elements packed from one run (x is not
    copied first), and so is a 2-D x of any other strides (one row
    broadcast, rows reversed): the same bits as the contiguous copies, in
    the streamed and blocked orders (400 and 1000 rows: 1000 rows of a K
    block are 4 MB of float, past the streamed order's 2 or 3 MB: blocked,
    130 outputs in one column block, whose tasks pack their own rows of x;
    530 outputs far-x on Intel at AVX-512's width, as 3000 rows were, at a
    third of their time, blocked in two column blocks elsewhere) and the
    orders of 12 and 97 rows, 130 or 530 outputs (the last sliver partial),
    on 1 and 2 threads, against float64. float16 widens as it packs. K is
    two blocks and a bit; one and a bit for 530 outputs, and those not in
    float64 (whose strided packing the other shapes cover), the two cases
    that had taken most of CI's time in this test (2026-12-07)."""
    rng = np.random.default_rng(m)
    k = (1 if n == 530 else 2) * K_BLOCK + 7
    x = {"x by columns": lambda: _r(rng, (k, m), elem).T, "both by columns": lambda: _r(rng, (k, m), elem).T,
         "x rows repeated": lambda: np.broadcast_to(_r(rng, (1, k), elem), (m, k)),
         "x rows reversed": lambda: _r(rng, (m, k), elem)[::-1]}.get(layout, lambda: _r(rng, (m, k), elem))()
    w = _r(rng, (k, n), elem).T if layout in ("weight by columns", "both by columns") else _r(rng, (n, k), elem)
    b = _r(rng, (n,), elem)
    for threads in (1, 2):
        attnc.set_num_threads(threads)
        got = F.linear(x, w, b)
        if m == 1000:
            assert attnc._C.last_gemm_order() == ("far_x" if _far_x_order() and n == 530 else "blocked"), simd_mode
        np.testing.assert_array_equal(got, F.linear(np.ascontiguousarray(x), np.ascontiguousarray(w), b),
                                      f"{simd_mode} M={m}")
    assert_close(got, x.astype(np.float64) @ w.astype(np.float64).T + b, elem, f"{simd_mode} M={m}")


def test_the_orders_test_reaches_every_order_every_level(dtype, simd_mode, restore_threads):
    """test_linear_each_order_every_level's sizes, with one row, reach every order of the
    GEMM at every level on this CPU: few rows, transposed, streamed and blocked (1000 rows
    added for double on Intel at AVX-512, where 1500 and 3000 had taken the far-x order;
    130 outputs are one column block, which it leaves to the blocked order:
    test_linear_far_x_by_weight_blocks_every_level has its own)."""
    attnc.set_num_threads(2)  # (as that test's second call; its first, on 1 thread, takes the same orders)
    reached = {_order_of(np.ones((m, 300), dtype), np.ones((130, 300), dtype)) for m in [1] + EACH_ORDER_ROWS}
    expected = {"few_rows", "transposed", "streamed", "blocked"}
    assert expected <= reached, (simd_mode, reached)


@pytest.mark.parametrize("m", [16, 32])
def test_linear_transposed_panels_every_level(m, dtype, simd_mode, restore_threads):
    """The transposed order writes its tiles of C^T to a panel a thread and
    turns it into C every 48 rows, in blocks of a vector's lanes squared:
    301 weight rows make task blocks of 72 to 156 rows (most of whose last
    48-row chunk ends short of a whole vector's lanes; the last sliver is
    cut at 301), and
    K = K_BLOCK + 1 two K blocks (the second, of one step, added to C through the
    same panels). x's 16 or 32 rows are the panels' columns; every level
    and dtype takes the order for one of them at least (both at AVX-512's
    float, 16 rows in one-vector tiles; 16 double rows, where 32 would not
    fit the order's L2 block). Against float64, on 1 and 2
    threads, and each row's bits as when alone."""
    rng = np.random.default_rng(m)
    x, w, b = _r(rng, (m, K_BLOCK + 1), dtype), _r(rng, (301, K_BLOCK + 1), dtype), _r(rng, (301,), dtype)
    _linear_on_threads_and_alone(x, w, b, (0, m // 2, m - 1), f"{simd_mode} M={m}")


@pytest.mark.parametrize("m", [60, 64])
def test_linear_rows_of_a_whole_k_block_every_level(m, dtype, simd_mode, restore_threads):
    """60 and 64 rows of x over K = K_BLOCK + 1: their packed block of a
    whole K block (256 KB of float) is over the transposed order's 144 KB
    but within the 256 KB it takes on Intel's cores at AVX-512
    (GEMM_TRANSPOSED_X_BYTES_INTEL) and the 288 KB elsewhere at AVX-512, so
    there float runs transposed, and streamed at other levels. Against
    float64, on 1 and 2 threads, and each row's bits as when alone."""
    rng = np.random.default_rng(m)
    x, w, b = _r(rng, (m, K_BLOCK + 1), dtype), _r(rng, (200, K_BLOCK + 1), dtype), _r(rng, (200,), dtype)
    _linear_on_threads_and_alone(x, w, b, (0, m // 2, m - 1), f"{simd_mode} M={m}")


@pytest.mark.parametrize("m,k", [(14, K_BLOCK + 1), (16, K_BLOCK + 1), (23, 300), (47, 300)])
def test_linear_one_vector_edge_tiles_every_level(m, k, dtype, simd_mode, restore_threads):
    """A tile at C's right edge with at most a vector's lanes of columns
    left runs on one vector of them, not two. The transposed order takes
    such tiles for x's last rows (its tiles' columns): 14 and 16 float rows
    at AVX-512 (one vector of 16 lanes, over two K blocks: the second adds
    to C through the same tiles), 47 (two vectors and one of 15 lanes), 23
    at AVX2 and AVX-512's double (two vectors and one of 7 of 8 lanes); the
    packed orders for the weights' last columns (301 = 9 x 32 + 13 at
    AVX-512's float, whose 23 rows are streamed). Against float64, on 1
    and 2 threads, and each row's bits as when alone."""
    rng = np.random.default_rng(m)
    x, w, b = _r(rng, (m, k), dtype), _r(rng, (301, k), dtype), _r(rng, (301,), dtype)
    _linear_on_threads_and_alone(x, w, b, (0, m // 2, m - 1), f"{simd_mode} M={m} K={k}")


@pytest.mark.parametrize("k", [K_BLOCK + 76, K_BLOCK], ids=["in-place", "packed"])
def test_linear_far_x_by_weight_blocks_every_level(k, dtype, simd_mode, restore_threads):
    """On Intel at AVX-512, an x far beyond L2 (800 rows of a whole K block, 3.3 MB of float)
    is streamed by blocks of weight slivers: 1530 outputs are 48 float slivers (96 double),
    6 (12) a task on 2 threads, in blocks of 3 (4) slivers, 384 (512) KB, the last sliver cut
    at 26 (10) columns. x read in place over two K blocks (rows 1100 elements apart), or packed, a copy
    a thread (rows 4 KB apart: one K block). Other CPUs and levels take the blocked order.
    Against float64, on 1 and 2 threads, and each row's bits as when alone."""
    rng = np.random.default_rng(k)
    x, w, b = _r(rng, (800, k), dtype), _r(rng, (1530, k), dtype), _r(rng, (1530,), dtype)
    order = "far_x" if _far_x_order() else "blocked"
    _linear_on_threads_and_alone(x, w, b, (0, 399, 799), f"{simd_mode} K={k}", order)


def test_linear_far_x_packed_past_8_mb_takes_the_blocked_order_every_level(dtype, simd_mode, restore_threads):
    """An x far beyond L2 whose rows are 4 KB apart cannot be read in place: the far-x
    order would pack all of it into a copy a thread, each thread packing the whole x and
    reading its copy back from memory once a block of slivers; past 8 MB of a K block
    (GEMM_FAR_A_COPY_BYTES: 2100 float rows, 1050 double) the 2-thread product takes
    the blocked order, which packs x once (a (65536, 1024) x (256, 1024)^T float product
    had taken 0.24 s far-x, 1.5x torch's time, and 0.14 s blocked). One thread makes no
    copies: far-x on Intel at AVX-512's width still. Against float64, the same bits on
    both, each row's bits as when alone."""
    rng = np.random.default_rng(0)
    m = 2100 if np.dtype(dtype) == np.float32 else 1050
    x, w, b = _r(rng, (m, K_BLOCK), dtype), _r(rng, (530, K_BLOCK), dtype), _r(rng, (530,), dtype)
    outs = []
    for threads, order in ((1, "far_x" if _far_x_order() else "blocked"), (2, "blocked")):
        attnc.set_num_threads(threads)
        outs.append(F.linear(x, w, b))
        assert attnc._C.last_gemm_order() == order, (simd_mode, threads, attnc._C.last_gemm_order())
    assert_close(outs[0], x.astype(np.float64) @ w.astype(np.float64).T + b, dtype, simd_mode)
    np.testing.assert_array_equal(outs[0], outs[1])
    for i in (0, m // 2, m - 1):
        np.testing.assert_array_equal(F.linear(x[i:i + 1], w, b)[0], outs[0][i])


# rows of x the streamed order takes at every level on either vendor (a packed x block
# of at most 1.25 MB, Intel's AVX-512 limit), each past its last whole sliver
STREAMED_ROWS = {np.dtype(np.float32): (305, 200), np.dtype(np.float64): (149, 98)}


@pytest.mark.parametrize("which", [0, 1])
def test_linear_streamed_x_in_place_every_level(which, dtype, simd_mode, restore_threads):
    """The streamed order reads x's whole MR-row slivers in place at AVX2
    and AVX-512 (the micro-kernel's broadcasts from its rows, a row pointer
    per four rows) and packs only a last partial sliver: 305 float rows and
    149 double rows are 5 past the last whole sliver of 12 (AVX-512) or 6
    (AVX2), 200 float rows 8 and 2, 98 double rows 2. K = 2 K_BLOCK + 7:
    three K blocks, each sliver read from its block's first column. The
    order asserted (401 float rows, once a case here, are blocked on Intel
    at AVX-512). Against float64, on 1 and 2 threads (each thread's copy of
    the partial sliver), each row's bits as when alone (the few-rows order)
    and as in a product of 16 rows (the transposed order, x packed)."""
    m = STREAMED_ROWS[np.dtype(dtype)][which]
    rng = np.random.default_rng(m)
    k = 2 * K_BLOCK + 7
    x, w, b = _r(rng, (m, k), dtype), _r(rng, (130, k), dtype), _r(rng, (130,), dtype)
    out = _linear_on_threads_and_alone(x, w, b, (0, 11, 12, m // 2, m - 6, m - 1), f"{simd_mode} M={m}",
                                       "streamed")
    np.testing.assert_array_equal(F.linear(x[m - 16:], w, b), out[m - 16:])


ATTNC_MAX_L1D_WAYS = attnc._C.MAX_L1D_WAYS


@pytest.fixture(params=[0, ATTNC_MAX_L1D_WAYS], ids=["ways_unknown", "ways_many"])
def l1d_ways(request):
    """The GEMM counts an L1 of unknown ways (as too few: rows in one set are
    packed) or of the most it knows (they are read in place where a tile's
    rows fit), whatever this CPU has; restored after."""
    before = attnc._C.l1d_ways()
    attnc._C.set_l1d_ways(request.param)
    yield request.param
    attnc._C.set_l1d_ways(before)


@pytest.mark.parametrize("m", [8, 32, 50])
def test_linear_rows_4_kb_apart_every_level(m, dtype, simd_mode, l1d_ways, restore_threads):
    """Rows a multiple of 4 KB apart share an L1 set: here the first
    multiple of 4 KB past a K block (2048 floats, 1536 doubles, 2048 16-bit
    elements at K_BLOCK 1024), so the GEMM packs what it would read in place: x's slivers
    in the streamed order (50 rows), the weights instead of the transposed
    order (32 float rows at AVX-512) unless the L1 has a way for each of a
    tile's rows (l1d_ways); and the few-rows order (8 rows at
    AVX-512's floats) loads the weights' rows whole, not by 16-byte blocks.
    A second K block added. Against float64, on 1
    and 2 threads, each row's bits as when alone (the few-rows order) and as
    with K's rows copied apart by 16 more elements (read in place, or by
    blocks, where the orders do)."""
    per_4_kb = 4096 // np.dtype(dtype).itemsize
    k = (K_BLOCK // per_4_kb + 1) * per_4_kb
    rng = np.random.default_rng(m)
    x, w, b = _r(rng, (m, k), dtype), _r(rng, (130, k), dtype), _r(rng, (130,), dtype)
    out = _linear_on_threads_and_alone(x, w, b, (0, m // 2, m - 1), f"{simd_mode} M={m}")
    apart = np.empty((m + 130, k + 16), dtype)[:, :k]
    apart[:m], apart[m:] = x, w
    np.testing.assert_array_equal(F.linear(apart[:m], apart[m:], b), out)


def test_l1d_ways_is_the_cpus():
    """The ways the GEMM counts are the L1 data cache's as the C library
    reports them (0 where it cannot tell); the testing hook takes 0 to
    ATTNC_MAX_L1D_WAYS and names its argument otherwise."""
    got = subprocess.run(["getconf", "LEVEL1_DCACHE_ASSOC"], capture_output=True, text=True).stdout.strip()
    reported = int(got) if got.isdigit() else 0  # "" or "undefined" where the C library cannot tell
    expected = reported if reported <= ATTNC_MAX_L1D_WAYS else 0
    assert attnc._C.l1d_ways() == expected
    for bad in (-1, ATTNC_MAX_L1D_WAYS + 1):
        with pytest.raises(ValueError, match="ways"):
            attnc._C.set_l1d_ways(bad)
    assert attnc._C.l1d_ways() == expected


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("k", [301, 2 * K_BLOCK + 7])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_linear_few_rows_every_level(m, k, with_bias, dtype, simd_mode, restore_threads):
    """Up to a few rows of x (a vector's lanes at AVX2: 8 floats, 4 doubles;
    half of them elsewhere: 8 floats at AVX-512, 2 at the portable level)
    the GEMM packs nothing: it reads the weights' rows in place and turns
    them in registers (one row at AVX2: two blocks of outputs side by side
    where a task has two whole ones), or at AVX2 (8 floats, 2 to 4 doubles)
    puts x's rows in a vector's lanes and broadcasts the weights. 130 outputs (a last
    block of lanes, or of 12 outputs, part-filled), K = 301 (a step past the last whole vector
    at every level) and 2 K_BLOCK + 7 (three K blocks, the last of 7 steps, past whole
    vectors too); against float64, on 1 and 2 threads (the smallest products
    stay on one), and each row's bits as when alone and as among 100 rows (a
    packed order). These float and double bits guard the order of the sums:
    a 16-bit result's rounding hides a different order's last bit."""
    rng = np.random.default_rng(m + k)
    x, w = _r(rng, (m, k), dtype), _r(rng, (130, k), dtype)
    b = _r(rng, (130,), dtype) if with_bias else None
    outs = []
    for threads in (1, 2):
        attnc.set_num_threads(threads)
        outs.append(F.linear(x, w, b))
    expected = x.astype(np.float64) @ w.astype(np.float64).T + (0 if b is None else b)
    assert_close(outs[0], expected, dtype, f"{simd_mode} M={m} K={k}")
    np.testing.assert_array_equal(outs[0], outs[1])
    among = F.linear(np.concatenate([_r(rng, (50, k), dtype), x, _r(rng, (50 - m, k), dtype)]), w, b)
    np.testing.assert_array_equal(among[50:50 + m], outs[0])
    for i in range(m):
        np.testing.assert_array_equal(F.linear(x[i:i + 1], w, b)[0], outs[0][i])


@pytest.mark.parametrize("m", [1, 2, 3])
def test_linear_few_rows_weights_past_l2_every_level(m, dtype, simd_mode, restore_threads):
    """Weights of more than 2 MB a thread (4.3 MB of float, 8.7 of double,
    contiguous rows of K = 1031 elements, so a last step past whole
    vectors): on Intel, the few-rows order of one or two rows asks for the
    next block's rows while it multiplies a block
    (GEMM_FEW_ROWS_PREFETCH_FROM_BYTES), including the last block of a
    task, which has no next; three rows do not ask. Against float64, on 1
    and 2 threads with the same bits, and each row's bits as among 100 rows
    (a packed order)."""
    rng = np.random.default_rng(m)
    k = 1031
    x, w, b = _r(rng, (m, k), dtype), _r(rng, (1100, k), dtype), _r(rng, (1100,), dtype)
    outs = []
    for threads in (1, 2):
        attnc.set_num_threads(threads)
        outs.append(F.linear(x, w, b))
    expected = x.astype(np.float64) @ w.astype(np.float64).T + b
    assert_close(outs[0], expected, dtype, f"{simd_mode} M={m}")
    np.testing.assert_array_equal(outs[0], outs[1])
    among = F.linear(np.concatenate([_r(rng, (50, k), dtype), x, _r(rng, (50 - m, k), dtype)]), w, b)
    np.testing.assert_array_equal(among[50:50 + m], outs[0])


@pytest.mark.parametrize("positions", [1, 2, 8])
def test_module_few_rows_parts_every_level(positions, dtype, simd_mode):
    """A module's Q, K and V projections are one product of three parts,
    here in the few-rows order (one item of 1, 2 or 8 positions: rows of x;
    not at the 16-byte level's doubles, whose order takes 1, nor for 8 rows
    where it takes fewer). With 40 outputs a part, 16-output blocks cut a
    part's end (32-47) or C's (112-119), and so do 12-output blocks (36-47,
    x's rows in the lanes at AVX2: 8 floats, 2 doubles) and, for one row at
    AVX2, pairs of 8- or 4-output blocks (FEW_ROWS_CHAINS: 32-47 crosses Q's
    end, so its blocks go one at a time): their rows are read through a
    pointer each; the blocks within one part are read from a base per four
    rows at AVX-512's floats (GEMM_FEW_ROWS_SPACED), in the lanes and in
    pairs. Against float64 (with 2 or more keys, Q's and K's rows matter;
    with one, V's)."""
    m = attnc.MultiHeadAttention(40, 4, dtype=dtype, rng=np.random.default_rng(4)).eval()
    x = _r(np.random.default_rng(5), (1, positions, 40), dtype)
    assert_close(m(x), ref_module(m, x)[0], dtype, f"{simd_mode}")


@pytest.mark.parametrize("offset", [1, 4, 7, 15])
@pytest.mark.parametrize("k", [19, K_BLOCK + 3, 2 * K_BLOCK + 7])
@pytest.mark.parametrize("m", [1, 3, 8, 50])
def test_linear_weights_at_any_alignment(m, k, offset, dtype, simd_mode):
    """The few-rows order (1, 3 and 8 rows) starts each K block with the steps
    up to the first weight row's next vector boundary (a whole turned
    block, only those steps used), so that its other loads are aligned
    (rows loaded a 16-byte block at a time, from 1 row at AVX2 and from 6
    at AVX-512, only up to the next 16-byte boundary: offsets of whole
    blocks take no such steps); so
    does the packing of whole slivers in the packed orders (50 rows), whose
    last block ends at the K block's end, over steps already stored. Weights
    whose rows start `offset` elements past a 64-byte boundary (a view into
    a larger buffer; K = 19: one vector at most, K_BLOCK + 3 and 2 K_BLOCK + 7: two
    and three K blocks): against float64, and each row's bits as among 100 rows and as
    with the weights copied (NumPy's own alignment)."""
    rng = np.random.default_rng(m + k + offset)
    itemsize = np.dtype(dtype).itemsize
    buffer = np.empty(130 * k + 64, dtype)
    start = (-buffer.ctypes.data % 64) // itemsize + offset
    w = buffer[start:start + 130 * k].reshape(130, k)
    w[...] = _r(rng, (130, k), dtype)
    x, b = _r(rng, (m, k), dtype), _r(rng, (130,), dtype)
    out = F.linear(x, w, b)
    assert_close(out, x.astype(np.float64) @ w.astype(np.float64).T + b, dtype, f"{simd_mode} M={m} K={k}")
    among = F.linear(np.concatenate([_r(rng, (50, k), dtype), x, _r(rng, (50 - m, k), dtype)]), w, b)
    np.testing.assert_array_equal(among[50:50 + m], out)
    np.testing.assert_array_equal(F.linear(x, w.copy(), b), out)


def _attention_grads(q, k, v, d_out, scale):
    """dQ, dK, dV of softmax(q k^T scale) v in float64, by the chain rule."""
    q, k, v, d_out = (t.astype(np.float64) for t in (q, k, v, d_out))
    p = ref_attend(q, k, v, scale)[1].astype(np.float64)
    d_p = d_out @ np.swapaxes(v, -1, -2)
    d_s = p * (d_p - np.sum(d_p * p, axis=-1, keepdims=True))
    return scale * d_s @ k, scale * np.swapaxes(d_s, -1, -2) @ q, np.swapaxes(p, -1, -2) @ d_out


def test_edge_tiles_of_every_height_every_level(dtype, simd_mode):
    """Tiles cut by an edge (1 to MR - 1 rows; MR is 4, 6 or 12) run the
    micro-kernel on whole steps of rows (gemm_tile_rows, thirds or halves
    of MR) rather than MR rows of padding: x of 13 to 36 rows through the
    GEMM against 97 to 108 weight rows (the transposed order's tiles are
    the weights' rows), and attention of 17 to 40 queries over as many keys
    or 192 more (the flash path: the score product's last key sliver, alone
    or after a whole key tile, the value product's last queries, the
    backward's last key rows), each against float64. test_low_precision.py
    runs the same sizes through the bfloat16 pairs."""
    rng = np.random.default_rng(3)
    for n_out in range(97, 109):  # the transposed order's edge tiles are the weights' last rows
        w, b = _r(rng, (n_out, 70), dtype), _r(rng, (n_out,), dtype)
        for m in range(13, 37):
            x = _r(rng, (m, 70), dtype)
            assert_close(F.linear(x, w, b), x.astype(np.float64) @ w.astype(np.float64).T + b, dtype,
                         f"{simd_mode} M={m} N={n_out}")
    for n in range(17, 41):
        for s in (n, 192 + n):  # the only key tile, or a short one after a whole one (BLOCK_K 192)
            q, k, v, d_out = _r(rng, (1, n, 16), dtype), _r(rng, (1, s, 16), dtype), _r(rng, (1, s, 24), dtype), \
                _r(rng, (1, n, 24), dtype)
            out, lse = F.scaled_dot_product_attention(q, k, v, return_lse=True)
            assert_close(out, ref_attend(q, k, v, 0.25)[0], dtype, f"{simd_mode} L={n} S={s}")
            grads = F.scaled_dot_product_attention_backward(d_out, q, k, v, out, lse)
            for name, got, expected in zip("qkv", grads, _attention_grads(q, k, v, d_out, 0.25)):
                assert_grad_close(got, expected, dtype, f"{simd_mode} L={n} S={s} d{name}")


@pytest.mark.parametrize("S", [11, 12, 13, 191, 192, 193, 205, 216])
@pytest.mark.parametrize("window", [None, (30, 0)], ids=["full", "window"])
def test_sdpa_keys_read_in_place_every_level(S, window, dtype, simd_mode, restore_threads):
    """The score product reads float and double keys in place, in whole MR
    slivers (12, 6 or 4 keys) that end within the item's S keys, and packs
    the rest (a last partial sliver): S around multiples of MR and of the
    192-key tile, keys a view with rows 3 E apart (as a module's projection
    buffer holds them), the last item's keys ending the buffer (a read past
    S would leave it: ASan's CI run checks that), and a sliding window,
    whose key tiles end before S. Against float64 (out, weights, the
    gradients), on 1 and 2 threads, and the bits of contiguous keys."""
    rng = np.random.default_rng(S)
    E, L = 16, 40
    q, v, d_out = _r(rng, (3, L, E), dtype), _r(rng, (3, S, E), dtype), _r(rng, (3, L, E), dtype)
    k = _r(rng, (3, S, 3 * E), dtype)[:, :, E:2 * E]  # rows 3 E apart; the buffer ends with the last key
    if window is None:
        expected = ref_attend(q, k, v, 1 / np.sqrt(E))[0]
    else:
        keep = np.tril(np.triu(np.ones((L, S), bool), -window[0]), window[1])
        expected = ref_attend(q, k, v, 1 / np.sqrt(E), keep)[0]
    outs = []
    for threads in (1, 2):
        attnc.set_num_threads(threads)
        outs.append(F.scaled_dot_product_attention(q, k, v, window=window, return_lse=True))
    out, lse = outs[0]
    assert_close(out, expected, dtype, f"{simd_mode} S={S} window={window}")
    np.testing.assert_array_equal(outs[1][0], out)
    np.testing.assert_array_equal(F.scaled_dot_product_attention(q, np.ascontiguousarray(k), v, window=window), out)
    if window is None:
        out_w, weights = F.scaled_dot_product_attention(q, k, v, return_weights=True)
        assert_close(out_w, expected, dtype, f"{simd_mode} S={S} with weights")
        assert_close(weights, ref_attend(q, k, v, 1 / np.sqrt(E))[1], dtype, f"{simd_mode} S={S} weights")
        grads = F.scaled_dot_product_attention_backward(d_out, q, k, v, out, lse)
        for name, got, ref in zip("qkv", grads, _attention_grads(q, k, v, d_out, 1 / np.sqrt(E))):
            assert_grad_close(got, ref, dtype, f"{simd_mode} S={S} d{name}")


@pytest.mark.parametrize("Ev", [8, 40, 64, 72])
@pytest.mark.parametrize("L", [40, 130], ids=["one_query_tile", "two_query_tiles"])
def test_sdpa_values_read_in_place_every_level(L, Ev, dtype, simd_mode, restore_threads):
    """Where an item has one query tile (L up to 96), the value product
    reads float and double values in place, in whole NR-column slivers (32
    floats or 16 doubles at AVX-512, 16 or 8 at AVX2, 8 or 4 at the
    portable level), and packs the rest (the columns past the last whole
    sliver); with more query tiles it packs them all. Ev below, at and past
    those widths, values a view with rows 3 Ev apart whose last row ends
    the buffer; against float64 (out and the gradients), on 1 and 2 threads,
    and the bits of contiguous values."""
    rng = np.random.default_rng(L + Ev)
    S, E = 77, 16
    q, k, d_out = _r(rng, (2, L, E), dtype), _r(rng, (2, S, E), dtype), _r(rng, (2, L, Ev), dtype)
    v = _r(rng, (2, S, 3 * Ev), dtype)[:, :, 2 * Ev:]  # rows 3 Ev apart; the buffer ends with the last value
    expected = ref_attend(q, k, v, 1 / np.sqrt(E))[0]
    outs = []
    for threads in (1, 2):
        attnc.set_num_threads(threads)
        outs.append(F.scaled_dot_product_attention(q, k, v, return_lse=True))
    out, lse = outs[0]
    assert_close(out, expected, dtype, f"{simd_mode} L={L} Ev={Ev}")
    np.testing.assert_array_equal(outs[1][0], out)
    np.testing.assert_array_equal(F.scaled_dot_product_attention(q, k, np.ascontiguousarray(v)), out)
    grads = F.scaled_dot_product_attention_backward(d_out, q, k, v, out, lse)
    for name, got, ref in zip("qkv", grads, _attention_grads(q, k, v, d_out, 1 / np.sqrt(E))):
        assert_grad_close(got, ref, dtype, f"{simd_mode} L={L} Ev={Ev} d{name}")


@pytest.mark.parametrize("L,S,E,Ev", [(1, 1, 1, 1), (7, 13, 5, 3), (97, 193, 17, 33), (131, 389, 64, 65),
                                      (200, 31, 9, 130)])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_sdpa_every_level(L, S, E, Ev, masked, is_causal, dtype, simd_mode):
    rng = np.random.default_rng(L + S + E + Ev)
    q, k, v = _r(rng, (2, L, E), dtype), _r(rng, (2, S, E), dtype), _r(rng, (2, S, Ev), dtype)
    keep = None
    if masked:
        keep = rng.random((L, S)) < 0.6
        keep[:, 0] = True
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=is_causal)
    ref_out, ref_weights = ref_attend(q, k, v, 1 / np.sqrt(E), keep, is_causal)
    assert_close(out, ref_out, dtype, f"{simd_mode} L={L} S={S} E={E} Ev={Ev}")
    if not is_causal:  # the materialised path (weights returned) too
        out_w, weights = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, return_weights=True)
        assert_close(out_w, out, dtype)
        assert weights.shape == (2, L, S)
        assert_close(weights, ref_weights, dtype, f"{simd_mode} weights")  # (an audit: shape alone was checked)


def test_levels_reported_and_capped():
    best, before = SIMD_LEVELS[-1], attnc._C.simd_level()
    assert SIMD_LEVELS[0] == "portable"
    assert list(SIMD_LEVELS) == [lv for lv in ("portable", "avx2", "avx512", "avx512bf16") if lv in SIMD_LEVELS]
    # the import chooses the best level, but on an Intel CPU not avx512bf16 (its
    # vdpbf16ps products are slower there than the AVX-512 level's: cpu.c), which
    # stays available to set_simd_level (checked in a fresh interpreter: this
    # session's level may have been set by conftest)
    chosen = subprocess.run([sys.executable, "-c", "import attnc; print(attnc._C.simd_level())"],
                            capture_output=True, text=True, check=True).stdout.strip()
    with open("/proc/cpuinfo") as cpuinfo:
        intel = "GenuineIntel" in cpuinfo.read().split()
    assert attnc._C.cpu_is_intel() == intel
    assert chosen == ("avx512" if intel and best == "avx512bf16" else best)
    try:
        for level in SIMD_LEVELS:
            attnc._C.set_simd_level(level)
            assert attnc._C.simd_level() == level
        for level in ("avx2", "avx512", "avx512bf16"):  # a level this CPU does not run is refused, nothing changes
            if level in SIMD_LEVELS:
                continue
            attnc._C.set_simd_level("portable")
            with pytest.raises(ValueError, match="level"):
                attnc._C.set_simd_level(level)
            assert attnc._C.simd_level() == "portable"
        attnc._C.set_simd_level(best)
        # (a name cut short by a NUL was read up to it: "portable\0x" set the portable level; a
        # fuzz of attnc._C, 2026-12-06)
        for bad in ("sse", "AVX2", "", "portable\0x", "portable\0"):
            with pytest.raises(ValueError, match="level"):
                attnc._C.set_simd_level(bad)
        for bad in (2, None):  # not a string
            with pytest.raises(TypeError, match="level"):
                attnc._C.set_simd_level(bad)
        assert attnc._C.simd_level() == best
    finally:
        attnc._C.set_simd_level(before)


def test_avx512_available_where_the_cpu_has_it():
    flags = open("/proc/cpuinfo").read().split()
    has_avx2 = all(f in flags for f in ("avx2", "fma"))
    has_avx512 = all(f in flags for f in ("avx512f", "avx512vl", "avx512dq", "avx2", "fma"))
    assert ("avx2" in SIMD_LEVELS) == has_avx2
    assert ("avx512" in SIMD_LEVELS) == has_avx512
    has_avx512bf16 = has_avx512 and all(f in flags for f in ("avx512bw", "avx512_bf16"))
    assert ("avx512bf16" in SIMD_LEVELS) == has_avx512bf16
    # the list agrees with what setting each level and reading it back finds
    found, before = [], attnc._C.simd_level()
    try:
        for name in ("portable", "avx2", "avx512", "avx512bf16"):
            try:
                attnc._C.set_simd_level(name)
            except ValueError:
                continue
            if attnc._C.simd_level() == name:
                found.append(name)
    finally:
        attnc._C.set_simd_level(before)
    assert tuple(attnc._C.simd_levels()) == tuple(found)
