# Source of 002_line_by_line.ipynb (document 002, self-attention explained line by line).

# %% [markdown]
# # 逐行解读 — self-attention, line by line
#
# Document 002 explains level 1 of self-attention (`SelfattentionV1`) line by line, then
# gives three code cells: level 1, level 2 (`SelfattentionV2`, one fused projection) and
# level 3 (`slefattentionV3`, dropout, mask, output projection). This notebook follows it
# with `attnc` and NumPy in place of PyTorch: each explained line is run and its shape
# printed, then each code cell is run with the same shapes. The weights are random, so the
# numbers are not the document's; they are reproducible (fixed seeds).
#
# Levels 2 and 3 of the document do not run as written (typos; see the *Erratum* cells);
# attnc implements what the text describes. The last cell loads the same weights into the
# document's torch classes (typos fixed) and compares, if PyTorch is installed.

# %% [include] _plots.py

# %% [markdown]
# ## step1: 了解公式 — the formula
#
# $$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\left(\frac{QK^T}{\sqrt{d_k}}\right)V$$
#
# ## step2: 开始代码 — the code, line by line
#
# **1-3行** — the imports. attnc needs only NumPy; `attnc.functional` has `linear` and
# `softmax`, the two operations the lines below use.

# %%
import math

import numpy as np

import attnc
from attnc import functional as F

np.set_printoptions(precision=4, suppress=True)
attnc.manual_seed(2)               # parameter init and dropout masks
rng = np.random.default_rng(2)     # the inputs (torch.rand -> rng.random)

# %% [markdown]
# **5-12行** — the class and its three linear layers, `hidden_dim -> hidden_dim` each. The
# document calls them `querry_proj`, `key_proj`, `value_proj`; attnc's `SelfAttentionV1`
# calls them `Q_proj`, `K_proj`, `V_proj` (as document 000 does).
#
# **34-35行**, moved first so that every line below can run: `X = torch.rand(3, 2, 4)`, three
# sequences of two positions with 4 features each, and the module with `hidden_dim = 4`.

# %%
X = rng.random((3, 2, 4), dtype=np.float32)
self_att_net = attnc.SelfAttentionV1(4)
print(self_att_net)
print("hidden_dim:", self_att_net.hidden_dim)

# %% [markdown]
# **16-18行** — Q, K and V: each linear layer keeps the shape `(batch, seq, hidden_dim)`.

# %%
Q = F.linear(X, self_att_net.Q_proj.weight, self_att_net.Q_proj.bias)
K = F.linear(X, self_att_net.K_proj.weight, self_att_net.K_proj.bias)
V = F.linear(X, self_att_net.V_proj.weight, self_att_net.V_proj.bias)
print("Q", Q.shape, "K", K.shape, "V", V.shape)

# %% [markdown]
# **21-23行** — `attention_value = Q @ Kᵀ`: `K.transpose(-1, -2)` swaps the last two axes, so
# the product is `(batch, seq, seq)`: one score per (query, key) pair.

# %%
attention_value = Q @ np.swapaxes(K, -1, -2)
print("attention_value", attention_value.shape)

# %% [markdown]
# **26-28行** — divide by `sqrt(hidden_dim)` and take the softmax over the last axis (the
# keys), so each row sums to 1. (The explanation's snippet lost a parenthesis:
# `torch.softmaxattention_value / ...` is `torch.softmax(attention_value / ..., dim=-1)`, as
# in the code cell below it.)

# %%
attention_weight = F.softmax(attention_value / math.sqrt(self_att_net.hidden_dim), axis=-1)
print(attention_weight)
print("row sums:", attention_weight.sum(-1).ravel())

# %% [markdown]
# **31-32行** — the output, the weights times V: `(batch, seq, hidden_dim)`, the shape of `X`.
#
# **36行** — `self_att_net(X)` runs all of the above in one call (one C kernel in attnc);
# it gives the same output and weights as the lines run one by one.

# %%
output = attention_weight @ V
print("output", output.shape)
net_output, net_weight = self_att_net(X, return_weights=True)
print("max |module - line by line| output :", np.abs(net_output - output).max())
print("max |module - line by line| weights:", np.abs(net_weight - attention_weight).max())

# %% [markdown]
# **维度 d_k 的计算** — with multi-head attention each head's `d_k` is the hidden size divided
# by the number of heads: 256 and 8 heads give 32, the head size attnc's
# `MultiHeadAttention` uses (and scales by `1/sqrt(32)`).

# %%
print("head_dim of MultiHeadAttention(256, 8):", attnc.MultiHeadAttention(256, 8).head_dim)

# %% [markdown]
# ## 第一重最简单代码 — level 1, the simplest code
#
# The document's first code cell, whole: the module prints its weights in `forward`; here
# `return_weights=True` returns them.

# %%
X = rng.random((3, 2, 4), dtype=np.float32)

self_att_net = attnc.SelfAttentionV1(4)
output, attention_weight = self_att_net(X, return_weights=True)
print(attention_weight)
print(output)

# %% [markdown]
# ## 第二重：小网络优化——优化了效率 — level 2, one fused projection
#
# **Erratum.** The document's `SelfattentionV2` splits with
# `torch.split(QKV, self.hidden_dim, hidden_dim = -1)`: `hidden_dim` is not an argument of
# `torch.split` (it means `dim = -1`), so `forward` raises `TypeError`. And the cell then
# builds `SelfattentionV1(4)`, not V2: the weights and output it prints come from level 1.
# Below, the corrected level 2, `attnc.SelfAttentionV2(4)`, runs on a new `X` of the same
# shape, and NumPy's `np.split(QKV, 3, axis=-1)` shows the intended split.

# %%
X = rng.random((3, 2, 4), dtype=np.float32)

self_att_net = attnc.SelfAttentionV2(4)
output, attention_weight = self_att_net(X, return_weights=True)
print(attention_weight)
print(output)

# %%
QKV = F.linear(X, self_att_net.proj.weight, self_att_net.proj.bias)   # (batch, seq, hidden_dim * 3)
Q, K, V = np.split(QKV, 3, axis=-1)                                   # torch.split(QKV, hidden_dim, dim=-1)
reference = F.softmax(Q @ np.swapaxes(K, -1, -2) / math.sqrt(self_att_net.dim)) @ V
print("QKV", QKV.shape, "-> Q", Q.shape, "K", K.shape, "V", V.shape)
print("max |attnc - NumPy split|:", np.abs(output - reference).max())

# %% [markdown]
# ## 第三重：加入一些细节 — level 3, the details
#
# 细节1: dropout; 细节2: a mask, since sentences have different lengths; 细节3: an output
# projection (optional).
#
# **Errata.** The document's `slefattentionV3` cannot run:
# - `nn.Dropout(self.droupout_rate)` reads an attribute that was never set (the argument is
#   `droupout_rate`): the constructor raises `AttributeError`;
# - `forward(slef, ...)` names its first argument `slef` but uses `self.dim`;
# - `if attention_mask is None:` is inverted (it must mask when a mask *is* given);
#   `marked_fill` is `masked_fill`, and `float = "-inf"` is the fill value `float("-inf")`;
# - the softmax reads `attention_weight` before it exists (the scores are `attention_value`);
# - `forward` computes `out_put` but returns nothing;
# - the cell again builds `SelfattentionV1(4)`, so its printed numbers are level 1's.
#
# The corrected level 3 is `attnc.SelfAttentionV3(dim, dropout_rate)`. Like the document's
# call, the first run has no mask. attnc fills masked scores with `-1e20`, as documents 000
# and 001 do, not `-inf`: see below why.

# %%
X = rng.random((3, 2, 4), dtype=np.float32)

self_att_net = attnc.SelfAttentionV3(4)
output, attention_weight = self_att_net(X, return_weights=True)   # training mode: dropout is on
print(attention_weight)
print(output)

# %% [markdown]
# With a mask: one row per sentence (1 = a real token, 0 = padding), repeated over the
# queries. The third sentence here is all padding. With `-1e20` its scores are all equal
# and the softmax is uniform; with the document's `-inf` they are all `-inf` and the softmax
# is `0/0 = NaN`, which then spreads through everything computed from it.

# %%
lengths_mask = np.array(
    [
        [1, 1],
        [1, 0],
        [0, 0],
    ]
)
attention_mask = np.repeat(lengths_mask[:, None, :], 2, axis=1)   # (3, 2, 2)
self_att_net.eval()
output, attention_weight = self_att_net(X, attention_mask, return_weights=True)
print(attention_weight)

QKV = F.linear(X, self_att_net.proj.weight, self_att_net.proj.bias)
Q, K, V = np.split(QKV, 3, axis=-1)
scores = Q @ np.swapaxes(K, -1, -2) / math.sqrt(self_att_net.dim)
with np.errstate(invalid="ignore"):
    filled = np.where(attention_mask == 0, -np.inf, scores)
    shifted = np.exp(filled - filled.max(-1, keepdims=True))
    inf_weights = shifted / shifted.sum(-1, keepdims=True)
print("softmax after a -inf fill, sentence 2:\n", inf_weights[2])

# %%
plot_attention(attention_weight, attention_mask, title="SelfAttentionV3 with a padding mask (-1e20 fill)",
               col_names=["sentence 0", "sentence 1", "sentence 2 (all padding)"])

# %% [markdown]
# ## Cross-check against the document's PyTorch classes
#
# The document's three classes with their typos fixed (`dim=-1` in `torch.split`; `self`,
# `masked_fill`, `is not None`, `-1e20`, `return`), loaded with the attnc modules' weights,
# in evaluation mode. `SelfattentionV1`'s parameter names are mapped to attnc's. The
# document's level 2 and level 3 as written are run once to show their errors. Skipped
# when PyTorch is not installed.

# %%
try:
    import torch
    import torch.nn as nn
except ImportError:
    torch = None
    print("torch is not installed: the cross-check is skipped")

if torch is not None:
    class SelfattentionV1(nn.Module):
        def __init__(self, hidden_dim: int = 728) -> None:
            super().__init__()
            self.hidden_dim = hidden_dim
            self.querry_proj = nn.Linear(hidden_dim, hidden_dim)
            self.key_proj = nn.Linear(hidden_dim, hidden_dim)
            self.value_proj = nn.Linear(hidden_dim, hidden_dim)

        def forward(self, x):
            Q = self.querry_proj(x)
            K = self.key_proj(x)
            V = self.value_proj(x)
            attention_value = torch.matmul(Q, K.transpose(-1, -2))
            attention_weight = torch.softmax(attention_value / math.sqrt(self.hidden_dim), dim=-1)
            return torch.matmul(attention_weight, V)

    class SelfattentionV2AsWritten(nn.Module):
        def __init__(self, hidden_dim: int = 728) -> None:
            super().__init__()
            self.hidden_dim = hidden_dim
            self.proj = nn.Linear(hidden_dim, hidden_dim * 3)

        def forward(self, x):
            QKV = self.proj(x)
            Q, K, V = torch.split(QKV, self.hidden_dim, hidden_dim=-1)
            attention_value = torch.matmul(Q, K.transpose(-1, -2))
            attention_weight = torch.softmax(attention_value / math.sqrt(self.hidden_dim), dim=-1)
            return attention_weight @ V

    class SelfattentionV2(SelfattentionV2AsWritten):
        def forward(self, x):
            QKV = self.proj(x)
            Q, K, V = torch.split(QKV, self.hidden_dim, dim=-1)   # erratum fixed
            attention_value = torch.matmul(Q, K.transpose(-1, -2))
            attention_weight = torch.softmax(attention_value / math.sqrt(self.hidden_dim), dim=-1)
            return attention_weight @ V

    class slefattentionV3AsWritten(nn.Module):
        def __init__(self, dim, droupout_rate=0.1):
            super().__init__()
            self.dim = dim
            self.proj = nn.Linear(dim, dim * 3)
            self.attention_dropout = nn.Dropout(self.droupout_rate)
            self.output_proj = nn.Linear(dim, dim)

    class SelfattentionV3(nn.Module):   # errata fixed
        def __init__(self, dim, droupout_rate=0.1):
            super().__init__()
            self.dim = dim
            self.proj = nn.Linear(dim, dim * 3)
            self.attention_dropout = nn.Dropout(droupout_rate)
            self.output_proj = nn.Linear(dim, dim)

        def forward(self, x, attention_mask=None):
            QKV = self.proj(x)
            Q, K, V = torch.split(QKV, self.dim, dim=-1)
            attention_value = Q @ K.transpose(-1, -2) / math.sqrt(self.dim)
            if attention_mask is not None:
                attention_value = attention_value.masked_fill(attention_mask == 0, float("-1e20"))
            attention_weight = torch.softmax(attention_value, dim=-1)
            attention_weight = self.attention_dropout(attention_weight)
            attention_result = attention_weight @ V
            return self.output_proj(attention_result)

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
        print(f"{name:16s} max |attnc - torch| = {difference:.2e}")
        assert difference < 1e-5

    x = rng.random((3, 2, 4), dtype=np.float32)
    v1 = attnc.SelfAttentionV1(4)
    cross_check("SelfattentionV1", v1, SelfattentionV1(4), x,
                rename={"Q_proj": "querry_proj", "K_proj": "key_proj", "V_proj": "value_proj"})
    v2 = attnc.SelfAttentionV2(4)
    try:
        SelfattentionV2AsWritten(4)(torch.from_numpy(x))
    except TypeError as error:
        print(f"{'SelfattentionV2':16s} as written: TypeError: {error}")
    cross_check("SelfattentionV2", v2, SelfattentionV2(4), x)
    try:
        slefattentionV3AsWritten(4)
    except AttributeError as error:
        print(f"{'slefattentionV3':16s} as written: AttributeError: {error}")
    cross_check("SelfattentionV3", self_att_net, SelfattentionV3(4), X, attention_mask)
    print("torch softmax after a -inf fill:", torch.softmax(torch.full((2,), float("-inf")), dim=-1))
