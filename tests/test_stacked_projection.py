"""A module's Q, K and V projections run as one product of x with the three
weights stacked (x packed once). Its bits must be those of three separate
`linear` calls followed by the attention: a part's rows never depend on the
other parts, on where a micro-kernel sliver straddles two parts, or on which
biases are missing. Oracles: attnc's own functional layer, bit for bit, and
the float64 NumPy reference."""
import numpy as np
import pytest

import attnc
from attnc import functional as F
from toolkit import assert_close, ref_module

# dim_k and dim_v not multiples of any sliver width (16, 32 columns), so
# slivers straddle the Q/K and K/V boundaries; 256 crosses the direct-loop
# threshold and fills whole slivers; T crosses a row block of the GEMM (48)
SHAPES = [(37, 13, 19), (64, 40, 24), (256, 256, 256)]
LENGTHS = [1, 5, 130]


def composed(m, x):
    """The module's forward from the functional layer: three linear calls, SDPA."""
    parts = [m.linear_q, m.linear_k, m.linear_v]
    q, k, v = (F.linear(x, p.weight, p.bias) for p in parts)
    return F.scaled_dot_product_attention(q, k, v, scale=1 / np.sqrt(m.dim_k))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize("dim_in,dim_k,dim_v", SHAPES)
def test_stacked_projection_has_the_bits_of_three(dim_in, dim_k, dim_v, T, dtype):
    m = attnc.SelfAttention(dim_in, dim_k, dim_v, bias=True, dtype=dtype, rng=np.random.default_rng(1)).eval()
    x = np.random.default_rng(2).standard_normal((3, T, dim_in)).astype(dtype)
    out = m(x)
    np.testing.assert_array_equal(out, composed(m, x))
    assert_close(out, ref_module(m, x)[0], dtype, "stacked projection vs float64 oracle")


@pytest.mark.parametrize("missing", ["linear_q", "linear_k", "linear_v", "none", "all"])
def test_stacked_projection_with_some_biases_missing(missing):
    """Biases of some parts only: the stacked bias has zeros for the others."""
    m = attnc.SelfAttention(37, 13, 19, bias=True, rng=np.random.default_rng(3)).eval()
    for name in (["linear_q", "linear_k", "linear_v"] if missing == "all" else [missing]):
        if name != "none":
            getattr(m, name).bias = None
    x = np.random.default_rng(4).standard_normal((2, 130, 37)).astype(np.float32)
    out = m(x)
    np.testing.assert_array_equal(out, composed(m, x))
    assert_close(out, ref_module(m, x)[0], np.float32, f"bias of {missing} missing")


def test_multihead_projections_stacked_from_separate_arrays():
    """MultiHeadAttention's four Linear layers hold separate arrays; the
    output is the same whether or not the Q, K, V weights are adjacent in
    memory (views of one (3D, D) array)."""
    m = attnc.MultiHeadAttention(48, 4, rng=np.random.default_rng(5)).eval()
    x = np.random.default_rng(6).standard_normal((2, 70, 48)).astype(np.float32)
    separate = m(x)
    stacked = np.concatenate([m.query_linear.weight, m.key_linear.weight, m.value_linear.weight])
    for i, layer in enumerate([m.query_linear, m.key_linear, m.value_linear]):
        layer.weight = stacked[48 * i:48 * (i + 1)]
    np.testing.assert_array_equal(m(x), separate)
    assert_close(separate, ref_module(m, x)[0], np.float32, "MultiHeadAttention vs float64 oracle")
