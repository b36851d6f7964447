"""attnc.nn.MultiheadAttention: torch.nn.MultiheadAttention for NumPy arrays.

Same constructor, parameters (names, shapes, initialisation, state_dict
order), forward arguments, mask conventions and results as torch's, so a
torch state_dict loads unchanged. The projections run on attnc's linear
and the attention on attnc.functional.scaled_dot_product_attention, the
torch-convention masks turned into one additive score bias; but an
eval-mode self-attention call with no masks (and no appended keys) is the
document modules' one C call, with the same bits.
"""
import math
from typing import NamedTuple

import numpy as np

from . import _C
from ._blocks import blocks, converted, filled
from ._checks import as_array, divides, flag, is_floating, positive_int
from ._docs import shared_docs
from ._random import draw_seed
from .frozen import FrozenMultiheadAttention
from .functional import (_widened, linear, linear_backward, scaled_dot_product_attention,
                         scaled_dot_product_attention_backward)
from .module import Linear, Module, _grad_dtype, _initial_values, _sized_by


_PARAMETERS = ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias", "bias_k",
               "bias_v", "out_proj.weight", "out_proj.bias")


class _Geometry(NamedTuple):
    """The module's sizes and layout flags as a forward read them, once: a
    user may change any between calls (or another thread during one), and
    the backward computes with the forward's."""
    embed_dim: int
    num_heads: int
    head_dim: int
    kdim: int
    vdim: int
    separate: bool  # q_proj_weight, k_proj_weight and v_proj_weight, not in_proj_weight
    batch_first: bool
    zero_attn: bool


def _xavier_uniform(draw, shape, sizes, dtype):
    """torch.nn.init.xavier_uniform_: uniform in +-sqrt(6 / (fan_in + fan_out)),
    as an array of `dtype`; `sizes`: the constructor's arguments that size it
    (_initial_values)."""
    def uniform(size):  # the bound inside: a size past any float fails as a shape does (_initial_values)
        receptive = math.prod(shape[2:])
        bound = math.sqrt(6.0 / (shape[1] * receptive + shape[0] * receptive))
        return draw.uniform(-bound, bound, size)

    return _initial_values(uniform, shape, sizes, dtype)


def _xavier_normal(draw, shape, sizes, dtype):
    """torch.nn.init.xavier_normal_: normal with std sqrt(2 / (fan_in + fan_out))."""
    def normal(size):  # the scale inside, as _xavier_uniform's bound
        receptive = math.prod(shape[2:])
        std = math.sqrt(2.0 / (shape[1] * receptive + shape[0] * receptive))
        return draw.normal(0.0, std, size)

    return _initial_values(normal, shape, sizes, dtype)


@shared_docs
class MultiheadAttention(Module):
    """Multi-head attention with torch.nn.MultiheadAttention's API, for NumPy arrays.

    ``num_heads`` heads of ``embed_dim // num_heads`` features attend from
    a query sequence over a key/value sequence, then an output projection.
    Same constructor, parameters (names, shapes, initialisation,
    state_dict order), forward arguments, mask conventions and results as
    torch's, so a torch state_dict loads unchanged.

    Call it as ``mha(query, key, value, key_padding_mask=None,
    need_weights=True, attn_mask=None, average_attn_weights=True,
    is_causal=False)``: `query` ``(L, N, E)``, `key` ``(S, N, kdim)``,
    `value` ``(S, N, vdim)`` (``(N, L, E)``... with `batch_first`; ``(L,
    E)``... unbatched) give ``(attn_output, attn_weights)``: ``(L, N, E)``
    and ``(N, L, S)`` averaged over the heads (None without `need_weights`).
    Masks follow torch: `key_padding_mask` ``(N, S)``, `attn_mask` ``(L,
    S)`` or ``(N * num_heads, L, S)``, True hides a key. See `forward`.

    Parameters
    ----------
    embed_dim : int
        E, the feature size of the query and of the output; >= 1.
    num_heads : int
        The number of heads; >= 1 and divides `embed_dim`.
    dropout : float, default 0.0
        {dropout_probability}
    bias : bool, default True
        Whether the input and output projections have biases.
    add_bias_kv : bool, default False
        Learn `bias_k` and `bias_v`, appended as one more key and value.
    add_zero_attn : bool, default False
        Append a zero key and value per head (after `bias_k`/`bias_v`).
    kdim : int, optional
        The feature size of the key; None: `embed_dim`.
    vdim : int, optional
        The feature size of the value; None: `embed_dim`.
    batch_first : bool, default False
        True: inputs and outputs are ``(N, L, E)``; False: ``(L, N, E)``,
        as torch.
    {dtype}
    {rng_with_dropout}

    Attributes
    ----------
    in_proj_weight : ndarray, shape (3 * embed_dim, embed_dim), or None
        The stacked Q, K, V projection weights when ``kdim == vdim ==
        embed_dim``, else None.
    q_proj_weight, k_proj_weight, v_proj_weight : ndarray or None
        ``(E, E)``, ``(E, kdim)``, ``(E, vdim)`` when `kdim` or `vdim`
        differs from `embed_dim`, else None.
    in_proj_bias : ndarray, shape (3 * embed_dim,), or None
        With `bias`.
    bias_k, bias_v : ndarray, shape (1, 1, embed_dim), or None
        With `add_bias_kv`.
    out_proj : Linear
        ``embed_dim -> embed_dim``, with a bias when `bias`.
    head_dim : int
        ``embed_dim // num_heads``.

    Raises
    ------
    ValueError
        If `embed_dim`, `num_heads`, `kdim` or `vdim` is < 1,
        `num_heads` does not divide `embed_dim`, or `dropout` is outside
        ``[0, 1]``; the message names the argument.
    TypeError
        If a size is not an integer, `dropout` is not a number, `dtype`
        is not float16, bfloat16 (with ml_dtypes), float32 or float64, or
        `rng` is neither a ``numpy.random.Generator`` nor None.

    See Also
    --------
    attnc.MultiHeadAttention : Document 001's multi-head self-attention
        (one input; 1/True in a mask keeps a key).

    Notes
    -----
    Initialisation as torch's: ``xavier_uniform_`` for the projection
    weights, zeros for `in_proj_bias` and ``out_proj.bias``,
    ``xavier_normal_`` for `bias_k` and `bias_v`, ``torch.nn.Linear``'s
    for ``out_proj.weight``; drawn from `rng`.

    Mask convention, torch's: a bool mask's True hides a key (the
    opposite of the documents' classes, where 1/True keeps it); a float
    mask is added to the scores.

    {starts_in_training}
    It computes in its own dtype: float64 inputs to a float32 module give
    float32 outputs.

    Examples
    --------
    >>> import numpy as np
    >>> import attnc
    >>> rng = np.random.default_rng(0)
    >>> mha = attnc.nn.MultiheadAttention(8, num_heads=2, batch_first=True, rng=rng).eval()
    >>> list(mha.state_dict())
    ['in_proj_weight', 'in_proj_bias', 'out_proj.weight', 'out_proj.bias']
    >>> x = rng.normal(size=(3, 5, 8))  # (N, L, E) with batch_first
    >>> padding = np.zeros((3, 5), dtype=bool)
    >>> padding[2, 3:] = True  # True: item 2's keys 3 and 4 are padding
    >>> output, weights = mha(x, x, x, key_padding_mask=padding)
    >>> output.shape, weights.shape
    ((3, 5, 8), (3, 5, 5))
    >>> print(weights[2, 0, 3:])
    [0. 0.]
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.embed_dim = positive_int(embed_dim, "embed_dim")
        self.num_heads = positive_int(num_heads, "num_heads")
        divides(self.num_heads, self.embed_dim, "num_heads", "embed_dim")
        self.head_dim = self.embed_dim // self.num_heads
        self.kdim = self.embed_dim if kdim is None else positive_int(kdim, "kdim")
        self.vdim = self.embed_dim if vdim is None else positive_int(vdim, "vdim")
        bias, add_bias_kv = flag(bias, "bias"), flag(add_bias_kv, "add_bias_kv")
        self._qkv_same_embed_dim = self.kdim == self.embed_dim and self.vdim == self.embed_dim
        self.dropout = _C.probability(dropout, name="dropout")
        self.batch_first = batch_first
        self.add_zero_attn = add_zero_attn
        e = self.embed_dim
        draw = self._generator()
        if self._qkv_same_embed_dim:
            self.register_parameter("in_proj_weight", _xavier_uniform(draw, (3 * e, e), "embed_dim", self.dtype))
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            for name, columns, sizes in (("q", e, "embed_dim"), ("k", self.kdim, "embed_dim, kdim"),
                                         ("v", self.vdim, "embed_dim, vdim")):
                self.register_parameter(f"{name}_proj_weight", _xavier_uniform(draw, (e, columns), sizes, self.dtype))
            self.register_parameter("in_proj_weight", None)
        self.register_parameter("in_proj_bias", np.zeros(3 * e) if bias else None)
        with _sized_by("embed_dim"):
            self.out_proj = Linear(e, e, bias=bias, dtype=dtype, rng=rng)
        if bias:
            self.out_proj.bias[...] = 0
        for name in ("bias_k", "bias_v"):
            value = _xavier_normal(draw, (1, 1, e), "embed_dim", self.dtype) if add_bias_kv else None
            self.register_parameter(name, value)

    # A frozen copy's packs of its in_proj_weight and out_proj.weight (FrozenMultiheadAttention)
    _packed = None

    def __setattr__(self, name, value):
        if name in ("batch_first", "add_zero_attn"):  # kept as bools, whenever set
            value = flag(value, name)
        super().__setattr__(name, value)

    def __getstate__(self):
        """As Module's, without a frozen copy's packs (a capsule: freezing
        makes them again)."""
        state = super().__getstate__()
        state.pop("_packed", None)
        return state

    def freeze(self):
        """A frozen copy of this module for inference: `FrozenMultiheadAttention`.

        Its calls take `forward`'s arguments and return this module's
        eval-mode forward as of now, bit for bit; its self-attention calls
        (query, key and value one array, no masks, the stacked
        in_proj_weight) read the projection weights packed once instead of
        at every call. Later edits to this module do not reach it.

        Returns
        -------
        FrozenMultiheadAttention

        Raises
        ------
        TypeError
            If this module's class overrides ``forward`` (or ``__call__``).
        ValueError, TypeError
            If a parameter or size was replaced by a wrong value (naming
            it), as a forward would.
        MemoryError
            If the copies or the packed weights cannot be allocated.

        Examples
        --------
        >>> import numpy as np
        >>> import attnc
        >>> mha = attnc.nn.MultiheadAttention(8, 2, rng=np.random.default_rng(0))
        >>> x = np.random.default_rng(1).normal(size=(3, 2, 8))  # (L, N, E)
        >>> out, weights = mha.freeze()(x, x, x)
        >>> bool(np.array_equal(out, mha.eval()(x, x, x)[0]))
        True
        """
        return FrozenMultiheadAttention(self)

    # -- forward ---------------------------------------------------------------
    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        """Attend from `query` over `key` and `value`, as torch.nn.MultiheadAttention.

        In training mode the weights are dropped with probability
        `dropout` (the mask drawn from the module's `rng`), and the forward
        keeps what `backward` needs: private copies of query, key and
        value (one for inputs given as the same object), their
        projections, the attention output and row log-sum-exps, the score
        bias and the dropout seed (never the ``(L, S)`` weights). An
        eval-mode forward keeps nothing.

        Parameters
        ----------
        query : array_like, shape (L, N, E)
            ``(N, L, E)`` with `batch_first`; ``(L, E)`` unbatched. Bool,
            integer or floating; converted to the module dtype.
        key : array_like, shape (S, N, kdim)
            ``(N, S, kdim)`` with `batch_first`; ``(S, kdim)`` unbatched.
        value : array_like, shape (S, N, vdim)
            ``(N, S, vdim)`` with `batch_first`; ``(S, vdim)`` unbatched.
        key_padding_mask : array_like, shape (N, S), optional
            ``(S,)`` unbatched. Bool (True: the key is padding, hidden) or
            floating (added to the scores of that key).
        need_weights : bool, default True
            Also return the attention weights.
        attn_mask : array_like, shape (L, S) or (N * num_heads, L, S), optional
            ``(num_heads, L, S)`` unbatched. Bool (True: the query may not
            see the key) or floating (added to the scores). Summed with
            `key_padding_mask` when both are given.
        average_attn_weights : bool, default True
            Average the returned weights over the heads.
        is_causal : bool, default False
            torch's hint that `attn_mask` is the causal mask; it needs
            `attn_mask`. With ``need_weights=False`` and no
            `key_padding_mask`, the top-left causal mask (key j > query i
            hidden) replaces `attn_mask`; otherwise `attn_mask` is used as
            given, as in torch. Give that causal mask: with another one,
            torch's own paths disagree (its no_grad fast path uses
            `attn_mask`, its other path the causal mask, as attnc here).

        Returns
        -------
        attn_output : ndarray, shape (L, N, E)
            ``(N, L, E)`` with `batch_first`, ``(L, E)`` unbatched; a new
            array in the module dtype (float32 for float64 inputs to a
            float32 module).
        attn_weights : ndarray or None
            With `need_weights`, the weights after dropout, as torch:
            ``(N, L, S')`` averaged over the heads, else ``(N, num_heads,
            L, S')`` (unbatched ``(L, S')``, ``(num_heads, L, S')``), where
            S' is S plus the keys `add_bias_kv` and `add_zero_attn`
            append. None without `need_weights`.

        Raises
        ------
        ValueError
            Naming the argument: an input that is not 2-D or 3-D like
            `query`, a feature size other than E, `kdim` or `vdim`,
            sequence or batch sizes that do not match, a mask of another
            shape, or `is_causal` without `attn_mask`.
        TypeError
            For an input of an unsupported dtype (complex, object,
            string) or an integer mask (its 0/1 meaning would be
            ambiguous).

        Notes
        -----
        A query row whose every key is masked gets weights 0 and an
        attention output of 0 before `out_proj`, as torch's
        ``need_weights=False`` path with autograd on; torch's
        ``need_weights=True`` path, and its inference fast path
        (batch-first, eval mode, under ``torch.no_grad()``), give NaN
        there.

        `add_bias_kv` appends `bias_k` and `bias_v` as one more key and
        value, then `add_zero_attn` a zero key and value per head; the
        masks allow both.

        Examples
        --------
        >>> import numpy as np
        >>> import attnc
        >>> rng = np.random.default_rng(0)
        >>> mha = attnc.nn.MultiheadAttention(8, num_heads=2, rng=rng).eval()
        >>> x = rng.normal(size=(5, 3, 8))  # (L, N, E)
        >>> causal = np.triu(np.ones((5, 5), dtype=bool), k=1)  # True: hidden
        >>> output, weights = mha(x, x, x, attn_mask=causal, average_attn_weights=False)
        >>> output.shape, weights.shape
        ((5, 3, 8), (3, 2, 5, 5))
        >>> print(weights[0, 0, 0])  # the first query sees the first key only
        [1. 0. 0. 0. 0.]
        """
        return self._forward(query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights,
                             is_causal)

    def _forward(self, query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights,
                 is_causal, frozen=None):
        """forward; with `frozen`, a frozen copy's (geometry, given, params),
        read and checked once when it was made, instead of at every call."""
        need_weights, average_attn_weights = flag(need_weights, "need_weights"), flag(average_attn_weights,
                                                                                        "average_attn_weights")
        is_causal = flag(is_causal, "is_causal")
        if frozen is None:
            geometry = self._geometry()
            given, params = self._checked_parameters(geometry)
        else:
            geometry, given, params = frozen
        training = self.training  # read once: another thread may switch the mode
        p = _C.probability(self.dropout, name="dropout") if training else 0.0
        if is_causal and attn_mask is None:
            raise ValueError("is_causal: needs attn_mask (torch's hint); give the causal mask as attn_mask")
        batched, inputs = self._inputs(query, key, value, geometry, keep=training)
        if (not training and query is key and key is value and attn_mask is None and key_padding_mask is None
                and not geometry.separate and params["bias_k"] is None and not geometry.zero_attn):
            return self._self_attention(inputs[0], batched, params, geometry, need_weights, average_attn_weights)
        n, tgt_len, src_len = inputs[0].shape[0], inputs[0].shape[1], inputs[1].shape[1]
        causal = is_causal and key_padding_mask is None and not need_weights
        bias = self._score_bias(None if causal else attn_mask, key_padding_mask, batched, n, tgt_len, src_len,
                                geometry, params)
        q, k, v = self._project(inputs, params, geometry)
        seed = draw_seed(_C.check_rng(self.rng)) if p > 0 else None
        try:
            result = scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal, attn_bias=bias, seed=seed,
                                                  return_weights=need_weights, return_lse=training)
        except (MemoryError, ValueError) as error:
            raise _named_need_weights(error) from None
        out_heads, *rest = result if isinstance(result, tuple) else (result,)
        out = linear(_merge_heads(out_heads), params["out_proj.weight"], params["out_proj.bias"])
        output = _to_layout(out, batched, geometry)
        if training:
            grad_dtypes = (_grad_dtype(key, self.dtype), _grad_dtype(value, self.dtype))
            # the parameters as given, not as computed with: backward converts them again, so that it uses
            # their values at backward time (an in-place edit in between included) whatever their dtype or layout
            state = (inputs, (q, k, v), out_heads, rest[-1], bias, causal, p, seed, given, batched, grad_dtypes,
                     geometry)
            self._keep_for_backward(state, output.shape, query, given)
        if not need_weights:
            return output, None
        weights = rest[0] if p == 0 else _C.dropout(rest[0], p, dtype=rest[0].dtype, seed=seed)  # (the dtype out has)
        return output, _returned_weights(weights, batched, average_attn_weights)

    def _self_attention(self, x, batched, params, geometry, need_weights, average_attn_weights):
        """forward for eval-mode self-attention with no masks (query, key and
        value one object, the stacked in_proj_weight, no bias_k / bias_v or
        zero attention): the document modules' one C call over x (N, L, E),
        the in-projection fused, instead of projection, attention and output
        projection called one by one from Python, with the same bits (each
        product's elements summed in one K order, the attention the same
        kernel's). A frozen copy's call reads the packs of its weights
        (_packed: what freeze_module made of exactly these arrays; None, and
        ignored for any others, otherwise)."""
        weights_and_biases = tuple(params[name] for name in _FUSED_NAMES)
        try:
            result = _C.self_attention(x, weights_and_biases, _fused_spec(geometry), None, self.dtype, 0.0, False,
                                       None, need_weights, None, False, self._packed)
        except (MemoryError, ValueError) as error:
            raise _named_need_weights(error) from None
        out, weights = result if need_weights else (result, None)
        output = _to_layout(out, batched, geometry)
        return output, None if weights is None else _returned_weights(weights, batched, average_attn_weights)

    def _geometry(self):
        """The sizes and flags, read once and checked (a user may have changed
        a size): ValueError or TypeError naming the first that does not fit."""
        e = positive_int(self.embed_dim, "embed_dim")
        heads = positive_int(self.num_heads, "num_heads")
        divides(heads, e, "num_heads", "embed_dim")
        head_dim = self.head_dim
        if head_dim != e // heads:
            raise ValueError(f"num_heads: {heads} heads of embed_dim={e} are {e // heads} "
                             f"wide, but head_dim is {head_dim}")
        kdim, vdim, separate = positive_int(self.kdim, "kdim"), positive_int(self.vdim, "vdim"), \
            not self._qkv_same_embed_dim
        for name, size in (("kdim", kdim), ("vdim", vdim)):
            if not separate and size != e:  # the stacked in_proj_weight projects E features of each
                raise ValueError(f"{name}: the stacked in_proj_weight projects embed_dim={e} features of key "
                                 f"and value, but {name} is {size}")
        return _Geometry(e, heads, head_dim, kdim, vdim, separate, flag(self.batch_first, "batch_first"),
                         flag(self.add_zero_attn, "add_zero_attn"))

    def _checked_parameters(self, geometry):
        """(given, params): the parameters by state_dict key as looked up now
        (a user may have replaced any), and as computed with: each in the
        module dtype (_computed_with: the array itself when it already is
        one), checked against the shapes `geometry` gives. TypeError or
        ValueError naming the first that does not fit."""
        e, separate = geometry.embed_dim, geometry.separate
        given = dict(zip(_PARAMETERS, self._values_of(_PARAMETERS)))
        has_bias_kv = given["bias_k"] is not None or given["bias_v"] is not None
        shapes = {"in_proj_weight": None if separate else (3 * e, e),
                  "q_proj_weight": (e, e) if separate else None,
                  "k_proj_weight": (e, geometry.kdim) if separate else None,
                  "v_proj_weight": (e, geometry.vdim) if separate else None,
                  "in_proj_bias": (3 * e,), "bias_k": (1, 1, e), "bias_v": (1, 1, e),
                  "out_proj.weight": (e, e), "out_proj.bias": (e,)}
        optional = {"in_proj_bias", "out_proj.bias"}
        params = {}
        for name, value in given.items():
            shape = shapes[name]
            if value is None and (shape is None or name in optional or (name.startswith("bias_") and not has_bias_kv)):
                params[name] = None
                continue
            if shape is None:
                raise ValueError(f"{name}: expected None (the module's {'separate' if separate else 'stacked'} "
                                 f"projection weights are used), got shape {np.shape(value)}")
            if value is None:
                raise ValueError(f"{name}: expected shape {shape}, got None")
            params[name] = _computed_with(value, name, self.dtype)
            if params[name].shape != shape:
                raise ValueError(f"{name}: expected shape {shape}, got {params[name].shape}")
        return given, params

    def _inputs(self, query, key, value, geometry, keep):
        """(batched, (query, key, value) batch first, (N, L or S, features),
        in the module dtype): views of the converted inputs, or with `keep`
        private C-contiguous copies for backward. An input given as the same
        object as another is converted (and copied) once."""
        arrays = {}
        for name, x, dim in (("query", query, geometry.embed_dim), ("key", key, geometry.kdim),
                             ("value", value, geometry.vdim)):
            if id(x) not in arrays:
                arrays[id(x)] = _C.as_parameter(x, name=name, dtype=self.dtype)
            a = arrays[id(x)]
            ndim = arrays[id(query)].ndim
            if a.ndim not in (2, 3) or a.ndim != ndim:
                raise ValueError(f"{name}: expected 3 dimensions (batched) or 2 (unbatched), as many as query's "
                                 f"{ndim}; got shape {a.shape}")
            if a.shape[-1] != dim:
                raise ValueError(f"{name}: expected {dim} features last, got shape {a.shape}")
        batched = arrays[id(query)].ndim == 3
        batch_first = {i: _from_layout(a, batched, geometry) for i, a in arrays.items()}
        if keep:
            batch_first = {i: _C.copy(a) for i, a in batch_first.items()}
        q_in, k_in, v_in = (batch_first[id(x)] for x in (query, key, value))
        if k_in.shape[:2] != v_in.shape[:2]:
            raise ValueError(f"value: expected key's batch and sequence sizes {k_in.shape[:2]}, got {v_in.shape[:2]}")
        if q_in.shape[0] != k_in.shape[0]:
            raise ValueError(f"key: expected query's batch size {q_in.shape[0]}, got {k_in.shape[0]}")
        return batched, (q_in, k_in, v_in)

    def _score_bias(self, attn_mask, key_padding_mask, batched, n, tgt_len, src_len, geometry, params):
        """The masks as one additive score bias broadcastable to (N, H, L, S'),
        S' = S plus the appended keys (allowed: bias 0); None without masks.
        Each mask's scores are in the module dtype (bool True -> -inf), then
        summed in it; a value beyond its range (float32's -1e9 in float16, two
        finfo.min summed) is -inf, the key hidden: no overflow warning. Made
        in one pass by blocks of whole rows (_blocks.filled), Ctrl-C taken
        between: whole-array NumPy calls over a (32, 2048, 2048) mask held it
        for 0.9 s."""
        if attn_mask is None and key_padding_mask is None:
            return None
        heads = geometry.num_heads
        masks = []  # in the bias's axes: (L, S) or (N, H, L, S), and (N, 1, 1, S)
        if attn_mask is not None:
            stacked = (n * heads, tgt_len, src_len)
            expected = (f"(L, S) = {(tgt_len, src_len)} or " +
                        (f"(N * num_heads, L, S) = {stacked}" if batched else f"(num_heads, L, S) = {stacked}"))
            mask = self._checked_mask(attn_mask, "attn_mask", ((tgt_len, src_len), stacked), expected)
            masks.append(mask if mask.shape == (tgt_len, src_len) else mask.reshape(n, heads, tgt_len, src_len))
        if key_padding_mask is not None:
            shape = (n, src_len) if batched else (src_len,)
            mask = self._checked_mask(key_padding_mask, "key_padding_mask", (shape,),
                                      f"{shape} ({'(N, S)' if batched else '(S,)'})")
            masks.append(mask.reshape(n, 1, 1, src_len))
        given = np.broadcast(*masks).shape
        extra = (params["bias_k"] is not None) + geometry.zero_attn

        def scores(part):  # a block of the bias (() the whole): the masks' scores summed, then `extra` zeros
            total = None
            for whole in masks:
                block = whole if part == () else np.broadcast_to(whole, given)[part]
                score = np.asarray(np.where(block, -np.inf, 0.0) if block.dtype.kind == "b" else block, self.dtype)
                total = score if total is None else total + score
            if not extra:
                return total
            return np.concatenate([total, np.zeros(total.shape[:-1] + (extra,), self.dtype)], axis=-1)

        with np.errstate(over="ignore"):
            return filled(given[:-1] + (src_len + extra,), self.dtype, scores, axes=range(len(given) - 1))

    def _checked_mask(self, mask, name, shapes, expected):
        """A torch-convention mask (bool True: not allowed; floats: added to
        the scores) as an array; TypeError for another dtype, ValueError
        (`expected`) for a shape not in `shapes`, both before anything is
        converted (a wrong, broadcast one of 2**40 elements raised NumPy's
        MemoryError)."""
        mask = as_array(mask, name)
        if mask.dtype.kind != "b" and not is_floating(mask.dtype):
            raise TypeError(f"{name}: expected a bool mask (True: not allowed) or a floating one (added to the "
                            f"scores), got dtype {mask.dtype}")
        if mask.shape not in shapes:
            raise ValueError(f"{name}: expected shape {expected}, got {mask.shape}")
        return mask

    def _project(self, inputs, params, geometry):
        """The Q, K, V projections of the batch-first inputs split into heads,
        (N, H, L or S', head_dim), with bias_k / bias_v and then the zero key /
        value appended after the S keys / values."""
        e = geometry.embed_dim
        q, k, v = _projections(inputs, params, geometry)
        n = q.shape[0]
        keys, values = [k], [v]
        if params["bias_k"] is not None:
            keys.append(np.broadcast_to(params["bias_k"], (n, 1, e)))
            values.append(np.broadcast_to(params["bias_v"], (n, 1, e)))
        if geometry.zero_attn:
            keys.append(np.zeros((n, 1, e), self.dtype))
            values.append(np.zeros((n, 1, e), self.dtype))
        if len(keys) > 1:
            k, v = np.concatenate(keys, axis=1), np.concatenate(values, axis=1)
        return tuple(_split_heads(t, geometry) for t in (q, k, v))

    # -- backward --------------------------------------------------------------
    def backward(self, grad_output):
        """The gradients with respect to query, key and value of the last training-mode forward.

        Every parameter's gradient (`in_proj_weight` or
        `q_proj_weight`/`k_proj_weight`/`v_proj_weight`, `in_proj_bias`,
        `bias_k`, `bias_v`, ``out_proj.weight``, ``out_proj.bias``) is added
        into its buffer (see `named_grads`), as torch accumulates
        ``.grad``. The dropout mask is the forward's (recomputed from its
        seed). One backward per forward.

        Parameters
        ----------
        grad_output : array_like
            The gradient with respect to the forward's `attn_output` (its
            shape); converted to the module dtype. The `attn_weights` are
            not differentiated.

        Returns
        -------
        grad_query, grad_key, grad_value : ndarray
            Always three arrays, each of its input's shape and dtype (the
            input's own when it was a floating array of 16 bits or more,
            as torch's ``.grad``, else the module's). For self-attention,
            ``mha(x, x, x)``, the gradient with respect to `x` is their
            sum.

        Raises
        ------
        RuntimeError
            Without a training-mode forward, for a second backward of one
            forward, or for a parameter replaced since the forward
            (naming it).
        ValueError
            If `grad_output` does not have the forward output's shape (the
            forward's state stays: a corrected call works).

        Examples
        --------
        >>> import numpy as np
        >>> import attnc
        >>> rng = np.random.default_rng(0)
        >>> mha = attnc.nn.MultiheadAttention(8, num_heads=2, rng=rng)  # training mode
        >>> x = rng.normal(size=(5, 3, 8))
        >>> output, _ = mha(x, x, x, need_weights=False)
        >>> grad_query, grad_key, grad_value = mha.backward(np.ones_like(output))
        >>> grad_x = grad_query + grad_key + grad_value
        >>> grad_x.shape, grad_x.dtype
        ((5, 3, 8), dtype('float64'))
        """
        grad_output = _C.as_parameter(grad_output, name="grad_output", dtype=self.dtype)
        state = self._kept(grad_output)
        (inputs, (q, k, v), out_heads, lse, bias, causal, p, seed, given, batched, grad_dtypes, geometry) = state
        params = {name: None if value is None else _computed_with(value, name, self.dtype)
                  for name, value in given.items()}
        grad_out = _from_layout(grad_output, batched, geometry)
        grad_merged, grad_w_out, grad_b_out = linear_backward(
            grad_out, _merge_heads(out_heads), params["out_proj.weight"],
            need_bias_grad=params["out_proj.bias"] is not None)
        grad_q, grad_k, grad_v = (_merge_heads(g) for g in scaled_dot_product_attention_backward(
            _split_heads(grad_merged, geometry), q, k, v, out_heads, lse, is_causal=causal, dropout_p=p,
            attn_bias=bias, seed=seed))
        src_len = inputs[1].shape[1]
        grads = {}
        if params["bias_k"] is not None:  # the key / value right after the S given ones
            # each item's 16-bit gradient, summed over the batch in float32 (NumPy would add in 16 bits)
            grads["bias_k"] = _widened(grad_k[:, src_len:src_len + 1]).sum(axis=0, keepdims=True).astype(grad_k.dtype)
            grads["bias_v"] = _widened(grad_v[:, src_len:src_len + 1]).sum(axis=0, keepdims=True).astype(grad_v.dtype)
        need_bias = params["in_proj_bias"] is not None
        projected = [linear_backward(g[:, :x.shape[1]], x, w, need_bias_grad=need_bias)  # appended rows dropped
                     for g, x, w in zip((grad_q, grad_k, grad_v), inputs, _in_weights(params, geometry))]
        grad_inputs = [part[0] for part in projected]
        if not geometry.separate:
            grads["in_proj_weight"] = np.concatenate([part[1] for part in projected])
        else:
            grads.update(zip(("q_proj_weight", "k_proj_weight", "v_proj_weight"), (part[1] for part in projected)))
        if need_bias:
            grads["in_proj_bias"] = np.concatenate([part[2] for part in projected])
        grads["out_proj.weight"], grads["out_proj.bias"] = grad_w_out, grad_b_out
        grad_query, grad_key, grad_value = (_to_layout(g, batched, geometry) for g in grad_inputs)
        return (self._finish_backward(state, grads, grad_query), converted(grad_key, grad_dtypes[0]),
                converted(grad_value, grad_dtypes[1]))


def _computed_with(value, name, dtype):
    """A parameter as forward computes with it: the array itself when it is
    an aligned C-contiguous ndarray of `dtype` (read-only too: a frozen
    copy's), else converted as an assignment converts it (as_parameter)."""
    if (type(value) is np.ndarray and value.dtype == dtype and value.flags.c_contiguous
            and value.flags.aligned):
        return value
    return _C.as_parameter(value, name=name, dtype=dtype)


# The parameters of the self-attention path (MultiheadAttention._self_attention), as its C
# module spec names them: the in-projection fused, then the output projection.
_FUSED_NAMES = ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias")


def _fused_spec(geometry):
    """The C module spec of the self-attention path (and of a frozen copy's
    packs): _FUSED_NAMES, E wide everywhere, a heads axis in the weights; a
    row of -inf scores gives 0, as the module's other paths (not nan_rows)."""
    e = geometry.embed_dim
    return _FUSED_NAMES, "dropout", (e, e, e, e), geometry.num_heads, True, True, False


def _named_need_weights(error):
    """A MemoryError or ValueError (a size past NumPy's, as of a zero-size
    batch whose weights would be too big) raised by a forward's attention,
    as forward raises it: for the attention weights, which the kernels name
    return_weights, one of its type naming the caller's need_weights; any
    other as it is."""
    message = str(error)
    if not message.startswith("return_weights:"):
        return error
    return type(error)("need_weights" + message[len("return_weights"):])


_HEAD_MEAN_BLOCK = 1 << 18  # elements of the weights a block of _head_mean reads


def _head_mean(weights):
    """The attention weights (N, H, L, S) averaged over the heads, (N, L, S)
    in their dtype (in float32 for 16-bit weights: NumPy's bfloat16 mean
    adds in bfloat16), by blocks of about _HEAD_MEAN_BLOCK elements (whole
    items, else rows of one), Python asking for Ctrl-C between them: one
    NumPy mean of 512 MiB of weights, the GIL held, had kept it waiting 0.25
    s. Each element is the same in-order sum over the heads, divided by H,
    as in one mean of all."""
    n, _, length, keys = weights.shape
    averaged = np.empty((n, length, keys), weights.dtype)
    for part in blocks(weights.shape, (0, 2), _HEAD_MEAN_BLOCK):  # (the heads always whole)
        averaged[part[:1] + part[2:]] = _widened(weights[part]).mean(axis=-3)
    return averaged


def _returned_weights(weights, batched, average):
    """The attention weights (N, H, L, S) as forward returns them: averaged
    over the heads with `average` (_head_mean), the batch axis dropped
    unbatched."""
    if average:
        weights = _head_mean(weights)
    return weights if batched else weights[0].copy()  # (a copy that owns its data, not a view: API.md)


def _in_weights(params, geometry):
    """The Q, K, V projection weights of `params`: row blocks of in_proj_weight, or the three."""
    if not geometry.separate:
        e = geometry.embed_dim
        return tuple(params["in_proj_weight"][i * e:(i + 1) * e] for i in range(3))
    return tuple(params[name] for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"))


def _projections(inputs, params, geometry):
    """query, key and value (N, L or S, E) projected, each by its rows of
    the weights. Consecutive projections of one input (self-attention's
    three, or key and value of one memory) through the stacked
    in_proj_weight run as one product, whose outputs are column views of
    it: one call instead of two or three (the input converted once, the
    threads given a wider product), and the same bits, since every output
    element is the same K-order sum in any product."""
    e = geometry.embed_dim
    weights = _in_weights(params, geometry)
    projected, first = [], 0
    while first < 3:
        end = first + 1
        while not geometry.separate and end < 3 and inputs[end] is inputs[first]:
            end += 1
        weight = weights[first] if end - first == 1 else params["in_proj_weight"][first * e:end * e]
        bias = None if params["in_proj_bias"] is None else params["in_proj_bias"][first * e:end * e]
        out = linear(inputs[first], weight, bias)
        projected += [out[..., i * e:(i + 1) * e] for i in range(end - first)]
        first = end
    return projected


def _split_heads(t, geometry):
    """(N, T, E) -> (N, H, T, head_dim), a view."""
    n, length, _ = t.shape
    return t.reshape(n, length, geometry.num_heads, geometry.head_dim).swapaxes(1, 2)


def _merge_heads(t):
    """(N, H, T, head_dim) -> (N, T, H * head_dim), a C-contiguous copy (made
    a block at a time, Ctrl-C asked between: _C.copy)."""
    n, heads, length, head_dim = t.shape
    return _C.copy(t.swapaxes(1, 2)).reshape(n, length, heads * head_dim)


def _to_layout(t, batched, geometry):
    """(N, T, E) -> the caller's layout: (T, N, E), (N, T, E) or (T, E), in
    an array of its own (API.md: results own their data), copied unless it
    is t itself (t[0], and the swap of an N of 1, would be views; _C.copy:
    a block at a time, Ctrl-C asked between)."""
    if batched and geometry.batch_first:
        return t
    return _C.copy(t.swapaxes(0, 1) if batched else t[0])


def _from_layout(t, batched, geometry):
    """The caller's layout -> (N, T, E), a view."""
    if not batched:
        return t[np.newaxis]
    return t if geometry.batch_first else t.swapaxes(0, 1)
