import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # helpers, doc_models

import attnc  # noqa: E402

torch.set_num_threads(2)


@pytest.fixture(params=[True, False], ids=["simd", "portable"])
def simd_mode(request):
    """Runs a test with the AVX2 kernels allowed, then with the portable C path forced."""
    attnc._C.set_simd(request.param)
    try:
        if not request.param:
            assert not attnc._C.simd_active()
        yield request.param
    finally:
        attnc._C.set_simd(True)


@pytest.fixture
def restore_threads():
    before = attnc.get_num_threads()
    yield before
    attnc.set_num_threads(before)


@pytest.fixture(params=[np.float32, np.float64], ids=["f32", "f64"])
def dtype(request):
    return np.dtype(request.param)
