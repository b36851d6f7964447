# Source of 001_attention_module.ipynb (document 001, "AttentionModule").

# %% [markdown]
# # AttentionModule — from a simple attention module to multi-head attention
#
# Document 001 writes attention four times: a simple version, an efficient one (one fused
# projection), one with the details (dropout, mask, output projection), and multi-head
# attention. This notebook runs each of its code cells with `attnc` in place of PyTorch:
# same shapes, same masks, the same quantities printed. The weights are random, so the
# numbers are not the document's; they are reproducible (fixed seeds).
#
# | document (torch) | attnc | note |
# | --- | --- | --- |
# | `EasyAttentionModule(hidden_dim)` | `attnc.SelfAttentionV1(hidden_dim)` | `query_linear`/`key_linear`/`value_linear` are attnc's `Q_proj`/`K_proj`/`V_proj` |
# | `AttentionModule(dim)` | `attnc.SelfAttentionV2(dim)` | one `proj` (dim -> 3·dim); erratum: reads `self.hidden_dim` |
# | `Attention(dim, dropout)` | `attnc.SelfAttentionV3(dim, dropout_rate)` | `proj`, `output_proj`; attnc calls the dropout module `attention_dropout` (it has no parameters) |
# | `MuitiHeadAttention(hidden_dim, head_num, dropout)` | `attnc.MultiHeadAttention(hidden_dim, head_num, dropout)` | same parameter names |
#
# The last cell loads the same weights into the document's torch classes and compares, if
# PyTorch is installed; everything else needs only NumPy.

# %% [include] _plots.py

# %%
import math

import numpy as np

import attnc

np.set_printoptions(precision=4, suppress=True)
attnc.manual_seed(1)               # parameter init and dropout masks
rng = np.random.default_rng(1)     # the inputs (torch.randn -> rng.standard_normal)

# %% [markdown]
# ## 简洁版本 — the simple version
#
# `EasyAttentionModule` is level 1 of document 000 with other names: three `Linear` layers,
# scores `Q Kᵀ / sqrt(hidden_dim)` (`K.transpose(-2, -1)`, so any number of leading batch
# dims works, as the document's comment says), softmax, weights times V.

# %%
X = rng.standard_normal((2, 3, 4), dtype=np.float32)
print(X)

net = attnc.SelfAttentionV1(4)
output, attention_weight = net(X, return_weights=True)
print(output)

# %%
print("attention_weight:\n", attention_weight)
print("parameter names:", list(net.state_dict()))

# %% [markdown]
# ## 效率优化 — the efficient version
#
# One `Linear(dim, 3·dim)` and a split into Q, K, V. The document defines the class but
# never calls it; here it runs on the same `X`.
#
# **Erratum.** The document's `AttentionModule.forward` divides by
# `math.sqrt(self.hidden_dim)`, but `__init__` only sets `self.dim`: calling the module
# raises `AttributeError` (shown in the last cell when PyTorch is installed). The intended
# scale is `1/sqrt(dim)`, which `attnc.SelfAttentionV2` uses; the NumPy computation below
# confirms it.

# %%
net2 = attnc.SelfAttentionV2(4)
output2 = net2(X)
print(output2)

QKV = X @ net2.proj.weight.T + net2.proj.bias
Q, K, V = np.split(QKV, 3, axis=-1)                   # torch.split(QKV, self.dim, dim=-1)
attention_value = Q @ K.transpose(0, 2, 1)
reference = attnc.functional.softmax(attention_value / math.sqrt(net2.dim)) @ V   # self.dim, not self.hidden_dim
print("has dim:", hasattr(net2, "dim"), "| has hidden_dim:", hasattr(net2, "hidden_dim"))
print("max |attnc - NumPy with 1/sqrt(dim)|:", np.abs(output2 - reference).max())

# %% [markdown]
# ## 加入细节 — adding the details
#
# `Attention` adds dropout on the weights (`p = 0.01` here), a mask and an output
# projection. Its mask is one row per sequence, `(batch, seq)`, repeated over the queries.
# The document prints three tensors inside `forward`: the masked scores, the weights after
# the softmax, the weights after dropout. attnc's fused kernel returns the weights after
# the softmax (`return_weights=True`); the masked scores are recomputed below with NumPy from
# the module's parameters. The module is in training mode, as in the document.

# %%
X = rng.standard_normal((3, 4, 2), dtype=np.float32)
print(X)
# batch_size * seq * seq
mask = np.array(
    [
        [1, 1, 1, 0],
        [1, 1, 0, 0],
        [1, 0, 0, 0],
    ]
)
print(mask.shape)
mask = np.repeat(mask[:, None, :], 4, axis=1)     # mask.unsqueeze(1).repeat(1, 4, 1)
print(mask.shape)
net3 = attnc.SelfAttentionV3(2, 0.01)
output, attention_weight = net3(X, mask, return_weights=True)

QKV = X @ net3.proj.weight.T + net3.proj.bias
Q, K, V = np.split(QKV, 3, axis=-1)
scores = np.where(mask == 0, -1e20, Q @ K.transpose(0, 2, 1) / math.sqrt(net3.dim))   # masked_fill(mask == 0, -1e20)
print(scores)
print(attention_weight)
print(output)

# %% [markdown]
# The third print of the document, the weights after dropout, is internal to attnc's kernel.
# What dropout does to them is what `attnc.Dropout(0.01)` does: zero each weight with
# probability 0.01 and scale the others by `1/0.99`.

# %%
dropout = attnc.Dropout(0.01, rng=np.random.default_rng(7))
print(dropout(attention_weight)[0])

# %%
plot_attention(attention_weight, mask, title="Attention (SelfAttentionV3): weights per batch element",
               col_names=[f"batch {b}" for b in range(3)])

# %% [markdown]
# In evaluation mode (no dropout) the output is exactly `output_proj(weights @ V)`:

# %%
net3.eval()
reference = (attnc.functional.softmax(scores) @ V) @ net3.output_proj.weight.T + net3.output_proj.bias
print("max |attnc - NumPy| (eval):", np.abs(net3(X, mask) - reference).max())

# %% [markdown]
# ## 多头注意力 — multi-head attention
#
# `hidden_dim = 128` is split into `head_num = 8` heads of `head_dim = 16`:
# `(batch, seq, hidden_dim) -> (batch, head_num, seq, head_dim)`; each head attends on its
# own with the scale `1/sqrt(head_dim)`; the heads are merged back and go through
# `output_linear`. The mask is one row per sequence, `(3, 2)`, expanded to the
# multi-head scores' shape `(batch, head_num, seq, seq) = (3, 8, 2, 2)`
# (`unsqueeze(1).unsqueeze(2).expand(3, 8, 2, 2)` is `np.broadcast_to(m[:, None, None, :], ...)`).
#
# The module is put in evaluation mode (as in `python -m attnc`); the document ran it in
# training mode, where dropout (p = 0.1) also changes the output.

# %%
X = rng.standard_normal((3, 2, 128), dtype=np.float32)
# batch_size * seq * seq
mask1 = np.broadcast_to(
    np.array(
        [
            [0, 1],
            [0, 0],
            [1, 0],
        ]
    )[:, None, None, :],
    (3, 8, 2, 2),
)
print(mask1.shape)
net4 = attnc.MultiHeadAttention(128, 8).eval()
output, attention_weight = net4(X, mask1, return_weights=True)
print(attention_weight.shape)
with np.printoptions(threshold=100, edgeitems=3):   # summarised, as torch prints a large tensor
    print(output)

# %% [markdown]
# Each sequence's mask keeps different keys: sequence 0 keeps only key 1, sequence 2 only
# key 0, so every head puts all its weight there. Sequence 1 masks *both* keys: both scores
# become `-1e20`, equal, and the softmax is uniform (0.5, 0.5) — the documents'
# `masked_fill(mask == 0, -1e20)` never produces NaN (a `-inf` fill would:
# `softmax([-inf, -inf])` is `0/0`).

# %%
plot_attention(attention_weight, mask1, title="MultiHeadAttention(128, 8): weights per head",
               row_names=[f"batch {b}" for b in range(3)], col_names=[f"head {h}" for h in range(8)])

# %%
with np.errstate(invalid="ignore"):
    minus_inf = np.array([-np.inf, -np.inf])
    print("softmax with -inf fill :", np.exp(minus_inf - minus_inf.max()) / np.exp(minus_inf - minus_inf.max()).sum())
print("softmax with -1e20 fill:", attnc.functional.softmax(np.array([-1e20, -1e20])))
print("attnc, batch 1, head 0 :\n", attention_weight[1, 0])

# %% [markdown]
# The head split written out in NumPy gives the same output. (The document's
# `k_state.transpose(-1, 2)` is `transpose(-1, -2)` on a 4-D tensor.) A mask with a heads
# axis of 1, `(3, 1, 1, 2)`, broadcasts to the same result without `expand`.

# %%
batch_size, seq_len, _ = X.shape
def heads(t):   # (batch, seq, hidden) -> (batch, head_num, seq, head_dim)
    return t.reshape(batch_size, seq_len, net4.head_num, net4.head_dim).transpose(0, 2, 1, 3)
q_state = heads(X @ net4.query_linear.weight.T + net4.query_linear.bias)
k_state = heads(X @ net4.key_linear.weight.T + net4.key_linear.bias)
v_state = heads(X @ net4.value_linear.weight.T + net4.value_linear.bias)
scores = q_state @ k_state.transpose(0, 1, 3, 2) / math.sqrt(net4.head_dim)
weights = attnc.functional.softmax(np.where(mask1 == 0, -1e20, scores))
output_mid = (weights @ v_state).transpose(0, 2, 1, 3).reshape(batch_size, seq_len, -1)
reference = output_mid @ net4.output_linear.weight.T + net4.output_linear.bias
print("max |attnc - NumPy| output :", np.abs(output - reference).max())
print("max |attnc - NumPy| weights:", np.abs(attention_weight - weights).max())
print("(3, 1, 1, 2) mask, same output:", np.array_equal(net4(X, mask1[:, :1, :1, :]), output))

# %% [markdown]
# ## Cross-check against the document's PyTorch classes
#
# The document's classes (their debugging prints removed, `self.hidden_dim` read as
# `self.dim` in `AttentionModule`), loaded with the attnc modules' weights, in evaluation
# mode, on the same inputs. `EasyAttentionModule`'s parameter names are mapped to attnc's.
# The document's `AttentionModule` as written is run once to show its error. Skipped when
# PyTorch is not installed.

# %%
try:
    import torch
    import torch.nn as nn
except ImportError:
    torch = None
    print("torch is not installed: the cross-check is skipped")

if torch is not None:
    class EasyAttentionModule(nn.Module):
        def __init__(self, hidden_dim: int = 728) -> None:
            super().__init__()
            self.hidden_dim = hidden_dim
            self.query_linear = nn.Linear(hidden_dim, hidden_dim)
            self.key_linear = nn.Linear(hidden_dim, hidden_dim)
            self.value_linear = nn.Linear(hidden_dim, hidden_dim)

        def forward(self, X):
            Q = self.query_linear(X)
            K = self.key_linear(X)
            V = self.value_linear(X)
            attention_value = torch.matmul(Q, K.transpose(-2, -1))
            attention_weight = torch.softmax(attention_value / math.sqrt(self.hidden_dim), dim=-1)
            return torch.matmul(attention_weight, V)

    class AttentionModuleAsWritten(nn.Module):
        def __init__(self, dim: int = 728) -> None:
            super().__init__()
            self.dim = dim
            self.proj = nn.Linear(dim, dim * 3)

        def forward(self, X):
            QKV = self.proj(X)
            Q, K, V = torch.split(QKV, self.dim, dim=-1)
            attention_value = torch.matmul(Q, K.transpose(-2, -1))
            attention_weight = torch.softmax(attention_value / math.sqrt(self.hidden_dim), dim=-1)
            return torch.matmul(attention_weight, V)

    class AttentionModule(AttentionModuleAsWritten):
        def forward(self, X):
            QKV = self.proj(X)
            Q, K, V = torch.split(QKV, self.dim, dim=-1)
            attention_value = torch.matmul(Q, K.transpose(-2, -1))
            attention_weight = torch.softmax(attention_value / math.sqrt(self.dim), dim=-1)  # erratum fixed
            return torch.matmul(attention_weight, V)

    class Attention(nn.Module):
        def __init__(self, dim, dropout) -> None:
            super().__init__()
            self.dim = dim
            self.proj = nn.Linear(dim, dim * 3)
            self.dropout = nn.Dropout(dropout)
            self.output_proj = nn.Linear(dim, dim)

        def forward(self, X, attention_mask=None):
            QKV = self.proj(X)
            Q, K, V = torch.split(QKV, self.dim, dim=-1)
            attention_value = Q @ K.transpose(-2, -1)
            attention_weight = attention_value / math.sqrt(self.dim)
            if attention_mask is not None:
                attention_weight = attention_weight.masked_fill(attention_mask == 0, float("-1e20"))
            attention_weight = torch.softmax(attention_weight, dim=-1)
            attention_weight = self.dropout(attention_weight)
            output = attention_weight @ V
            return self.output_proj(output)

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
            attention_weight = torch.matmul(q_state, k_state.transpose(-1, 2)) / math.sqrt(self.head_dim)
            if attention_mask is not None:
                attention_weight = attention_weight.masked_fill(attention_mask == 0, float("-1e20"))
            attention_weight = torch.softmax(attention_weight, dim=-1)
            attention_weight = self.dropout(attention_weight)
            output_mid = attention_weight @ v_state
            output_mid = output_mid.transpose(1, 2).contiguous()
            output_mid = output_mid.view(batch_size, seq_len, -1)
            return self.output_linear(output_mid)

    def cross_check(name, ours, theirs, *inputs, rename=None):
        rename = rename or {}
        state = {}
        for key, value in ours.state_dict().items():
            prefix, _, leaf = key.partition(".")
            state[rename.get(prefix, prefix) + "." + leaf] = torch.from_numpy(value)
        theirs.load_state_dict(state)
        ours.eval(), theirs.eval()
        with torch.no_grad():
            expected = theirs(*[torch.from_numpy(np.array(a)) for a in inputs]).numpy()
        difference = np.abs(ours(*inputs) - expected).max()
        print(f"{name:20s} max |attnc - torch| = {difference:.2e}")
        assert difference < 1e-5

    x4 = rng.standard_normal((2, 3, 4), dtype=np.float32)
    cross_check("EasyAttentionModule", net, EasyAttentionModule(4), x4,
                rename={"Q_proj": "query_linear", "K_proj": "key_linear", "V_proj": "value_linear"})
    try:
        AttentionModuleAsWritten(4)(torch.from_numpy(x4))
    except AttributeError as error:
        print(f"{'AttentionModule':20s} as written: AttributeError: {error}")
    cross_check("AttentionModule", net2, AttentionModule(4), x4)
    x2 = rng.standard_normal((3, 4, 2), dtype=np.float32)
    cross_check("Attention", net3, Attention(2, 0.01), x2, mask)
    cross_check("MuitiHeadAttention", net4, MuitiHeadAttention(128, 8), X, mask1)
