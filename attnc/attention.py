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
from .module import Dropout, Linear, Module


def _spec(projections, *, in_dim, qk_dim, v_dim, out_dim=-1, n_heads=1, heads_axis=False, fused=False,
          dropout=None):
    """The module description attnc._C.self_attention takes (see its docstring).

    projections: the prefixes of the Q, K, V projections (one prefix when
    fused), then the output projection's when out_dim >= 0; dropout: the
    dotted name of the dropout probability, if the module has one."""
    names = tuple(f"{prefix}.{param}" for prefix in projections for param in ("weight", "bias"))
    return names, dropout or "dropout_p", (in_dim, qk_dim, v_dim, out_dim), n_heads, heads_axis, fused


class SelfAttentionV1(Module):
    """000 level 1: separate Q, K, V projections; scale 1/sqrt(hidden_dim)."""

    def __init__(self, hidden_dim=728, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.hidden_dim = positive_int(hidden_dim, "hidden_dim")
        self.Q_proj = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
        self.K_proj = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
        self.V_proj = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
        self._spec = _spec(("Q_proj", "K_proj", "V_proj"), in_dim=hidden_dim, qk_dim=hidden_dim, v_dim=hidden_dim)

    def forward(self, x, *, return_weights=False):
        q, k, v = self.Q_proj, self.K_proj, self.V_proj
        return _C.self_attention(x, params=(q.weight, q.bias, k.weight, k.bias, v.weight, v.bias), spec=self._spec,
                                 dtype=self.dtype, return_weights=return_weights)


class SelfAttentionV2(Module):
    """000 level 2: one fused projection (dim -> 3*dim, split Q, K, V in that
    order; the C layer takes the row blocks in place); scale 1/sqrt(dim)."""

    def __init__(self, dim=728, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.dim = positive_int(dim, "dim")
        self.proj = Linear(dim, dim * 3, dtype=dtype, rng=rng)
        self._spec = _spec(("proj",), in_dim=dim, qk_dim=dim, v_dim=dim, fused=True)

    def forward(self, x, *, return_weights=False):
        return _C.self_attention(x, params=(self.proj.weight, self.proj.bias), spec=self._spec, dtype=self.dtype,
                                 return_weights=return_weights)


class SelfAttentionV3(Module):
    """000 level 3: fused projection, mask, dropout on the weights, output projection."""

    def __init__(self, dim=728, dropout_rate=0.1, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.dim = positive_int(dim, "dim")
        self.proj = Linear(dim, dim * 3, dtype=dtype, rng=rng)
        self.attention_dropout = Dropout(_C.probability(dropout_rate, name="dropout_rate"), dtype=dtype, rng=rng)
        self.output_proj = Linear(dim, dim, dtype=dtype, rng=rng)
        self._spec = _spec(("proj", "output_proj"), in_dim=dim, qk_dim=dim, v_dim=dim, out_dim=dim, fused=True,
                           dropout="attention_dropout.p")

    def forward(self, x, attention_mask=None, *, return_weights=False):
        proj, out = self.proj, self.output_proj
        return _C.self_attention(x, params=(proj.weight, proj.bias, out.weight, out.bias), spec=self._spec,
                                 attention_mask=attention_mask, dtype=self.dtype, dropout_p=self.attention_dropout.p,
                                 training=self.training, rng=self.rng, return_weights=return_weights)


class SelfAttentionV4(Module):
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

    def forward(self, x, attention_mask=None, *, return_weights=False):
        q, k, v = self.query, self.key, self.value
        return _C.self_attention(x, params=(q.weight, q.bias, k.weight, k.bias, v.weight, v.bias), spec=self._spec,
                                 attention_mask=attention_mask, dtype=self.dtype, dropout_p=self.attention_dropout.p,
                                 training=self.training, rng=self.rng, return_weights=return_weights)


SelfAttentionInterview = SelfAttentionV4


class MultiHeadAttention(Module):
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

    def forward(self, x, attention_mask=None, *, return_weights=False):
        q, k, v, out = self.query_linear, self.key_linear, self.value_linear, self.output_linear
        return _C.self_attention(x, params=(q.weight, q.bias, k.weight, k.bias, v.weight, v.bias, out.weight, out.bias),
                                 spec=self._spec, attention_mask=attention_mask, dtype=self.dtype,
                                 dropout_p=self.dropout.p, training=self.training, rng=self.rng,
                                 return_weights=return_weights)


class SelfAttention(Module):
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
        q, k, v = self.linear_q, self.linear_k, self.linear_v
        return _C.self_attention(x, params=(q.weight, q.bias, k.weight, k.bias, v.weight, v.bias), spec=self._spec,
                                 attention_mask=attention_mask, dtype=self.dtype, return_weights=return_weights)


class MultiHeadSelfAttention(Module):
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
        q, k, v = self.linear_q, self.linear_k, self.linear_v
        return _C.self_attention(x, params=(q.weight, q.bias, k.weight, k.bias, v.weight, v.bias), spec=self._spec,
                                 attention_mask=attention_mask, dtype=self.dtype, return_weights=return_weights)
