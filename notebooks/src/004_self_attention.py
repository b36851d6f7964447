# Source of 004_self_attention.ipynb (document 004, "（多头）自注意力机制的PyTorch实现").

# %% [markdown]
# # （多头）自注意力机制的PyTorch实现 — (multi-head) self-attention
#
# Document 004 gives two templates: `SelfAttention(dim_in, dim_k, dim_v)` and
# `MultiHeadSelfAttention(dim_in, dim_k, dim_v, num_heads=8)`, with linear layers without
# bias. attnc has both under the same names, with the same parameter names (`linear_q`,
# `linear_k`, `linear_v`) and `bias=False` by default. The document has no example call;
# this notebook runs both classes on small random inputs, prints the shapes, weights and
# outputs, adds the mask the document leaves out ("mask的实现方式同上"), and shows its
# erratum. The numbers are reproducible (fixed seeds).
#
# The last cell loads the same weights into the document's torch classes (erratum fixed)
# and compares, if PyTorch is installed; everything else needs only NumPy.

# %% [include] _plots.py

# %%
import math

import numpy as np

import attnc
from attnc import functional as F

np.set_printoptions(precision=4, suppress=True)
attnc.manual_seed(4)               # parameter init
rng = np.random.default_rng(4)     # the inputs

# %% [markdown]
# ## 自注意力 — self-attention
#
# Scaled dot product scores, so keys and queries have the same size `dim_k`; values have
# `dim_v`. The scale is `_norm_fact = 1/sqrt(dim_k)`. Input `x: (batch, n, dim_in)`.

# %%
batch, n, dim_in, dim_k, dim_v = 2, 4, 6, 4, 8
x = rng.standard_normal((batch, n, dim_in), dtype=np.float32)
net = attnc.SelfAttention(dim_in, dim_k, dim_v)
print(net)
print("parameters:", {name: value.shape for name, value in net.state_dict().items()})
att, dist = net(x, return_weights=True)
print("dist", dist.shape, "att", att.shape)   # batch, n, n / batch, n, dim_v
print(dist)
print(att)

# %% [markdown]
# The document's `forward`, line by line in NumPy (without biases), gives the same result:

# %%
q = F.linear(x, net.linear_q.weight)  # batch, n, dim_k
k = F.linear(x, net.linear_k.weight)  # batch, n, dim_k
v = F.linear(x, net.linear_v.weight)  # batch, n, dim_v
reference_dist = F.softmax(q @ k.transpose(0, 2, 1) * net._norm_fact)   # batch, n, n
reference_att = reference_dist @ v
print("_norm_fact = 1/sqrt(dim_k):", net._norm_fact, "=", 1 / math.sqrt(dim_k))
print("max |attnc - NumPy| att :", np.abs(att - reference_att).max())
print("max |attnc - NumPy| dist:", np.abs(dist - reference_dist).max())

# %% [markdown]
# ### The mask
#
# The document leaves the mask out and suggests multiplying `k` or `q` element-wise by a
# mask that is 1 where kept and `-Inf` where masked. That does not work: a masked key's
# features become ±∞, so its dot products with the queries are ±∞ or NaN (∞ − ∞), never
# reliably −∞, and a softmax row that meets them is NaN.
# The other documents' way, and attnc's, is to fill the masked scores:
# `masked_fill(mask == 0, -1e20)`. Here the second sequence is one position shorter than
# the first (a padding mask of shape `(batch, 1, n)`, broadcast over the queries).

# %%
padding = np.array(
    [
        [1, 1, 1, 1],
        [1, 1, 1, 0],
    ]
)
attention_mask = padding[:, None, :]                   # (batch, 1, n)
att, dist = net(x, attention_mask, return_weights=True)
print(dist)

inf_mask = np.where(padding == 1, 1.0, -np.inf)[:, :, None]   # 1 kept, -Inf masked, per key
with np.errstate(invalid="ignore", over="ignore"):
    multiplied = F.softmax(q @ (k * inf_mask).transpose(0, 2, 1) * net._norm_fact)
print("multiplying k by a 1/-Inf mask, sequence 1:\n", multiplied[1])

# %%
plot_attention(dist, attention_mask, title="SelfAttention with a padding mask",
               col_names=["sequence 0", "sequence 1 (last position padded)"])

# %% [markdown]
# ## 多头自注意力 — multi-head self-attention
#
# One big matrix computes every head's Q, K and V at once; reshaping and permuting puts the
# heads in the batch, each head attends like single-head attention with its slice of
# `dim_k / num_heads` (scale `1/sqrt(dim_k / num_heads)`), and the heads' outputs are
# concatenated back to `dim_v`. There is no output projection. (这里并行计算多个头的trick要注意.)

# %%
num_heads = 2
mhsa = attnc.MultiHeadSelfAttention(dim_in, 8, 8, num_heads=num_heads)
print(mhsa)
att, dist = mhsa(x, return_weights=True)
print("dist", dist.shape, "att", att.shape)   # batch, nh, n, n / batch, n, dim_v
print(dist)
print(att)

# %%
plot_attention(dist, title=f"MultiHeadSelfAttention, {num_heads} heads",
               row_names=[f"batch {b}" for b in range(batch)], col_names=[f"head {h}" for h in range(num_heads)])

# %% [markdown]
# With the padding mask: a multi-head mask needs a heads axis, `(batch, 1, 1, n)`, so that it
# broadcasts to the scores `(batch, heads, n, n)`.

# %%
head_mask = padding[:, None, None, :]                  # (batch, 1, 1, n)
att_masked, dist_masked = mhsa(x, head_mask, return_weights=True)
print(dist_masked[1])
plot_attention(dist_masked, head_mask, title="MultiHeadSelfAttention with a padding mask",
               row_names=[f"batch {b}" for b in range(batch)], col_names=[f"head {h}" for h in range(num_heads)])

# %% [markdown]
# **Erratum.** The document flattens the heads with `q.reshape(-1, nh, dk)` (and the same
# for `k`, `v`) and merges them with `.reshape(batch, nh, self.dim_v)`, where it means `n`
# (the sequence length) both times, as its comments say (`batch * nh, n, dk`;
# `batch, n, dim_v`). When `n == nh` nothing shows; otherwise the last reshape fails. Below,
# the document's `forward` in NumPy: it fails for `n = 4` with 2 heads, and agrees with attnc
# when the sequence length equals the number of heads.

# %%
def document_forward(module, x):
    """004's MultiHeadSelfAttention.forward as written, in NumPy."""
    batch, n, dim_in = x.shape
    nh = module.num_heads
    dk = module.dim_k // nh
    dv = module.dim_v // nh
    dims_perm = (0, 2, 1, 3)
    q = F.linear(x, module.linear_q.weight).reshape(batch, n, nh, dk).transpose(dims_perm)
    k = F.linear(x, module.linear_k.weight).reshape(batch, n, nh, dk).transpose(dims_perm)
    v = F.linear(x, module.linear_v.weight).reshape(batch, n, nh, dv).transpose(dims_perm)
    q, k = q.reshape(-1, nh, dk), k.reshape(-1, nh, dk)   # the document's nh, meant n
    v = v.reshape(-1, nh, dv)
    dist = F.softmax(q @ k.transpose(0, 2, 1) * module._norm_fact)
    att = dist @ v
    return att.reshape(batch, nh, n, dv).transpose(0, 2, 1, 3).reshape(batch, nh, module.dim_v)


try:
    document_forward(mhsa, x)
except ValueError as error:
    print(f"n = {n}, nh = {num_heads}: ValueError: {error}")
x_short = x[:, :num_heads]                             # n == nh
print(f"n = nh = {num_heads}: max |document - attnc| =", np.abs(document_forward(mhsa, x_short) - mhsa(x_short)).max())

# %% [markdown]
# ## Cross-check against the document's PyTorch classes
#
# The document's two classes with `bias=False`, the `attention_mask` argument added as the
# other documents apply it (`masked_fill(mask == 0, -1e20)`), and `n` in place of `nh` in the
# multi-head reshapes, loaded with the attnc modules' weights. Skipped when PyTorch is not
# installed.

# %%
try:
    import torch
    import torch.nn as nn
except ImportError:
    torch = None
    print("torch is not installed: the cross-check is skipped")

if torch is not None:
    class SelfAttention(nn.Module):
        def __init__(self, dim_in, dim_k, dim_v):
            super(SelfAttention, self).__init__()
            self.dim_in = dim_in
            self.dim_k = dim_k
            self.dim_v = dim_v
            self.linear_q = nn.Linear(dim_in, dim_k, bias=False)
            self.linear_k = nn.Linear(dim_in, dim_k, bias=False)
            self.linear_v = nn.Linear(dim_in, dim_v, bias=False)
            self._norm_fact = 1 / math.sqrt(dim_k)

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
            return torch.bmm(dist, v)

    class MultiHeadSelfAttention(nn.Module):
        def __init__(self, dim_in, dim_k, dim_v, num_heads=8):
            super(MultiHeadSelfAttention, self).__init__()
            assert dim_k % num_heads == 0 and dim_v % num_heads == 0
            self.dim_in = dim_in
            self.dim_k = dim_k
            self.dim_v = dim_v
            self.num_heads = num_heads
            self.linear_q = nn.Linear(dim_in, dim_k, bias=False)
            self.linear_k = nn.Linear(dim_in, dim_k, bias=False)
            self.linear_v = nn.Linear(dim_in, dim_v, bias=False)
            self._norm_fact = 1 / math.sqrt(dim_k // num_heads)

        def forward(self, x, attention_mask=None):
            batch, n, dim_in = x.shape
            assert dim_in == self.dim_in
            nh = self.num_heads
            dk = self.dim_k // nh
            dv = self.dim_v // nh
            dims_perm = (0, 2, 1, 3)
            q = self.linear_q(x).reshape(batch, n, nh, dk).permute(dims_perm)
            k = self.linear_k(x).reshape(batch, n, nh, dk).permute(dims_perm)
            v = self.linear_v(x).reshape(batch, n, nh, dv).permute(dims_perm)
            q, k = q.reshape(-1, n, dk), k.reshape(-1, n, dk)   # erratum fixed: n, not nh
            v = v.reshape(-1, n, dv)
            dist = torch.bmm(q, k.transpose(1, 2)) * self._norm_fact
            if attention_mask is not None:
                dist = dist.reshape(batch, nh, n, n).masked_fill(attention_mask == 0, float("-1e20")).reshape(-1, n, n)
            dist = torch.softmax(dist, dim=-1)
            att = torch.bmm(dist, v)
            return att.reshape(batch, nh, n, dv).permute(0, 2, 1, 3).reshape(batch, n, self.dim_v)   # erratum fixed

    def cross_check(name, ours, theirs, *inputs):
        theirs.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})
        with torch.no_grad():
            expected = theirs.eval()(*[torch.from_numpy(np.array(a)) for a in inputs]).numpy()
        difference = np.abs(ours.eval()(*inputs) - expected).max()
        print(f"{name:36s} max |attnc - torch| = {difference:.2e}")
        assert difference < 1e-5

    cross_check("SelfAttention", net, SelfAttention(dim_in, dim_k, dim_v), x)
    cross_check("SelfAttention, padding mask", net, SelfAttention(dim_in, dim_k, dim_v), x, attention_mask)
    cross_check("MultiHeadSelfAttention", mhsa, MultiHeadSelfAttention(dim_in, 8, 8, num_heads), x)
    cross_check("MultiHeadSelfAttention, padding mask", mhsa, MultiHeadSelfAttention(dim_in, 8, 8, num_heads),
                x, head_mask)
