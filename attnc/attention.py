"""The documents' attention classes, each a few lines over one C call.

Parameter names follow the documents, so state_dicts move between a
document's torch class and its attnc twin unchanged.
"""
import math

import numpy as np

from . import _C
from ._checks import divides, positive_int, probability
from .module import Dropout, Linear, Module


def _attend(module, x, q, k, v, *, scale, n_heads=1, heads_axis=False, out=None, dropout=None,
            mask=None, return_weights=False):
    """One fused forward: q, k, v (and out) are (weight, bias) pairs."""
    p = dropout.p if dropout is not None and module.training else 0.0
    out_weight, out_bias = out if out is not None else (None, None)
    return _C.self_attention(x, *q, *k, *v, out_weight, out_bias, n_heads, heads_axis, scale, mask, p,
                             module._dropout_seed(p), return_weights)


def _pair(linear):
    return linear.weight, linear.bias


class SelfAttentionV1(Module):
    """000 level 1: separate Q, K, V projections; scale 1/sqrt(hidden_dim)."""

    def __init__(self, hidden_dim=728, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.hidden_dim = positive_int(hidden_dim, "hidden_dim")
        self.Q_proj = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
        self.K_proj = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
        self.V_proj = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)

    def forward(self, x, *, return_weights=False):
        return _attend(self, x, _pair(self.Q_proj), _pair(self.K_proj), _pair(self.V_proj),
                       scale=1 / math.sqrt(self.hidden_dim), return_weights=return_weights)


class _FusedProjection(Module):
    """One (dim -> 3*dim) projection, split Q, K, V in that order: the
    slices are views of the fused weight, so the split costs nothing."""

    def _qkv(self):
        weight, bias, d = self.proj.weight, self.proj.bias, self.dim
        return [(weight[i * d:(i + 1) * d], bias[i * d:(i + 1) * d]) for i in range(3)]


class SelfAttentionV2(_FusedProjection):
    """000 level 2: one fused projection; scale 1/sqrt(dim)."""

    def __init__(self, dim=728, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.dim = positive_int(dim, "dim")
        self.proj = Linear(dim, dim * 3, dtype=dtype, rng=rng)

    def forward(self, x, *, return_weights=False):
        return _attend(self, x, *self._qkv(), scale=1 / math.sqrt(self.dim), return_weights=return_weights)


class SelfAttentionV3(_FusedProjection):
    """000 level 3: fused projection, mask, dropout on the weights, output projection."""

    def __init__(self, dim=728, dropout_rate=0.1, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.dim = positive_int(dim, "dim")
        self.proj = Linear(dim, dim * 3, dtype=dtype, rng=rng)
        self.attention_dropout = Dropout(probability(dropout_rate, "dropout_rate"), dtype=dtype, rng=rng)
        self.output_proj = Linear(dim, dim, dtype=dtype, rng=rng)

    def forward(self, x, attention_mask=None, *, return_weights=False):
        return _attend(self, x, *self._qkv(), scale=1 / math.sqrt(self.dim), out=_pair(self.output_proj),
                       dropout=self.attention_dropout, mask=attention_mask, return_weights=return_weights)


class SelfAttentionV4(Module):
    """000 level 4, the interview version: query, key, value, mask, dropout."""

    def __init__(self, dim=728, dropout_rate=0.1, *, dtype=np.float32, rng=None):
        super().__init__(dtype=dtype, rng=rng)
        self.dim = positive_int(dim, "dim")
        self.query = Linear(dim, dim, dtype=dtype, rng=rng)
        self.key = Linear(dim, dim, dtype=dtype, rng=rng)
        self.value = Linear(dim, dim, dtype=dtype, rng=rng)
        self.attention_dropout = Dropout(probability(dropout_rate, "dropout_rate"), dtype=dtype, rng=rng)

    def forward(self, x, attention_mask=None, *, return_weights=False):
        return _attend(self, x, _pair(self.query), _pair(self.key), _pair(self.value),
                       scale=1 / math.sqrt(self.dim), dropout=self.attention_dropout, mask=attention_mask,
                       return_weights=return_weights)


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
        self.dropout = Dropout(probability(dropout, "dropout"), dtype=dtype, rng=rng)
        self.query_linear = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
        self.key_linear = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
        self.value_linear = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)
        self.output_linear = Linear(hidden_dim, hidden_dim, dtype=dtype, rng=rng)

    def forward(self, x, attention_mask=None, *, return_weights=False):
        return _attend(self, x, _pair(self.query_linear), _pair(self.key_linear), _pair(self.value_linear),
                       scale=1 / math.sqrt(self.head_dim), n_heads=self.head_num, heads_axis=True,
                       out=_pair(self.output_linear), dropout=self.dropout, mask=attention_mask,
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

    def forward(self, x, attention_mask=None, *, return_weights=False):
        return _attend(self, x, _pair(self.linear_q), _pair(self.linear_k), _pair(self.linear_v),
                       scale=self._norm_fact, mask=attention_mask, return_weights=return_weights)


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

    def forward(self, x, attention_mask=None, *, return_weights=False):
        return _attend(self, x, _pair(self.linear_q), _pair(self.linear_k), _pair(self.linear_v),
                       scale=self._norm_fact, n_heads=self.num_heads, heads_axis=True, mask=attention_mask,
                       return_weights=return_weights)
