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
import math

import numpy as np

from . import _C
from ._checks import divides, positive_int
from .module import Dropout, Linear, Module, _detached


def _spec(projections, *, in_dim, qk_dim, v_dim, out_dim=-1, n_heads=1, heads_axis=False, fused=False,
          dropout=None):
    """The module description attnc._C.self_attention takes (see its docstring).

    projections: the prefixes of the Q, K, V projections (one prefix when
    fused), then the output projection's when out_dim >= 0; dropout: the
    dotted name of the dropout probability, if the module has one."""
    names = tuple(f"{prefix}.{param}" for prefix in projections for param in ("weight", "bias"))
    return names, dropout or "dropout_p", (in_dim, qk_dim, v_dim, out_dim), n_heads, heads_axis, fused


class _Attention(Module):
    """What the seven attention modules share: the forward as one C call
    over the parameters the spec names, and its backward as another, from
    what a training-mode forward kept (the Q, K, V projections, the merged
    heads, each row's log-sum-exp, the dropout seed; never the (T, T)
    weights)."""

    def _dropout_p(self):
        return 0.0

    def _attend(self, x, attention_mask=None, return_weights=False):
        params = tuple(getattr(*self._owner_of(key)) for key in self._spec[0])
        p, training = self._dropout_p(), self.training  # read once: another thread may switch the mode
        result = _C.self_attention(x, params=params, spec=self._spec, attention_mask=attention_mask,
                                   dtype=self.dtype, dropout_p=p, training=training, rng=self.rng,
                                   return_weights=return_weights, save=training)
        if not training:
            return result
        result, saved = result
        out = result[0] if return_weights else result
        mask = None if attention_mask is None else np.array(_detached(attention_mask), copy=True)
        self._keep_for_backward((saved, params, mask, p), out.shape, x)
        return result

    def backward(self, grad_output):
        """The gradient with respect to x of the most recent training-mode
        forward (x's shape; x's dtype when x is a floating array, as torch's
        x.grad, else the module's), given grad_output (the gradient with respect to its
        output, converted to the module dtype); every parameter's gradient
        is added into its buffer (named_grads), as torch accumulates .grad.
        The dropout mask is the forward's (recomputed from its seed).
        One backward per forward: RuntimeError without a training-mode
        forward, for a second backward, or for a parameter replaced since
        the forward; ValueError for a grad_output of another shape. A
        backward that raised (MemoryError, KeyboardInterrupt too) keeps the
        forward's state: it can be called again. Parameters edited in place between the two are not detected: the
        backward uses their values at backward time."""
        grad_output = _C.as_parameter(_detached(grad_output), name="grad_output", dtype=self.dtype)
        saved, params, mask, p = self._kept(grad_output)
        names = self._spec[0]
        self._check_unchanged(dict(zip(names, params)))
        grad_x, grad_w, grad_b, grad_w_out, grad_b_out = _C.self_attention_backward(
            grad_output, saved, params=params, spec=self._spec, attention_mask=mask, dtype=self.dtype, dropout_p=p)
        _, qk_dim, v_dim, out_dim = self._spec[2]
        fused = self._spec[5]
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
        self._add_grads(grads)
        return self._release_kept(grad_x)


class SelfAttentionV1(_Attention):
    """000 level 1: separate Q, K, V projections; scale 1/sqrt(hidden_dim)."""

    def __init__(self, hidden_dim=728, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.hidden_dim = positive_int(hidden_dim, "hidden_dim")
        self.Q_proj = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
        self.K_proj = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
        self.V_proj = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
        self._spec = _spec(("Q_proj", "K_proj", "V_proj"), in_dim=hidden_dim, qk_dim=hidden_dim, v_dim=hidden_dim)

    def forward(self, x, *, return_weights=False):
        return self._attend(x, return_weights=return_weights)


class SelfAttentionV2(_Attention):
    """000 level 2: one fused projection (dim -> 3*dim, split Q, K, V in that
    order; the C layer takes the row blocks in place); scale 1/sqrt(dim)."""

    def __init__(self, dim=728, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.dim = positive_int(dim, "dim")
        self.proj = Linear(dim, dim * 3, dtype=dtype, rng=rng)
        self._spec = _spec(("proj",), in_dim=dim, qk_dim=dim, v_dim=dim, fused=True)

    def forward(self, x, *, return_weights=False):
        return self._attend(x, return_weights=return_weights)


class SelfAttentionV3(_Attention):
    """000 level 3: fused projection, mask, dropout on the weights, output projection."""

    def __init__(self, dim=728, dropout_rate=0.1, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.dim = positive_int(dim, "dim")
        self.proj = Linear(dim, dim * 3, dtype=dtype, rng=rng)
        self.attention_dropout = Dropout(_C.probability(dropout_rate, name="dropout_rate"), dtype=dtype, rng=rng)
        self.output_proj = Linear(dim, dim, dtype=dtype, rng=rng)
        self._spec = _spec(("proj", "output_proj"), in_dim=dim, qk_dim=dim, v_dim=dim, out_dim=dim, fused=True,
                           dropout="attention_dropout.p")

    def _dropout_p(self):
        return self.attention_dropout.p

    def forward(self, x, attention_mask=None, *, return_weights=False):
        return self._attend(x, attention_mask, return_weights)


class SelfAttentionV4(_Attention):
    """000 level 4, the interview version: query, key, value, mask, dropout."""

    def __init__(self, dim=728, dropout_rate=0.1, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.dim = positive_int(dim, "dim")
        self.query = Linear(dim, dim, dtype=dtype, rng=rng)
        self.key = Linear(dim, dim, dtype=dtype, rng=rng)
        self.value = Linear(dim, dim, dtype=dtype, rng=rng)
        self.attention_dropout = Dropout(_C.probability(dropout_rate, name="dropout_rate"), dtype=dtype, rng=rng)
        self._spec = _spec(("query", "key", "value"), in_dim=dim, qk_dim=dim, v_dim=dim,
                           dropout="attention_dropout.p")

    def _dropout_p(self):
        return self.attention_dropout.p

    def forward(self, x, attention_mask=None, *, return_weights=False):
        return self._attend(x, attention_mask, return_weights)


SelfAttentionInterview = SelfAttentionV4


class MultiHeadAttention(_Attention):
    """001 MuitiHeadAttention: head_num heads of hidden_dim // head_num,
    dropout on the weights, output projection."""

    def __init__(self, hidden_dim, head_num, dropout=0.1, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.hidden_dim = positive_int(hidden_dim, "hidden_dim")
        self.head_num = positive_int(head_num, "head_num")
        divides(self.head_num, self.hidden_dim, "head_num", "hidden_dim")
        self.head_dim = self.hidden_dim // self.head_num
        self.dropout = Dropout(_C.probability(dropout, name="dropout"), dtype=dtype, rng=rng)
        self.query_linear = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
        self.key_linear = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
        self.value_linear = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
        self.output_linear = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
        self._spec = _spec(("query_linear", "key_linear", "value_linear", "output_linear"), in_dim=hidden_dim,
                           qk_dim=hidden_dim, v_dim=hidden_dim, out_dim=hidden_dim, n_heads=head_num,
                           heads_axis=True, dropout="dropout.p")

    def _dropout_p(self):
        return self.dropout.p

    def forward(self, x, attention_mask=None, *, return_weights=False):
        return self._attend(x, attention_mask, return_weights)


class SelfAttention(_Attention):
    """003/004 SelfAttention: dim_in -> dim_k (Q, K) and dim_v (V); scale 1/sqrt(dim_k)."""

    def __init__(self, dim_in, dim_k, dim_v, bias=False, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.dim_in = positive_int(dim_in, "dim_in")
        self.dim_k = positive_int(dim_k, "dim_k")
        self.dim_v = positive_int(dim_v, "dim_v")
        self.linear_q = Linear(dim_in, dim_k, bias=bias, dtype=dtype, rng=rng)
        self.linear_k = Linear(dim_in, dim_k, bias=bias, dtype=dtype, rng=rng)
        self.linear_v = Linear(dim_in, dim_v, bias=bias, dtype=dtype, rng=rng)
        self._norm_fact = 1 / math.sqrt(self.dim_k)
        self._spec = _spec(("linear_q", "linear_k", "linear_v"), in_dim=dim_in, qk_dim=dim_k, v_dim=dim_v)

    def forward(self, x, attention_mask=None, *, return_weights=False):
        return self._attend(x, attention_mask, return_weights)


class MultiHeadSelfAttention(_Attention):
    """004 MultiHeadSelfAttention (errata fixed): num_heads heads, scale
    1/sqrt(dim_k // num_heads), heads merged back to dim_v, no output projection."""

    def __init__(self, dim_in, dim_k, dim_v, num_heads=8, bias=False, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.dim_in = positive_int(dim_in, "dim_in")
        self.dim_k = positive_int(dim_k, "dim_k")
        self.dim_v = positive_int(dim_v, "dim_v")
        self.num_heads = positive_int(num_heads, "num_heads")
        divides(self.num_heads, self.dim_k, "num_heads", "dim_k")
        divides(self.num_heads, self.dim_v, "num_heads", "dim_v")
        self.linear_q = Linear(dim_in, dim_k, bias=bias, dtype=dtype, rng=rng)
        self.linear_k = Linear(dim_in, dim_k, bias=bias, dtype=dtype, rng=rng)
        self.linear_v = Linear(dim_in, dim_v, bias=bias, dtype=dtype, rng=rng)
        self._norm_fact = 1 / math.sqrt(self.dim_k // self.num_heads)
        self._spec = _spec(("linear_q", "linear_k", "linear_v"), in_dim=dim_in, qk_dim=dim_k, v_dim=dim_v,
                           n_heads=num_heads, heads_axis=True)

    def forward(self, x, attention_mask=None, *, return_weights=False):
        return self._attend(x, attention_mask, return_weights)
