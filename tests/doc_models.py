"""The documents' PyTorch classes, the oracles of the attnc modules.

Copied from the five documents (the tutorials) with only the Errata of API.md fixed:
- the debugging prints are removed (000 SelfAttentionv2/v3, SelfAttentionInterview, 001);
- 004 SelfAttention / MultiHeadSelfAttention get a `bias` flag (003's layers have
  biases, 004's none) and the `attention_mask` argument the other documents have
  ("同上"), applied as the documents do: `masked_fill(mask == 0, -1e20)`;
- 004 MultiHeadSelfAttention reshapes with `n` where it wrote `nh`.
The documents' parameter names are kept so that state_dict keys match attnc's.
`MultiHeadSelfAttention003` is 003's class unchanged: NOT an oracle (it attends over
feature channels), kept only to show that attnc differs from it. At the end, the
documents' other spellings of the same models (001's and 002's classes, 003's
SelfAttention as `SelfAttention003`), for attnc.from_torch's tests.
"""
import math
from math import sqrt

import torch
import torch.nn as nn


# ----------------------------------------------------------------------------
# 000: 手写self-attention四重境界


class SelfAttentionv1(nn.Module):
    def __init__(self, hidden_dim: int = 728):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.Q_proj = nn.Linear(hidden_dim, hidden_dim)
        self.K_proj = nn.Linear(hidden_dim, hidden_dim)
        self.V_proj = nn.Linear(hidden_dim, hidden_dim)

    def forward(self, X):
        Q = self.Q_proj(X)
        K = self.K_proj(X)
        V = self.V_proj(X)
        attention_scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.hidden_dim)
        attention_weights = torch.softmax(attention_scores, dim=-1)
        output = torch.matmul(attention_weights, V)
        return output


class SelfAttentionv2(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim
        self.proj = nn.Linear(dim, dim * 3)

    def forward(self, x):
        qkv = self.proj(x)
        Q, K, V = torch.split(qkv, self.dim, dim=-1)
        output = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(self.dim), dim=-1) @ V
        return output


class SelfAttentionv3(nn.Module):
    def __init__(self, dim, dropout_rate=0.1):
        super().__init__()
        self.dim = dim
        self.proj = nn.Linear(dim, dim * 3)
        self.attention_dropout = nn.Dropout(dropout_rate)
        self.output_proj = nn.Linear(dim, dim)

    def forward(self, x, attention_mask=None):
        qkv = self.proj(x)
        Q, K, V = torch.split(qkv, self.dim, dim=-1)
        attention_weight = Q @ K.transpose(-1, -2) / math.sqrt(self.dim)
        if attention_mask is not None:
            attention_weight = attention_weight.masked_fill(attention_mask == 0, float("-1e20"))
        attention_weight = torch.softmax(attention_weight, dim=-1)
        attention_weight = self.attention_dropout(attention_weight)
        output = self.output_proj(torch.matmul(attention_weight, V))
        return output


class SelfAttentionInterview(nn.Module):
    def __init__(self, dim: int, dropout_rate: float = 0.1) -> None:
        super().__init__()
        self.dim = dim
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.attention_dropout = nn.Dropout(dropout_rate)

    def forward(self, x, attention_mask=None):
        Q = self.query(x)
        K = self.key(x)
        V = self.value(x)
        attention_weight = Q @ K.transpose(-2, -1) / math.sqrt(self.dim)
        if attention_mask is not None:
            attention_weight = attention_weight.masked_fill(attention_mask == 0, float("-1e20"))
        attention_weight = torch.softmax(attention_weight, dim=-1)
        attention_weight = self.attention_dropout(attention_weight)
        output = attention_weight @ V
        return output


# ----------------------------------------------------------------------------
# 001: AttentionModule (MuitiHeadAttention; the document's spelling)


class MuitiHeadAttention(nn.Module):
    def __init__(self, hidden_dim, head_num, dropout=0.1) -> None:
        super().__init__()
        self.hidden_dim = hidden_dim
        self.head_num = head_num
        self.head_dim = hidden_dim // head_num
        self.dropout = nn.Dropout(dropout)
        self.query_linear = nn.Linear(hidden_dim, hidden_dim)
        self.key_linear = nn.Linear(hidden_dim, hidden_dim)
        self.value_linear = nn.Linear(hidden_dim, hidden_dim)
        self.output_linear = nn.Linear(hidden_dim, hidden_dim)

    def forward(self, X, attention_mask=None):
        batch_size, seq_len, _ = X.size()
        Q = self.query_linear(X)
        K = self.key_linear(X)
        V = self.value_linear(X)
        q_state = Q.view(batch_size, seq_len, self.head_num, self.head_dim).transpose(1, 2)
        k_state = K.view(batch_size, seq_len, self.head_num, self.head_dim).transpose(1, 2)
        v_state = V.view(batch_size, seq_len, self.head_num, self.head_dim).transpose(1, 2)
        # the document's transpose(-1, 2) is transpose(-1, -2) on a 4-D tensor
        attention_weight = torch.matmul(q_state, k_state.transpose(-1, 2)) / math.sqrt(self.head_dim)
        if attention_mask is not None:
            attention_weight = attention_weight.masked_fill(attention_mask == 0, float("-1e20"))
        attention_weight = torch.softmax(attention_weight, dim=-1)
        attention_weight = self.dropout(attention_weight)
        output_mid = attention_weight @ v_state
        output_mid = output_mid.transpose(1, 2).contiguous()
        output_mid = output_mid.view(batch_size, seq_len, -1)
        output = self.output_linear(output_mid)
        return output


# ----------------------------------------------------------------------------
# 004 (bias flag from 003): SelfAttention, MultiHeadSelfAttention


class SelfAttention(nn.Module):
    def __init__(self, dim_in, dim_k, dim_v, bias=False):
        super(SelfAttention, self).__init__()
        self.dim_in = dim_in
        self.dim_k = dim_k
        self.dim_v = dim_v
        self.linear_q = nn.Linear(dim_in, dim_k, bias=bias)
        self.linear_k = nn.Linear(dim_in, dim_k, bias=bias)
        self.linear_v = nn.Linear(dim_in, dim_v, bias=bias)
        self._norm_fact = 1 / sqrt(dim_k)

    def forward(self, x, attention_mask=None):
        batch, n, dim_in = x.shape
        assert dim_in == self.dim_in
        q = self.linear_q(x)
        k = self.linear_k(x)
        v = self.linear_v(x)
        dist = torch.bmm(q, k.transpose(1, 2)) * self._norm_fact
        if attention_mask is not None:
            dist = dist.masked_fill(attention_mask == 0, float("-1e20"))
        dist = torch.softmax(dist, dim=-1)
        att = torch.bmm(dist, v)
        return att


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, dim_in, dim_k, dim_v, num_heads=8, bias=False):
        super(MultiHeadSelfAttention, self).__init__()
        assert dim_k % num_heads == 0 and dim_v % num_heads == 0
        self.dim_in = dim_in
        self.dim_k = dim_k
        self.dim_v = dim_v
        self.num_heads = num_heads
        self.linear_q = nn.Linear(dim_in, dim_k, bias=bias)
        self.linear_k = nn.Linear(dim_in, dim_k, bias=bias)
        self.linear_v = nn.Linear(dim_in, dim_v, bias=bias)
        self._norm_fact = 1 / sqrt(dim_k // num_heads)

    def forward(self, x, attention_mask=None):
        # attention_mask, when given, broadcasts to (batch, nh, n, n)
        batch, n, dim_in = x.shape
        assert dim_in == self.dim_in
        nh = self.num_heads
        dk = self.dim_k // nh
        dv = self.dim_v // nh
        dims_perm = (0, 2, 1, 3)
        q = self.linear_q(x).reshape(batch, n, nh, dk).permute(dims_perm)
        k = self.linear_k(x).reshape(batch, n, nh, dk).permute(dims_perm)
        v = self.linear_v(x).reshape(batch, n, nh, dv).permute(dims_perm)
        q, k = q.reshape(-1, n, dk), k.reshape(-1, n, dk)  # erratum: n, not nh
        v = v.reshape(-1, n, dv)
        dist = torch.bmm(q, k.transpose(1, 2)) * self._norm_fact
        if attention_mask is not None:
            dist = dist.reshape(batch, nh, n, n).masked_fill(attention_mask == 0, float("-1e20"))
            dist = dist.reshape(-1, n, n)
        dist = torch.softmax(dist, dim=-1)
        att = torch.bmm(dist, v)
        att = att.reshape(batch, nh, n, dv).permute(0, 2, 1, 3).reshape(batch, n, self.dim_v)  # erratum
        return att


# ----------------------------------------------------------------------------
# 003's MultiHeadSelfAttention, unchanged (attends over channels): not an oracle


class MultiHeadSelfAttention003(nn.Module):
    def __init__(self, input_dim, dim_k, dim_v, nums_head):
        super().__init__()
        assert dim_k % nums_head == 0
        assert dim_v % nums_head == 0
        self.dim_k = dim_k
        self.dim_v = dim_v
        self.q = nn.Linear(input_dim, dim_k)
        self.k = nn.Linear(input_dim, dim_k)
        self.v = nn.Linear(input_dim, dim_v)
        self.nums_head = nums_head
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x):
        Q = self.q(x).view(-1, x.shape[1], self.nums_head, self.dim_k // self.nums_head).permute(0, 2, 3, 1)
        K = self.k(x).view(-1, x.shape[1], self.nums_head, self.dim_k // self.nums_head).permute(0, 2, 3, 1)
        V = self.v(x).view(-1, x.shape[1], self.nums_head, self.dim_v // self.nums_head).permute(0, 2, 3, 1)
        attention = torch.matmul(self.softmax(torch.matmul(Q, K.permute(0, 1, 3, 2)) / math.sqrt(self.dim_k)),
                                 V).transpose(-2, -1)
        attention = attention.transpose(1, 2)
        output = attention.reshape(-1, x.shape[1], x.shape[2])
        return output


# ----------------------------------------------------------------------------
# the documents' other spellings (001's and 002's classes, 003's SelfAttention),
# their errata fixed and their debugging prints removed, with the documents'
# names and parameter names


class EasyAttentionModule(nn.Module):      # 001: SelfAttentionV1 with query_linear, key_linear, value_linear
    def __init__(self, hidden_dim: int = 728) -> None:
        super().__init__()
        self.hidden_dim = hidden_dim
        self.query_linear = nn.Linear(hidden_dim, hidden_dim)
        self.key_linear = nn.Linear(hidden_dim, hidden_dim)
        self.value_linear = nn.Linear(hidden_dim, hidden_dim)

    def forward(self, X):
        Q, K, V = self.query_linear(X), self.key_linear(X), self.value_linear(X)
        attention_value = torch.matmul(Q, K.transpose(-2, -1))
        attention_weight = torch.softmax(attention_value / math.sqrt(self.hidden_dim), dim=-1)
        return torch.matmul(attention_weight, V)


class AttentionModule(nn.Module):          # 001 (erratum fixed: self.dim, not self.hidden_dim)
    def __init__(self, dim: int = 728) -> None:
        super().__init__()
        self.dim = dim
        self.proj = nn.Linear(dim, dim * 3)

    def forward(self, X):
        Q, K, V = torch.split(self.proj(X), self.dim, dim=-1)
        attention_weight = torch.softmax(torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.dim), dim=-1)
        return torch.matmul(attention_weight, V)


class Attention(nn.Module):                # 001: dropout, attention_mask, output_proj
    def __init__(self, dim, dropout) -> None:
        super().__init__()
        self.dim = dim
        self.proj = nn.Linear(dim, dim * 3)
        self.dropout = nn.Dropout(dropout)
        self.output_proj = nn.Linear(dim, dim)

    def forward(self, X, attention_mask=None):
        Q, K, V = torch.split(self.proj(X), self.dim, dim=-1)
        attention_weight = Q @ K.transpose(-2, -1) / math.sqrt(self.dim)
        if attention_mask is not None:
            attention_weight = attention_weight.masked_fill(attention_mask == 0, float("-1e20"))
        attention_weight = self.dropout(torch.softmax(attention_weight, dim=-1))
        return self.output_proj(attention_weight @ V)


class SelfattentionV1(nn.Module):          # 002: querry_proj, key_proj, value_proj
    def __init__(self, hidden_dim: int = 728) -> None:
        super().__init__()
        self.hidden_dim = hidden_dim
        self.querry_proj = nn.Linear(hidden_dim, hidden_dim)
        self.key_proj = nn.Linear(hidden_dim, hidden_dim)
        self.value_proj = nn.Linear(hidden_dim, hidden_dim)

    def forward(self, x):
        Q, K, V = self.querry_proj(x), self.key_proj(x), self.value_proj(x)
        attention_weight = torch.softmax(torch.matmul(Q, K.transpose(-1, -2)) / math.sqrt(self.hidden_dim), dim=-1)
        return torch.matmul(attention_weight, V)


class SelfattentionV2(nn.Module):          # 002 (erratum fixed: dim=-1 in torch.split)
    def __init__(self, hidden_dim: int = 728) -> None:
        super().__init__()
        self.hidden_dim = hidden_dim
        self.proj = nn.Linear(hidden_dim, hidden_dim * 3)

    def forward(self, x):
        Q, K, V = torch.split(self.proj(x), self.hidden_dim, dim=-1)
        attention_weight = torch.softmax(torch.matmul(Q, K.transpose(-1, -2)) / math.sqrt(self.hidden_dim), dim=-1)
        return attention_weight @ V


class slefattentionV3(nn.Module):          # 002 (errata fixed: self, droupout_rate, masked_fill, is not None, return)
    def __init__(self, dim, droupout_rate=0.1):
        super().__init__()
        self.dim = dim
        self.proj = nn.Linear(dim, dim * 3)
        self.attention_dropout = nn.Dropout(droupout_rate)
        self.output_proj = nn.Linear(dim, dim)

    def forward(self, x, attention_mask=None):
        Q, K, V = torch.split(self.proj(x), self.dim, dim=-1)
        attention_weight = Q @ K.transpose(-1, -2) / math.sqrt(self.dim)
        if attention_mask is not None:
            attention_weight = attention_weight.masked_fill(attention_mask == 0, float("-1e20"))
        attention_weight = self.attention_dropout(torch.softmax(attention_weight, dim=-1))
        return self.output_proj(attention_weight @ V)


class SelfAttention003(nn.Module):         # 003 (its name: SelfAttention, as 004's): q, k, v with biases, an nn.Softmax
    def __init__(self, input_dim, dim_k, dim_v):
        super().__init__()
        self.dim_k = dim_k
        self.q = nn.Linear(input_dim, dim_k)
        self.k = nn.Linear(input_dim, dim_k)
        self.v = nn.Linear(input_dim, dim_v)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x):
        Q, K, V = self.q(x), self.k(x), self.v(x)
        return torch.bmm(self.softmax(torch.bmm(Q, K.permute(0, 2, 1)) / math.sqrt(self.dim_k)), V)
