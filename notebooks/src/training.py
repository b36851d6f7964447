# Source of training.ipynb: a tiny model around document 001's MultiHeadAttention learns
# to reverse sequences with attnc's gradients and AdamW; the same model, from the same
# weights and batches, is trained in PyTorch and the two loss curves are compared.

# %% [markdown]
# # Training — a tiny model learns to reverse a sequence
#
# Every attnc module has a `backward`, and `attnc.optim.AdamW` updates the parameters the
# way `torch.optim.AdamW` does. This notebook trains a model built around document 001's
# `MultiHeadAttention` on a toy task, with NumPy and attnc only:
#
# | layer | what it is | parameters |
# | --- | --- | --- |
# | `embed` | token embedding plus a learned positional embedding, in NumPy | `embed.weight` (vocab, hidden), `embed.position` (seq, hidden) |
# | `attention` | `attnc.MultiHeadAttention(hidden, heads, dropout=0.0)` | `query_linear`, `key_linear`, `value_linear`, `output_linear` |
# | `readout` | `attnc.Linear(hidden, vocab)`: one score per token | `readout.weight`, `readout.bias` |
#
# and the loss, the cross-entropy of the readout's scores, is written in NumPy with its
# gradient. The task: read 8 tokens out of 10 and output them in **reverse order**. Each
# output position must fetch the token at the mirrored position, which only attention can
# do; it needs to know positions, hence the positional embedding (attention alone cannot
# tell the positions apart: permuting the input permutes its output).
#
# Then the same model is written in PyTorch, loaded with the same initial weights, and
# trained on the same batches with `torch.optim.AdamW`: in float64 and without dropout
# (`dropout=0.0`, so neither side draws a random mask), the two loss curves agree to
# rounding. That last part is skipped when PyTorch is not installed.

# %% [include] _plots.py

# %%
import math

import numpy as np

import attnc

np.set_printoptions(precision=4, suppress=True)

VOCAB, SEQ, HIDDEN, HEADS = 10, 8, 32, 4
STEPS, BATCH = 300, 32
DTYPE = np.float64                      # float64 on both sides: the curves agree to ~1e-15

init_rng = np.random.default_rng(0)     # the initial weights
data_rng = np.random.default_rng(1)     # the batches and the held-out sequences

# %% [markdown]
# ## The data
#
# All the batches are drawn up front, so the PyTorch run below sees exactly the same ones:
# 300 batches of 32 sequences of 8 tokens in `0..9`. The target is the sequence reversed.
# 1000 more sequences are kept aside to measure the accuracy.

# %%
batches = data_rng.integers(0, VOCAB, size=(STEPS, BATCH, SEQ))
held_out = data_rng.integers(0, VOCAB, size=(1000, SEQ))


def reverse(tokens):
    return tokens[..., ::-1]


print("a sequence:", batches[0, 0], "-> target:", reverse(batches[0, 0]))

# %% [markdown]
# ## The model
#
# The embedding is a small `attnc.Module` subclass: its two tables are registered
# parameters, so `named_parameters()`, `state_dict()`, `named_grads()` and the optimizer
# cover them like the attention's. Its forward looks rows up; its backward adds each
# position's gradient into the row it came from (`np.add.at`, since a token can occur twice
# in a batch) and sums the positional gradient over the batch. The tokens have no gradient,
# so it returns nothing. It initialises both tables from N(0, 1), as `torch.nn.Embedding`.
#
# The model's backward runs the layers' backwards in reverse order: each takes the gradient
# with respect to its output and returns the one with respect to its input, adding its
# parameters' gradients into their buffers.

# %%
class Embedding(attnc.Module):
    """Token embedding plus a learned positional embedding: (batch, seq) ints -> (batch, seq, dim)."""

    def __init__(self, vocab, seq, dim, *, rng, dtype=np.float32):
        super().__init__(dtype=dtype, rng=rng)
        self.register_parameter("weight", rng.standard_normal((vocab, dim)))
        self.register_parameter("position", rng.standard_normal((seq, dim)))
        self.tokens = None

    def forward(self, tokens):
        if self.training:
            self.tokens = tokens               # kept for backward
        return self.weight[tokens] + self.position

    def backward(self, grad_output):
        grads = dict(self.named_grads())
        np.add.at(grads["weight"], self.tokens, grad_output)
        grads["position"] += grad_output.sum(axis=0)
        self.tokens = None


class Reverser(attnc.Module):
    def __init__(self, *, rng, dtype=np.float32):
        super().__init__(dtype=dtype, rng=rng)
        self.embed = Embedding(VOCAB, SEQ, HIDDEN, dtype=dtype, rng=rng)
        self.attention = attnc.MultiHeadAttention(HIDDEN, HEADS, dropout=0.0, dtype=dtype, rng=rng)
        self.readout = attnc.Linear(HIDDEN, VOCAB, dtype=dtype, rng=rng)

    def forward(self, tokens, *, return_weights=False):
        """Scores (batch, seq, vocab); with return_weights, also the attention weights."""
        hidden = self.attention(self.embed(tokens), return_weights=return_weights)
        if return_weights:
            hidden, weights = hidden
            return self.readout(hidden), weights
        return self.readout(hidden)

    def backward(self, grad_scores):
        self.embed.backward(self.attention.backward(self.readout.backward(grad_scores)))


model = Reverser(dtype=DTYPE, rng=init_rng)
initial_state = model.state_dict()        # copies: the PyTorch twin starts from these
print(model)
print({name: value.shape for name, value in initial_state.items()})

# %% [markdown]
# ## The loss
#
# The mean over every position of `-log softmax(scores)[target]`; its gradient with respect
# to the scores is `(softmax(scores) - onehot(target)) / (number of positions)`.

# %%
def cross_entropy(scores, targets):
    """Mean cross-entropy and its gradient with respect to the scores."""
    shifted = scores - scores.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    onehot = np.eye(scores.shape[-1])[targets]
    loss = -(onehot * log_probs).sum(axis=-1).mean()
    return loss, (np.exp(log_probs) - onehot) / targets.size


def accuracy(model, tokens):
    """(share of tokens right, share of whole sequences right), in evaluation mode."""
    predicted = model.eval()(tokens).argmax(axis=-1)
    model.train()
    right = predicted == reverse(tokens)
    return right.mean(), right.all(axis=-1).mean()


example = held_out[:1]                    # the sequence whose attention is plotted below
_, weights_before = model.eval()(example, return_weights=True)
model.train()
print("before training: token accuracy %.3f, sequence accuracy %.3f" % accuracy(model, held_out))

# %% [markdown]
# ## Training with attnc
#
# The loop is torch's: clear the gradients, forward (training mode keeps what backward
# needs), loss, backward, step. `attnc.optim.AdamW` with its defaults (`lr=1e-3`,
# `betas=(0.9, 0.999)`, `eps=1e-8`, `weight_decay=1e-2`) updates every parameter of the
# model, the embedding tables included.

# %%
optimizer = attnc.optim.AdamW(model)
attnc_losses = []
for tokens in batches:
    optimizer.zero_grad()
    loss, grad_scores = cross_entropy(model(tokens), reverse(tokens))
    model.backward(grad_scores)
    optimizer.step()
    attnc_losses.append(loss)
attnc_losses = np.array(attnc_losses)
SHOWN = [0, 50, 100, 150, 200, 250, STEPS - 1]     # printed after the loop: one output per cell
print("\n".join(f"step {step:3d}  loss {attnc_losses[step]:.4f}" for step in SHOWN))

# %%
token_accuracy, sequence_accuracy = accuracy(model, held_out)
print(f"after training, on {len(held_out)} held-out sequences: token accuracy {token_accuracy:.3f}, "
      f"sequence accuracy {sequence_accuracy:.3f}")
predicted = model.eval()(held_out[:4]).argmax(axis=-1)
for tokens, guess in zip(held_out[:4], predicted):
    print(tokens, "->", guess, "right" if np.array_equal(guess, reverse(tokens)) else "WRONG")
_, weights_after = model(example, return_weights=True)
model.train()

# %% [markdown]
# ## What the heads learned
#
# The attention weights of the four heads on one held-out sequence, before and after
# training (evaluation mode, `return_weights=True`). Before, each query spreads its weight
# over the keys by the random embeddings' similarity; after, every head puts most of query
# `i`'s weight on key `7 - i`, the token it must output: the anti-diagonal.

# %%
print("sequence:", example[0], "-> target:", reverse(example[0]))
plot_attention(np.concatenate([weights_before, weights_after]),
               title=f"attention weights on {example[0]}",
               row_names=["before training", "after training"], col_names=[f"head {h}" for h in range(HEADS)])

# %% [markdown]
# ## The same model in PyTorch
#
# Document 001's `MuitiHeadAttention` (its mask and dropout left out: there is no padding
# and `dropout=0.0`), the embedding as two `nn.Parameter`s, an `nn.Linear` readout, with the
# same `state_dict` keys as the attnc model, so its `state_dict()` loads as it is. It is
# trained in float64 on the same batches, with `torch.optim.AdamW` and the same defaults
# (`foreach=False`: the single-tensor implementation that attnc's follows operation by
# operation), and `torch.nn.functional.cross_entropy`.

# %%
try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    torch = None
    print("torch is not installed: the PyTorch run is skipped")

if torch is not None:
    torch.set_num_threads(1)   # tensors this small gain nothing from threads; a busy machine makes them wait

    class TorchEmbedding(nn.Module):
        def __init__(self, vocab, seq, dim):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(vocab, dim))
            self.position = nn.Parameter(torch.empty(seq, dim))

        def forward(self, tokens):
            return self.weight[tokens] + self.position

    class MuitiHeadAttention(nn.Module):
        def __init__(self, hidden_dim, head_num):
            super().__init__()
            self.head_num = head_num
            self.head_dim = hidden_dim // head_num
            self.query_linear = nn.Linear(hidden_dim, hidden_dim)
            self.key_linear = nn.Linear(hidden_dim, hidden_dim)
            self.value_linear = nn.Linear(hidden_dim, hidden_dim)
            self.output_linear = nn.Linear(hidden_dim, hidden_dim)

        def forward(self, X):
            batch_size, seq_len, _ = X.size()
            q_state, k_state, v_state = (
                linear(X).view(batch_size, seq_len, self.head_num, self.head_dim).transpose(1, 2)
                for linear in (self.query_linear, self.key_linear, self.value_linear))
            attention_weight = torch.softmax(q_state @ k_state.transpose(-1, -2) / math.sqrt(self.head_dim), dim=-1)
            output_mid = (attention_weight @ v_state).transpose(1, 2).reshape(batch_size, seq_len, -1)
            return self.output_linear(output_mid)

    class TorchReverser(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = TorchEmbedding(VOCAB, SEQ, HIDDEN)
            self.attention = MuitiHeadAttention(HIDDEN, HEADS)
            self.readout = nn.Linear(HIDDEN, VOCAB)

        def forward(self, tokens):
            return self.readout(self.attention(self.embed(tokens)))

    twin = TorchReverser().to(torch.float64)
    twin.load_state_dict({key: torch.from_numpy(value) for key, value in initial_state.items()})
    torch_optimizer = torch.optim.AdamW(twin.parameters(), foreach=False)
    torch_losses = []
    for tokens in torch.from_numpy(batches):
        torch_optimizer.zero_grad()
        loss = F.cross_entropy(twin(tokens).reshape(-1, VOCAB), tokens.flip(-1).reshape(-1))
        loss.backward()
        torch_optimizer.step()
        torch_losses.append(loss.item())
    torch_losses = np.array(torch_losses)
    print("\n".join(f"step {step:3d}  loss {torch_losses[step]:.4f}   (attnc {attnc_losses[step]:.4f})"
                    for step in SHOWN))

# %% [markdown]
# ## The two loss curves
#
# On a log scale, so the end of training is visible too; the right panel is their
# difference, step by step.

# %%
fig, (ax, ax_diff) = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True,
                                  gridspec_kw={"width_ratios": [2, 1]})
steps = np.arange(STEPS)
ax.plot(steps, attnc_losses, label="attnc (NumPy + attnc backward, attnc.optim.AdamW)", linewidth=3, alpha=0.5)
if torch is not None:
    ax.plot(steps, torch_losses, "--", color="black", label="PyTorch (autograd, torch.optim.AdamW)", linewidth=1)
    ax_diff.plot(steps, attnc_losses - torch_losses, color="tab:red", linewidth=1)
else:
    ax_diff.text(0.5, 0.5, "PyTorch not installed", ha="center", va="center", transform=ax_diff.transAxes)
ax.set_yscale("log")
ax.set_xlabel("step")
ax.set_ylabel("cross-entropy")
ax.set_title("training loss, same initial weights and batches (float64)", fontsize=9)
ax.legend(fontsize=8)
ax_diff.set_xlabel("step")
ax_diff.set_title("attnc loss - PyTorch loss", fontsize=9)
ax_diff.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
plt.show()

# %% [markdown]
# ## The check
#
# The largest difference between the two runs' losses over the 300 steps (asserted tiny, so
# the notebook fails if the attnc gradients or optimizer drift from PyTorch's), and the
# largest difference between the trained parameters.

# %%
print(f"attnc: loss {attnc_losses[0]:.4f} -> {attnc_losses[-1]:.6f}, "
      f"held-out token accuracy {token_accuracy:.3f}, sequence accuracy {sequence_accuracy:.3f}")
if torch is None:
    print("torch is not installed: the comparison is skipped")
else:
    loss_difference = np.abs(attnc_losses - torch_losses).max()
    trained = twin.state_dict()
    weight_difference = max(np.abs(value - trained[key].numpy()).max() for key, value in model.state_dict().items())
    print(f"torch: loss {torch_losses[0]:.4f} -> {torch_losses[-1]:.6f}")
    print(f"max |attnc - torch| loss over {STEPS} steps = {loss_difference:.2e}")
    print(f"max |attnc - torch| trained parameter   = {weight_difference:.2e}")
    assert loss_difference < 1e-9, loss_difference
    assert weight_difference < 1e-6, weight_difference
