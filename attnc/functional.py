"""linear, softmax and scaled_dot_product_attention: thin over attnc._C,
which checks every argument (naming it) and computes.

Result dtype: float64 if any floating input (x/weight/bias, or
query/key/value) is float64, else float32; a mask never changes it.
"""
from . import _C


def linear(x, weight, bias=None):
    """x @ weight.T + bias over any leading dims of x; weight (out, in)."""
    return _C.linear(x, weight, bias)


def softmax(x, axis=-1):
    """Numerically stable softmax (the row maximum is subtracted first)."""
    return _C.softmax(x, axis=axis)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 *, rng=None, return_weights=False):
    """softmax(query @ key^T * scale, masked) @ value over broadcast batch dims.

    attn_mask: broadcastable to (..., L, S); 0/False positions get -1e20
    (the documents' masked_fill), anything else is kept. is_causal: keys
    j > i are excluded (weight exactly 0), together with attn_mask.
    Returns (..., L, Ev), or (out, weights) with the pre-dropout weights.
    """
    return _C.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                           is_causal=is_causal, scale=scale, rng=rng, return_weights=return_weights)
