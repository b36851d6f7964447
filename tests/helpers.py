"""Shared test helpers: the class registry, a float64 NumPy reference, torch runners.

The NumPy reference is written from the documents' formulas, independently of attnc:
Q, K, V projections, scores = Q K^T * scale, masked_fill(mask == 0, -1e20), softmax,
weights @ V (heads split as reshape(..., seq, heads, head_dim)).
"""
import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

import attnc
import doc_models as dm

MASKED_FILL = -1e20


# ----------------------------------------------------------------------------
# tolerances


def tol_for(dtype):
    return 1e-5 if np.dtype(dtype) == np.float32 else 1e-10


def assert_close(actual, expected, dtype, what=""):
    """max|a - b| <= tol * max(1, max|b|), tol 1e-5 (float32) or 1e-10 (float64)."""
    actual = np.asarray(actual)
    if isinstance(expected, torch.Tensor):
        expected = expected.detach().numpy()
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    if expected.size == 0:
        return
    assert np.all(np.isfinite(actual)), f"{what}: non-finite values in attnc's result"
    scale = max(1.0, float(np.max(np.abs(expected))))
    err = float(np.max(np.abs(actual.astype(np.float64) - expected)))
    assert err <= tol_for(dtype) * scale, f"{what}: max abs err {err:.3e} > {tol_for(dtype) * scale:.3e}"


def torch_dtype(dtype):
    return torch.float32 if np.dtype(dtype) == np.float32 else torch.float64


# ----------------------------------------------------------------------------
# float64 NumPy reference


def np_linear(x, w, b=None):
    y = np.matmul(np.asarray(x, np.float64), np.asarray(w, np.float64).T)
    return y if b is None else y + np.asarray(b, np.float64)


def np_softmax(s, axis=-1):
    s = np.asarray(s, np.float64)
    m = np.max(s, axis=axis, keepdims=True)
    e = np.exp(s - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def np_attend(q, k, v, scale, mask=None):
    """softmax(q k^T * scale, masked_fill(mask == 0, -1e20)) @ v; returns (out, weights)."""
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if mask is not None:
        scores = np.where(np.asarray(mask) == 0, MASKED_FILL, scores)
    w = np_softmax(scores)
    return np.matmul(w, v), w


def split_heads(t, heads):
    # (..., seq, heads * hd) -> (..., heads, seq, hd)
    t = t.reshape(t.shape[:-1] + (heads, t.shape[-1] // heads))
    return np.swapaxes(t, -2, -3)


def merge_heads(t):
    # (..., heads, seq, hd) -> (..., seq, heads * hd)
    t = np.swapaxes(t, -2, -3)
    return t.reshape(t.shape[:-2] + (t.shape[-2] * t.shape[-1],))


def _p(sd, name):
    return sd.get(name + ".weight"), sd.get(name + ".bias")


def np_reference(kind, sd, x, mask=None, heads=None):
    """Output and weights of class `kind` with parameters `sd` (name -> array), in float64."""
    sd = {k: np.asarray(v, np.float64) for k, v in sd.items()}
    x = np.asarray(x, np.float64)
    d = x.shape[-1]
    if kind == "SelfAttentionV1":
        q, k, v = (np_linear(x, *_p(sd, n)) for n in ("Q_proj", "K_proj", "V_proj"))
        return np_attend(q, k, v, 1 / math.sqrt(d), mask)
    if kind in ("SelfAttentionV2", "SelfAttentionV3"):
        qkv = np_linear(x, *_p(sd, "proj"))
        q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
        out, w = np_attend(q, k, v, 1 / math.sqrt(d), mask)
        if kind == "SelfAttentionV3":
            out = np_linear(out, *_p(sd, "output_proj"))
        return out, w
    if kind == "SelfAttentionV4":
        q, k, v = (np_linear(x, *_p(sd, n)) for n in ("query", "key", "value"))
        return np_attend(q, k, v, 1 / math.sqrt(d), mask)
    if kind == "SelfAttention":
        q, k, v = (np_linear(x, *_p(sd, n)) for n in ("linear_q", "linear_k", "linear_v"))
        return np_attend(q, k, v, 1 / math.sqrt(q.shape[-1]), mask)
    if kind == "MultiHeadAttention":
        q, k, v = (np_linear(x, *_p(sd, n)) for n in ("query_linear", "key_linear", "value_linear"))
        hd = q.shape[-1] // heads
        out, w = np_attend(split_heads(q, heads), split_heads(k, heads), split_heads(v, heads),
                           1 / math.sqrt(hd), mask)
        return np_linear(merge_heads(out), *_p(sd, "output_linear")), w
    if kind == "MultiHeadSelfAttention":
        q, k, v = (np_linear(x, *_p(sd, n)) for n in ("linear_q", "linear_k", "linear_v"))
        hd = q.shape[-1] // heads
        out, w = np_attend(split_heads(q, heads), split_heads(k, heads), split_heads(v, heads),
                           1 / math.sqrt(hd), mask)
        return merge_heads(out), w
    raise AssertionError(kind)


def np_values(kind, sd, x):
    """The V rows (before any output projection) of class `kind`, float64."""
    sd = {k: np.asarray(v, np.float64) for k, v in sd.items()}
    x = np.asarray(x, np.float64)
    d = x.shape[-1]
    if kind == "SelfAttentionV1":
        return np_linear(x, *_p(sd, "V_proj"))
    if kind in ("SelfAttentionV2", "SelfAttentionV3"):
        return np_linear(x, *_p(sd, "proj"))[..., 2 * d:]
    if kind == "SelfAttentionV4":
        return np_linear(x, *_p(sd, "value"))
    if kind == "MultiHeadAttention":
        return np_linear(x, *_p(sd, "value_linear"))
    return np_linear(x, *_p(sd, "linear_v"))


# ----------------------------------------------------------------------------
# the class registry: how to build each attnc class and its document oracle


def heads_for(dim):
    for h in (4, 3, 2):
        if dim % h == 0 and dim // h >= 2:
            return h
    return 1


@dataclass
class Case:
    name: str            # test id
    kind: str            # attnc class name (for np_reference)
    make: Callable       # (dim, **kw) -> attnc module
    make_torch: Callable  # (dim) -> torch module
    masked: bool
    heads: Optional[Callable] = None   # dim -> head count (multi-head classes)
    native_batch: bool = True          # torch class handles any leading dims

    def n_heads(self, dim):
        return self.heads(dim) if self.heads else None


MHSA_HEADS, MHSA_DK, MHSA_DV = 3, 2, 3   # dim_k = 6, dim_v = 9: dim_k != dim_v, odd head sizes

CASES = [
    Case("V1", "SelfAttentionV1", lambda d, **kw: attnc.SelfAttentionV1(d, **kw),
         lambda d: dm.SelfAttentionv1(d), masked=False),
    Case("V2", "SelfAttentionV2", lambda d, **kw: attnc.SelfAttentionV2(d, **kw),
         lambda d: dm.SelfAttentionv2(d), masked=False),
    Case("V3", "SelfAttentionV3", lambda d, **kw: attnc.SelfAttentionV3(d, 0.1, **kw),
         lambda d: dm.SelfAttentionv3(d, 0.1), masked=True),
    Case("V4", "SelfAttentionV4", lambda d, **kw: attnc.SelfAttentionV4(d, 0.1, **kw),
         lambda d: dm.SelfAttentionInterview(d, 0.1), masked=True),
    Case("MHA", "MultiHeadAttention", lambda d, **kw: attnc.MultiHeadAttention(d, heads_for(d), 0.1, **kw),
         lambda d: dm.MuitiHeadAttention(d, heads_for(d), 0.1), masked=True, heads=heads_for,
         native_batch=False),
    Case("SA-bias", "SelfAttention", lambda d, **kw: attnc.SelfAttention(d, d + 1, d + 2, bias=True, **kw),
         lambda d: dm.SelfAttention(d, d + 1, d + 2, bias=True), masked=True, native_batch=False),
    Case("SA-nobias", "SelfAttention", lambda d, **kw: attnc.SelfAttention(d, max(1, d - 1), d + 2, **kw),
         lambda d: dm.SelfAttention(d, max(1, d - 1), d + 2, bias=False), masked=True, native_batch=False),
    Case("MHSA-bias", "MultiHeadSelfAttention",
         lambda d, **kw: attnc.MultiHeadSelfAttention(d, MHSA_HEADS * MHSA_DK, MHSA_HEADS * MHSA_DV, MHSA_HEADS,
                                                      bias=True, **kw),
         lambda d: dm.MultiHeadSelfAttention(d, MHSA_HEADS * MHSA_DK, MHSA_HEADS * MHSA_DV, MHSA_HEADS, bias=True),
         masked=True, heads=lambda d: MHSA_HEADS, native_batch=False),
    Case("MHSA-nobias", "MultiHeadSelfAttention",
         lambda d, **kw: attnc.MultiHeadSelfAttention(d, MHSA_HEADS * MHSA_DK, MHSA_HEADS * MHSA_DV, MHSA_HEADS,
                                                      **kw),
         lambda d: dm.MultiHeadSelfAttention(d, MHSA_HEADS * MHSA_DK, MHSA_HEADS * MHSA_DV, MHSA_HEADS, bias=False),
         masked=True, heads=lambda d: MHSA_HEADS, native_batch=False),
]
CASE_IDS = [c.name for c in CASES]
MASKED_CASES = [c for c in CASES if c.masked]
MASKED_IDS = [c.name for c in MASKED_CASES]
DROPOUT_CASES = [c for c in CASES if c.kind in ("SelfAttentionV3", "SelfAttentionV4", "MultiHeadAttention")]
DROPOUT_IDS = [c.name for c in DROPOUT_CASES]


def torch_sd(tmodel):
    return {k: v.detach().clone() for k, v in tmodel.state_dict().items()}


def np_sd(tmodel):
    return {k: v.detach().numpy().astype(np.float64) for k, v in tmodel.state_dict().items()}


def make_pair(case, dim, dtype=np.float32, seed=0):
    """A torch document model (eval, dtype) and the attnc model with its weights."""
    torch.manual_seed(seed)
    tm = case.make_torch(dim).eval()
    if np.dtype(dtype) == np.float64:
        tm = tm.double()
    am = case.make(dim, dtype=dtype, rng=np.random.default_rng(seed + 1000)).eval()
    am.load_state_dict(torch_sd(tm))
    return tm, am


def scores_shape(case, dim, x_shape):
    lead, s = tuple(x_shape[:-2]), x_shape[-2]
    h = case.n_heads(dim)
    return lead + ((h,) if h else ()) + (s, s)


def torch_forward(case, tm, x, mask=None):
    """The document model's output for x of any leading dims (flattened when needed)."""
    xt = torch.from_numpy(np.array(x, copy=True))          # writable, contiguous copies
    mt = None if mask is None else torch.from_numpy(np.array(mask, copy=True))
    with torch.no_grad():
        if case.native_batch:
            return (tm(xt) if not case.masked else tm(xt, mt)).numpy()
        lead, (s, d) = x.shape[:-2], x.shape[-2:]
        b = int(np.prod(lead)) if lead else 1
        x3 = xt.reshape(b, s, d)
        m3 = None
        if mt is not None:
            h = case.n_heads(d)
            full = scores_shape(case, d, x.shape)
            m3 = mt.broadcast_to(full).reshape((b,) + ((h,) if h else ()) + (s, s))
        out = tm(x3, m3) if case.masked else tm(x3)
        return out.reshape(tuple(lead) + tuple(out.shape[-2:])).numpy()


def random_keep_mask(rng, shape, dtype=np.int64):
    """A 0/1 mask of `shape` whose last axis is never all zero (keeps torch oracles NaN-free)."""
    m = (rng.random(shape) < 0.6)
    m[..., 0] |= ~m.any(axis=-1)
    return m.astype(dtype)
