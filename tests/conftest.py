"""pytest fixtures only; everything else the tests share is in toolkit.py."""
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # toolkit, doc_models

import attnc  # noqa: E402
from toolkit import KERNEL_LEVELS, SIMD_LEVELS, real_thread_counts  # noqa: E402

torch.set_num_threads(2)

# The level every test runs at unless it asks for another: the best this CPU
# has, or ATTNC_TEST_SIMD_LEVEL (.ci/wide_vectors.sh runs the portable level
# built with the AVX-512 vector width)
ONLY_LEVEL = os.environ.get("ATTNC_TEST_SIMD_LEVEL")
DEFAULT_LEVEL = ONLY_LEVEL or SIMD_LEVELS[-1]
attnc._C.set_simd_level(DEFAULT_LEVEL)

# The levels the simd_mode fixtures run a test at: every level this CPU has
# (best first), or ATTNC_TEST_SIMD_LEVEL's alone. In .ci/wide_vectors.sh's
# build the other levels are this CPU's own kernels, which the README's test
# command has just run at every level: that run repeated them until 2026-12-07
# (560 s of a 1664 s CI for its 32-byte build, most of it at the native levels).
FIXTURE_KERNEL_LEVELS = (ONLY_LEVEL,) if ONLY_LEVEL else KERNEL_LEVELS[::-1]
FIXTURE_SIMD_LEVELS = (ONLY_LEVEL,) if ONLY_LEVEL else SIMD_LEVELS[::-1]


def at_level(level):
    attnc._C.set_simd_level(level)
    try:
        assert attnc._C.simd_level() == level
        yield level
    finally:
        attnc._C.set_simd_level(DEFAULT_LEVEL)


@pytest.fixture(params=FIXTURE_KERNEL_LEVELS)
def simd_mode(request):
    """Runs a test at every kernel ISA level this CPU has (best first), then restores the
    default; not at the levels that add bfloat16 kernels only (toolkit.BF16_ONLY_LEVELS).
    With ATTNC_TEST_SIMD_LEVEL, at that level alone."""
    yield from at_level(request.param)


@pytest.fixture(params=FIXTURE_SIMD_LEVELS)
def simd_mode_all(request):
    """simd_mode at the levels that add bfloat16 kernels only too."""
    yield from at_level(request.param)


@pytest.fixture
def restore_threads():
    """Tests that set thread counts: each count really runs that many threads
    and splits the work for them, even past this machine's CPUs (a 2-CPU
    machine would otherwise run 3 and 4 threads as 2)."""
    with real_thread_counts() as before:
        yield before


@pytest.fixture(params=[np.float32, np.float64], ids=["f32", "f64"])
def dtype(request):
    return np.dtype(request.param)


@pytest.fixture
def serial_torch():
    """torch on one thread while a test runs (test files with tiny torch oracles
    use it for all their tests): with torch's two threads such files ran ~10x
    slower on a busy 2-core machine."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
