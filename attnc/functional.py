"""linear, softmax and scaled_dot_product_attention, and their backward
functions: thin over attnc._C, which checks every argument (naming it)
and computes.

Result dtype: float64 if any floating input (x/weight/bias, or
query/key/value, or the gradients and saved outputs a backward takes) is
float64, else float32; a mask never changes it.
"""
import operator

import numpy as np

from . import _C


def linear(x, weight, bias=None):
    """x @ weight.T + bias over any leading dims of x; weight (out, in)."""
    return _C.linear(x, weight, bias)


def softmax(x, axis=-1):
    """Numerically stable softmax (the row maximum is subtracted first)."""
    return _C.softmax(x, axis=axis)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 *, rng=None, return_weights=False, return_lse=False, attn_bias=None,
                                 enable_gqa=False, causal_alignment="top_left", window=None, seed=None):
    """softmax(query @ key^T * scale + attn_bias, masked) @ value over broadcast batch dims.

    query (..., L, E), key (..., S, E), value (..., S, Ev).
    attn_bias: floats broadcastable to (..., L, S), added to the scaled
    scores (torch's float attn_mask: -inf hides a key).
    attn_mask: broadcastable to (..., L, S); 0/False positions get -1e20
    (the documents' masked_fill: a row masked everywhere attends
    uniformly), anything else is kept.
    is_causal: query i sees keys j <= its aligned diagonal c: c = i
    (causal_alignment "top_left", torch's) or i + S - L ("bottom_right":
    the last query sees the last key, as in decoding with a KV cache).
    window (left, right): query i sees keys in [c - left, c + right] (each
    side an int >= 0, or None: unbounded), sliding-window attention; with
    is_causal too, right is at most 0.
    A row left with no key by attn_bias, is_causal or window gives output
    0 (and lse -inf), as torch's math path.
    enable_gqa: grouped-query attention: query heads H on axis -3, key and
    value heads Hkv dividing H; query head h attends with key/value head
    h // (H // Hkv), as torch. No copy of key or value is made.
    dropout_p > 0 drops weights by a counter-based mask keyed by `seed`
    (an int in [0, 2**64); None: drawn from rng, or the global generator):
    give the same seed to the backward to train through it.
    Returns (..., L, Ev); with return_weights also the pre-dropout weights
    (..., L, S), with return_lse also each row's log-sum-exp of the scaled,
    masked scores (..., L) (what scaled_dot_product_attention_backward
    recomputes the weights from), in the order (out, weights, lse).
    """
    grouped = _Grouped(query, key, value, attn_mask, attn_bias) if enable_gqa else None
    if grouped:
        query, key, value, attn_mask, attn_bias = grouped.inputs
    result = _C.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                             is_causal=is_causal, scale=scale, rng=rng,
                                             return_weights=return_weights, return_lse=return_lse,
                                             attn_bias=attn_bias, causal_alignment=causal_alignment, window=window,
                                             seed=seed)
    if not grouped:
        return result
    if not isinstance(result, tuple):
        return grouped.merge_heads(result, 2)
    trailing = (2,) + ((2,) if return_weights else ()) + ((1,) if return_lse else ())  # out, weights, lse
    return tuple(grouped.merge_heads(part, n) for part, n in zip(result, trailing))


def scaled_dot_product_attention_backward(grad_out, query, key, value, out, lse, attn_mask=None, is_causal=False,
                                          scale=None, dropout_p=0.0, *, attn_bias=None, enable_gqa=False,
                                          causal_alignment="top_left", window=None, seed=None):
    """(grad_query, grad_key, grad_value) of scaled_dot_product_attention,
    given grad_out (the gradient with respect to its output) and that
    forward's out and lse (return_lse=True), with the same query, key,
    value and score arguments (attn_mask, attn_bias, is_causal, scale,
    enable_gqa, causal_alignment, window).

    Flash-style: the weights are recomputed tile by tile from lse, never
    stored (a row whose |lse| is too large for that, e.g. masked everywhere
    or under a large bias, from its recomputed max and sum); extra memory
    is about twice the packed query and gradient rows of the items in
    flight, never (L, S). Each gradient has its
    input's shape, summed over the batch dims the input was broadcast
    along (and over each group of query heads for key and value with
    enable_gqa), as autograd does. A masked position's score is the
    constant -1e20, so it passes no gradient to query or key; the tiles
    outside every band of is_causal or window are not computed. With dropout_p > 0,
    `seed` must be the forward's (the mask is recomputed from it, never
    stored); without it, ValueError.
    """
    shapes = [np.shape(given) for given in (query, key, value)]
    grouped = _Grouped(query, key, value, attn_mask, attn_bias) if enable_gqa else None
    if grouped:
        query, key, value, attn_mask, attn_bias = grouped.inputs
        grad_out, out, lse = (grouped.split_heads(part, n) for part, n in ((grad_out, 2), (out, 2), (lse, 1)))
    grads = _C.scaled_dot_product_attention_backward(grad_out, query, key, value, out, lse, attn_mask=attn_mask,
                                                     is_causal=is_causal, scale=scale, dropout_p=dropout_p,
                                                     attn_bias=attn_bias, causal_alignment=causal_alignment,
                                                     window=window, seed=seed)
    grads = [_sum_to_shape(grad, np.shape(given)) for grad, given in zip(grads, (query, key, value))]
    return tuple(grad.reshape(shape) for grad, shape in zip(grads, shapes))


class _Grouped:
    """Grouped-query attention as broadcasting: query (..., H, L, E) viewed
    as (..., Hkv, H // Hkv, L, E), key and value (..., Hkv, S, E) as
    (..., Hkv, 1, S, E), masks and biases with a heads axis split alike;
    results merged back to H heads. Views only: nothing is copied."""

    def __init__(self, query, key, value, attn_mask, attn_bias):
        query, key, value = (np.asarray(a) for a in (query, key, value))
        for name, array in (("query", query), ("key", key), ("value", value)):
            if array.ndim < 3:
                raise ValueError(f"{name}: enable_gqa needs a heads axis, (..., heads, seq, dim); got shape "
                                 f"{array.shape}")
        heads, kv_heads = query.shape[-3], key.shape[-3]
        if value.shape[-3] != kv_heads:
            raise ValueError(f"value: expected {kv_heads} heads (as key), got {value.shape[-3]}")
        if kv_heads == 0 or heads % kv_heads:
            raise ValueError(f"key: {kv_heads} key/value heads do not divide the query's {heads} heads")
        self.heads, self.kv_heads, self.group = heads, kv_heads, heads // kv_heads
        masks = []
        for name, array in (("attn_mask", attn_mask), ("attn_bias", attn_bias)):
            if array is not None:
                array = np.asarray(array)
                if array.ndim >= 3 and array.shape[-3] not in (1, heads):
                    raise ValueError(f"{name}: its heads axis (-3) has {array.shape[-3]} entries; expected 1 or "
                                     f"the query's {heads}")
            masks.append(self.split_heads(array, 2) if array is not None and array.ndim >= 3 else array)
        self.inputs = (self.split_heads(query, 2), self._shared(key), self._shared(value), *masks)

    def split_heads(self, array, trailing):
        """(..., H, `trailing` dims) -> (..., Hkv, group, ...); a heads axis of 1 (a mask's) -> (..., 1, 1, ...)."""
        array = np.asarray(array)
        axis = array.ndim - 1 - trailing
        if axis < 0:
            return array  # too few dims to have a heads axis: the C layer names the shape error
        heads = (1, 1) if array.shape[axis] == 1 and self.heads != 1 else (self.kv_heads, self.group)
        return array.reshape(array.shape[:axis] + heads + array.shape[axis + 1:])

    @staticmethod
    def _shared(array):
        """(..., Hkv, S, E) -> (..., Hkv, 1, S, E): one key/value head for its group."""
        return array.reshape(array.shape[:-2] + (1,) + array.shape[-2:])

    def merge_heads(self, array, trailing):
        """(..., Hkv, group, `trailing` dims) -> (..., H, ...): out and weights (2), lse (1)."""
        axis = array.ndim - 2 - trailing
        return array.reshape(array.shape[:axis] + (self.heads,) + array.shape[axis + 2:])


def _sum_to_shape(grad, shape):
    """grad (the broadcast batch's gradient) summed down to `shape`."""
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    broadcast = tuple(d for d, size in enumerate(shape) if size == 1 and grad.shape[d] != 1)
    return grad.sum(axis=broadcast, keepdims=True) if broadcast else grad


def _result_dtype(named):
    """The dtype rule above for {name: input}, each as an array (a value
    NumPy cannot take is an error naming it)."""
    arrays = {}
    for name, value in named.items():
        try:
            arrays[name] = np.asarray(value)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{name}: {error}") from error
    wide = any(a.dtype.kind == "f" and a.dtype.itemsize >= 8 for a in arrays.values())
    dt = np.float64 if wide else np.float32
    # C-contiguous arrays of dt (the inputs themselves when they already are)
    return dt, [_C.as_parameter(a, name=name, dtype=dt) for name, a in arrays.items()]


def linear_backward(grad_out, x, weight, need_bias_grad=True):
    """The gradients of linear(x, weight, bias) given grad_out, the gradient
    with respect to its output: (grad_x, grad_weight, grad_bias).

    grad_out (..., out), x (..., in) with the same leading dims, weight
    (out, in). grad_x = grad_out @ weight has x's shape; grad_weight =
    sum over the leading dims of grad_out^T x (out, in); grad_bias = the
    sum of grad_out over the leading dims (out,), or None when
    need_bias_grad is False. The products run on the GEMM of linear (bit
    for bit the same for any thread count). Result dtype as linear's.
    """
    dt, (g, xa, w) = _result_dtype({"grad_out": grad_out, "x": x, "weight": weight})
    if w.ndim != 2:
        raise ValueError(f"weight: expected 2 dimensions (out_features, in_features), got shape {w.shape}")
    n_out, n_in = w.shape
    if xa.ndim < 1 or xa.shape[-1] != n_in:
        raise ValueError(f"x: expected shape (..., {n_in}) (weight's in_features last), got {xa.shape}")
    if g.shape != xa.shape[:-1] + (n_out,):
        raise ValueError(f"grad_out: expected shape {xa.shape[:-1] + (n_out,)} (x's leading dims, weight's "
                         f"out_features), got {g.shape}")
    rows = 1
    for size in xa.shape[:-1]:
        rows *= size
    g2, x2 = g.reshape(rows, n_out), xa.reshape(rows, n_in)
    grad_x = _C.linear(g, w.T, dtype=dt)             # grad_out @ weight, weight read in place
    grad_weight = _C.linear(g2.T, x2.T, dtype=dt)    # grad_out^T @ x over all rows
    grad_bias = g2.sum(axis=0) if need_bias_grad else None
    return grad_x, grad_weight, grad_bias


def softmax_backward(grad_out, out, axis=-1):
    """The gradient of softmax(x, axis) with respect to x, given its output
    `out` and grad_out, the gradient with respect to that output:
    out * (grad_out - sum(grad_out * out, axis)). grad_out and out have the
    same shape; axis is taken as softmax takes it (any integer in
    [-ndim, ndim); a 0-d out is one row of one element).
    Result dtype: float64 if either input is float64, else float32.
    """
    _, (g, y) = _result_dtype({"grad_out": grad_out, "out": out})
    if g.shape != y.shape:
        raise ValueError(f"grad_out: expected the shape of out, {y.shape}, got {g.shape}")
    try:
        axis = operator.index(axis)
    except TypeError as error:
        raise TypeError(f"axis: expected an integer, got {type(axis).__name__}") from error
    span = max(y.ndim, 1)
    if not -span <= axis < span:
        raise ValueError(f"axis: {axis} is out of range for an array of {y.ndim} dimensions")
    shape = y.shape
    if y.ndim == 0:
        g, y, axis = g.reshape(1), y.reshape(1), 0
    gy = g * y
    return (y * (g - gy.sum(axis=axis, keepdims=True))).reshape(shape)
