"""The documents' attention classes, each a few lines over one C call.

Parameter names follow the documents, so state_dicts move between a
document's torch class and its attnc twin unchanged.

Each forward hands its parameters to attnc._C.self_attention with the
module's `_spec`, built once here at construction: the parameters' names
(their state_dict keys, for error messages) and the sizes they must have.
The binding checks every parameter against it at each call (so a parameter
resized or replaced after construction gives an error naming it, never a
crash) and scales by 1/sqrt(Q's columns per head), which is each document's
scale; attributes such as `head_dim` are informational only.
"""
import functools
import math

import numpy as np

from . import _C
from ._checks import as_array, divides, positive_int
from ._docs import shared_docs
from .frozen import FrozenAttention
from .module import Dropout, Linear, Module, _replaced_method, _sized_by


def _private_copy(array):
    """A copy of `array` no caller can change, no larger than its own data:
    each broadcast (zero-stride) axis copied once and broadcast back (a
    read-only view of the copy)."""
    if 0 not in array.strides:
        return _C.copy(array)
    once = tuple(slice(0, 1) if stride == 0 and size > 1 else slice(None)
                 for size, stride in zip(array.shape, array.strides))
    return np.broadcast_to(_C.copy(array[once]), array.shape)


def _spec(projections, *, in_dim, qk_dim, v_dim, out_dim=-1, n_heads=1, heads_axis=False, fused=False,
          dropout=None):
    """The module description attnc._C.self_attention takes (see its docstring).

    projections: the prefixes of the Q, K, V projections (one prefix when
    fused), then the output projection's when out_dim >= 0; dropout: the
    dotted name of the dropout probability, if the module has one. The
    last element, nan_rows: a row of -inf scores gives NaN weights and
    output, as the documents' torch.softmax does."""
    names = tuple(f"{prefix}.{param}" for prefix in projections for param in ("weight", "bias"))
    return names, dropout or "dropout_p", (in_dim, qk_dim, v_dim, out_dim), n_heads, heads_axis, fused, True


@functools.lru_cache(maxsize=64)
def _projection_names(parameter_names):
    """The projections' names (the submodules) in a spec's dotted parameter names."""
    return tuple(dict.fromkeys(name.split(".")[0] for name in parameter_names))


_WHAT_IS_READ = {Linear: "weight and bias", Dropout: "p and mode"}


def _check_computes_as(name, module, base):
    """TypeError naming `name` unless `module` computes as `base` (attnc's Linear
    or Dropout) does. The attention modules read a projection's weight and bias
    and a dropout's p and mode, and never call them, so another kind of module,
    a subclass overriding forward, __call__ or backward, or a forward or
    backward set on the instance (which torch's document classes would call)
    would be computed as if it were a plain `base`."""
    own = getattr(module, "__dict__", {})  # (the common case first: checked at every forward)
    if type(module) is base and "forward" not in own and "__call__" not in own and "backward" not in own:
        return
    if not isinstance(module, base):
        raise TypeError(f"{name}: expected a {base.__name__}, got {type(module).__name__}")
    replaced = _replaced_method(module, base, ("forward", "__call__", "backward"))
    if replaced:
        raise TypeError(f"{name}: {replaced}, which this module would not call (it reads the {base.__name__}'s "
                        f"{_WHAT_IS_READ[base]}); assign a {base.__name__}")


class _Attention(Module):
    """What the seven attention modules share: the forward as one C call
    over the parameters the spec names, and its backward as another, from
    what a training-mode forward kept (the Q, K, V projections, the merged
    heads, each row's log-sum-exp, the dropout seed; never the (T, T)
    weights)."""

    def _dropout(self):
        """(probability, active): the dropout submodule's p and mode (its own, as torch's)."""
        return 0.0, False

    def _dropout_of(self, child):
        """(p, training) of the Dropout submodule `child`; TypeError naming it
        if it was replaced by another kind of module."""
        dropout = self._modules.get(child)
        if dropout is None:
            self._submodule((child,))  # (names a deleted one)
        _check_computes_as(child, dropout, Dropout)
        return dropout.p, dropout.training

    def __setattr__(self, name, value):
        """A projection takes only a module that computes as Linear does: the
        forward reads a projection's weight and bias and never calls it, so a
        module of another kind, or a Linear subclass with its own forward,
        would be computed as if it were a Linear (checked here, so that a
        refused one leaves the module as it was; a forward or backward set
        on a projection later is found at the next forward)."""
        spec = self.__dict__.get("_spec")  # (None while __init__ assigns the projections)
        if spec is not None and isinstance(value, Module) and name in _projection_names(spec[0]):
            _check_computes_as(name, value, Linear)
        super().__setattr__(name, value)

    def _check_projections(self):
        """TypeError naming a projection that no longer computes as Linear does:
        its class was checked when it was assigned, but a forward or backward
        may have been set on it since."""
        for name in _projection_names(self._spec[0]):
            _check_computes_as(name, self._modules[name], Linear)

    def _attend(self, x, attention_mask=None, return_weights=False):
        params = self._values_of(self._spec[0])  # (first: it names a deleted projection)
        self._check_projections()
        # read once: another thread may switch the modes
        (p, dropout_active), training = self._dropout(), self.training
        if dropout_active:  # a number once, for the forward and its backward alike (an object's __float__ once)
            p = _C.probability(p, self._spec[1])
        if training and attention_mask is not None:  # read once, for the forward and its backward alike
            attention_mask = _private_copy(as_array(attention_mask, "attention_mask"))
        # by position (keywords cost 2.5 us a call): x, params, spec, attention_mask, dtype,
        # dropout_p, training (dropout applied), rng, return_weights, scale, save (state kept)
        result = _C.self_attention(x, params, self._spec, attention_mask, self.dtype, p, dropout_active, self.rng,
                                   return_weights, None, training)
        if not training:
            return result
        result, saved = result
        out = result[0] if return_weights else result
        state = (saved, params, attention_mask, p if dropout_active else 0.0)
        self._keep_for_backward(state, out.shape, x, dict(zip(self._spec[0], params)))
        return result

    def freeze(self):
        """A frozen copy of this module for inference: `FrozenAttention`.

        Its calls return this module's eval-mode forward as of now, bit for
        bit, with the projection weights packed once instead of at every
        call. Later edits to this module do not reach it.

        Returns
        -------
        FrozenAttention

        Raises
        ------
        TypeError
            If this module's class overrides ``forward`` (or ``__call__``).
        AttributeError, TypeError, ValueError
            If a parameter was deleted, replaced by a wrong value or
            resized, or the dropout probability is outside ``[0, 1]``
            (naming it), as a forward would.

        Examples
        --------
        >>> import numpy as np
        >>> import attnc
        >>> net = attnc.SelfAttentionV1(4, rng=np.random.default_rng(0))
        >>> x = np.random.default_rng(1).normal(size=(2, 3, 4))
        >>> bool(np.array_equal(net.freeze()(x), net.eval()(x)))
        True
        """
        return FrozenAttention(self)

    def backward(self, grad_output):
        """The gradient with respect to `x` of the last training-mode forward.

        Also adds every parameter's gradient into its buffer (see
        `named_grads`), as torch accumulates ``.grad``. The dropout mask
        is the forward's (recomputed from its seed). One backward per
        forward; a backward that raised (MemoryError and
        KeyboardInterrupt too) keeps the forward's state, so it can be
        called again.

        Parameters
        ----------
        grad_output : array_like
            The gradient with respect to that forward's output (its
            shape); converted to the module dtype.

        Returns
        -------
        ndarray
            The gradient with respect to the forward's `x`: `x`'s shape,
            and `x`'s dtype when `x` was a floating array of 16 bits or
            more (as torch's ``x.grad``), else the module's.

        Raises
        ------
        RuntimeError
            Without a training-mode forward (an eval-mode forward keeps
            nothing), for a second backward of one forward, or for a
            parameter replaced since the forward (naming it).
        ValueError
            If `grad_output` does not have the forward output's shape.

        Notes
        -----
        Parameters edited in place between the forward and the backward
        are not detected (torch raises there): the backward combines the
        Q, K, V projections and the attention output the forward kept with
        the parameters' values at backward time, so the gradients then
        belong to neither the old values nor the new. The backward is one
        C call (output projection, flash attention backward over the
        heads, projection gradients as GEMMs); it never stores the
        ``(seq, seq)`` weights.

        Examples
        --------
        >>> import numpy as np
        >>> import attnc
        >>> net = attnc.SelfAttentionV1(4, rng=np.random.default_rng(0))
        >>> x = np.random.default_rng(1).normal(size=(2, 3, 4))
        >>> y = net(x)  # training mode: keeps what backward needs
        >>> grad_x = net.backward(np.ones_like(y))
        >>> grad_x.shape, grad_x.dtype
        ((2, 3, 4), dtype('float64'))
        >>> [name for name, grad in net.named_grads()][:2]
        ['Q_proj.weight', 'Q_proj.bias']
        """
        grad_output = _C.as_parameter(grad_output, name="grad_output", dtype=self.dtype)
        state = self._kept(grad_output)
        saved, params, mask, p = state
        grad_x, grad_w, grad_b, grad_w_out, grad_b_out = _C.self_attention_backward(
            grad_output, saved, params=params, spec=self._spec, attention_mask=mask, dtype=self.dtype, dropout_p=p)
        names, _, (_, qk_dim, v_dim, out_dim), _, _, fused, _ = self._spec
        ends = (3 * qk_dim,) if fused else (qk_dim, 2 * qk_dim, 2 * qk_dim + v_dim)
        grads, start = {}, 0
        for part, end in enumerate(ends):  # row blocks of the stacked Q, K, V gradients
            weight, bias = names[2 * part], names[2 * part + 1]
            grads[weight] = grad_w[start:end]
            grads[bias] = grad_b[start:end] if params[2 * part + 1] is not None else None
            start = end
        if out_dim >= 0:
            grads[names[-2]] = grad_w_out
            grads[names[-1]] = grad_b_out if params[-1] is not None else None
        return self._finish_backward(state, grads, grad_x)


@shared_docs
class SelfAttentionV1(_Attention):
    """Self-attention with separate Q, K, V projections (document 000, level 1).

    ``softmax(Q @ K^T / sqrt(hidden_dim)) @ V`` with ``Q = Q_proj(x)``,
    ``K = K_proj(x)``, ``V = V_proj(x)``; no mask, no dropout, no output
    projection. The twin of document 000's ``SelfAttentionv1`` (and 001's
    ``EasyAttentionModule``, 002's ``SelfattentionV1``).

    Call it as ``net(x, return_weights=False)``: `x` ``(..., seq,
    hidden_dim)`` gives the output ``(..., seq, hidden_dim)``, and with
    `return_weights` also the weights ``(..., seq, seq)``; see `forward`.

    Parameters
    ----------
    hidden_dim : int, default 728
        The feature size of `x`, of Q, K, V and of the output; >= 1.
    {dtype}
    {rng}

    Attributes
    ----------
    Q_proj, K_proj, V_proj : Linear
        The projections, ``hidden_dim -> hidden_dim`` with biases
        (state_dict keys ``"Q_proj.weight"``, ``"Q_proj.bias"``, ...).
    hidden_dim : int
        As given.

    Raises
    ------
    ValueError
        If `hidden_dim` is < 1.
    {constructor_type_error}

    Notes
    -----
    {own_dtype}

    Examples
    --------
    >>> import numpy as np
    >>> import attnc
    >>> net = attnc.SelfAttentionV1(hidden_dim=4, rng=np.random.default_rng(0))
    >>> net
    SelfAttentionV1(
      (Q_proj): Linear(in_features=4, out_features=4, bias=True)
      (K_proj): Linear(in_features=4, out_features=4, bias=True)
      (V_proj): Linear(in_features=4, out_features=4, bias=True)
    )
    >>> x = np.random.default_rng(1).normal(size=(3, 2, 4))  # (batch, seq, hidden_dim)
    >>> output, weights = net(x, return_weights=True)
    >>> output.shape, weights.shape, output.dtype
    ((3, 2, 4), (3, 2, 2), dtype('float32'))
    """

    def __init__(self, hidden_dim=728, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.hidden_dim = positive_int(hidden_dim, "hidden_dim")
        with _sized_by("hidden_dim"):
            self.Q_proj = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
            self.K_proj = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
            self.V_proj = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
        self._spec = _spec(("Q_proj", "K_proj", "V_proj"), in_dim=hidden_dim, qk_dim=hidden_dim, v_dim=hidden_dim)

    def forward(self, x, *, return_weights=False):
        """Attend over the sequence axis of `x`.

        {what_forward_keeps}

        Parameters
        ----------
        x : array_like, shape (..., seq, hidden_dim)
            {x_description}
        {return_weights}

        Returns
        -------
        output : ndarray, shape (..., seq, hidden_dim)
            {output_description}
        weights : ndarray, shape (..., seq, seq)
            ``softmax(Q @ K^T / sqrt(hidden_dim))``; only with
            ``return_weights=True``.

        Raises
        ------
        ValueError
            If `x` has fewer than 2 dims or its last dimension is not
            `hidden_dim`.
        TypeError
            If `x` is complex, object or string.
        """
        return self._attend(x, return_weights=return_weights)


@shared_docs
class SelfAttentionV2(_Attention):
    """Self-attention with one fused Q, K, V projection (document 000, level 2).

    ``proj`` maps ``dim -> 3 * dim``, split into Q, K, V in that order (the
    C layer takes the weight's row blocks in place); then
    ``softmax(Q @ K^T / sqrt(dim)) @ V``. The twin of document 000's
    ``SelfAttentionv2`` (and 001's ``AttentionModule``, 002's
    ``SelfattentionV2``).

    Call it as ``net(x, return_weights=False)``: `x` ``(..., seq, dim)``
    gives the output ``(..., seq, dim)``, and with `return_weights` also the
    weights ``(..., seq, seq)``; see `forward`.

    Parameters
    ----------
    dim : int, default 728
        The feature size of `x` and of the output; >= 1.
    {dtype}
    {rng}

    Attributes
    ----------
    proj : Linear
        ``dim -> 3 * dim``, with a bias: rows ``[0, dim)`` give Q,
        ``[dim, 2 dim)`` K, ``[2 dim, 3 dim)`` V.
    dim : int
        As given.

    Raises
    ------
    ValueError
        If `dim` is < 1.
    {constructor_type_error}

    Notes
    -----
    {own_dtype}

    Examples
    --------
    >>> import numpy as np
    >>> import attnc
    >>> net = attnc.SelfAttentionV2(dim=4, rng=np.random.default_rng(0))
    >>> net.proj
    Linear(in_features=4, out_features=12, bias=True)
    >>> x = np.random.default_rng(1).normal(size=(3, 2, 4))  # (batch, seq, dim)
    >>> output, weights = net(x, return_weights=True)
    >>> output.shape, weights.shape
    ((3, 2, 4), (3, 2, 2))
    >>> np.allclose(weights.sum(axis=-1), 1)
    True
    """

    def __init__(self, dim=728, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.dim = positive_int(dim, "dim")
        with _sized_by("dim"):
            self.proj = Linear(dim, dim * 3, dtype=dtype, rng=rng)
        self._spec = _spec(("proj",), in_dim=dim, qk_dim=dim, v_dim=dim, fused=True)

    def forward(self, x, *, return_weights=False):
        """Attend over the sequence axis of `x`.

        {what_forward_keeps}

        Parameters
        ----------
        x : array_like, shape (..., seq, dim)
            {x_description}
        {return_weights}

        Returns
        -------
        output : ndarray, shape (..., seq, dim)
            {output_description}
        weights : ndarray, shape (..., seq, seq)
            ``softmax(Q @ K^T / sqrt(dim))``; only with
            ``return_weights=True``.

        Raises
        ------
        ValueError
            If `x` has fewer than 2 dims or its last dimension is not `dim`.
        TypeError
            If `x` is complex, object or string.
        """
        return self._attend(x, return_weights=return_weights)


@shared_docs
class _MaskedWithDropout(_Attention):
    """Levels 3 and 4 of document 000: one head, a mask, and dropout on the
    weights from the `attention_dropout` submodule."""

    def _dropout(self):
        return self._dropout_of("attention_dropout")

    def forward(self, x, attention_mask=None, *, return_weights=False):
        """Attend over the sequence axis of `x`, with a mask and dropout.

        {dropout_in_training}
        {what_forward_keeps}

        Parameters
        ----------
        x : array_like, shape (..., seq, dim)
            {x_description}
        {attention_mask}
        {return_weights}

        Returns
        -------
        output : ndarray, shape (..., seq, dim)
            {output_description}
        weights : ndarray, shape (..., seq, seq)
            ``softmax(masked(Q @ K^T / sqrt(dim)))`` (before dropout); only
            with ``return_weights=True``.

        Raises
        ------
        ValueError
            If `x` has fewer than 2 dims or its last dimension is not `dim`; or
            if `attention_mask` does not broadcast to the scores' shape.
        TypeError
            If `x` or `attention_mask` is complex, object or string.
        """
        return self._attend(x, attention_mask, return_weights)


@shared_docs
class SelfAttentionV3(_MaskedWithDropout):
    """Self-attention with mask, dropout, output projection (document 000, level 3).

    The fused projection of `SelfAttentionV2`, then the mask, the
    softmax, dropout on the weights, the weighted sum of V and
    ``output_proj``. The twin of document 000's ``SelfAttentionv3`` (and
    001's ``Attention``, 002's ``slefattentionV3``).

    Call it as ``net(x, attention_mask=None, return_weights=False)``: `x`
    ``(..., seq, dim)`` gives the output ``(..., seq, dim)``, and with
    `return_weights` also the weights ``(..., seq, seq)``.
    {mask_summary}

    Parameters
    ----------
    dim : int, default 728
        The feature size of `x` and of the output; >= 1.
    dropout_rate : float, default 0.1
        {dropout_probability}
    {dtype}
    {rng_with_dropout}

    Attributes
    ----------
    proj : Linear
        ``dim -> 3 * dim``, split into Q, K, V in that order.
    attention_dropout : Dropout
        Holds `dropout_rate` as its ``p``.
    output_proj : Linear
        ``dim -> dim``.
    dim : int
        As given.

    Raises
    ------
    ValueError
        If `dim` is < 1, or `dropout_rate` is outside ``[0, 1]``.
    {constructor_type_error}

    Notes
    -----
    {starts_in_training}
    {own_dtype}

    Examples
    --------
    >>> import numpy as np
    >>> import attnc
    >>> net = attnc.SelfAttentionV3(dim=4, rng=np.random.default_rng(0)).eval()
    >>> x = np.random.default_rng(1).normal(size=(2, 3, 4))  # (batch, seq, dim)
    >>> # (batch, 1, seq), broadcast over the queries: item 1's key 2 is padding
    >>> mask = np.array([[1, 1, 1], [1, 1, 0]])[:, None, :]
    >>> output, weights = net(x, mask, return_weights=True)
    >>> output.shape, weights.shape
    ((2, 3, 4), (2, 3, 3))
    >>> print(weights[1, :, 2])
    [0. 0. 0.]
    """

    def __init__(self, dim=728, dropout_rate=0.1, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.dim = positive_int(dim, "dim")
        with _sized_by("dim"):
            self.proj = Linear(dim, dim * 3, dtype=dtype, rng=rng)
            self.attention_dropout = Dropout(_C.probability(dropout_rate, name="dropout_rate"), dtype=dtype, rng=rng)
            self.output_proj = Linear(dim, dim, dtype=dtype, rng=rng)
        self._spec = _spec(("proj", "output_proj"), in_dim=dim, qk_dim=dim, v_dim=dim, out_dim=dim, fused=True,
                           dropout="attention_dropout.p")


@shared_docs
class SelfAttentionV4(_MaskedWithDropout):
    """Self-attention, the interview version (document 000, level 4).

    Separate ``query``, ``key``, ``value`` projections, the mask, the
    softmax and dropout on the weights; no output projection. The twin
    of document 000's ``SelfAttentionInterview``; ``SelfAttentionInterview``
    is this class.

    Call it as ``net(x, attention_mask=None, return_weights=False)``: `x`
    ``(..., seq, dim)`` gives the output ``(..., seq, dim)``, and with
    `return_weights` also the weights ``(..., seq, seq)``.
    {mask_summary}

    Parameters
    ----------
    dim : int, default 728
        The feature size of `x` and of the output; >= 1.
    dropout_rate : float, default 0.1
        {dropout_probability}
    {dtype}
    {rng_with_dropout}

    Attributes
    ----------
    query, key, value : Linear
        The projections, ``dim -> dim`` with biases.
    attention_dropout : Dropout
        Holds `dropout_rate` as its ``p``.
    dim : int
        As given.

    Raises
    ------
    ValueError
        If `dim` is < 1, or `dropout_rate` is outside ``[0, 1]``.
    {constructor_type_error}

    Notes
    -----
    {starts_in_training}
    {own_dtype}

    Examples
    --------
    >>> import numpy as np
    >>> import attnc
    >>> net = attnc.SelfAttentionInterview(4, rng=np.random.default_rng(0)).eval()
    >>> x = np.random.default_rng(1).normal(size=(3, 4, 4))  # (batch, seq, dim)
    >>> causal = np.tril(np.ones((4, 4)))  # query i sees keys 0..i
    >>> output, weights = net(x, causal, return_weights=True)
    >>> output.shape
    (3, 4, 4)
    >>> print(weights[0, 0])
    [1. 0. 0. 0.]
    """

    def __init__(self, dim=728, dropout_rate=0.1, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.dim = positive_int(dim, "dim")
        with _sized_by("dim"):
            self.query = Linear(dim, dim, dtype=dtype, rng=rng)
            self.key = Linear(dim, dim, dtype=dtype, rng=rng)
            self.value = Linear(dim, dim, dtype=dtype, rng=rng)
        self.attention_dropout = Dropout(_C.probability(dropout_rate, name="dropout_rate"), dtype=dtype, rng=rng)
        self._spec = _spec(("query", "key", "value"), in_dim=dim, qk_dim=dim, v_dim=dim,
                           dropout="attention_dropout.p")


SelfAttentionInterview = SelfAttentionV4


@shared_docs
class MultiHeadAttention(_Attention):
    """Multi-head self-attention with an output projection (document 001).

    ``head_num`` heads of ``head_dim = hidden_dim // head_num`` features:
    Q, K, V projections, each split into heads, scaled scores, the mask,
    the softmax, dropout on the weights, the heads' weighted sums of V
    merged back and ``output_linear``. The twin of document 001's
    ``MuitiHeadAttention``; torch's ``nn.MultiheadAttention`` is
    ``attnc.nn.MultiheadAttention``.

    Call it as ``net(x, attention_mask=None, return_weights=False)``: `x`
    ``(..., seq, hidden_dim)`` gives the output ``(..., seq, hidden_dim)``,
    and with `return_weights` also the weights ``(..., head_num, seq,
    seq)``. The mask broadcasts to ``(..., head_num, seq, seq)``: give it a
    heads axis, ``(batch, 1, 1, seq)`` for padded keys, ``(batch, 1, seq,
    seq)`` or ``(seq, seq)``; 1/True keeps a key, 0/False masks it. See
    `forward`.

    Parameters
    ----------
    hidden_dim : int
        The feature size of `x` and of the output; >= 1.
    head_num : int
        The number of heads; >= 1 and divides `hidden_dim`.
    dropout : float, default 0.1
        {dropout_probability}
    {dtype}
    {rng_with_dropout}

    Attributes
    ----------
    query_linear, key_linear, value_linear, output_linear : Linear
        The projections, ``hidden_dim -> hidden_dim`` with biases.
    dropout : Dropout
        Holds the `dropout` probability as its ``p``.
    hidden_dim, head_num : int
        As given.
    head_dim : int
        ``hidden_dim // head_num``.

    Raises
    ------
    ValueError
        If `hidden_dim` or `head_num` is < 1, `head_num` does not divide
        `hidden_dim`, or `dropout` is outside ``[0, 1]``.
    {constructor_type_error}

    See Also
    --------
    attnc.nn.MultiheadAttention : ``torch.nn.MultiheadAttention``'s twin
        (query, key and value inputs; True in a mask hides a key).

    Notes
    -----
    The scores are ``Q @ K^T / sqrt(head_dim)`` per head. Heads are split
    as ``reshape(batch, seq, head_num, head_dim)`` and merged back the
    same way. Mask convention: 1/True keeps a key, 0/False masks it (the
    document's ``masked_fill(mask == 0, -1e20)``), the opposite of
    ``torch.nn.MultiheadAttention``'s bool masks.

    {starts_in_training}
    {own_dtype}

    Examples
    --------
    >>> import numpy as np
    >>> import attnc
    >>> rng = np.random.default_rng(0)
    >>> net = attnc.MultiHeadAttention(hidden_dim=8, head_num=2, rng=rng).eval()
    >>> x = rng.standard_normal((3, 5, 8))  # (batch, seq, hidden_dim)
    >>> # (batch, heads, queries, keys), broadcast over heads and queries
    >>> mask = np.ones((3, 1, 1, 5), dtype=bool)
    >>> mask[2, ..., 3:] = False  # item 2: keys 3 and 4 are padding
    >>> output, weights = net(x, mask, return_weights=True)
    >>> output.shape, weights.shape
    ((3, 5, 8), (3, 2, 5, 5))
    >>> print(weights[2, 0, 0, 3:])
    [0. 0.]
    >>> net(x.astype(np.float64)).dtype  # the module's dtype
    dtype('float32')
    """

    def __init__(self, hidden_dim, head_num, dropout=0.1, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.hidden_dim = positive_int(hidden_dim, "hidden_dim")
        self.head_num = positive_int(head_num, "head_num")
        divides(self.head_num, self.hidden_dim, "head_num", "hidden_dim")
        self.head_dim = self.hidden_dim // self.head_num
        self.dropout = Dropout(_C.probability(dropout, name="dropout"), dtype=dtype, rng=rng)
        with _sized_by("hidden_dim"):
            self.query_linear = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
            self.key_linear = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
            self.value_linear = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
            self.output_linear = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
        self._spec = _spec(("query_linear", "key_linear", "value_linear", "output_linear"), in_dim=hidden_dim,
                           qk_dim=hidden_dim, v_dim=hidden_dim, out_dim=hidden_dim, n_heads=head_num,
                           heads_axis=True, dropout="dropout.p")

    def _dropout(self):
        return self._dropout_of("dropout")

    def forward(self, x, attention_mask=None, *, return_weights=False):
        """Multi-head attention over the sequence axis of `x`, with mask and dropout.

        {dropout_in_training}
        {what_forward_keeps}

        Parameters
        ----------
        x : array_like, shape (..., seq, hidden_dim)
            {x_description}
        attention_mask : array_like, optional
            Which keys each query may attend to, broadcastable (NumPy
            rules) to the scores' shape ``(..., head_num, seq, seq)``; give
            it a heads axis: ``(batch, 1, 1, seq)`` to mask padded keys,
            ``(batch, 1, seq, seq)``, or ``(seq, seq)`` (a ``(batch, 1,
            seq)`` mask would line its batch axis up with the heads).
            {mask_values}
        {return_weights}

        Returns
        -------
        output : ndarray, shape (..., seq, hidden_dim)
            {output_description}
        weights : ndarray, shape (..., head_num, seq, seq)
            Per head, ``softmax(masked(Q @ K^T / sqrt(head_dim)))`` (before
            dropout); only with ``return_weights=True``.

        Raises
        ------
        ValueError
            If `x` has fewer than 2 dims or its last dimension is not
            `hidden_dim`; or if `attention_mask` does not broadcast to the
            scores' shape.
        TypeError
            If `x` or `attention_mask` is complex, object or string.
        """
        return self._attend(x, attention_mask, return_weights)


@shared_docs
class SelfAttention(_Attention):
    """Self-attention with separate key and value sizes (documents 003 and 004).

    ``softmax(Q @ K^T / sqrt(dim_k)) @ V`` with Q and K projected from
    ``dim_in`` to ``dim_k`` and V to ``dim_v``; no dropout, no output
    projection. The twin of the ``SelfAttention`` of documents 003 and
    004 (which take no mask; attnc adds one, as the other documents
    have).

    Call it as ``net(x, attention_mask=None, return_weights=False)``: `x`
    ``(..., seq, dim_in)`` gives the output ``(..., seq, dim_v)``, and with
    `return_weights` also the weights ``(..., seq, seq)``.
    {mask_summary}

    Parameters
    ----------
    dim_in : int
        The feature size of `x`; >= 1.
    dim_k : int
        The size of Q and K; >= 1.
    dim_v : int
        The size of V and of the output; >= 1.
    bias : bool, default False
        Whether the projections have biases (003's have, 004's have not).
    {dtype}
    {rng}

    Attributes
    ----------
    linear_q, linear_k : Linear
        ``dim_in -> dim_k``.
    linear_v : Linear
        ``dim_in -> dim_v``.
    dim_in, dim_k, dim_v : int
        As given.

    Raises
    ------
    ValueError
        If a size is < 1.
    {constructor_type_error}

    Notes
    -----
    {own_dtype}

    Examples
    --------
    >>> import numpy as np
    >>> import attnc
    >>> net = attnc.SelfAttention(dim_in=4, dim_k=6, dim_v=3, rng=np.random.default_rng(0))
    >>> x = np.random.default_rng(1).normal(size=(2, 5, 4))  # (batch, seq, dim_in)
    >>> output, weights = net(x, return_weights=True)
    >>> output.shape, weights.shape
    ((2, 5, 3), (2, 5, 5))
    """

    def __init__(self, dim_in, dim_k, dim_v, bias=False, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.dim_in = positive_int(dim_in, "dim_in")
        self.dim_k = positive_int(dim_k, "dim_k")
        self.dim_v = positive_int(dim_v, "dim_v")
        with _sized_by("dim_in, dim_k, dim_v"):
            self.linear_q = Linear(dim_in, dim_k, bias=bias, dtype=dtype, rng=rng)
            self.linear_k = Linear(dim_in, dim_k, bias=bias, dtype=dtype, rng=rng)
            self.linear_v = Linear(dim_in, dim_v, bias=bias, dtype=dtype, rng=rng)
        self._norm_fact = 1 / math.sqrt(self.dim_k)
        self._spec = _spec(("linear_q", "linear_k", "linear_v"), in_dim=dim_in, qk_dim=dim_k, v_dim=dim_v)

    def forward(self, x, attention_mask=None, *, return_weights=False):
        """Attend over the sequence axis of `x`, with an optional mask.

        {what_forward_keeps}

        Parameters
        ----------
        x : array_like, shape (..., seq, dim_in)
            {x_description}
        {attention_mask}
        {return_weights}

        Returns
        -------
        output : ndarray, shape (..., seq, dim_v)
            {output_description}
        weights : ndarray, shape (..., seq, seq)
            ``softmax(masked(Q @ K^T / sqrt(dim_k)))``; only with
            ``return_weights=True``.

        Raises
        ------
        ValueError
            If `x` has fewer than 2 dims or its last dimension is not `dim_in`;
            or if `attention_mask` does not broadcast to the scores' shape.
        TypeError
            If `x` or `attention_mask` is complex, object or string.
        """
        return self._attend(x, attention_mask, return_weights)


@shared_docs
class MultiHeadSelfAttention(_Attention):
    """Multi-head self-attention, no output projection (documents 003 and 004).

    Q and K are projected to ``dim_k``, V to ``dim_v``, each split into
    ``num_heads`` heads; per head ``softmax(Q @ K^T / sqrt(dim_k //
    num_heads)) @ V``; the heads merged back to ``dim_v``. The twin of the
    ``MultiHeadSelfAttention`` of documents 003 and 004, with their
    errata fixed (003 attends over feature channels and scales by
    ``sqrt(dim_k)``; 004 reshapes with the wrong size).

    Call it as ``net(x, attention_mask=None, return_weights=False)``: `x`
    ``(..., seq, dim_in)`` gives the output ``(..., seq, dim_v)``, and with
    `return_weights` also the weights ``(..., num_heads, seq, seq)``. The
    mask broadcasts to ``(..., num_heads, seq, seq)``: give it a heads axis,
    ``(batch, 1, 1, seq)`` for padded keys, ``(batch, 1, seq, seq)`` or
    ``(seq, seq)``; 1/True keeps a key, 0/False masks it. See `forward`.

    Parameters
    ----------
    dim_in : int
        The feature size of `x`; >= 1.
    dim_k : int
        The size of Q and K over all heads; >= 1, divisible by
        `num_heads`.
    dim_v : int
        The size of V and of the output over all heads; >= 1, divisible
        by `num_heads`.
    num_heads : int, default 8
        The number of heads; >= 1.
    bias : bool, default False
        Whether the projections have biases (003's have, 004's have not).
    {dtype}
    {rng}

    Attributes
    ----------
    linear_q, linear_k : Linear
        ``dim_in -> dim_k``.
    linear_v : Linear
        ``dim_in -> dim_v``.
    dim_in, dim_k, dim_v, num_heads : int
        As given.

    Raises
    ------
    ValueError
        If a size or `num_heads` is < 1, or `num_heads` does not divide
        `dim_k` or `dim_v`.
    {constructor_type_error}

    Notes
    -----
    Heads are split as ``reshape(batch, seq, num_heads, head_size)`` and
    merged back the same way.
    {own_dtype}

    Examples
    --------
    >>> import numpy as np
    >>> import attnc
    >>> net = attnc.MultiHeadSelfAttention(dim_in=4, dim_k=6, dim_v=4, num_heads=2,
    ...                                    rng=np.random.default_rng(0))
    >>> x = np.random.default_rng(1).normal(size=(2, 5, 4))  # (batch, seq, dim_in)
    >>> output, weights = net(x, return_weights=True)
    >>> output.shape, weights.shape
    ((2, 5, 4), (2, 2, 5, 5))
    """

    def __init__(self, dim_in, dim_k, dim_v, num_heads=8, bias=False, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.dim_in = positive_int(dim_in, "dim_in")
        self.dim_k = positive_int(dim_k, "dim_k")
        self.dim_v = positive_int(dim_v, "dim_v")
        self.num_heads = positive_int(num_heads, "num_heads")
        divides(self.num_heads, self.dim_k, "num_heads", "dim_k")
        divides(self.num_heads, self.dim_v, "num_heads", "dim_v")
        with _sized_by("dim_in, dim_k, dim_v"):
            self.linear_q = Linear(dim_in, dim_k, bias=bias, dtype=dtype, rng=rng)
            self.linear_k = Linear(dim_in, dim_k, bias=bias, dtype=dtype, rng=rng)
            self.linear_v = Linear(dim_in, dim_v, bias=bias, dtype=dtype, rng=rng)
        self._norm_fact = 1 / math.sqrt(self.dim_k // self.num_heads)
        self._spec = _spec(("linear_q", "linear_k", "linear_v"), in_dim=dim_in, qk_dim=dim_k, v_dim=dim_v,
                           n_heads=num_heads, heads_axis=True)

    def forward(self, x, attention_mask=None, *, return_weights=False):
        """Multi-head attention over the sequence axis of `x`, with optional mask.

        {what_forward_keeps}

        Parameters
        ----------
        x : array_like, shape (..., seq, dim_in)
            {x_description}
        attention_mask : array_like, optional
            Which keys each query may attend to, broadcastable (NumPy
            rules) to the scores' shape ``(..., num_heads, seq, seq)``; give
            it a heads axis: ``(batch, 1, 1, seq)`` to mask padded keys,
            ``(batch, 1, seq, seq)``, or ``(seq, seq)`` (a ``(batch, 1,
            seq)`` mask would line its batch axis up with the heads).
            {mask_values}
        {return_weights}

        Returns
        -------
        output : ndarray, shape (..., seq, dim_v)
            {output_description}
        weights : ndarray, shape (..., num_heads, seq, seq)
            Per head, ``softmax(masked(Q @ K^T / sqrt(dim_k // num_heads)))``;
            only with ``return_weights=True``.

        Raises
        ------
        ValueError
            If `x` has fewer than 2 dims or its last dimension is not `dim_in`;
            or if `attention_mask` does not broadcast to the scores' shape.
        TypeError
            If `x` or `attention_mask` is complex, object or string.
        """
        return self._attend(x, attention_mask, return_weights)
