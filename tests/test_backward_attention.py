"""Backward of the attention: every module's backward (grad of x and of each
parameter) and attnc.functional.scaled_dot_product_attention_backward, against
torch autograd on the same values (in float64, the documents' formulas: masked_fill
with -1e20, causal -inf), float64 central differences of the NumPy reference, the
module's own dropout mask, other thread counts and batches (the same bits), and
the one-backward-per-forward protocol."""
import math

import numpy as np
import pytest
import torch

import attnc
from attnc import functional as F
from toolkit import (DROPOUT_IDS, DROPOUT_MODELS, MODEL, MODEL_IDS, MODELS, make_pair, module_heads, padded_batch,
                     padding_bias, random_keep_mask, ref_attend, ref_forward, scores_shape)
from toolkit import assert_grad_close as check
from toolkit import K_BLOCK, lone_key_masks, real_thread_counts

DROP_ATTR = ("attention_dropout", "dropout")   # the dropout submodule's name (both sides)


pytestmark = pytest.mark.usefixtures("serial_torch")


def normal(rng, shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def set_dropout(module, p):
    for name in DROP_ATTR:
        sub = getattr(module, name, None)
        if sub is not None:
            sub.p = p


def torch_module_grads(model, tm, x, mask, g, drop=None):
    """(out, grad_x, {name: grad}) of the document model by autograd in float64 and
    training mode, x of any leading dims (flattened for the classes without them);
    drop: attnc's dropout mask (lead..., heads, T, T) in place of torch's dropout."""
    tm = tm.double().train()
    xt = torch.tensor(np.asarray(x, np.float64), requires_grad=True)
    lead, (s, d) = x.shape[:-2], x.shape[-2:]
    b, h = int(np.prod(lead)), model.n_heads(d)
    mt = None if mask is None else torch.from_numpy(np.array(mask))
    if drop is not None:
        t = torch.from_numpy(drop.astype(np.float64))
        t = t[..., 0, :, :] if model.native_batch else t.reshape((b, drop.shape[-3], s, s))
        getattr(tm, next(n for n in DROP_ATTR if hasattr(tm, n))).forward = lambda w: w * t   # attnc's mask
    if model.native_batch:
        out = tm(xt, mt) if model.masked else tm(xt)
    else:
        if mt is not None:
            mt = mt.broadcast_to(scores_shape(model, d, x.shape)).reshape((b,) + ((h,) if h else ()) + (s, s))
        x3 = xt.reshape(b, s, d)
        out = tm(x3, mt) if model.masked else tm(x3)
        out = out.reshape(tuple(lead) + tuple(out.shape[-2:]))
    out.backward(torch.tensor(np.asarray(g, np.float64)))
    return out.detach().numpy(), xt.grad.numpy(), {n: p.grad.numpy() for n, p in tm.named_parameters()}


def attnc_grads(model, am, x, mask, g, return_weights=False):
    """(out, grad_x, {name: grad}) of one training-mode forward and backward from zeroed buffers."""
    am.train()
    am.zero_grad()
    out = am(x, mask, return_weights=return_weights) if model.masked else am(x, return_weights=return_weights)
    out = out[0] if return_weights else out
    gx = am.backward(g)
    return out, gx, {n: buf.copy() for n, buf in am.named_grads()}


def compare_to_torch(model, tm, am, x, mask, g, dtype, what, drop=None, return_weights=False):
    out, gx, grads = attnc_grads(model, am, x, mask, g, return_weights)
    t_out, t_gx, t_grads = torch_module_grads(model, tm, x, mask, g, drop)
    check(out, t_out, dtype, f"{what} out")
    check(gx, t_gx, dtype, f"{what} grad_x")
    assert set(grads) == set(t_grads), (what, sorted(grads), sorted(t_grads))
    for name, grad in grads.items():
        check(grad, t_grads[name], dtype, f"{what} {name}")


def make_mask(rng, kind, model, dim, x_shape, dtype):
    """A 0/1 mask (or with other nonzero values for the int8 case) of a broadcast shape
    the module accepts: full scores shape, 'ss' (T, T), 'bcast' (lead..., 1, T, T) for
    multi-head and (1, T, T) for single-head, 'keys' (lead..., 1, [1,] T); 'row':
    the full shape with the first item's second query row fully masked."""
    lead, s, h = tuple(x_shape[:-2]), x_shape[-2], model.n_heads(dim)
    shape = {"full": scores_shape(model, dim, x_shape), "row": scores_shape(model, dim, x_shape), "ss": (s, s),
             "bcast": lead + (1, s, s) if h else (1, s, s),
             "keys": lead + ((1, 1, s) if h else (1, s))}[kind]
    m = random_keep_mask(rng, shape)
    if kind == "row":
        m[(0,) * (m.ndim - 2) + (min(1, s - 1),)] = 0
    if np.dtype(dtype) == np.int8:
        m = m * rng.choice(np.array([1, 3, -2]), shape)
    return m.astype(dtype)


# (seq, dim, leading dims of x, mask kind, mask dtype): sizes across the kernel's tiles
MODULE_CASES = [
    (1, 8, (2,), "full", np.int64), (1, 8, (3,), None, None), (2, 8, (2,), "keys", bool),
    (5, 12, (2, 3), "full", np.int8), (5, 8, (2, 3), "row", bool), (7, 8, (), "ss", np.int64),
    (95, 8, (2,), "bcast", np.int64), (97, 12, (1,), "ss", bool), (191, 8, (1,), "row", np.int64),
    (193, 8, (2,), "keys", np.int64), (300, 8, (1,), None, None), (300, 12, (1,), "full", bool),
]


@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
def test_module_gradients_match_torch(model, dtype):
    rng = np.random.default_rng(0)
    for seq, dim, lead, kind, mdt in MODULE_CASES:
        kind = kind if model.masked else None
        tm, am = make_pair(model, dim, dtype)
        set_dropout(tm, 0.0)
        set_dropout(am, 0.0)
        x = normal(rng, lead + (seq, dim), dtype)
        mask = None if kind is None else make_mask(rng, kind, model, dim, x.shape, mdt)
        out_dim = am(x, mask).shape[-1] if model.masked else am(x).shape[-1]
        g = normal(rng, lead + (seq, out_dim), dtype)
        compare_to_torch(model, tm, am, x, mask, g, dtype, f"seq={seq} dim={dim} lead={lead} mask={kind}",
                         return_weights=seq in (5, 97))   # a forward that also returns the weights


# ============================================================================
# the functional backward


def check_biased_grads(grads, q, k, v, bias, g, dtype):
    """attnc's (grad_q, grad_k, grad_v) against torch's autograd in float64 of
    softmax(q k^T / 4 + bias) v (E = 16)."""
    Q, K, V = (torch.tensor(a.astype(np.float64), requires_grad=True) for a in (q, k, v))
    scores = Q @ K.transpose(-1, -2) / 4 + torch.from_numpy(np.asarray(bias, np.float64))
    (torch.softmax(scores, -1) @ V).backward(torch.from_numpy(g.astype(np.float64)))
    for got, w, name in zip(grads, (Q.grad, K.grad, V.grad), ("grad_query", "grad_key", "grad_value")):
        check(got, w, dtype, name)


def torch_sdpa(q, k, v, g, mask=None, causal=False, scale=None):
    """(out, lse, grad_q, grad_k, grad_v) of the math path by autograd in float64."""
    Q, K, V = (torch.tensor(np.asarray(a, np.float64), requires_grad=True) for a in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = Q @ K.transpose(-1, -2) * scale
    if mask is not None:
        scores = scores.masked_fill(torch.from_numpy(np.asarray(mask)) == 0, -1e20)
    if causal:
        scores = scores + torch.full(scores.shape[-2:], -math.inf, dtype=torch.float64).triu(1)
    out = torch.softmax(scores, dim=-1) @ V
    out.backward(torch.tensor(np.asarray(g, np.float64)))
    return out.detach().numpy(), torch.logsumexp(scores, -1).detach().numpy(), Q.grad, K.grad, V.grad


def sdpa_inputs(rng, qb, kb, vb, L, S, E, Ev, dtype):
    return (normal(rng, qb + (L, E), dtype), normal(rng, kb + (S, E), dtype), normal(rng, vb + (S, Ev), dtype))


def column_sums_in_k_blocks(g, real):
    """Column sums of g (rows, n) in the order derived by hand from the GEMM of ones (1, rows)
    . g through which the module's bias gradients were first summed (at every level but
    AVX512_BF16's bfloat16 pairs): each block of K_BLOCK rows added row by row from zero in
    `real`, the blocks' sums added in order."""
    total = np.zeros(g.shape[1], real)
    for first in range(0, len(g), K_BLOCK):
        block = np.zeros(g.shape[1], real)
        for row in g[first:first + K_BLOCK].astype(real):
            block += row
        total += block
    return total


@pytest.mark.parametrize("rows, n", [(1, 5), (7, 16), (K_BLOCK - 24, 17), (K_BLOCK + 1, 100), (K_BLOCK + 300, 100),
                                     (2 * K_BLOCK + 52, 40), (3, 1100)])
@pytest.mark.parametrize("elem", ["float32", "float64", "float16", "bfloat16"])
def test_module_bias_gradient_is_the_column_sums_in_k_blocks(rows, n, elem, simd_mode_all, restore_threads):
    """The output projection's bias gradient is grad_out's column sums: blocks of K_BLOCK
    rows each summed from zero in the compute type (float for the 16-bit dtypes), the
    blocks' sums in order, rounded once. The same bits on 1, 2 and 3 threads (the columns
    split among tasks of up to 512), one to three blocks, column counts off the vector
    widths. The rows are items of one row each: the bias gradient sums the rows of all
    items alike, and one item of 2100 rows spent 1.2 s a case on its attention (2.8 s
    under ASan, 74 s over all its cases there; 2026-12-07)."""
    import ml_dtypes
    dt = ml_dtypes.bfloat16 if elem == "bfloat16" else np.dtype(elem)
    real = np.float64 if elem == "float64" else np.float32
    rng = np.random.default_rng(rows + n)
    x, grad = normal(rng, (rows, 1, n), dt), normal(rng, (rows, 1, n), dt)
    expected = column_sums_in_k_blocks(grad[:, 0], real).astype(dt)
    for threads in (1, 2, 3):
        attnc.set_num_threads(threads)
        module = attnc.MultiHeadAttention(n, 1, 0.0, dtype=dt, rng=np.random.default_rng(1))
        module(x)
        module.backward(grad)
        got = dict(module.named_grads())["output_linear.bias"]
        np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8),
                                      f"{elem} ({rows}, {n}), {threads} threads")


@pytest.mark.parametrize("n", [5, 40, 100])
def test_module_qkv_bias_gradients_are_the_column_sums_of_their_projections(n, dtype, simd_mode, restore_threads):
    """The Q, K and V biases' gradients are the column sums (in K blocks, as above) of the
    projections' gradients: with x the identity (n rows of n), each weight gradient
    dP^T . x is dP^T exactly (one product by 1 and zeros a sum), so dP is read back from it."""
    rng = np.random.default_rng(n)
    x, grad = np.eye(n, dtype=dtype)[None], normal(rng, (1, n, n), dtype)
    for threads in (1, 2, 3):
        attnc.set_num_threads(threads)
        module = attnc.MultiHeadAttention(n, 1, 0.0, dtype=dtype, rng=np.random.default_rng(1))
        module(x)
        module.backward(grad)
        grads = dict(module.named_grads())
        for name in ("query_linear", "key_linear", "value_linear"):
            expected = column_sums_in_k_blocks(grads[name + ".weight"].T, dtype)
            np.testing.assert_array_equal(grads[name + ".bias"], expected, f"{name}, {threads} threads")


@pytest.mark.parametrize("embed", [8, 200, 300])
def test_module_gradients_of_separate_weights_equal_those_of_one_stacked_array(embed, dtype, restore_threads):
    """The backward multiplies dQKV by the Q, K and V weights as one (3 embed, embed)
    matrix: read in place when they are row blocks of one array, else a stacked copy made by
    tasks of 256 KB on the pool's threads (at 200 and 300 wide the parts end inside tasks).
    Both give the same bits, on 1, 2 and 3 threads."""
    rng = np.random.default_rng(embed)
    x, grad = normal(rng, (2, 5, embed), dtype), normal(rng, (2, 5, embed), dtype)
    stack = normal(rng, (3 * embed, embed), dtype)
    names = ("query_linear", "key_linear", "value_linear")
    for threads in (1, 2, 3):
        attnc.set_num_threads(threads)
        results = []
        for in_one_array in (True, False):
            module = attnc.MultiHeadAttention(embed, 4, 0.0, dtype=dtype, rng=np.random.default_rng(1))
            for i, name in enumerate(names):
                part = stack[i * embed:(i + 1) * embed]
                getattr(module, name).weight = part if in_one_array else part.copy()
            assert np.shares_memory(module.key_linear.weight, stack) == in_one_array
            module(x)
            results.append([module.backward(grad)] + [g for _, g in module.named_grads()])
        for stacked, separate in zip(*results):
            np.testing.assert_array_equal(separate.view(np.uint8), stacked.view(np.uint8),
                                          f"{embed} wide, {threads} threads")


# id: (query, key, value batch dims, L, S, E, Ev, mask shape, mask dtype, is_causal, scale)
SDPA_CASES = {
    "plain": ((2, 3), (2, 3), (2, 3), 5, 7, 4, 4, None, None, False, None),
    "causal-L<S": ((2,), (2,), (2,), 5, 9, 4, 3, None, None, True, None),
    "causal-L>S": ((2,), (2,), (2,), 9, 5, 4, 3, None, None, True, None),
    "causal-masked": ((2, 2), (2, 2), (2, 2), 97, 193, 8, 5, (2, 1, 97, 193), bool, True, None),
    "mask-full-row": ((2, 3), (2, 3), (2, 3), 6, 6, 4, 4, (2, 3, 6, 6), np.int64, False, None),
    "mask-keys": ((2, 3), (2, 3), (2, 3), 7, 9, 4, 4, (2, 1, 1, 9), bool, False, None),
    "mask-LS": ((2, 3), (2, 3), (2, 3), 7, 9, 4, 4, (7, 9), np.int8, False, None),
    "mask-heads": ((2, 3), (2, 3), (2, 3), 7, 9, 4, 4, (1, 3, 7, 9), np.int64, False, None),
    "mask-causal-row": ((2,), (2,), (2,), 8, 8, 4, 4, (2, 8, 8), np.int64, True, None),
    "kv-broadcast": ((2, 3), (1, 3), (1, 3), 6, 8, 4, 5, (2, 1, 6, 8), bool, False, None),
    "q-broadcast": ((3,), (2, 3), (2, 1), 6, 8, 4, 5, None, None, True, None),
    "E!=Ev": ((2,), (2,), (2,), 11, 13, 5, 17, None, None, False, None),
    "scale": ((2,), (2,), (2,), 11, 13, 6, 3, (11, 13), bool, False, 0.37),
    "1x1": ((1,), (1,), (1,), 1, 1, 3, 2, None, None, False, None),
    "1x300": ((1,), (1,), (1,), 1, 300, 8, 8, (300,), bool, False, None),
    "300x1": ((1,), (1,), (1,), 300, 1, 8, 8, None, None, True, None),
    "96x192": ((2,), (2,), (2,), 96, 192, 8, 8, None, None, True, None),
    "95x191": ((1,), (1,), (1,), 95, 191, 8, 8, (95, 191), np.int64, False, None),
    "97x193": ((1,), (1,), (1,), 97, 193, 8, 8, None, None, True, 0.2),
    "193x97": ((1,), (1,), (1,), 193, 97, 8, 8, (193, 97), bool, True, None),
    "300x300": ((1,), (1,), (1,), 300, 300, 8, 8, (1, 300, 300), np.int64, True, None),
}


@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_sdpa_backward_matches_torch(case, dtype):
    qb, kb, vb, L, S, E, Ev, mshape, mdt, causal, scale = SDPA_CASES[case]
    rng = np.random.default_rng(len(case))
    q, k, v = sdpa_inputs(rng, qb, kb, vb, L, S, E, Ev, dtype)
    mask = None
    if mshape is not None:
        mask = random_keep_mask(rng, mshape, mdt)
        if case.endswith("row"):
            mask[..., 1, :] = 0        # a fully masked query row: uniform weights (-1e20 everywhere)
    batch = np.broadcast_shapes(qb, kb, vb)
    g = normal(rng, batch + (L, Ev), dtype)
    out, lse = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                              return_lse=True)
    gq, gk, gv = F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, attn_mask=mask, is_causal=causal,
                                                         scale=scale)
    t_out, t_lse, tq, tk, tv = torch_sdpa(q, k, v, g, mask, causal, scale)
    for got, want, name in zip((out, gq, gk, gv), (t_out, tq, tk, tv), ("out", "grad_query", "grad_key", "grad_value")):
        check(got, want, dtype, name)
    tol = 1e-9 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(lse, t_lse, rtol=tol, atol=tol, err_msg="lse")   # elementwise: -1e20 rows
    assert lse.dtype == dtype


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpa_backward_padding_mask_matches_torch(causal, dtype):
    """Key blocks a padding mask hides from a whole query tile are left out of the
    backward (their P is exactly 0): the gradients are still the math path's."""
    rng = np.random.default_rng(40)
    q, k, v, keep = padded_batch(rng, dtype)
    g = normal(rng, (3, 2, q.shape[-2], 16), dtype)
    out, lse = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=causal, return_lse=True)
    grads = F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, attn_mask=keep, is_causal=causal)
    _, _, *want = torch_sdpa(q, k, v, g, keep, causal)
    for got, w, name in zip(grads, want, ("grad_query", "grad_key", "grad_value")):
        check(got, w, dtype, name)
    hidden = ~np.broadcast_to(keep[:, :, 0, :, None], grads[1].shape)
    if not causal:   # (causal: item 1's first queries see only hidden keys, which then weigh)
        np.testing.assert_array_equal(grads[1][hidden], 0)
        np.testing.assert_array_equal(grads[2][hidden], 0)


@pytest.mark.parametrize("lone", ["hidden", "kept"])
def test_sdpa_backward_one_key_unlike_the_rest_of_its_tile_matches_torch(lone, dtype, simd_mode):
    """The backward's mask covers (a pair of tile and key block kept whole, hidden whole or
    mixed: mask_cover, shared by the pair's skip test and its gradients) with one key
    unlike the rest of its tile, at vector edges and an overlapped row end, in both key
    tiles: the gradients as torch's."""
    rng = np.random.default_rng(47)
    L, S = 100, 269
    q, k, v = (normal(rng, (1, 2, n, 8), dtype) for n in (L, S, S))
    g = normal(rng, (1, 2, L, 8), dtype)
    for query, key, mask, keep in lone_key_masks("(L, S)", lone, L, S):
        if key not in (0, 63, 76, 191, 192, 223, 268) or query not in (0, 96, 99):
            continue
        out, lse = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, return_lse=True)
        grads = F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, attn_mask=mask)
        _, _, *want = torch_sdpa(q, k, v, g, keep)
        for got, w, name in zip(grads, want, ("grad_query", "grad_key", "grad_value")):
            check(got, w, dtype, f"{name}, query {query} key {key}")


@pytest.mark.parametrize("layout", ["contiguous", "rows apart", "keys apart"])
def test_sdpa_backward_per_position_mask_matches_torch(layout, dtype, simd_mode):
    """A mask that changes from query to query, read a vector of keys at a time and
    turned where its rows are contiguous along the keys (else key by key): the forward
    and the gradients as torch's, over query and key tiles with ends past whole vectors."""
    rng = np.random.default_rng(43)
    L, S = 131, 227
    q, k, v = (normal(rng, (2, 3, n, 16), dtype) for n in (L, S, S))
    keep = {"contiguous": rng.random((2, 1, L, S)) < 0.6,
            "rows apart": (rng.random((2, 1, L, S + 9)) < 0.6)[..., 4:S + 4],
            "keys apart": (rng.random((2, 1, L, 2 * S)) < 0.6)[..., ::2]}[layout]
    keep[0, 0, 5] = False   # a query that sees no key: uniform weights over the fill
    g = normal(rng, (2, 3, L, 16), dtype)
    out, lse = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, return_lse=True)
    grads = F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, attn_mask=keep)
    want_out, _, *want = torch_sdpa(q, k, v, g, keep)
    for got, w, name in zip((out, *grads), (want_out, *want), ("out", "grad_query", "grad_key", "grad_value")):
        check(got, w, dtype, name)


def test_sdpa_backward_all_padding_item_matches_torch(dtype):
    """An item whose every key is hidden attends uniformly (the fill everywhere): its
    key blocks must not be left out, though the mask hides them all."""
    rng = np.random.default_rng(42)
    q, k, v, keep = padded_batch(rng, dtype)
    keep[1] = False
    g = normal(rng, (3, 2, q.shape[-2], 16), dtype)
    out, lse = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, return_lse=True)
    grads = F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, attn_mask=keep)
    _, _, *want = torch_sdpa(q, k, v, g, keep)
    for got, w, name in zip(grads, want, ("grad_query", "grad_key", "grad_value")):
        check(got, w, dtype, name)
    assert np.abs(grads[2][1]).min() > 0     # every value of the item weighs


@pytest.mark.parametrize("bad", [np.inf, np.nan], ids=["inf", "nan"])
def test_sdpa_backward_padding_mask_non_finite_grad_out_reaches_hidden_keys(bad, dtype):
    """dV of a hidden key is the sum of its zero weights times dO: a non-finite dO makes it
    NaN, as in the math path, so the hidden blocks are computed then."""
    rng = np.random.default_rng(43)
    q, k, v, keep = padded_batch(rng, dtype)
    g = normal(rng, (3, 2, q.shape[-2], 16), dtype)
    g[0, 1, 7, 2] = bad
    out, lse = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, return_lse=True)
    grads = F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, attn_mask=keep)
    _, _, *want = torch_sdpa(q, k, v, g, keep)
    # (grad_key with an inf dO: attnc's D = dO . O is inf where torch's sum of P dP is NaN,
    # so some of its entries are inf where torch's are NaN: not what this test is about)
    names = ("grad_query", "grad_value") if bad == np.inf else ("grad_query", "grad_key", "grad_value")
    for got, w, name in zip(grads, want, ("grad_query", "grad_key", "grad_value")):
        if name in names:
            check(got, w, dtype, name)
    assert np.isnan(grads[2][0, 1, 600, 2])   # a hidden key of item 0


def test_sdpa_backward_padding_mask_leaves_the_bits_as_computing_every_pair(dtype, simd_mode):
    """The oracle: the same gradients computed over every (query tile, key block) pair. A
    row that hides every key (every 8th here, with dO 0 there, so that it adds exact zeros)
    keeps its tile's pairs computed; the padding mask's tiles leave the hidden blocks out."""
    rng = np.random.default_rng(41)
    q, k, v, keep = padded_batch(rng, dtype)
    L = q.shape[-2]
    dead = np.arange(L) % 8 == 0
    every_pair = np.broadcast_to(keep, (3, 1, L, keep.shape[-1])).copy()
    every_pair[:, :, dead] = False
    g = normal(rng, (3, 2, L, 16), dtype)
    g[:, :, dead] = 0
    results = []
    for mask in (keep, every_pair):
        out, lse = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, return_lse=True)
        results.append(F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, attn_mask=mask))
    (sq, sk, sv), (cq, ck, cv) = results
    assert sq[:, :, ~dead].tobytes() == cq[:, :, ~dead].tobytes()
    assert sk.tobytes() == ck.tobytes() and sv.tobytes() == cv.tobytes()


def test_sdpa_backward_padding_bias_matches_torch(dtype):
    """Padding as a -inf bias (torch's convention): pairs whose bias is -inf all over are
    left out of the backward; the gradients are still the math path's."""
    rng = np.random.default_rng(44)
    q, k, v, keep = padded_batch(rng, dtype)
    bias = padding_bias(keep, dtype)
    g = normal(rng, (3, 2, q.shape[-2], 16), dtype)
    out, lse = F.scaled_dot_product_attention(q, k, v, attn_bias=bias, return_lse=True)
    grads = F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, attn_bias=bias)
    check_biased_grads(grads, q, k, v, bias, g, dtype)


@pytest.mark.parametrize("overflow", ["dO . V", "dO . O"])
def test_sdpa_backward_band_keeps_pairs_whose_products_overflow(overflow, dtype, simd_mode):
    """Pairs outside the causal band are left out only when dP = dO . V and D = dO . O are
    surely finite: a finite value (or output) and dO whose product overflows give 0 * inf,
    NaN, at the hidden pairs in PyTorch's math path. The oracle: the band given as a bias
    (0 and a finite -max/2), which weighs the same and, the products overflowing, is not
    left out either; the gradients must have the same bits, and grad_query NaN in rows
    that cannot see the huge key, as in PyTorch."""
    rng = np.random.default_rng(47)
    L = 400
    q, k, v = (normal(rng, (1, 2, L, 16), dtype) for _ in range(3))
    g = np.full((1, 2, L, 16), 2, dtype)
    huge = np.finfo(dtype).max / 2
    if overflow == "dO . V":
        v[0, 1, 200] = huge          # hidden from queries 0..199
    band = np.triu(np.full((L, L), -huge), 1).astype(dtype)
    results = []
    for kw in (dict(is_causal=True), dict(attn_bias=band)):
        with np.errstate(all="ignore"):
            out, lse = F.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
            if overflow == "dO . O":
                out[0, 1, 7] = huge
            results.append(F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, **kw))
    for skipped, computed in zip(*results):
        assert skipped.tobytes() == computed.tobytes()
    assert np.isnan(results[0][0][0, 1, :200] if overflow == "dO . V" else results[0][1][0, 1]).any()


@pytest.mark.parametrize("values", ["normal", "nan value", "nan grad_out", "inf out", "nan lse",
                                    "dO . V overflows", "dO . O overflows"])
def test_sdpa_backward_padding_bias_bits_as_computing_every_pair(values, dtype, simd_mode):
    """The oracle: every 8th row's hidden keys get -2000 instead of -inf (a weight of
    exactly 0 just the same, in float64 too: exp(-2000) is below its range), far above
    the floor under which a finite bias's pairs are left out (bias_floor: here below
    -5000), so that no block is hidden all over and every pair is computed; every
    gradient must have the same bits. A NaN value, dO or inf output reaching the hidden
    pairs' gradients (0 * NaN), finite ones whose dP = dO . V or D = dO . O overflows (0 *
    inf), or a NaN lse given for a row (every P of the row NaN), must keep them computed."""
    rng = np.random.default_rng(45)
    q, k, v, keep = padded_batch(rng, dtype)
    L = q.shape[-2]
    bias = np.broadcast_to(padding_bias(keep, dtype), (3, 1, L, keep.shape[-1]))
    every_pair = bias.copy()
    dead = np.arange(L) % 8 == 0
    every_pair[:, :, dead] = np.where(np.isinf(every_pair[:, :, dead]), -2000, 0)
    g = normal(rng, (3, 2, L, 16), dtype)
    if values == "nan value":
        v[0, 1, 600, 2] = np.nan      # item 0 hides keys 250..699
    if values == "nan grad_out":
        g[0, 1, 7, 2] = np.nan
    huge = np.finfo(dtype).max / 2
    if values == "dO . V overflows":
        v[0, 1, 600] = huge          # a hidden key's value: finite, its dP = dO . V is not
        g[0, 1] = 2
    results = []
    for b in (bias, every_pair):
        with np.errstate(all="ignore"):
            out, lse = F.scaled_dot_product_attention(q, k, v, attn_bias=b, return_lse=True)
        if values == "inf out":
            out[0, 1, 7, 2] = np.inf
        if values == "nan lse":
            lse[0, 1, 7] = np.nan
        if values == "dO . O overflows":
            out[0, 1, 7] = huge      # finite, and so is dO; their D = dO . O is not
            g[0, 1, 7] = 2
        with np.errstate(all="ignore"):
            results.append(F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, attn_bias=b))
    for skipped, computed in zip(*results):
        assert skipped.tobytes() == computed.tobytes()
    if values != "normal":
        assert np.isnan(results[0][1][0, 1]).any()   # grad_key of item 0's head 1


@pytest.mark.parametrize("fill", ["finfo.min", "-1e9", "-1e4"])
def test_sdpa_backward_finite_mask_bias_bits_as_minus_inf(fill, dtype, simd_mode):
    """A causal and padding mask of finite values far below the scores (Hugging Face's
    torch.finfo(dtype).min, BERT's -1e4): every hidden key weighs exactly 0, as under -inf, so the
    forward and the gradients must have the bits of the -inf mask (every row keeps key 0),
    whose pairs are left out when hidden all over (tested against every pair computed
    above), while the finite mask's are left out below a floor of the rows' lse."""
    rng = np.random.default_rng(52)
    q, k, v, keep = padded_batch(rng, dtype, L=300, S=500)
    keep[1:] = True
    keep = keep & np.tril(np.ones((300, 500), bool), 200)
    g = normal(rng, (3, 2, 300, 16), dtype)
    low = np.finfo(dtype).min if fill == "finfo.min" else float(fill)
    results = []
    for hidden in (low, -np.inf):
        bias = np.where(keep, 0.0, hidden).astype(dtype)
        out, lse = F.scaled_dot_product_attention(q, k, v, attn_bias=bias, return_lse=True)
        grads = F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, attn_bias=bias)
        results.append((out, *grads))
    for finite, minus_inf in zip(*results):
        assert finite.tobytes() == minus_inf.tobytes()


@pytest.mark.parametrize("variant", ["hidden keys score high", "rows' lse far apart"])
def test_sdpa_backward_finite_mask_bias_that_weighs_is_computed(variant, simd_mode):
    """Finite masks whose hidden keys still weigh: item 0's hidden keys' q . k (up to 2e4)
    outweighs a fill of -1e4; odd rows' kept keys biased by 1e5 beside even rows' 0, with a
    fill of -3 (the floor must be far below the lowest lse of a tile, not the highest).
    Oracle: torch's autograd in float64."""
    rng = np.random.default_rng(53)
    q, k, v, keep = padded_batch(rng, np.float64, L=300, S=500)
    keep = keep & np.tril(np.ones((300, 500), bool), 200)
    kept, fill = 0.0, -1e4
    if variant == "hidden keys score high":
        q[0] = np.abs(q[0])
        k[0, :, 250:] = np.abs(k[0, :, 250:]) * 3000
    else:
        kept, fill = np.where(np.arange(300)[:, None] % 2, 1e5, 0.0), -3.0
    bias = np.where(keep, kept, fill)
    g = normal(rng, (3, 2, 300, 16))
    out, lse = F.scaled_dot_product_attention(q, k, v, attn_bias=bias, return_lse=True)
    grads = F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, attn_bias=bias)
    check_biased_grads(grads, q, k, v, bias, g, np.float64)


@pytest.mark.parametrize("lse_given", ["lse + 1e5", "one row's lse 1e30"])
def test_sdpa_backward_finite_mask_bias_with_an_lse_beyond_the_exact_limit(lse_given, dtype):
    """An lse far from the forward's: attnc recomputes the rows' max and sum for |lse|
    beyond a limit, so the gradients are still the math path's; a finite mask's pairs
    must not be left out by a floor made from that lse (a review found every pair left
    out: gradients 0). Oracle: torch's autograd in float64."""
    rng = np.random.default_rng(55)
    q, k, v, keep = padded_batch(rng, dtype, L=64, S=256)
    bias = np.where(keep, 0.0, np.finfo(dtype).min).astype(dtype)
    g = normal(rng, (3, 2, 64, 16), dtype)
    out, lse = F.scaled_dot_product_attention(q, k, v, attn_bias=bias, return_lse=True)
    if lse_given == "lse + 1e5":   # beyond the limit of both dtypes (128, 65536)
        lse = lse + 1e5
    else:
        lse[:, :, 0] = 1e30
    grads = F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, attn_bias=bias)
    check_biased_grads(grads, q, k, v, bias, g, dtype)


# ============================================================================
# dropout: the module's gradients are torch's under the module's own mask


def module_dropout_mask(am, x_shape, p, seed):
    """The dropout mask (lead..., heads, T, T), values 0 or 1/(1-p), of a module
    forward over x_shape whose rng was default_rng(seed): the functional with the
    module's item layout and zero query/key (uniform weights 1/T), value = identity."""
    lead, T = tuple(x_shape[:-2]), x_shape[-2]
    heads = module_heads(am) or 1
    head_dim = getattr(am, "head_dim", None) or am.dim      # MHA's head_dim; V3, V4: dim
    z = np.zeros(lead + (heads, T, head_dim), am.dtype)
    dropped = F.scaled_dot_product_attention(z, z, np.eye(T, dtype=am.dtype), dropout_p=p,
                                             rng=np.random.default_rng(seed)) * T
    keep = np.isclose(dropped, 1 / (1 - p), rtol=1e-5, atol=0)
    assert np.all(keep | (dropped == 0)), "the derived mask holds values other than 0 and 1/(1-p)"
    assert 0 < keep.mean() < 1
    return np.where(keep, 1 / (1 - p), 0.0)


@pytest.mark.parametrize("model", DROPOUT_MODELS, ids=DROPOUT_IDS)
def test_dropout_gradients_match_torch_with_the_module_mask(model, dtype):
    rng, p, dim = np.random.default_rng(5), 0.4, 8
    for seq, lead, kind in [(13, (2, 3), "row"), (193, (1,), None), (97, (2,), "keys")]:
        tm, am = make_pair(model, dim, dtype)
        set_dropout(am, p)
        x = normal(rng, lead + (seq, dim), dtype)
        mask = None if kind is None else make_mask(rng, kind, model, dim, x.shape, np.int64)
        g = normal(rng, lead + (seq, dim), dtype)
        drop = module_dropout_mask(am, x.shape, p, seed=seq)
        am.rng = np.random.default_rng(seq)       # the forward draws its mask's seed from default_rng(seq)
        compare_to_torch(model, tm, am, x, mask, g, dtype, f"seq={seq} lead={lead} mask={kind}", drop=drop)


# ============================================================================
# central differences in float64 (no torch)


def numeric_grad(f, a, h=1e-6):
    grad = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        up, down = a.copy(), a.copy()
        up[i] += h
        down[i] -= h
        grad[i] = (f(up) - f(down)) / (2 * h)
    return grad


def assert_relative(actual, expected, what):
    assert np.abs(expected).max() > 1e-3, what
    err = np.abs(actual - expected).max() / np.abs(expected).max()
    assert err < 1e-6, f"{what}: relative error {err:.3e}"


@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked-causal"])
def test_sdpa_backward_matches_central_differences(masked):
    rng = np.random.default_rng(6)
    q, k, v = sdpa_inputs(rng, (2,), (2,), (2,), 4, 5, 3, 2, np.float64)
    mask = None
    if masked:
        mask = np.ones((4, 5), np.int64)
        mask[3, 1] = mask[1, 4] = 0
        mask[2] = 0            # fully masked: uniform over the keys the causal row sees
    G = normal(rng, (2, 4, 2))
    scale = 1 / math.sqrt(3)
    out, lse = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=masked, return_lse=True)
    grads = F.scaled_dot_product_attention_backward(G, q, k, v, out, lse, attn_mask=mask, is_causal=masked)
    args = [q, k, v]
    for i, (name, grad) in enumerate(zip(("query", "key", "value"), grads)):
        def loss(a):
            xs = list(args)
            xs[i] = a
            return np.sum(ref_attend(*xs, scale, mask, masked)[0] * G)
        assert_relative(grad, numeric_grad(loss, args[i]), name)


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_module_backward_matches_central_differences(masked):
    rng = np.random.default_rng(7)
    am = attnc.MultiHeadAttention(6, 2, dropout=0.0, dtype=np.float64, rng=rng)
    x, G = normal(rng, (2, 4, 6)), normal(rng, (2, 4, 6))
    mask = None
    if masked:
        mask = random_keep_mask(rng, (2, 1, 4, 4))
        mask[1, 0, 3] = 0
    am(x, mask)
    gx = am.backward(G)
    sd = am.state_dict()
    grads = dict(am.named_grads())

    def loss(x_, w_):
        return np.sum(ref_forward("MultiHeadAttention", dict(sd, **{"query_linear.weight": w_}), x_, mask, 2)[0] * G)

    w = sd["query_linear.weight"]
    assert_relative(gx, numeric_grad(lambda a: loss(a, w), x), "grad_x")
    assert_relative(grads["query_linear.weight"], numeric_grad(lambda a: loss(x, a), w), "query_linear.weight")


# ============================================================================
# the same bits for any thread count and any batch


def over_threads(fn):
    """fn() on 1, 2 and 3 threads, each really running (real_thread_counts)."""
    with real_thread_counts():
        results = []
        for n in (1, 2, 3):
            attnc.set_num_threads(n)
            results.append(fn())
        return results


def assert_same_bits(results):
    for r in results[1:]:
        for a, b in zip(r, results[0]):
            np.testing.assert_array_equal(a, b)


def test_module_backward_same_bits_any_thread_count():
    rng = np.random.default_rng(8)
    x = normal(rng, (1, 200, 16), np.float32)      # 4 items: one pass plan at 1 thread, another at 2
    mask = random_keep_mask(rng, (1, 1, 200, 200))
    g = normal(rng, (1, 200, 16), np.float32)

    def run():
        am = attnc.MultiHeadAttention(16, 4, dropout=0.2, rng=np.random.default_rng(9))
        am(x, mask)
        return [am.backward(g)] + [buf for _, buf in am.named_grads()]
    assert_same_bits(over_threads(run))


@pytest.mark.parametrize("causal", [False, True], ids=["masked", "causal"])
def test_sdpa_backward_same_bits_any_thread_count(causal, dtype):
    rng = np.random.default_rng(9)
    q, k, v = sdpa_inputs(rng, (6,), (6,), (6,), 200, 200, 16, 8, dtype)
    mask = None if causal else random_keep_mask(rng, (6, 200, 200))
    g = normal(rng, (6, 200, 8), dtype)
    out, lse = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, return_lse=True)
    assert_same_bits(over_threads(lambda: F.scaled_dot_product_attention_backward(
        g, q, k, v, out, lse, attn_mask=mask, is_causal=causal)))


@pytest.mark.parametrize("L, S, causal, masked", [(200, 200, False, False), (200, 200, True, False),
                                                  (97, 193, False, True), (193, 97, True, True), (5, 300, True, True)])
def test_sdpa_backward_item_alone_same_bits_as_in_a_batch(L, S, causal, masked, dtype):
    rng = np.random.default_rng(L + S)
    q, k, v = sdpa_inputs(rng, (16,), (16,), (16,), L, S, 16, 12, dtype)
    mask = random_keep_mask(rng, (16, L, S)) if masked else None
    g = normal(rng, (16, L, 12), dtype)
    out, lse = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, return_lse=True)
    batch = F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, attn_mask=mask, is_causal=causal)
    alone = F.scaled_dot_product_attention_backward(g[0], q[0], k[0], v[0], out[0], lse[0], is_causal=causal,
                                                    attn_mask=None if mask is None else mask[0])
    for a, b, name in zip(alone, batch, ("grad_query", "grad_key", "grad_value")):
        np.testing.assert_array_equal(a, b[0], err_msg=name)


# ============================================================================
# the protocol and the errors


def mha(dtype=np.float64, dropout=0.0):
    return attnc.MultiHeadAttention(8, 2, dropout=dropout, dtype=dtype, rng=np.random.default_rng(10))


def xg(seed=11, shape=(2, 5, 8)):
    rng = np.random.default_rng(seed)
    return normal(rng, shape), normal(rng, shape)


def run_pair(am, x, g):
    """grad_x and the gradient buffers (copies) of one forward and backward."""
    am(x)
    return [am.backward(g)] + [b.copy() for _, b in am.named_grads()]


def test_backward_needs_a_training_forward_and_allows_one():
    am, (x, g) = mha(), xg()
    with pytest.raises(RuntimeError, match="no training-mode forward"):
        am.backward(g)
    am.eval()(x)
    with pytest.raises(RuntimeError, match="no training-mode forward"):
        am.backward(g)
    am.train()(x)
    am.backward(g)
    with pytest.raises(RuntimeError, match="no training-mode forward"):
        am.backward(g)


def test_eval_forward_keeps_nothing_backward_goes_through_the_last_training_forward():
    (x, g), am = xg(), mha()
    am(x)
    am.eval()(xg(12, (3, 7, 8))[0])      # another shape: the kept state and grad_output's shape stay the first's
    assert_same_bits([[am.backward(g)] + [b for _, b in am.named_grads()], run_pair(mha(), x, g)])


def test_wrong_grad_output_shape_keeps_the_state():
    am, (x, g) = mha(), xg()
    am(x)
    with pytest.raises(ValueError, match="^grad_output"):
        am.backward(g[:, :4])
    assert_same_bits([[am.backward(g)] + [b for _, b in am.named_grads()], run_pair(mha(), x, g)])


def test_replaced_parameter_is_named():
    am, (x, g) = mha(), xg()
    am(x)
    am.key_linear.weight = am.key_linear.weight.copy()
    with pytest.raises(RuntimeError, match=r"key_linear\.weight"):
        am.backward(g)


def test_gradients_accumulate_like_torch_and_zero_grad(dtype):
    model = MODEL["MHA"]
    tm, am = make_pair(model, 8, dtype)
    set_dropout(tm, 0.0)
    set_dropout(am, 0.0)
    x, g = (a.astype(dtype) for a in xg())
    _, _, once = attnc_grads(model, am, x, None, g)
    am(x)
    am.backward(g)          # a second pair adds into the buffers: exactly twice one pair
    twice = dict(am.named_grads())
    for name, grad in once.items():
        np.testing.assert_array_equal(twice[name], 2 * grad, err_msg=name)
    tm.double().train()
    xt = torch.tensor(x.astype(np.float64))
    for _ in range(2):
        tm(xt).backward(torch.tensor(g.astype(np.float64)))
    for name, p in tm.named_parameters():
        check(twice[name], p.grad, dtype, name)
    am.zero_grad()
    assert all(not buf.any() for _, buf in am.named_grads())
    am(x)
    am.backward(g)          # from zeros again: one pair's gradients
    for name, buf in am.named_grads():
        np.testing.assert_array_equal(buf, once[name], err_msg=name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gradients_add_into_the_buffers_they_had_in_place(dtype):
    """A backward adds each gradient into its buffer (commit's in-place add): the buffer
    object stays, and holds what NumPy's buffer + gradient gives, from any prior values; a
    shared Linear's two gradients add one after the other, the query's first. The gradients
    themselves come from the same module from zeroed buffers (0 + g is g)."""
    rng = np.random.default_rng(21)
    x, g = (a.astype(dtype) for a in xg())
    alone = mha(dtype)
    one_pass = dict(zip([n for n, _ in alone.named_grads()], run_pair(alone, x, g)[1:]))
    am = mha(dtype)
    buffers = dict(am.named_grads())
    before = {}
    for name, buffer in buffers.items():
        buffer[...] = normal(rng, buffer.shape, dtype)
        before[name] = buffer.copy()
    am(x)
    am.backward(g)
    for name, buffer in am.named_grads():
        assert buffer is buffers[name], name
        np.testing.assert_array_equal(buffer, np.add(before[name], one_pass[name]), err_msg=name)

    tied = mha(dtype)
    tied.key_linear = tied.query_linear   # one Linear for both: one buffer a parameter, two gradients
    untied = mha(dtype)   # the same values, the two Linears apart: those two gradients
    untied.key_linear.weight = untied.query_linear.weight.copy()
    untied.key_linear.bias = untied.query_linear.bias.copy()
    grads = dict(zip([n for n, _ in untied.named_grads()], run_pair(untied, x, g)[1:]))
    buffers = dict(tied.named_grads())
    start = {}
    for name in ("weight", "bias"):
        buffers[f"query_linear.{name}"][...] = normal(rng, buffers[f"query_linear.{name}"].shape, dtype)
        start[name] = buffers[f"query_linear.{name}"].copy()
    tied(x)
    tied.backward(g)
    for name in ("weight", "bias"):
        buffer = dict(tied.named_grads())[f"query_linear.{name}"]
        assert buffer is buffers[f"query_linear.{name}"], name
        expected = np.add(np.add(start[name], grads[f"query_linear.{name}"]), grads[f"key_linear.{name}"])
        np.testing.assert_array_equal(buffer, expected, err_msg=name)


def test_commit_checks_every_add_before_writing_any():
    """commit adds (its own loop: no NumPy call, no floating-point flags read, so nothing can
    fail once it writes) float32 or float64 arrays, native, aligned, C-contiguous and apart,
    and takes strict bools: anything else is refused before any item is written."""
    first, one = np.zeros(3), np.ones(3)
    storage = np.zeros(8)
    unaligned = np.frombuffer(np.zeros(25, np.uint8).data, np.float64, 3, offset=1)
    refused = {
        "float16": (np.zeros(3, np.float16), np.ones(3, np.float16)),
        "object": (np.zeros(3, object), np.ones(3, object)),
        "byte-swapped": (np.zeros(3, np.dtype("f8").newbyteorder()), np.ones(3, np.dtype("f8").newbyteorder())),
        "strided source": (np.zeros(3), np.ones(6)[::2]),
        "unaligned source": (np.zeros(3), unaligned),
        "overlapping": (storage[:3], storage[2:5]),
    }
    for case, (target, source) in refused.items():
        with pytest.raises(ValueError, match="item 1, an add"):
            attnc._C.commit([first, target], [one, source], [], [True, True])
        assert not first.any(), case
    with pytest.raises(TypeError, match=r"adds\[1\] is not a bool"):
        attnc._C.commit([first, first], [one, one], [], [True, 1])
    with pytest.raises(ValueError, match="2 targets, 1 adds"):
        attnc._C.commit([first, first], [one, one], [], [True])
    assert not first.any()
    attnc._C.commit([first, first], [2 * one, one], [], [False, True])   # a copy, then an add, in order
    np.testing.assert_array_equal(first, 3 * one)
    attnc._C.commit([first], [one], [])   # adds left out: a copy
    np.testing.assert_array_equal(first, one)


def test_gradients_that_overflow_their_buffers_add_in_full(recwarn):
    """Regression (review of the in-place add): NumPy's add checks the floating-point flags after
    writing, so under np.errstate(over="raise") (or warnings as errors) an overflowing buffer
    would have raised inside commit, after earlier buffers were written and with the forward's
    state kept (a retry adds those twice). commit's own loop gives inf, as torch's
    accumulation does, in every buffer, and releases the state."""
    x, g = xg()
    x, g = x.astype(np.float32), (g * 1e34).astype(np.float32)   # gradients past half an ulp of the largest float
    alone = mha(np.float32)
    one_pass = dict(zip([n for n, _ in alone.named_grads()], run_pair(alone, x, g)[1:]))
    am = mha(np.float32)
    before = {}
    for name, buffer in am.named_grads():
        buffer[...] = np.where(one_pass[name] > 0, np.finfo(np.float32).max, 1.0)
        before[name] = buffer.copy()
    am(x)
    with np.errstate(all="raise"):
        am.backward(g)
    assert not recwarn.list
    overflowed = []
    for name, buffer in am.named_grads():
        with np.errstate(over="ignore"):
            expected = before[name] + one_pass[name]
        overflowed += [name] * bool(np.isinf(expected).any())
        np.testing.assert_array_equal(buffer, expected, err_msg=name)
    assert {"query_linear.weight", "output_linear.bias"} <= set(overflowed), overflowed   # the first and last added
    with pytest.raises(RuntimeError, match="no training-mode forward"):
        am.backward(g)


def test_gradients_commit_cannot_add_are_summed_without_writing_a_buffer():
    """Regression (review of the in-place add): a NumPy scalar gradient (which has .dtype and
    .flags, but commit refuses as not an array) is summed, not sent as an add; and a gradient
    sharing memory with its buffer is summed into a new array, not into its own memory (the
    buffer's), so that no buffer is written before commit."""
    from attnc.module import _adds_in_place, _sum_into
    buffer = np.ones(4)
    assert _adds_in_place(buffer, np.ones(4)) and not _adds_in_place(buffer, buffer)
    assert not _adds_in_place(np.ones(()), np.float64(2.0))
    total = _sum_into(buffer, buffer[::-1], buffer.dtype)
    np.testing.assert_array_equal(buffer, np.ones(4))
    np.testing.assert_array_equal(total, np.full(4, 2.0))


def test_in_place_edit_of_x_after_forward_changes_nothing():
    (x, g), am = xg(), mha()
    x2 = x.copy()
    am(x2)
    x2[...] = 7.0
    assert_same_bits([[am.backward(g)] + [b for _, b in am.named_grads()], run_pair(mha(), x, g)])


def test_functional_backward_errors():
    rng = np.random.default_rng(15)
    q, k, v = sdpa_inputs(rng, (2,), (2,), (2,), 4, 5, 3, 2, np.float64)
    out, lse = F.scaled_dot_product_attention(q, k, v, return_lse=True)
    g = np.ones_like(out)
    for backward in (F.scaled_dot_product_attention_backward, attnc._C.scaled_dot_product_attention_backward):
        with pytest.raises(ValueError) as info:
            backward(g, q, k, v, out, lse, dropout_p=0.5)
        assert str(info.value).startswith("dropout_p"), str(info.value)
    bad = {"grad_out": np.ones((2, 4, 3)), "out": np.ones((2, 5, 2)), "lse": np.ones((2, 5))}
    for name, value in bad.items():
        args = {"grad_out": g, "out": out, "lse": lse, name: value}
        with pytest.raises(ValueError) as info:
            F.scaled_dot_product_attention_backward(args["grad_out"], q, k, v, args["out"], args["lse"])
        assert str(info.value).startswith(name + ":"), str(info.value)


@pytest.mark.parametrize("x_dtype", [np.float16, np.float64, np.int64])
def test_grad_x_has_the_dtype_of_a_floating_x(x_dtype):
    """As torch's x.grad: a float32 module given float16 or float64 x returns
    the gradient in x's dtype (the float32 computation's values, cast); other
    inputs (integers) get the module's dtype."""
    rng = np.random.default_rng(16)
    x = rng.integers(-3, 4, (2, 5, 8)).astype(x_dtype)
    g = rng.standard_normal((2, 5, 8)).astype(np.float32)
    expected = run_pair(mha(np.float32), x.astype(np.float32), g)[0]
    am = mha(np.float32)
    am(x)
    got = am.backward(g)
    want_dtype = np.dtype(x_dtype) if np.dtype(x_dtype).kind == "f" else np.dtype(np.float32)
    assert got.dtype == want_dtype
    assert np.array_equal(got, expected.astype(want_dtype))


def test_x_given_as_a_torch_tensor_is_copied_for_backward():
    """Regression (review): x given as another library's array (a torch tensor) was kept by
    reference, so an in-place edit after the forward changed the weight gradients."""
    (x, g), am, ref = xg(), mha(), mha()
    t = torch.tensor(x)
    am(t)
    t.add_(7.0)
    assert_same_bits([[am.backward(g)] + [b for _, b in am.named_grads()], run_pair(ref, x, g)])


def _broadcast_inputs(shared, dtype, seed):
    """q, k, v and the output gradient g of a batch (4, 3) whose `shared` inputs (the
    key and value, or the query) are one batch row (1, 3) broadcast over it: L = 2
    queries over S = 4096 keys of E = 128."""
    rng = np.random.default_rng(seed)
    L, S, E = 2, 4096, 128
    big, small = (4, 3), (1, 3)
    qb, kb = (big, small) if shared == "key-value" else (small, big)
    q, k, v = sdpa_inputs(rng, qb, kb, kb, L, S, E, E, dtype)
    return q, k, v, normal(rng, big + (L, E), dtype)


@pytest.mark.parametrize("shared", ["key-value", "query"])
def test_sdpa_backward_summed_in_runs_matches_the_repeated_inputs_sum(shared, dtype):
    """An input broadcast over the batch gets the sum of the items' gradients; the
    kernel adds them in runs of items through a scratch (here 4 runs of 3 items,
    with dropout, whose masks are keyed by the item's index in the whole batch).
    Oracle: the same call on the inputs repeated to the full batch (every item's
    own gradient, same masks), summed in float64; bits the same for any thread
    count. (The NumPy sum this replaces took the batch's size times the shared
    gradient: a review, 2026-11-24.)"""
    q, k, v, g = _broadcast_inputs(shared, dtype, seed=3)
    big = g.shape[:2]
    options = dict(dropout_p=0.25, seed=7)
    out, lse = F.scaled_dot_product_attention(q, k, v, return_lse=True, **options)
    results = over_threads(lambda: F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, **options))
    assert_same_bits(results)
    repeated = [np.ascontiguousarray(np.broadcast_to(a, big + a.shape[-2:])) for a in (q, k, v)]
    each = F.scaled_dot_product_attention_backward(g, *repeated, out, lse, **options)
    for got, items, given, name in zip(results[0], each, (q, k, v), ("grad_query", "grad_key", "grad_value")):
        assert got.shape == given.shape and got.dtype == dtype, name
        expected = items.astype(np.float64).sum(axis=0, keepdims=True) if given.shape[0] == 1 else items
        tol = 1e-12 if dtype == np.float64 else 2e-5
        np.testing.assert_allclose(got, expected, rtol=tol, atol=tol * np.abs(expected).max(), err_msg=name)


@pytest.mark.parametrize("shared", ["key-value", "query"])
def test_sdpa_backward_summed_in_runs_against_torch(shared, dtype):
    """The runs of the test above, without dropout, against an independent oracle: torch's
    autograd in float64 of the math (broadcast batch, softmax, weighted sum), which sums a
    broadcast input's gradient over the batch itself."""
    q, k, v, g = _broadcast_inputs(shared, dtype, seed=4)
    E = q.shape[-1]
    out, lse = F.scaled_dot_product_attention(q, k, v, return_lse=True)
    grads = F.scaled_dot_product_attention_backward(g, q, k, v, out, lse)
    tq, tk, tv = (torch.tensor(a.astype(np.float64), requires_grad=True) for a in (q, k, v))
    scores = tq @ tk.transpose(-1, -2) / math.sqrt(E)
    (torch.softmax(scores, -1) @ tv).backward(torch.tensor(g.astype(np.float64)))
    for got, t, name in zip(grads, (tq, tk, tv), ("grad_query", "grad_key", "grad_value")):
        check(got, t.grad, dtype, name)


def test_in_place_edit_of_parameters_between_forward_and_backward_is_as_documented():
    """API.md: such an edit is not detected; the backward combines the Q, K, V
    projections and the attention output the forward kept with the parameters'
    values at backward time. The oracle: torch's autograd from those kept
    values (made with the old weights) through the new weights."""
    rng = np.random.default_rng(17)
    B, T, D, H = 2, 5, 8, 2
    am = attnc.MultiHeadAttention(D, H, dropout=0.0, dtype=np.float64, rng=rng).train()
    x, g = normal(rng, (B, T, D)), normal(rng, (B, T, D))
    names = ("query_linear", "key_linear", "value_linear", "output_linear")
    old = {n: (getattr(am, n).weight.copy(), getattr(am, n).bias.copy()) for n in names}
    am(x)
    for n in names:                                          # edited in place after the forward
        getattr(am, n).weight *= 1.5
        getattr(am, n).bias += 0.25
    new = {n: (getattr(am, n).weight.copy(), getattr(am, n).bias.copy()) for n in names}
    grad_x = am.backward(g)
    grads = dict(am.named_grads())

    def heads(t):                                            # (B, T, D) -> (B, H, T, D / H)
        return t.reshape(B, T, H, D // H).transpose(1, 2)

    xt = torch.from_numpy(x)
    kept = [heads(xt @ torch.from_numpy(w).T + torch.from_numpy(b)).detach().requires_grad_()
            for w, b in (old[n] for n in names[:3])]
    scores = kept[0] @ kept[1].transpose(-1, -2) / math.sqrt(D // H)
    attended = (torch.softmax(scores, -1) @ kept[2]).transpose(1, 2).reshape(B, T, D).detach().requires_grad_()
    w_out, b_out = (torch.from_numpy(a).requires_grad_() for a in new["output_linear"])
    (attended @ w_out.T + b_out).backward(torch.from_numpy(g))
    (torch.softmax(scores, -1) @ kept[2]).transpose(1, 2).reshape(B, T, D).backward(attended.grad)
    expected_x = sum(kq.grad.transpose(1, 2).reshape(B, T, D) @ torch.from_numpy(new[n][0])
                     for kq, n in zip(kept, names[:3]))
    check(grad_x, expected_x.numpy(), np.float64, "grad_x")
    check(grads["output_linear.weight"], w_out.grad.numpy(), np.float64, "output_linear.weight")
    check(grads["output_linear.bias"], b_out.grad.numpy(), np.float64, "output_linear.bias")
    for kq, n in zip(kept, names[:3]):
        d = kq.grad.transpose(1, 2).reshape(B * T, D)
        check(grads[n + ".weight"], (d.T @ xt.reshape(B * T, D)).numpy(), np.float64, n + ".weight")
        check(grads[n + ".bias"], d.sum(0).numpy(), np.float64, n + ".bias")
