# Source of 000_four_levels.ipynb (document 000, "手写self-attention四重境界").
# The random draws follow `python -m attnc` (same seeds, same order), so the tour
# and this notebook print the same numbers for levels 1 to 4.

# %% [markdown]
# # 手写self-attention四重境界 — four levels of hand-written self-attention
#
# Document 000 writes self-attention four times, each version adding a detail. This notebook
# runs every code cell of the document with `attnc` in place of PyTorch: same shapes, same
# masks, the same quantities printed (shapes, attention weights, outputs). The weights are
# random, so the numbers are not the document's; they are reproducible (fixed seeds).
#
# | document (torch) | attnc | parameters |
# | --- | --- | --- |
# | `SelfAttentionv1(hidden_dim)` | `attnc.SelfAttentionV1(hidden_dim)` | `Q_proj`, `K_proj`, `V_proj` |
# | `SelfAttentionv2(dim)` | `attnc.SelfAttentionV2(dim)` | `proj` (dim -> 3·dim, split Q, K, V) |
# | `SelfAttentionv3(dim, dropout_rate)` | `attnc.SelfAttentionV3(dim, dropout_rate)` | `proj`, `output_proj` |
# | `SelfAttentionInterview(dim, dropout_rate)` | `attnc.SelfAttentionInterview` (= `SelfAttentionV4`) | `query`, `key`, `value` |
#
# The last cell loads the same weights into the document's torch classes and compares, if
# PyTorch is installed; everything else needs only NumPy.

# %% [include] _plots.py

# %%
import math

import numpy as np

import attnc

np.set_printoptions(precision=4, suppress=True)
attnc.manual_seed(0)               # parameter init and dropout masks
rng = np.random.default_rng(0)     # the inputs (torch.randn -> rng.standard_normal)
print("attnc", attnc.__version__)

# %% [markdown]
# ## step1: 了解公式 — the formula
#
# $$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\left(\frac{QK^T}{\sqrt{d_k}}\right)V$$
#
# ## step2: 开始写代码 — the code
#
# ### 第一重境界：简化版本 — level 1, the plain version
#
# Three `Linear` layers make Q, K and V from `X (batch, seq, hidden_dim)`; the scores
# `Q Kᵀ / sqrt(hidden_dim)` are `(batch, seq, seq)`; softmax over the keys; weights times V.

# %%
X = rng.standard_normal((3, 2, 4), dtype=np.float32)
net = attnc.SelfAttentionV1(hidden_dim=4)
print(net)
res = net(X)
print(res.shape)

# %% [markdown]
# The same computation written out in NumPy from the module's own parameters, line by line
# as in the document, gives the same result; `return_weights=True` also returns the
# attention weights (each row sums to 1).

# %%
Q = X @ net.Q_proj.weight.T + net.Q_proj.bias
K = X @ net.K_proj.weight.T + net.K_proj.bias
V = X @ net.V_proj.weight.T + net.V_proj.bias
attention_scores = Q @ K.transpose(0, 2, 1) / math.sqrt(net.hidden_dim)
attention_weights = attnc.functional.softmax(attention_scores, axis=-1)
output = attention_weights @ V

res, weights = net(X, return_weights=True)
print("attention_weights:\n", weights)
print("row sums:", weights.sum(-1).ravel())
print("max |attnc - NumPy| output :", np.abs(res - output).max())
print("max |attnc - NumPy| weights:", np.abs(weights - attention_weights).max())

# %% [markdown]
# ### 第二重：效率优化 — level 2, one fused projection
#
# One `Linear(dim, 3·dim)` computes Q, K and V in a single matrix product; `torch.split`
# cuts the result into Q, K, V in that order. In `attnc.SelfAttentionV2` the split is free:
# rows `0:dim` of `proj.weight` make Q, `dim:2·dim` K, `2·dim:3·dim` V. The document's
# `forward` prints its output; here it is returned with the weights.

# %%
x = rng.standard_normal((3, 2, 4), dtype=np.float32)
net2 = attnc.SelfAttentionV2(4)
output, weights = net2(x, return_weights=True)
print("attention_weight:\n", weights)
print("output:\n", output)

# %%
qkv = x @ net2.proj.weight.T + net2.proj.bias          # (3, 2, 12)
Q, K, V = np.split(qkv, 3, axis=-1)                   # torch.split(qkv, dim, dim=-1)
reference = attnc.functional.softmax(Q @ K.transpose(0, 2, 1) / math.sqrt(net2.dim)) @ V
print("qkv shape:", qkv.shape, "-> Q, K, V:", Q.shape, K.shape, V.shape)
print("max |attnc - NumPy split|:", np.abs(output - reference).max())

# %% [markdown]
# ### 第3重：加入一些细节 — level 3, the details
#
# 1. dropout 位置 — dropout on the attention weights;
# 2. attention_mask 部分 — a mask: positions whose mask is 0 get the score `-1e20` before the
#    softmax (`masked_fill(mask == 0, -1e20)`), so their weight is 0;
# 3. output 矩阵映射(可选) — an output projection.
#
# The document's mask is one row of 1s and 0s per sequence, `(batch, seq)`, repeated over
# the queries: `mask.unsqueeze(1).repeat(1, 4, 1)` is `np.repeat(mask[:, None, :], 4, axis=1)`.
# A freshly built module is in training mode (as in torch), so dropout is on, as it was when
# the document ran this cell. `return_weights=True` returns the weights *before* dropout:
# that is what the document prints.

# %%
# shape [batch_size, seq_len, dim]
x = rng.standard_normal((3, 4, 2), dtype=np.float32)

# mask矩阵应该和 attention_weight 形状相同 [batch_size, seq_len, seq_len]
mask = np.array(
    [
        [1, 1, 1, 0],
        [1, 1, 0, 0],
        [1, 0, 0, 0],
    ]
)
print("mask shape:", mask.shape)
mask = np.repeat(mask[:, None, :], 4, axis=1)     # mask.unsqueeze(1).repeat(1, 4, 1)
print("repeat mask shape:", mask.shape)

net3 = attnc.SelfAttentionV3(2)
print("training:", net3.training)
output, attention_weight = net3(x, mask, return_weights=True)
print("attention_weight shape:", attention_weight.shape)
print("attention_weight :", attention_weight)
print(output)

# %% [markdown]
# The masked keys get weight exactly 0; the third sequence keeps only its first key, so each
# of its queries puts all its weight there.

# %%
plot_attention(attention_weight, mask, title="SelfAttentionV3: attention weights per batch element",
               col_names=[f"batch {b}" for b in range(3)])

# %% [markdown]
# In the document's printed output the first row of the third sequence differs from the
# other three although all four have the same weights: dropout zeroed that weight in
# training mode. In evaluation mode dropout is off, and the output is exactly
# `output_proj(weights @ V)`:

# %%
net3.eval()
output_eval = net3(x, mask)
qkv = x @ net3.proj.weight.T + net3.proj.bias
Q, K, V = np.split(qkv, 3, axis=-1)
scores = np.where(mask == 0, -1e20, Q @ K.transpose(0, 2, 1) / math.sqrt(net3.dim))
reference = (attnc.functional.softmax(scores) @ V) @ net3.output_proj.weight.T + net3.output_proj.bias
print(output_eval)
print("max |attnc - NumPy| (eval):", np.abs(output_eval - reference).max())

# %% [markdown]
# The repeated mask is not needed: any mask that broadcasts to the scores `(batch, seq, seq)`
# works, so `(batch, 1, seq)` gives the same result.

# %%
print("same with a (3, 1, 4) mask:", np.array_equal(net3(x, mask[:, :1, :]), output_eval))

# %% [markdown]
# ### 第4重：面试写法 — level 4, the interview version
#
# Separate `query`, `key`, `value` layers, mask and dropout on the weights, no output
# projection. `attnc.SelfAttentionInterview` is `attnc.SelfAttentionV4`. The module is put in
# evaluation mode so the printed output is `weights @ V` (the document ran it in training
# mode, with dropout).

# %%
x = rng.standard_normal((3, 3, 4), dtype=np.float32)

mask = np.array(
    [
        [1, 0, 1],
        [1, 0, 0],
        [0, 0, 1],
    ]
)
mask = np.repeat(mask[:, None, :], 3, axis=1)     # mask.unsqueeze(1).repeat(1, 3, 1)
net4 = attnc.SelfAttentionInterview(4).eval()
print("SelfAttentionInterview is SelfAttentionV4:", attnc.SelfAttentionInterview is attnc.SelfAttentionV4)
output, attention_weight = net4(x, mask, return_weights=True)
print(attention_weight)
print(output)

# %%
plot_attention(attention_weight, mask, title="SelfAttentionInterview: attention weights",
               col_names=[f"batch {b}" for b in range(3)])

# %% [markdown]
# The second and third sequences keep a single key, so all their queries get the same
# output row: the value of that key.

# %%
V = x @ net4.value.weight.T + net4.value.bias
print("batch 1 output == value of key 0:", np.allclose(output[1], V[1, 0], atol=1e-6))
print("batch 2 output == value of key 2:", np.allclose(output[2], V[2, 2], atol=1e-6))

# %% [markdown]
# ## Cross-check against the document's PyTorch classes
#
# The document's classes (their debugging prints removed), loaded with the attnc modules'
# weights (`state_dict` keys are the same), in evaluation mode, on the same inputs. Skipped
# when PyTorch is not installed.

# %%
try:
    import torch
    import torch.nn as nn
except ImportError:
    torch = None
    print("torch is not installed: the cross-check is skipped")

if torch is not None:
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
            return torch.matmul(attention_weights, V)

    class SelfAttentionv2(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.dim = dim
            self.proj = nn.Linear(dim, dim * 3)

        def forward(self, x):
            qkv = self.proj(x)
            Q, K, V = torch.split(qkv, self.dim, dim=-1)
            return torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(self.dim), dim=-1) @ V

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
            return self.output_proj(torch.matmul(attention_weight, V))

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
            return attention_weight @ V

    def cross_check(name, ours, theirs, *inputs):
        theirs.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})
        ours.eval(), theirs.eval()
        with torch.no_grad():
            expected = theirs(*[torch.from_numpy(np.array(a)) for a in inputs]).numpy()
        difference = np.abs(ours(*inputs) - expected).max()
        print(f"{name:24s} max |attnc - torch| = {difference:.2e}")
        assert difference < 1e-5

    cross_check("SelfAttentionv1", net, SelfAttentionv1(4), X)
    cross_check("SelfAttentionv2", net2, SelfAttentionv2(4), rng.standard_normal((3, 2, 4), dtype=np.float32))
    x3 = rng.standard_normal((3, 4, 2), dtype=np.float32)
    mask3 = np.repeat(np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]])[:, None, :], 4, axis=1)
    cross_check("SelfAttentionv3", net3, SelfAttentionv3(2), x3, mask3)
    cross_check("SelfAttentionInterview", net4, SelfAttentionInterview(4), x, mask)
