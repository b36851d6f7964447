# Source of 003_hand_derivation.ipynb (document 003, "Attention理解": self-attention by hand).

# %% [markdown]
# # Attention理解 — self-attention derived by hand
#
# Document 003 computes self-attention by hand on a 3 × 4 input with integer weights, then
# gives two PyTorch classes, `SelfAttention` and `MultiHeadSelfAttention`. This notebook
# redoes the derivation with `attnc.functional` and NumPy. Unlike the other documents, every
# number here is deterministic, so each step is checked against the values the document
# prints (`assert`). Then come the two classes: `attnc.SelfAttention(..., bias=True)` (003's
# layers have biases) and `attnc.MultiHeadSelfAttention(..., bias=True)`, whose document
# version has errors, shown next to the corrected result.
#
# The last cell loads the same weights into the document's torch classes (errata fixed)
# and compares, if PyTorch is installed; everything else needs only NumPy.

# %% [include] _plots.py

# %%
import math

import numpy as np

import attnc
from attnc import functional as F

np.set_printoptions(precision=4, suppress=True)
attnc.manual_seed(3)               # parameter init of the modules at the end

# %% [markdown]
# ## 动手推导Self-Attention — the derivation by hand
#
# **Step 1: 准备输入** — three inputs of four features. **Step 2: 初始化权重** — the key,
# query and value weights, `(4, 3)` each: they map 4 features to 3.

# %%
x = np.array(
    [
        [1, 0, 1, 0],  # Input 1
        [0, 2, 0, 2],  # Input 2
        [1, 1, 1, 1],  # Input 3
    ],
    dtype=np.float32,
)
w_key = np.array([[0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 1, 0]], dtype=np.float32)
w_query = np.array([[1, 0, 1], [1, 0, 0], [0, 0, 1], [0, 1, 1]], dtype=np.float32)
w_value = np.array([[0, 2, 0], [0, 3, 0], [1, 0, 3], [1, 1, 0]], dtype=np.float32)

# %% [markdown]
# **Step 3: 导出key, query and value的表示** — `x @ w`. `attnc.functional.linear(x, weight)`
# computes `x @ weight.T` (a torch `Linear` stores its weight as `(out, in)`), so it takes
# the transposed matrices. The document's printed values are written below only to be
# compared with.

# %%
keys = F.linear(x, w_key.T)
querys = F.linear(x, w_query.T)
values = F.linear(x, w_value.T)
print(keys)
print(querys)
print(values)

document_keys = [[0, 1, 1], [4, 4, 0], [2, 3, 1]]
document_querys = [[1, 0, 2], [2, 2, 2], [2, 1, 3]]
document_values = [[1, 2, 3], [2, 8, 0], [2, 6, 3]]
assert np.array_equal(keys, document_keys)
assert np.array_equal(querys, document_querys)
assert np.array_equal(values, document_values)
print("keys, querys, values: as in the document")

# %% [markdown]
# **Step 4: 计算输入的注意力得分 (attention scores)** — `querys @ keys.T`, one score per
# (query, key) pair. (`F.linear(querys, keys)` is the same product.) There is no
# `1/sqrt(d_k)` scaling in this derivation.

# %%
attn_scores = querys @ keys.T
print(attn_scores)
assert np.array_equal(attn_scores, F.linear(querys, keys))
assert np.array_equal(attn_scores, [[2, 4, 4], [4, 16, 12], [4, 12, 10]])
print("attention scores: as in the document")

# %% [markdown]
# **Step 5: 计算softmax** — over each row (`dim=-1`). The document prints the softmax to
# five significant digits; attnc's agrees to that precision.

# %%
attn_scores_softmax = F.softmax(attn_scores, axis=-1)
with np.printoptions(suppress=False):   # scientific notation, as torch prints it
    print(attn_scores_softmax)
document_softmax = [
    [6.3379e-02, 4.6831e-01, 4.6831e-01],
    [6.0337e-06, 9.8201e-01, 1.7986e-02],
    [2.9539e-04, 8.8054e-01, 1.1917e-01],
]
np.testing.assert_allclose(attn_scores_softmax, document_softmax, rtol=1e-4)
print("softmax: as in the document (5 significant digits)")

# %% [markdown]
# For readability the document then rounds the weights to one decimal:

# %%
exact_softmax = attn_scores_softmax
attn_scores_softmax = np.array(
    [
        [0.0, 0.5, 0.5],
        [0.0, 1.0, 0.0],
        [0.0, 0.9, 0.1],
    ],
    dtype=np.float32,
)
print("largest rounding:", np.abs(exact_softmax - attn_scores_softmax).max())

# %% [markdown]
# **Step 6: 将attention scores乘以value** — each value row `j` times the weight every query
# gives key `j`: `values[:, None] * attn_scores_softmax.T[:, :, None]` has shape
# `(key, query, feature)`.

# %%
weighted_values = values[:, None] * attn_scores_softmax.T[:, :, None]
print(weighted_values.shape)
print(weighted_values)
document_weighted_values = [
    [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    [[1.0, 4.0, 0.0], [2.0, 8.0, 0.0], [1.8, 7.2, 0.0]],
    [[1.0, 3.0, 1.5], [0.0, 0.0, 0.0], [0.2, 0.6, 0.3]],
]
np.testing.assert_allclose(weighted_values, document_weighted_values, atol=1e-6)
print("weighted values: as in the document")

# %% [markdown]
# **Step 7: 对加权后的value求和以得到输出** — summing over the keys (axis 0) gives one output
# per query. The sum is the matrix product `weights @ values`.

# %%
outputs = weighted_values.sum(axis=0)
print(outputs)
np.testing.assert_allclose(outputs, [[2.0, 7.0, 1.5], [2.0, 8.0, 0.0], [2.0, 7.8, 0.3]], atol=1e-6)
np.testing.assert_allclose(outputs, attn_scores_softmax @ values, atol=1e-6)
print("outputs: as in the document, and equal to attn_scores_softmax @ values")

# %% [markdown]
# ### The same in one call
#
# `attnc.functional.scaled_dot_product_attention` does steps 4 to 7 in one C kernel. With
# `scale=1.0` (the derivation does not scale) it returns the exact softmax of step 5 and the
# outputs of the unrounded weights.

# %%
exact_outputs, weights = F.scaled_dot_product_attention(querys, keys, values, scale=1.0, return_weights=True)
print(weights)
print(exact_outputs)
print("weights == step 5 softmax:", np.allclose(weights, exact_softmax, rtol=1e-6, atol=1e-9))
print("outputs == exact weights @ values:", np.allclose(exact_outputs, exact_softmax @ values, atol=1e-5))
print("outputs with the rounded weights differ by at most", np.abs(exact_outputs - outputs).max())

# %%
plot_attention(np.stack([exact_softmax, attn_scores_softmax]), title="Hand-derived attention weights",
               col_names=["exact softmax (step 5)", "rounded by the document"])

# %% [markdown]
# Attention as used in practice divides the scores by `sqrt(d_k)` (here `d_k = 3`), the
# default `scale` of `scaled_dot_product_attention`: the weights are less peaked.

# %%
scaled_outputs, scaled_weights = F.scaled_dot_product_attention(querys, keys, values, return_weights=True)
print(scaled_weights)
print(scaled_outputs)

# %% [markdown]
# ## Self-Attention
#
# The document's `SelfAttention(input_dim, dim_k, dim_v)` has three `nn.Linear` layers
# (with biases) `q`, `k`, `v` and scales by `1/sqrt(dim_k)`. attnc's class is
# `attnc.SelfAttention(dim_in, dim_k, dim_v, bias=True)`; its layers are called `linear_q`,
# `linear_k`, `linear_v` (document 004's names). (The docstring's `q : batch_size *
# input_dim * dim_k` means the layer maps `input_dim` to `dim_k`; Q itself is
# `batch_size * seq_len * dim_k`, as the comments in `forward` say.)
#
# Loaded with the hand-derivation weights and zero biases, the module computes the scaled
# attention of the previous cell, for a batch of one sequence.

# %%
net = attnc.SelfAttention(4, 3, 3, bias=True)
print(net)
net.load_state_dict({
    "linear_q.weight": w_query.T, "linear_q.bias": np.zeros(3),
    "linear_k.weight": w_key.T, "linear_k.bias": np.zeros(3),
    "linear_v.weight": w_value.T, "linear_v.bias": np.zeros(3),
})
attention, dist = net(x[None], return_weights=True)   # x[None]: batch_size 1, seq_len 3, input_dim 4
print(attention.shape)
print(attention)
print("== scaled_dot_product_attention with scale 1/sqrt(3):", np.allclose(attention[0], scaled_outputs, atol=1e-5))

# %% [markdown]
# ## Multi-Head Self-Attention
#
# The idea: split `dim_k` (and `dim_v`) into `nums_head` heads, let each head attend over
# the **sequence** with its own slice of Q, K, V, scale by `1/sqrt(dim_k / nums_head)`, and
# concatenate the heads' outputs back to `dim_v`.
#
# **Errata.** The document's `forward` does something else:
# - `.view(-1, seq_len, nums_head, head_dim).permute(0, 2, 3, 1)` gives Q, K, V of shape
#   `(batch, heads, head_dim, seq_len)`, and `Q @ K.permute(0, 1, 3, 2)` is then
#   `(batch, heads, head_dim, head_dim)`: the softmax weighs **feature channels** against each
#   other, not positions;
# - it scales by `sqrt(dim_k)`, not by the head size `sqrt(dim_k / nums_head)`;
# - it reshapes the output to `x.shape[2]` (the input size) where it means `dim_v`, so it
#   only runs when `dim_v == input_dim` (and the channel product needs equal Q and V head
#   sizes).
#
# Below, the document's computation is written in NumPy (`document_forward`) and compared
# with `attnc.MultiHeadSelfAttention(dim_in, dim_k, dim_v, num_heads, bias=True)`, which
# implements the intended computation, on the hand-derivation input, with 2 heads of size 2
# (the sizes are chosen so that the document's code runs).

# %%
mhsa = attnc.MultiHeadSelfAttention(4, 4, 4, num_heads=2, bias=True)
print(mhsa)
X = x[None]                                           # (batch 1, seq_len 3, input_dim 4)
output, head_weights = mhsa(X, return_weights=True)
print("attnc weights (batch, heads, seq, seq):", head_weights.shape)
print(head_weights)
print(output)


def document_forward(module, x):
    """003's MultiHeadSelfAttention.forward, line for line, in NumPy."""
    nums_head, dim_k, dim_v = module.num_heads, module.dim_k, module.dim_v
    def heads(layer, size):
        projected = F.linear(x, layer.weight, layer.bias)
        return projected.reshape(-1, x.shape[1], nums_head, size // nums_head).transpose(0, 2, 3, 1)
    Q, K, V = heads(module.linear_q, dim_k), heads(module.linear_k, dim_k), heads(module.linear_v, dim_v)
    weights = F.softmax(Q @ K.transpose(0, 1, 3, 2) / math.sqrt(dim_k))      # (batch, heads, head_dim, head_dim)
    attention = np.swapaxes(weights @ V, -2, -1)                              # (batch, heads, seq, head_dim)
    attention = attention.transpose(0, 2, 1, 3)                               # (batch, seq, heads, head_dim)
    return attention.reshape(-1, x.shape[1], x.shape[2]), weights


document_output, channel_weights = document_forward(mhsa, X)
print("document weights (batch, heads, head_dim, head_dim):", channel_weights.shape)
print(channel_weights)
print(document_output)
print("max |document - attnc|:", np.abs(document_output - output).max())

# %% [markdown]
# The two kinds of weights, per head: attnc's weigh the 3 positions of the sequence; the
# document's weigh the 2 feature channels of each head.

# %%
plot_attention(head_weights, title="attnc MultiHeadSelfAttention: over positions",
               row_names=["batch 0"], col_names=["head 0", "head 1"])
plot_attention(channel_weights, title="document 003 as written: over channels", row_names=["batch 0"],
               col_names=["head 0", "head 1"], axis_names=("channel", "channel"))

# %% [markdown]
# The corrected computation in NumPy — permute to `(batch, heads, seq, head_dim)`, scale by
# the head size, merge the heads back to `dim_v` — is what attnc returns:

# %%
def corrected_forward(module, x):
    batch, n, _ = x.shape
    def heads(layer, size):
        projected = F.linear(x, layer.weight, layer.bias)
        return projected.reshape(batch, n, module.num_heads, size // module.num_heads).transpose(0, 2, 1, 3)
    Q, K, V = heads(module.linear_q, module.dim_k), heads(module.linear_k, module.dim_k), heads(module.linear_v, module.dim_v)
    weights = F.softmax(Q @ np.swapaxes(K, -1, -2) / math.sqrt(module.dim_k // module.num_heads))
    return (weights @ V).transpose(0, 2, 1, 3).reshape(batch, n, module.dim_v), weights


reference, reference_weights = corrected_forward(mhsa, X)
print("max |attnc - corrected NumPy| output :", np.abs(output - reference).max())
print("max |attnc - corrected NumPy| weights:", np.abs(head_weights - reference_weights).max())

# %% [markdown]
# ## Cross-check against the document's PyTorch classes
#
# `SelfAttention` as in the document (its `q`, `k`, `v` mapped to attnc's `linear_q`, ...),
# `MultiHeadSelfAttention` with the errata fixed, loaded with the attnc modules' weights.
# The document's `MultiHeadSelfAttention` as written is also run, to confirm that
# `document_forward` above reproduces it. Skipped when PyTorch is not installed.

# %%
try:
    import torch
    import torch.nn as nn
except ImportError:
    torch = None
    print("torch is not installed: the cross-check is skipped")

if torch is not None:
    class SelfAttention(nn.Module):
        def __init__(self, input_dim, dim_k, dim_v):
            super().__init__()
            self.dim_k = dim_k
            self.q = nn.Linear(input_dim, dim_k)
            self.k = nn.Linear(input_dim, dim_k)
            self.v = nn.Linear(input_dim, dim_v)
            self.softmax = nn.Softmax(dim=-1)

        def forward(self, x):
            Q = self.q(x)
            K = self.k(x)
            V = self.v(x)
            return torch.bmm(self.softmax(torch.bmm(Q, K.permute(0, 2, 1)) / math.sqrt(self.dim_k)), V)

    class MultiHeadSelfAttentionAsWritten(nn.Module):
        def __init__(self, input_dim, dim_k, dim_v, nums_head):
            super(MultiHeadSelfAttentionAsWritten, self).__init__()
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
            return attention.reshape(-1, x.shape[1], x.shape[2])

    class MultiHeadSelfAttention(MultiHeadSelfAttentionAsWritten):
        def forward(self, x):   # errata fixed: heads over positions, head-size scale, dim_v
            Q = self.q(x).view(-1, x.shape[1], self.nums_head, self.dim_k // self.nums_head).permute(0, 2, 1, 3)
            K = self.k(x).view(-1, x.shape[1], self.nums_head, self.dim_k // self.nums_head).permute(0, 2, 1, 3)
            V = self.v(x).view(-1, x.shape[1], self.nums_head, self.dim_v // self.nums_head).permute(0, 2, 1, 3)
            scores = torch.matmul(Q, K.permute(0, 1, 3, 2)) / math.sqrt(self.dim_k // self.nums_head)
            attention = torch.matmul(self.softmax(scores), V)   # [batch_size, n_head, seq_len, head_size]
            attention = attention.transpose(1, 2)               # [batch_size, seq_len, n_head, head_size]
            return attention.reshape(-1, x.shape[1], self.dim_v)

    to_document_names = {"linear_q": "q", "linear_k": "k", "linear_v": "v"}

    def load(ours, theirs):
        state = {}
        for key, value in ours.state_dict().items():
            prefix, _, leaf = key.partition(".")
            state[to_document_names[prefix] + "." + leaf] = torch.from_numpy(value)
        theirs.load_state_dict(state)
        return theirs.eval()

    def cross_check(name, ours, theirs, x):
        with torch.no_grad():
            expected = load(ours, theirs)(torch.from_numpy(x)).numpy()
        difference = np.abs(ours(x) - expected).max()
        print(f"{name:38s} max |attnc - torch| = {difference:.2e}")
        assert difference < 1e-5

    cross_check("SelfAttention", net, SelfAttention(4, 3, 3), x[None])
    batch = np.random.default_rng(3).standard_normal((2, 5, 4), dtype=np.float32)
    cross_check("SelfAttention (random batch)", net, SelfAttention(4, 3, 3), batch)
    cross_check("MultiHeadSelfAttention (fixed)", mhsa, MultiHeadSelfAttention(4, 4, 4, 2), X)
    cross_check("MultiHeadSelfAttention (random batch)", mhsa, MultiHeadSelfAttention(4, 4, 4, 2), batch)
    with torch.no_grad():
        as_written = load(mhsa, MultiHeadSelfAttentionAsWritten(4, 4, 4, 2))(torch.from_numpy(X)).numpy()
    print(f"{'document as written vs NumPy':38s} max diff = {np.abs(as_written - document_output).max():.2e}")
