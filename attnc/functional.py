"""linear, softmax and scaled_dot_product_attention: thin over attnc._C.

Result dtype: float64 if any floating input (x/weight/bias, or
query/key/value) is float64, else float32; a mask never changes it.
"""
import math
import operator

from . import _C
from ._checks import as_real, finite, probability, result_dtype
from ._random import check_rng, draw_seed


def linear(x, weight, bias=None):
    """x @ weight.T + bias over any leading dims of x; weight (out, in)."""
    x, weight = as_real(x, "x"), as_real(weight, "weight")
    bias = None if bias is None else as_real(bias, "bias")
    return _C.linear(x, weight, bias, result_dtype(x, weight, bias))


def softmax(x, axis=-1):
    """Numerically stable softmax (the row maximum is subtracted first)."""
    x = as_real(x, "x")
    axis = operator.index(axis)
    span = max(x.ndim, 1)  # a 0-d array is one row of one element
    if not -span <= axis < span:
        raise ValueError(f"axis: {axis} is out of range for an array of {x.ndim} dimensions")
    return _C.softmax(x, axis, result_dtype(x))


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 *, rng=None, return_weights=False):
    """softmax(query @ key^T * scale, masked) @ value over broadcast batch dims.

    attn_mask: broadcastable to (..., L, S); 0/False positions get -1e20
    (the documents' masked_fill), anything else is kept. is_causal: keys
    j > i are excluded (weight exactly 0), together with attn_mask.
    Returns (..., L, Ev), or (out, weights) with the pre-dropout weights.
    """
    query, key, value = as_real(query, "query"), as_real(key, "key"), as_real(value, "value")
    dropout_p = probability(dropout_p, "dropout_p")
    check_rng(rng)
    if scale is None:
        head_size = query.shape[-1] if query.ndim else 0
        scale = 1 / math.sqrt(head_size) if head_size else 1.0
    scale = finite(scale, "scale")
    seed = draw_seed(rng) if dropout_p > 0 else 0
    return _C.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, bool(is_causal), scale,
                                           seed, bool(return_weights), result_dtype(query, key, value))
