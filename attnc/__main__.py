"""python -m attnc: a tour of the documents' own examples, computed by attnc.

Runs the example cells of the documents (000's four levels, 001's
multi-head attention with its (3, 8, 2, 2) mask, 003's hand derivation,
002's level 1 line by line, 004's two classes, in that order) and prints
shapes, weights and outputs the way the documents do, then trains 001's
multi-head attention for a few steps (backward, attnc.optim.AdamW) and
freezes it for inference (module.freeze()). Needs only NumPy.

The sections of 000 and 001 and the training draw from one generator, in that
order (notebooks/000_four_levels.ipynb draws the same); the sections of 002
and 004 have their own, seeded as their notebooks are, so each prints the
numbers of its notebook's first cells.
"""
import argparse
import math

import numpy as np

import attnc
from attnc import functional as F


PRINT_OPTIONS = dict(precision=4, suppress=True)


def section(title):
    print("\n" + "=" * 72 + "\n" + title + "\n" + "=" * 72)


def padding_mask(rows, seq):
    """The documents' mask: (batch, seq) rows repeated over queries -> (batch, seq, seq)."""
    mask = np.array(rows)
    return np.repeat(mask[:, None, :], seq, axis=1)


def level_1(rng):
    section("000 level 1: SelfAttentionV1(hidden_dim=4) on X (3, 2, 4)")
    x = rng.standard_normal((3, 2, 4), dtype=np.float32)
    net = attnc.SelfAttentionV1(hidden_dim=4)
    print(net)
    print("output shape:", net(x).shape)


def level_2(rng):
    section("000 level 2: SelfAttentionV2(dim=4), one fused Q/K/V projection")
    x = rng.standard_normal((3, 2, 4), dtype=np.float32)
    output, weights = attnc.SelfAttentionV2(4)(x, return_weights=True)
    print("attention_weight:\n", weights)
    print("output:\n", output)


def level_3(rng):
    section("000 level 3: SelfAttentionV3(2): padding mask, dropout, output_proj")
    x = rng.standard_normal((3, 4, 2), dtype=np.float32)
    mask = padding_mask([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]], 4)
    print("mask shape:", mask.shape)
    net = attnc.SelfAttentionV3(2)  # training mode, as in the document: dropout is on
    output, weights = net(x, mask, return_weights=True)
    print("attention_weight shape:", weights.shape)
    print("attention_weight (before dropout; masked keys are 0):\n", weights)
    print("output:\n", output)


def level_4(rng):
    section("000 level 4: SelfAttentionInterview(4) on (3, 3, 4) with its mask")
    x = rng.standard_normal((3, 3, 4), dtype=np.float32)
    mask = padding_mask([[1, 0, 1], [1, 0, 0], [0, 0, 1]], 3)
    net = attnc.SelfAttentionInterview(4).eval()
    output, weights = net(x, mask, return_weights=True)
    print(weights)
    print(output)


def multi_head(rng):
    section("001 MultiHeadAttention(128, 8) on X (3, 2, 128) with a (3, 8, 2, 2) mask")
    x = rng.standard_normal((3, 2, 128), dtype=np.float32)
    rows = np.array([[0, 1], [0, 0], [1, 0]])
    mask = np.broadcast_to(rows[:, None, None, :], (3, 8, 2, 2))  # unsqueeze(1).unsqueeze(2).expand
    print("mask shape:", mask.shape)
    net = attnc.MultiHeadAttention(128, 8).eval()
    output, weights = net(x, mask, return_weights=True)
    print("attention_weight shape:", weights.shape)
    print("batch 1 masks every key: each head attends uniformly:\n", weights[1, 0])
    print("output shape:", output.shape)
    print("output[0, :, :6]:\n", output[0, :, :6])


def hand_derivation():
    section("003 by hand: keys, querys, values, scores, softmax, outputs")
    x = np.array([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]], dtype=np.float32)
    w_key = np.array([[0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 1, 0]], dtype=np.float32)
    w_query = np.array([[1, 0, 1], [1, 0, 0], [0, 0, 1], [0, 1, 1]], dtype=np.float32)
    w_value = np.array([[0, 2, 0], [0, 3, 0], [1, 0, 3], [1, 1, 0]], dtype=np.float32)
    keys, querys, values = (F.linear(x, w.T) for w in (w_key, w_query, w_value))
    print("keys:\n", keys, "\nquerys:\n", querys, "\nvalues:\n", values)
    outputs, weights = F.scaled_dot_product_attention(querys, keys, values, scale=1.0, return_weights=True)
    print("attn_scores = querys @ keys.T:\n", F.linear(querys, keys))
    print("softmax(attn_scores):\n", weights)
    print("outputs (exact weights):\n", outputs)
    rounded = np.array([[0.0, 0.5, 0.5], [0.0, 1.0, 0.0], [0.0, 0.9, 0.1]], dtype=np.float32)
    print("outputs with the document's rounded weights:\n", rounded @ values)
    net = attnc.SelfAttention(4, 3, 3, bias=False)
    net.load_state_dict({"linear_q.weight": w_query.T, "linear_k.weight": w_key.T, "linear_v.weight": w_value.T})
    print("attnc.SelfAttention with these weights (scaled by 1/sqrt(3)):\n", net(x[None])[0])


def line_by_line():
    """002's level 1 explained line by line: X = torch.rand(3, 2, 4), SelfattentionV1(4).
    Returns (its inputs, what it printed)."""
    section("002 逐行解读 (line by line): SelfattentionV1(4) on X = torch.rand(3, 2, 4)")
    x = np.random.default_rng(2).random((3, 2, 4), dtype=np.float32)   # torch.rand: uniform on [0, 1)
    net = attnc.SelfAttentionV1(4, rng=np.random.default_rng(2))
    q, k, v = (F.linear(x, proj.weight, proj.bias) for proj in (net.Q_proj, net.K_proj, net.V_proj))
    print("lines 16-18  Q, K, V = querry_proj(x), key_proj(x), value_proj(x):", q.shape, k.shape, v.shape)
    attention_value = q @ np.swapaxes(k, -1, -2)
    print("lines 21-23  attention_value = Q @ K.transpose(-1, -2):", attention_value.shape)
    attention_weight = F.softmax(attention_value / math.sqrt(net.hidden_dim), axis=-1)
    print("lines 26-28  attention_weight = softmax(attention_value / sqrt(hidden_dim), dim=-1):\n",
          attention_weight)
    output = attention_weight @ v
    print("lines 31-32  output = attention_weight @ V:\n", output)
    module_difference = float(np.abs(net(x) - output).max())
    print(f"line 36      self_att_net(X), one kernel call: max |difference| = {module_difference:.1e}")
    head_dim = attnc.MultiHeadAttention(256, 8, rng=np.random.default_rng(2)).head_dim
    print("d_k of 256 features in 8 heads (MultiHeadAttention(256, 8).head_dim):", head_dim)
    return (dict(x=x, module=net),
            dict(attention_weight=attention_weight, output=output, module_difference=module_difference,
                 head_dim=head_dim))


def self_attention_templates():
    """004's two classes, which it gives without an example call: run on x (2, 4, 6),
    the multi-head one with a padding mask (the document: "mask的实现方式同上").
    Returns (its inputs, what it printed)."""
    section("004 （多头）自注意力机制的PyTorch实现: SelfAttention(6, 4, 8), MultiHeadSelfAttention(6, 8, 8, 2)")
    x = np.random.default_rng(4).standard_normal((2, 4, 6), dtype=np.float32)   # batch, n, dim_in
    init = np.random.default_rng(4)   # both modules' parameters, in order
    net = attnc.SelfAttention(6, 4, 8, rng=init)
    att, dist = net(x, return_weights=True)
    print("SelfAttention: dist (batch, n, n)", dist.shape, " att (batch, n, dim_v)", att.shape)
    print("dist:\n", dist)
    print("att[0]:\n", att[0])
    multi_head = attnc.MultiHeadSelfAttention(6, 8, 8, num_heads=2, rng=init)
    mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0]])[:, None, None, :]   # (batch, 1, 1, n): sequence 1 is padded
    multi_head_att, multi_head_dist = multi_head(x, mask, return_weights=True)
    print("MultiHeadSelfAttention with a padding mask: dist (batch, nh, n, n)", multi_head_dist.shape,
          " att", multi_head_att.shape)
    print("dist[1], both heads (its last key is padding: weight 0):\n", multi_head_dist[1])
    print("att[1]:\n", multi_head_att[1])
    return (dict(x=x, module=net, multi_head=multi_head, mask=mask),
            dict(dist=dist, att_0=att[0], multi_head_dist_1=multi_head_dist[1],
                 multi_head_att_1=multi_head_att[1]))


def training(rng, steps=30):
    section(f"training: MultiHeadAttention(16, 4) learns the sequence mean, {steps} AdamW steps")
    x = rng.standard_normal((8, 6, 16), dtype=np.float32)
    target = np.broadcast_to(x.mean(axis=1, keepdims=True), x.shape)  # each position: its sequence's mean
    net = attnc.MultiHeadAttention(16, 4, dropout=0.0)  # training mode: a forward keeps what backward needs
    optimizer = attnc.optim.AdamW(net, lr=1e-2)
    losses = []
    for step in range(steps + 1):
        optimizer.zero_grad()
        error = net(x) - target
        losses.append(float(np.mean(error ** 2)))  # mean squared error
        if step % 5 == 0:
            print(f"step {step:2d}  loss {losses[-1]:.4f}")
        if step < steps:
            net.backward(2 * error / error.size)  # d loss / d output
            optimizer.step()
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} ({losses[0] / losses[-1]:.0f}x lower after {steps} steps)")
    return net, x


def inference(net, x):
    section("inference: the trained module frozen, its weights packed once (module.freeze())")
    frozen = net.eval().freeze()
    print(frozen)
    trained = net(x)
    print("frozen(x) is net.eval()(x), bit for bit:", bool(np.array_equal(frozen(x), trained)))
    net.output_linear.weight[...] = 0  # an edit after freezing: the frozen snapshot keeps its weights
    print("after net.output_linear.weight[...] = 0, frozen(x) is still the trained output:",
          bool(np.array_equal(frozen(x), trained)), "| net(x) is:", bool(np.array_equal(net(x), trained)))


def main():
    with np.printoptions(**PRINT_OPTIONS):
        tour()


def tour():
    print(f"attnc {attnc.__version__}: {attnc.get_num_threads()} threads, "
          f"{attnc._C.simd_level()} kernels")
    attnc.manual_seed(0)
    rng = np.random.default_rng(0)
    level_1(rng)
    level_2(rng)
    level_3(rng)
    level_4(rng)
    multi_head(rng)
    hand_derivation()
    line_by_line()
    self_attention_templates()
    inference(*training(rng))
    print("\nEvery class mirrors a document's; see README.md for the table and the errata.")


if __name__ == "__main__":
    # no options: --help says what the tour does, anything else is refused
    argparse.ArgumentParser(prog="python -m attnc", description=(__doc__ or "").split("\n\n")[0]).parse_args()
    main()
