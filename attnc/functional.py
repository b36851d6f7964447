"""linear, softmax and scaled_dot_product_attention, and their backward
functions: thin over attnc._C, which checks every argument (naming it)
and computes.

Result dtype: the narrowest of float16, bfloat16, float32 and float64
that holds every input's values (x/weight/bias, or query/key/value, or the
gradients and saved outputs a backward takes), in any byte order: float64
if any is float64; float16 or bfloat16 if all floating inputs are that
dtype and none is an integer or bool; else float32. Integer and bool
inputs count as float32, and float16 with bfloat16 gives float32 (neither
holds the other). Mixed inputs promote, never narrow (but longdouble,
which no kernel computes in, is taken as float64). A mask or an
``attn_bias`` never changes the result dtype (it is converted to it), nor
does ``lse`` (``linear``'s ``bias`` is a data input, as listed above).
bfloat16 is ``ml_dtypes.bfloat16`` (``pip install ml_dtypes``); ``import
attnc`` does not import ml_dtypes (asking for "bfloat16" by name does).
Complex, object and string inputs raise TypeError.

float16 and bfloat16 are stored in 16 bits and computed in float32:
products are accumulated, softmax and log-sum-exp taken in float32, and
each result is rounded once to the nearest 16-bit value (ties to even);
``lse`` comes in float32 for them. A 16-bit result is the float32
computation on the widened inputs, rounded. Inputs may be views, non-contiguous, Fortran-ordered,
read-only or byte-swapped; they are never modified, and every result is
a new C-contiguous array.
"""
import numpy as np

from . import _C
from ._blocks import blocks, converted
from ._checks import as_array, flag, integer, is_floating

__all__ = ["linear", "softmax", "scaled_dot_product_attention", "linear_backward", "softmax_backward",
           "scaled_dot_product_attention_backward"]


def linear(x, weight, bias=None):
    """Apply ``x @ weight.T + bias`` over the leading dims of `x`.

    Parameters
    ----------
    x : array_like, shape (..., in_features)
        The input, at least 1-D; bool, integer or floating.
    weight : array_like, shape (out_features, in_features)
        The weight, as ``torch.nn.Linear`` stores it.
    bias : array_like, shape (out_features,), optional
        Added to every row; None (the default) adds nothing.

    Returns
    -------
    ndarray, shape (..., out_features)
        A new array of the result dtype of `x`, `weight` and `bias` (the
        module's dtype rule: float16, bfloat16, float32 or float64).

    Raises
    ------
    ValueError
        If `x` is 0-d or its last dimension is not ``in_features``, if
        `weight` is not 2-D, or if `bias` is not ``(out_features,)``; the
        message names the argument.
    TypeError
        If an input is complex, object or string.

    See Also
    --------
    linear_backward : Its gradients.

    Examples
    --------
    >>> import numpy as np
    >>> from attnc import functional as F
    >>> x = np.arange(6.0).reshape(2, 3)
    >>> weight = np.array([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    >>> F.linear(x, weight, bias=np.array([0.5, -1.0]))
    array([[ 0.5,  2. ],
           [ 3.5, 11. ]])
    """
    return _C.linear(x, weight, bias)


def softmax(x, axis=-1):
    """Softmax along one axis, numerically stable (the maximum is subtracted first).

    Parameters
    ----------
    x : array_like
        Any shape; bool, integer or floating. A 0-d `x` is one row of one
        element.
    axis : int, default -1
        The axis the softmax normalises, in ``[-ndim, ndim)``.

    Returns
    -------
    ndarray
        The shape of `x`; in `x`'s dtype when it is float16, bfloat16 or
        float64, else float32. A row of all ``-inf`` gives NaN, as
        ``torch.softmax``. A value below the dtype's smallest normal
        number may come out 0 where torch's is subnormal.

    Raises
    ------
    ValueError
        If `axis` is out of range.
    TypeError
        If `axis` is not an integer, or `x` is complex, object or string.

    See Also
    --------
    softmax_backward : Its gradient.

    Examples
    --------
    >>> import numpy as np
    >>> from attnc import functional as F
    >>> print(np.round(F.softmax(np.log([[1.0, 2.0, 5.0]])), 6))
    [[0.125 0.25  0.625]]
    >>> print(F.softmax(np.array([1000.0, 1000.0])))
    [0.5 0.5]
    """
    return _C.softmax(x, axis=axis)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 *, rng=None, return_weights=False, return_lse=False, attn_bias=None,
                                 enable_gqa=False, causal_alignment="top_left", window=None, seed=None):
    """Attention: ``softmax(scale * query @ key^T + attn_bias, masked) @ value``.

    Computed by a flash-attention kernel (tiles and an online softmax:
    the ``(L, S)`` weights are only stored when `return_weights` asks for
    them), over broadcast batch dims.

    Parameters
    ----------
    query : array_like, shape (..., L, E)
        L queries of E features; the leading dims of `query`, `key` and
        `value` broadcast against each other (NumPy rules).
    key : array_like, shape (..., S, E)
        S keys.
    value : array_like, shape (..., S, Ev)
        One value per key.
    attn_mask : array_like, optional
        Which keys each query may see, broadcastable to ``(..., L, S)``;
        bool, integer or floating. A position whose value is 0 or False
        gets the score -1e20 (the documents' ``masked_fill(mask == 0,
        -1e20)``: a row masked everywhere attends uniformly); any other
        value, NaN included, keeps it. Not additive: a float score bias
        is `attn_bias`.
    dropout_p : float, default 0.0
        Probability in ``[0, 1]`` of dropping each weight (the rest are
        scaled by ``1/(1 - dropout_p)``); applied whenever > 0 (there is
        no training flag here).
    is_causal : bool, default False
        Hide the keys after each query's aligned diagonal (see Notes).
    scale : float, optional
        Multiplies ``query @ key^T``; finite, and 0 or normal in float32
        (magnitude 1.2e-38 to 3.4e38; in float64 when the result is
        float64). None (the default): ``1/sqrt(E)``.
    rng : numpy.random.Generator, optional
        Draws the dropout `seed` when `seed` is None; None: the package's
        global generator (see ``attnc.manual_seed``).
    return_weights : bool, default False
        Also return the attention weights, before dropout.
    return_lse : bool, default False
        Also return each row's log-sum-exp of its scores, what
        `scaled_dot_product_attention_backward` needs.
    attn_bias : array_like, optional
        Floats broadcastable to ``(..., L, S)``, added to the scaled
        scores (torch's float ``attn_mask``; ``-inf`` hides a key). Its
        dtype never changes the result's.
    enable_gqa : bool, default False
        Grouped-query attention: `query` has H heads on axis -3, `key` and
        `value` Hkv heads dividing H; query head h uses key/value head
        ``h // (H // Hkv)``, as torch. No copy of `key` or `value` is
        made. A mask or bias with a heads axis has H or 1 entries on it.
    causal_alignment : {"top_left", "bottom_right"}, default "top_left"
        Where query i's diagonal is: key ``c = i`` (torch's `is_causal`),
        or ``c = i + S - L`` (the last query sees the last key, as in
        decoding with a KV cache).
    window : tuple (left, right), optional
        Sliding-window attention: query i sees the keys in ``[c - left,
        c + right]``; each side an int >= 0, or None (unbounded). With
        `is_causal`, a `right` above 0 is taken as 0.
    seed : int, optional
        The key of the counter-based dropout mask, in ``[0, 2**64)``; the
        same seed gives the same mask for any thread count. Give it to
        the backward to train through dropout. None: drawn from `rng`.

    Returns
    -------
    out : ndarray, shape (..., L, Ev)
        The attended values, over the broadcast batch dims, in the result
        dtype of `query`, `key` and `value` (the module's dtype rule; so
        are the weights). Alone, or first of the tuple ``(out, weights,
        lse)`` that the ``return_*`` flags select.
    weights : ndarray, shape (..., L, S)
        The weights before dropout; only with ``return_weights=True``.
    lse : ndarray, shape (..., L)
        Each row's log-sum-exp of its scaled, biased, masked scores; only
        with ``return_lse=True``. float32 for float16 and bfloat16 results
        (computed in float32), else the result dtype.

    Raises
    ------
    ValueError
        Naming the argument: `query`, `key` or `value` with fewer than 2
        dims or sizes that do not fit (E, S, the batch dims), `attn_mask`
        or `attn_bias` not broadcastable to ``(..., L, S)``, `dropout_p`
        outside ``[0, 1]``, `scale` not finite or below the normal range
        (see `scale`), `seed` outside ``[0,
        2**64)``, `causal_alignment` not one of the two, a `window` side
        negative; with `enable_gqa`, inputs without a heads axis or head
        counts that do not divide.
    TypeError
        Naming the argument: a complex, object or string input or mask, a
        bool `attn_bias`, a `window` that is not a pair, a `seed` or
        `scale` that is not a number, an `rng` that is not a
        ``numpy.random.Generator``.

    See Also
    --------
    scaled_dot_product_attention_backward : Its gradients.

    Notes
    -----
    The scores, in this order: ``scale * query @ key^T``; plus
    `attn_bias`; `attn_mask`'s 0/False positions set to -1e20; then
    ``-inf`` added to the keys outside the band of `is_causal` and
    `window` (a finite score's weight is then exactly 0; a NaN or inf
    reaches the output, as in PyTorch's math path). Keys outside every
    band of a tile are not computed when the numbers they would meet are
    all finite (the result is then the same). A row left with no key by `attn_bias`, `is_causal` or
    `window` gives weights 0, output 0 and lse ``-inf``, as PyTorch's math
    path; a row masked everywhere by `attn_mask` attends uniformly.

    Mask conventions: `attn_mask` keeps 1/True, as a bool ``attn_mask``
    of ``torch.nn.functional.scaled_dot_product_attention`` does, but a
    hidden key's score is replaced by -1e20 (torch adds -inf), so a NaN
    or inf in a hidden key does not reach the row; torch's float
    ``attn_mask`` is additive, which here is `attn_bias`.
    ``torch.nn.MultiheadAttention``'s bool masks are the other way round
    (True = hidden); see ``attnc.nn.MultiheadAttention``.

    Examples
    --------
    >>> import numpy as np
    >>> from attnc import functional as F
    >>> rng = np.random.default_rng(0)
    >>> query = rng.standard_normal((2, 4, 8))
    >>> key = rng.standard_normal((2, 6, 8))
    >>> value = rng.standard_normal((2, 6, 3))
    >>> out, weights = F.scaled_dot_product_attention(query, key, value, is_causal=True,
    ...                                               return_weights=True)
    >>> out.shape, weights.shape
    ((2, 4, 3), (2, 4, 6))
    >>> print(weights[0, 0])  # causal: the first query sees the first key only
    [1. 0. 0. 0. 0. 0.]

    A mask keeps the keys where it is True (one row here, broadcast to
    every query):

    >>> keep = np.array([True, True, False, True, True, True])
    >>> out, weights = F.scaled_dot_product_attention(query, key, value, attn_mask=keep,
    ...                                               return_weights=True)
    >>> print(weights[..., 2])
    [[0. 0. 0. 0.]
     [0. 0. 0. 0.]]

    float16 (or ``ml_dtypes.bfloat16``) inputs give a result of their
    dtype, computed in float32 and rounded once; lse stays float32:

    >>> half = [a.astype(np.float16) for a in (query, key, value)]
    >>> out, lse = F.scaled_dot_product_attention(*half, return_lse=True)
    >>> out.dtype, lse.dtype
    (dtype('float16'), dtype('float32'))
    """
    grouped = _Grouped(query, key, value, attn_mask, attn_bias) \
        if enable_gqa is not False and flag(enable_gqa, "enable_gqa") else None
    if grouped:
        query, key, value, attn_mask, attn_bias = grouped.inputs
    # positional: parsing a dozen keywords cost 2.6 us a call (a tenth of a small one)
    result = _C.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, rng,
                                             return_weights, return_lse, attn_bias, causal_alignment, window, None,
                                             seed)
    if not grouped:
        return result
    if not isinstance(result, tuple):
        return grouped.merge_heads(result, 2)
    trailing = (2,) + ((2,) if return_weights else ()) + ((1,) if return_lse else ())  # out, weights, lse
    return tuple(grouped.merge_heads(part, n) for part, n in zip(result, trailing))


def scaled_dot_product_attention_backward(grad_out, query, key, value, out, lse, attn_mask=None, is_causal=False,
                                          scale=None, dropout_p=0.0, *, attn_bias=None, enable_gqa=False,
                                          causal_alignment="top_left", window=None, seed=None):
    """The gradients of `scaled_dot_product_attention` with respect to query, key and value.

    Flash-style: the weights are recomputed tile by tile from `lse`,
    never stored (a row whose lse is too large in magnitude for that,
    e.g. masked everywhere or under a large bias, and every row of an
    item of at most 16 queries, whose forward sums its scores in another
    order, from its own maximum and sum, taken from the same scores);
    extra memory is about twice the packed query and gradient rows of the
    items in flight and two numbers a query row, never ``(L, S)``. An input
    broadcast over batch axes (a key and value shared by a group of
    query heads, or a batch of one) gets the sum of the items'
    gradients, added item after item in order through a scratch as
    large as that gradient (or 4 MiB); for 16-bit inputs that call runs
    in float32 (widened copies, float32 gradients rounded at the end).

    Parameters
    ----------
    grad_out : array_like, shape (batch..., L, Ev)
        The gradient with respect to the forward's output; ``batch...``
        is the broadcast batch of `query`, `key` and `value`.
    query : array_like, shape (..., L, E)
        The forward's query.
    key : array_like, shape (..., S, E)
        The forward's key.
    value : array_like, shape (..., S, Ev)
        The forward's value.
    out : array_like, shape (batch..., L, Ev)
        The forward's output.
    lse : array_like, shape (batch..., L)
        The forward's log-sum-exp (``return_lse=True``).
    attn_mask : array_like, optional
        The forward's `attn_mask`.
    is_causal : bool, default False
        The forward's `is_causal`.
    scale : float, optional
        The forward's `scale`.
    dropout_p : float, default 0.0
        The forward's `dropout_p`; when > 0, `seed` is required.
    attn_bias : array_like, optional
        The forward's `attn_bias`.
    enable_gqa : bool, default False
        The forward's `enable_gqa`.
    causal_alignment : {"top_left", "bottom_right"}, default "top_left"
        The forward's `causal_alignment`.
    window : tuple (left, right), optional
        The forward's `window`.
    seed : int, optional
        The forward's dropout seed: the mask is recomputed from it.

    Returns
    -------
    grad_query : ndarray
        The shape of `query`: summed over the batch dims `query` was
        broadcast along, as autograd does (so are the other two); in the
        result dtype of `grad_out`, `query`, `key`, `value` and `out`
        (`lse` never counts; so are the other two).
    grad_key : ndarray
        The shape of `key`; with `enable_gqa` also summed over each group
        of query heads.
    grad_value : ndarray
        The shape of `value`, summed as `grad_key`.

    Raises
    ------
    ValueError
        Naming the argument: `grad_out`, `out` or `lse` of another shape
        than the forward's result; ``dropout_p > 0`` without `seed`; and
        every ValueError of the forward for the same arguments.
    TypeError
        As the forward, for inputs of unsupported types.

    See Also
    --------
    scaled_dot_product_attention : The forward.

    Notes
    -----
    A position masked by `attn_mask` has the constant score -1e20, so it
    passes no gradient to query or key (a fully masked row still passes
    its uniform weights' gradient to value); but a NaN or inf in a hidden
    key, which the forward keeps out of the row, reaches the row's query
    gradient as 0 x NaN, as torch's autograd of ``masked_fill(..., -1e20)``
    does. The tiles outside every band
    of `is_causal` or `window` are not computed. The gradients are
    bit-identical for any thread count.

    Examples
    --------
    >>> import numpy as np
    >>> from attnc import functional as F
    >>> rng = np.random.default_rng(0)
    >>> query = rng.standard_normal((2, 4, 8))
    >>> key = rng.standard_normal((2, 6, 8))
    >>> value = rng.standard_normal((2, 6, 3))
    >>> out, weights, lse = F.scaled_dot_product_attention(
    ...     query, key, value, return_weights=True, return_lse=True)
    >>> grad_out = np.ones_like(out)
    >>> grad_query, grad_key, grad_value = F.scaled_dot_product_attention_backward(
    ...     grad_out, query, key, value, out, lse)
    >>> grad_query.shape, grad_key.shape, grad_value.shape
    ((2, 4, 8), (2, 6, 8), (2, 6, 3))
    >>> np.allclose(grad_value, np.swapaxes(weights, -1, -2) @ grad_out)
    True
    """
    query, key, value = _arrays(query=query, key=key, value=value)
    shapes = [given.shape for given in (query, key, value)]
    grouped = _Grouped(query, key, value, attn_mask, attn_bias) if flag(enable_gqa, "enable_gqa") else None
    if grouped:
        query, key, value, attn_mask, attn_bias = grouped.inputs
        grad_out, out, lse = (grouped.split_result(part, n, name)
                              for part, n, name in ((grad_out, 2, "grad_out"), (out, 2, "out"), (lse, 1, "lse")))
    # An input broadcast over batch axes (or a key/value head shared by a group) gets its
    # gradient summed over them by the C layer, item after item: for 16-bit results, in
    # float32 (the kernel's dtype then), rounded once.
    batch = _broadcast_shape(*(given.shape[:-2] for given in (query, key, value)))
    summed = batch is not None and any(given.shape[:-2] != batch for given in (query, key, value))
    result_dtype = _C.result_dtype(grad_out=grad_out, query=query, key=key, value=value, out=out)
    widened = np.float32 if summed and result_dtype.itemsize == 2 else None
    if widened and attn_bias is not None:  # the bias rounded as the forward rounded it
        bias = as_array(attn_bias, "attn_bias")
        rounded = bias.dtype.kind in "iu" or is_floating(bias.dtype)  # others: the C layer's error
        with np.errstate(over="ignore"):  # (beyond the dtype's range: -inf, as the C layer reads it)
            attn_bias = converted(bias, result_dtype) if rounded else bias
    grads = _C.scaled_dot_product_attention_backward(grad_out, query, key, value, out, lse, attn_mask=attn_mask,
                                                     is_causal=is_causal, scale=scale, dropout_p=dropout_p,
                                                     attn_bias=attn_bias, causal_alignment=causal_alignment,
                                                     window=window, seed=seed, dtype=widened)
    # (reshaped only where the grouped heads' views made another shape: a reshape to the same shape
    # would give views where the C layer's arrays own their data)
    return tuple(_shaped(converted(grad, result_dtype), shape) for grad, shape in zip(grads, shapes))


def _shaped(array, shape):
    """array in `shape`: itself when it has it, else a reshaped view."""
    return array if array.shape == shape else array.reshape(shape)


def _view_with_one_more_axis(array, shape, name):
    """array.reshape(shape), shape having one axis more than array: ValueError
    naming `name` where that is more axes than NumPy allows."""
    try:
        return array.reshape(shape)
    except ValueError as error:
        raise ValueError(f"{name}: enable_gqa views it with its heads axis split in two, {array.ndim + 1} axes: "
                         f"{error}") from error


class _Grouped:
    """Grouped-query attention as broadcasting: query (..., H, L, E) viewed
    as (..., Hkv, H // Hkv, L, E), key and value (..., Hkv, S, E) as
    (..., Hkv, 1, S, E), masks and biases with a heads axis split alike;
    results merged back to H heads. Views only: nothing is copied."""

    def __init__(self, query, key, value, attn_mask, attn_bias):
        query, key, value = _arrays(query=query, key=key, value=value)
        _C.result_dtype(query=query, key=key, value=value)  # an object or complex input: TypeError, as without
        for name, array in (("query", query), ("key", key), ("value", value)):
            if array.ndim < 3:
                raise ValueError(f"{name}: enable_gqa needs a heads axis, (..., heads, seq, dim); got shape "
                                 f"{array.shape}")
        heads, kv_heads = query.shape[-3], key.shape[-3]
        if value.shape[-3] != kv_heads:
            raise ValueError(f"value: expected {kv_heads} heads (as key), got {value.shape[-3]}")
        if heads % kv_heads if kv_heads else heads:  # no heads of either: a zero-size batch, an empty result
            raise ValueError(f"key: {kv_heads} key/value heads do not divide the query's {heads} heads")
        self.heads, self.kv_heads, self.group = heads, kv_heads, heads // kv_heads if kv_heads else 1
        # the forward's out is (batch, H, L, Ev), lse (batch, H, L)
        batch = _broadcast_shape(query.shape[:-3], key.shape[:-3], value.shape[:-3])
        self.result_shape = None if batch is None else batch + (heads, query.shape[-2], value.shape[-1])
        scores = None if batch is None else batch + (heads, query.shape[-2], key.shape[-2])
        masks = []
        for name, array in (("attn_mask", attn_mask), ("attn_bias", attn_bias)):
            if array is not None:
                array = as_array(array, name)
                if array.ndim >= 3 and array.shape[-3] not in (1, heads):
                    raise ValueError(f"{name}: its heads axis (-3) has {array.shape[-3]} entries; expected 1 or "
                                     f"the query's {heads}")
                # named in the caller's terms here (the C layer would name the grouped view's shapes)
                if scores is not None and (array.ndim > len(scores) or _broadcast_shape(array.shape, scores) != scores):
                    raise ValueError(f"{name}: shape {array.shape} does not broadcast to the scores' shape {scores}")
            masks.append(self.split_heads(array, 2, name) if array is not None and array.ndim >= 3 else array)
        self.inputs = (self.split_heads(query, 2, "query"), self._shared(key, "key"), self._shared(value, "value"),
                       *masks)

    def split_heads(self, array, trailing, name):
        """(..., H, `trailing` dims) -> (..., Hkv, group, ...); a heads axis of 1 (a mask's) -> (..., 1, 1, ...)."""
        axis = array.ndim - 1 - trailing
        if axis < 0:
            return array  # too few dims to have a heads axis: the C layer names the shape error
        heads = (1, 1) if array.shape[axis] == 1 and self.heads != 1 else (self.kv_heads, self.group)
        return _view_with_one_more_axis(array, array.shape[:axis] + heads + array.shape[axis + 1:], name)

    def split_result(self, array, trailing, name):
        """split_heads of a result-shaped argument (grad_out, out, lse), whose heads axis is the query's;
        a shape other than the forward's result is named here, in the caller's terms (the C layer
        would name the grouped view's)."""
        array = as_array(array, name)
        _C.result_dtype(**{name: array})  # (as split_heads' caller)
        axis = array.ndim - 1 - trailing
        if axis >= 0 and array.shape[axis] != self.heads:
            raise ValueError(f"{name}: expected the query's {self.heads} heads on axis {axis - array.ndim}, "
                             f"got shape {array.shape}")
        expected = self.result_shape and self.result_shape[:len(self.result_shape) - 2 + trailing]
        if expected and array.shape != expected:
            raise ValueError(f"{name}: expected shape {expected} (the forward's), got {array.shape}")
        return self.split_heads(array, trailing, name)

    @staticmethod
    def _shared(array, name):
        """(..., Hkv, S, E) -> (..., Hkv, 1, S, E): one key/value head for its group."""
        return _view_with_one_more_axis(array, array.shape[:-2] + (1,) + array.shape[-2:], name)

    def merge_heads(self, array, trailing):
        """(..., Hkv, group, `trailing` dims) -> (..., H, ...): out and weights (2), lse (1)."""
        axis = array.ndim - 2 - trailing
        return array.reshape(array.shape[:axis] + (self.heads,) + array.shape[axis + 2:])


def _broadcast_shape(*shapes):
    """The shape the given shapes broadcast to, or None where they do not (the C layer names
    the input then); any number of axes (np.broadcast_shapes stops at 32)."""
    n = max(map(len, shapes))
    result = []
    for axis in range(n):
        sizes = {shape[axis - n + len(shape)] for shape in shapes if axis - n + len(shape) >= 0} - {1}
        if len(sizes) > 1:
            return None
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def _arrays(**named):
    """Each argument as an array (a value NumPy cannot take is an error naming it)."""
    return tuple(as_array(value, name) for name, value in named.items())


def _result_dtype(named):
    """The dtype rule above for {name: input}, each as an array (a value
    NumPy cannot take is an error naming it)."""
    arrays = dict(zip(named, _arrays(**named)))
    dt = _C.result_dtype(**arrays)
    # C-contiguous arrays of dt (the inputs themselves when they already are)
    return dt, [_C.as_parameter(a, name=name, dtype=dt) for name, a in arrays.items()]


def _widened(array):
    """array in the dtype its arithmetic runs in: float32 for float16 and bfloat16."""
    return array.astype(np.float32) if array.dtype.itemsize == 2 else array


def linear_backward(grad_out, x, weight, need_bias_grad=True):
    """The gradients of `linear` with respect to x, weight and bias.

    Parameters
    ----------
    grad_out : array_like, shape (..., out_features)
        The gradient with respect to the output of ``linear(x, weight,
        bias)``.
    x : array_like, shape (..., in_features)
        The forward's input, with the leading dims of `grad_out`.
    weight : array_like, shape (out_features, in_features)
        The forward's weight.
    need_bias_grad : bool, default True
        Whether to compute the bias gradient.

    Returns
    -------
    grad_x : ndarray, shape (..., in_features)
        ``grad_out @ weight``, in the result dtype of the three inputs
        (as the other two).
    grad_weight : ndarray, shape (out_features, in_features)
        ``grad_out^T @ x`` summed over the leading dims.
    grad_bias : ndarray, shape (out_features,) or None
        `grad_out` summed over the leading dims; None when
        `need_bias_grad` is False.

    Raises
    ------
    ValueError
        If `weight` is not 2-D, the last dimension of `x` is not
        ``in_features``, or `grad_out` is not ``x.shape[:-1] +
        (out_features,)``; the message names the argument.
    TypeError
        If an input is complex, object or string.

    Notes
    -----
    The products run on the GEMM of `linear`: bit for bit the same for
    any thread count.

    Examples
    --------
    >>> import numpy as np
    >>> from attnc import functional as F
    >>> x = np.array([[1.0, 2.0]])
    >>> weight = np.array([[1.0, 0.0], [0.0, 3.0]])
    >>> grad_x, grad_weight, grad_bias = F.linear_backward(np.array([[1.0, 1.0]]), x, weight)
    >>> print(grad_x, grad_bias)
    [[1. 3.]] [1. 1.]
    >>> print(grad_weight)
    [[1. 2.]
     [1. 2.]]
    """
    need_bias_grad = flag(need_bias_grad, "need_bias_grad")  # before any work
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
    grad_bias = _widened(g2).sum(axis=0).astype(dt, copy=False) if need_bias_grad else None
    return grad_x, grad_weight, grad_bias


_SOFTMAX_BACKWARD_BLOCK = 1 << 18  # elements of whole rows a block of softmax_backward takes


def softmax_backward(grad_out, out, axis=-1):
    """The gradient of `softmax` with respect to its input, from its output.

    Computes ``out * (grad_out - sum(grad_out * out, axis))``.

    Parameters
    ----------
    grad_out : array_like
        The gradient with respect to the softmax's output; the shape of
        `out`.
    out : array_like
        The output of ``softmax(x, axis)``.
    axis : int, default -1
        The softmax's axis, in ``[-ndim, ndim)`` (a 0-d `out` is one row
        of one element).

    Returns
    -------
    ndarray
        The shape of `out`, in the result dtype of the two inputs
        (computed in float32 for float16 and bfloat16).

    Raises
    ------
    ValueError
        If `grad_out` and `out` differ in shape, or `axis` is out of
        range.
    TypeError
        If `axis` is not an integer, or an input is complex, object or
        string.

    Examples
    --------
    >>> import numpy as np
    >>> from attnc import functional as F
    >>> out = np.array([0.125, 0.25, 0.625])
    >>> print(F.softmax_backward(np.array([1.0, 0.0, 0.0]), out))
    [ 0.109375 -0.03125  -0.078125]
    """
    dt, (g, y) = _result_dtype({"grad_out": grad_out, "out": out})
    if g.shape != y.shape:
        raise ValueError(f"grad_out: expected the shape of out, {y.shape}, got {g.shape}")
    axis = integer(axis, "axis")
    span = max(y.ndim, 1)
    if not -span <= axis < span:
        raise ValueError(f"axis: {axis} is out of range for an array of {y.ndim} dimensions")
    shape = y.shape
    result = np.empty(shape, dt)
    if y.size == 0:  # (the keepdims sum of an empty row axis would be a full buffer)
        return result
    if y.ndim == 0:  # one row of one element
        g, y, axis = g.reshape(1), y.reshape(1), 0
    rows_of_result = result.reshape(g.shape)  # (a view)
    # Blocks of whole rows, split along the first axis but the softmax's, each
    # computed in temporaries of its size: NumPy's passes over a whole 512 MiB
    # input held Ctrl-C for up to 1.2 s each and made a temporary of its
    # size. Never split along the last axis (blocks of strided columns took
    # 1.4-2x the time): a 2-d array's softmax along axis 0 is computed whole.
    split = 1 if axis % g.ndim == 0 else 0
    parts = blocks(g.shape, (split,), _SOFTMAX_BACKWARD_BLOCK) if split < g.ndim - 1 else [()]
    for part in parts:
        g_part, y_part = _widened(g[part]), _widened(y[part])
        gy = g_part * y_part
        np.subtract(g_part, gy.sum(axis=axis, keepdims=True), out=gy)
        np.multiply(y_part, gy, out=rows_of_result[part], casting="unsafe")
    return result
