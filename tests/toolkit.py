"""The test toolkit: everything the test files share, in one place (after
bottleneck's tests/util.py). Test files import from here only (plus numpy,
pytest, torch, hypothesis and attnc), never from conftest.py or from each
other.

- the registry of the attnc modules and their document twins (MODELS);
- the float64 NumPy oracle, written from the documents' formulas and
  independent of attnc (ref_linear, ref_softmax, ref_attend, ref_forward,
  ref_module, ref_values);
- the tolerance policy (tolerance) and the one assertion helper
  (assert_close);
- the kernel ISA levels this CPU runs (SIMD_LEVELS);
- torch runners for the document models (make_pair, torch_forward, ...).

torch is imported only by the torch runners (and doc_models on first use),
so a test that needs no torch (or a subprocess importing a test file) does
not pay for it.
"""
import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

import attnc

MASKED_FILL = -1e20   # the documents' masked_fill value


def __getattr__(name):
    """`from toolkit import doc_models`: the torch document classes, loaded on first use."""
    if name == "doc_models":
        import doc_models
        return doc_models
    raise AttributeError(name)


def _dm():
    import doc_models
    return doc_models


# ============================================================================
# kernel ISA levels


def simd_levels():
    """The kernel ISA levels this CPU can run, best last (e.g. ('portable', 'avx2'));
    test_simd_levels.py checks this list against setting each level and reading it back."""
    return tuple(attnc._C.simd_levels())


SIMD_LEVELS = simd_levels()

# The GEMM's K block (ATTNC_GEMM_KC in csrc/attnc.h): an element of a product
# sums its K blocks in order, each from zero. Tests of products over several
# blocks, or with a last block of a few steps, take K from it.
K_BLOCK = attnc._C.GEMM_KC
# Levels that add kernels for bfloat16 only (cpu.c: their other dtypes run the level
# below's kernels); the simd_mode fixture leaves them to the tests of bfloat16.
BF16_ONLY_LEVELS = ("avx512bf16",)
KERNEL_LEVELS = tuple(level for level in SIMD_LEVELS if level not in BF16_ONLY_LEVELS)


# ============================================================================
# tolerances and the assertion helper


def tolerance(dtype):
    """The largest error accepted in a result of `dtype`, as a fraction of
    max(1, max|expected|) (an absolute error for results of magnitude <= 1,
    relative to the largest entry otherwise):

    - float32: 1e-5, about 170 units in the last place (2^-24 = 6e-8). A
      result is a chain of float32 sums of up to a few thousand terms (GEMM
      and P.V reductions, blocked), a vectorised exp within 4 ulp, a
      softmax normalisation and (modules) two projections; rounding grows
      with the square root of the reduction length in practice, and
      1e-5 covers the longest reductions in the suite (k = 769, S = 1000)
      while a 1e-4 relative bug (a wrong scale, a lost term) still fails.
    - float64: 1e-11, about 45,000 ulp (2^-53 = 1.1e-16), the same error
      budget scaled by the same operation count, still far below any bug
      (the rounding of float64 through float32 alone gives 1e-8).

    The tolerance depends on the result's dtype only: a float64 result of
    float16, integer or float32 inputs is exact up to its own rounding
    (those inputs convert exactly). Before the toolkit, three policies
    existed (1e-5/1e-10, 2e-5/1e-11, 5e-5/1e-10); this is the tightest of
    each, so no test got looser."""
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return 1e-5
    if dtype == np.float64:
        return 1e-11
    raise ValueError(f"no tolerance for results of dtype {dtype}")


# PyTorch's own tolerances for its float16 and bfloat16 SDPA tests
# (test/test_transformers.py: default_atol, default_rtol), applied as
# torch.allclose does, element by element: |actual - expected| <= atol +
# rtol * |expected|. A float16 result rounds to 2^-11 relative and a bfloat16
# one to 2^-8, so these leave room for the rounding of the result itself and
# of the float32 steps before it; a wrong term or scale misses them.
LOW_PRECISION_TOLERANCES = {"float16": (1e-3, 1e-3), "bfloat16": (1e-3, 1.6e-2)}  # (atol, rtol)


def assert_close(actual, expected, dtype, what="", tol=None):
    """actual (an attnc result) against expected (an oracle's float64 values,
    a NumPy array, a torch tensor or a list): same shape, dtype == `dtype`,
    NaN at the same places, the same infinities at the same places, and the
    finite values within tol (default tolerance(dtype)) * max(1, max|expected finite|),
    or, for float16 and bfloat16 without tol, PyTorch's LOW_PRECISION_TOLERANCES."""
    if hasattr(expected, "detach"):   # a torch tensor
        expected = expected.detach().numpy()
    actual = np.asarray(actual)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    assert actual.dtype == np.dtype(dtype), (what, actual.dtype, np.dtype(dtype))
    if expected.size == 0:
        return
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(actual), nan, err_msg=f"{what}: NaN positions")
    inf = np.isinf(expected)
    np.testing.assert_array_equal(actual[inf], expected[inf], err_msg=f"{what}: inf positions")
    finite = ~nan & ~inf
    if finite.any() and np.dtype(dtype).name in LOW_PRECISION_TOLERANCES and tol is None:
        a, e = actual[finite].astype(np.float64), expected[finite]
        assert np.all(np.isfinite(a)), f"{what}: non-finite values where the oracle's are finite"
        atol, rtol = LOW_PRECISION_TOLERANCES[np.dtype(dtype).name]
        excess = np.abs(a - e) - (atol + rtol * np.abs(e))
        worst = int(np.argmax(excess))
        assert excess[worst] <= 0, f"{what}: |{a[worst]} - {e[worst]}| > {atol} + {rtol} * |expected|"
    elif finite.any():
        a, e = actual[finite].astype(np.float64), expected[finite]
        assert np.all(np.isfinite(a)), f"{what}: non-finite values where the oracle's are finite"
        scale = max(1.0, float(np.max(np.abs(e))))
        err = float(np.max(np.abs(a - e)))
        bound = (tolerance(dtype) if tol is None else tol) * scale
        assert err <= bound, f"{what}: max abs err {err:.3e} > {bound:.3e}"


# The most threads a test compares (1 to 4)
MAX_TEST_THREADS = 4


@contextlib.contextmanager
def real_thread_counts(most=MAX_TEST_THREADS):
    """Inside: set_num_threads(n) for n up to `most` runs n threads and splits the work
    for n, whatever this machine's CPUs (attnc._C.set_cpus_for_tests; a 2-CPU machine
    would otherwise run 3 and 4 threads as 2, and a 1-CPU one everything as 1). Yields
    the thread count before, which is restored after."""
    before = attnc.get_num_threads()
    attnc._C.set_cpus_for_tests(most)
    try:
        yield before
    finally:
        attnc._C.set_cpus_for_tests(0)
        attnc.set_num_threads(before)


# (mantissa bits, smallest normal exponent) of the 16-bit dtypes, for their units in the last place
_LOW_PRECISION_FORMATS = {"float16": (10, -14), "bfloat16": (7, -126)}


def assert_rounded_once(actual, expected, dtype, what="", ulps=1.0):
    """A float16 or bfloat16 result computed in float32 and rounded once, against a float64
    oracle: NaN and infinities at the same places, and every finite element within `ulps`
    units in the last place of `dtype` at the oracle's value (the rounding is half a
    unit) plus what the float32 computation before it may be off by, tolerance(float32)
    * max(1, max|expected|) (a sum that cancels to near 0 keeps float32's absolute
    error, which is many 16-bit units of a tiny result). Far tighter than PyTorch's
    LOW_PRECISION_TOLERANCES (1e-3 absolute, larger than most attention weights, plus 1e-3
    or 1.6e-2 relative): a lost factor of 1.01 or a small weight zeroed fails."""
    mantissa_bits, min_exponent = _LOW_PRECISION_FORMATS[np.dtype(dtype).name]
    actual = np.asarray(actual)
    expected = np.asarray(expected.detach().numpy() if hasattr(expected, "detach") else expected, np.float64)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    assert actual.dtype == np.dtype(dtype), (what, actual.dtype, np.dtype(dtype))
    nan, inf = np.isnan(expected), np.isinf(expected)
    np.testing.assert_array_equal(np.isnan(actual), nan, err_msg=f"{what}: NaN positions")
    np.testing.assert_array_equal(actual[inf], expected[inf], err_msg=f"{what}: inf positions")
    finite = ~(nan | inf)
    a, e = actual[finite].astype(np.float64), expected[finite]
    if e.size == 0:
        return
    # |e| in [2^exponent, 2^(exponent + 1)), or subnormal (0 too: frexp gives 0 an exponent of 0)
    exponent = np.where(e == 0, min_exponent, np.maximum(np.frexp(e)[1] - 1, min_exponent))
    unit = np.ldexp(1.0, exponent - mantissa_bits)
    float32_error = tolerance(np.float32) * max(1.0, float(np.abs(e).max()))
    excess = (np.abs(a - e) - float32_error) / unit
    worst = int(np.argmax(excess))
    if excess[worst] > ulps:
        raise AssertionError(f"{what}: {a[worst]!r} against {e[worst]!r}: {excess[worst]:.2f} units in the last "
                             f"place of {np.dtype(dtype).name} beyond float32's {float32_error:.1e} (at most {ulps})")


def assert_grad_close(actual, expected, dtype, what=""):
    """assert_close at the gradient tolerance: 1e-9 (float64)
    and 1e-4 (float32) of max(1, max|expected|). A gradient adds the
    backward's reductions (dP, dS, then dQ/dK/dV and the projections) to the
    forward's; a wrong term or scale still misses it by orders of magnitude."""
    assert_close(actual, expected, dtype, what, tol=1e-9 if np.dtype(dtype) == np.float64 else 1e-4)


def result_dtype(*dtypes):
    """attnc's result dtype for inputs of these dtypes: the narrowest of float16,
    bfloat16, float32 and float64 that holds every input (integers and bools
    count as float32; float16 with bfloat16 needs float32)."""
    names = set()
    for d in dtypes:
        d = np.dtype(d)
        if d.kind == "V" and d.itemsize == 2 and d.name == "bfloat16":
            names.add("bfloat16")
        elif d.kind == "f" and d.itemsize >= 8:
            names.add("float64")
        elif d.kind == "f" and d.itemsize == 2:
            names.add("float16")
        else:
            names.add("float32")
    if "float64" in names:
        return np.dtype(np.float64)
    if names in ({"float16"}, {"bfloat16"}):
        return np.dtype(names.pop())
    return np.dtype(np.float32)


# ============================================================================
# the float64 NumPy oracle: the documents' formulas, independent of attnc


def ref_linear(x, w, b=None):
    """x W^T + b (torch.nn.Linear)."""
    y = np.matmul(np.asarray(x, np.float64), np.asarray(w, np.float64).T)
    return y if b is None else y + np.asarray(b, np.float64)


def ref_softmax(s, axis=-1):
    """torch.softmax: exp(s - max) / sum; a NaN reaches its whole row, a row of
    -inf gives NaN (0/0), an empty axis gives an empty result."""
    s = np.asarray(s, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(s - np.max(s, axis=axis, keepdims=True, initial=-np.inf))
        return e / np.sum(e, axis=axis, keepdims=True)


def ref_attend(q, k, v, scale, mask=None, causal=False):
    """(out, weights) of attention, as the documents write it and PyTorch's math path runs it:

        scores  = q k^T * scale
        scores  = masked_fill(mask == 0, -1e20)      mask broadcasts to the scores
        scores += -inf where j > i                   causal: top-left diagonal, an addition,
                                                     so a NaN or +inf score stays NaN there
        weights = softmax(scores), a row whose every score is -inf gives 0 (PyTorch's math path)
        out     = weights @ v                        no keys (S = 0): an empty sum, zeros

    The weights are broadcast over the output's batch dimensions (attnc returns them so)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    with np.errstate(invalid="ignore", over="ignore"):
        scores = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
        if mask is not None:
            scores = np.where(np.asarray(mask) == 0, MASKED_FILL, scores)
        if causal:
            L, S = scores.shape[-2:]
            scores = scores + np.where(np.triu(np.ones((L, S), bool), 1), -np.inf, 0.0)
        w = ref_softmax(scores)
        w = np.where(np.all(scores == -np.inf, axis=-1, keepdims=True), 0.0, w)
        out = np.matmul(w, v)
        return out, np.broadcast_to(w, out.shape[:-2] + w.shape[-2:])


def padded_batch(rng, dtype, L=150, S=700):
    """q, k, v (3, 2, L or S, 16) and a padding mask (3, 1, 1, S) (True keeps a key) hiding
    runs of hundreds of keys, whole key tiles of the flash path: at the end (item 0: keys
    250..699), at the start (item 1: keys 0..449), in the middle (item 2: keys 100..599)."""
    q, k, v = (rng.standard_normal((3, 2, n, 16)).astype(dtype) for n in (L, S, S))
    keep = np.ones((3, 1, 1, S), bool)
    keep[0, ..., 250:] = False
    keep[1, ..., :450] = False
    keep[2, ..., 100:600] = False
    return q, k, v, keep


def padding_bias(keep, dtype):
    """The same padding in torch's convention: a bias of 0 where kept, -inf where hidden."""
    return np.where(keep, 0.0, -np.inf).astype(dtype)


def split_heads(t, heads):
    """(..., seq, heads * hd) -> (..., heads, seq, hd): reshape(..., seq, heads, head_dim)."""
    t = t.reshape(t.shape[:-1] + (heads, t.shape[-1] // heads))
    return np.swapaxes(t, -2, -3)


def merge_heads(t):
    """(..., heads, seq, hd) -> (..., seq, heads * hd)."""
    t = np.swapaxes(t, -2, -3)
    return t.reshape(t.shape[:-2] + (t.shape[-2] * t.shape[-1],))


def ref_forward(kind, sd, x, mask=None, heads=None):
    """(out, weights) of the document class `kind` (attnc's class name) in eval mode,
    with parameters `sd` (a state_dict: name -> array), in float64; `heads` for the
    multi-head classes. Each scale as its document writes it."""
    sd = {k: np.asarray(v, np.float64) for k, v in sd.items()}
    x = np.asarray(x, np.float64)
    d = x.shape[-1]

    def lin(prefix, t=x):
        return ref_linear(t, sd[prefix + ".weight"], sd.get(prefix + ".bias"))

    if kind == "SelfAttentionV1":                    # / sqrt(hidden_dim)
        return ref_attend(lin("Q_proj"), lin("K_proj"), lin("V_proj"), 1 / math.sqrt(d), mask)
    if kind in ("SelfAttentionV2", "SelfAttentionV3"):   # one proj to 3 dim, split; / sqrt(dim)
        qkv = lin("proj")
        out, w = ref_attend(qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:], 1 / math.sqrt(d), mask)
        return (lin("output_proj", out) if kind == "SelfAttentionV3" else out), w
    if kind == "SelfAttentionV4":                    # / sqrt(dim)
        return ref_attend(lin("query"), lin("key"), lin("value"), 1 / math.sqrt(d), mask)
    if kind == "SelfAttention":                      # / sqrt(dim_k)
        q, k, v = lin("linear_q"), lin("linear_k"), lin("linear_v")
        return ref_attend(q, k, v, 1 / math.sqrt(q.shape[-1]), mask)
    if kind == "MultiHeadAttention":                 # / sqrt(head_dim), then output_linear
        q, k, v = (split_heads(lin(p), heads) for p in ("query_linear", "key_linear", "value_linear"))
        out, w = ref_attend(q, k, v, 1 / math.sqrt(q.shape[-1]), mask)
        return lin("output_linear", merge_heads(out)), w
    if kind == "MultiHeadSelfAttention":             # / sqrt(dim_k // heads), no output projection
        q, k, v = (split_heads(lin(p), heads) for p in ("linear_q", "linear_k", "linear_v"))
        out, w = ref_attend(q, k, v, 1 / math.sqrt(q.shape[-1]), mask)
        return merge_heads(out), w
    raise AssertionError(kind)


def module_heads(module):
    """The head count of an attnc module (None for the single-head classes)."""
    attr = {"MultiHeadAttention": "head_num", "MultiHeadSelfAttention": "num_heads"}.get(type(module).__name__)
    return getattr(module, attr) if attr else None


def ref_module(module, x, mask=None):
    """(out, weights) of an attnc module in eval mode, from its own state_dict, in float64."""
    return ref_forward(type(module).__name__, module.state_dict(), x, mask, module_heads(module))


def ref_values(kind, sd, x):
    """The V rows (before any output projection) of class `kind`, in float64."""
    sd = {k: np.asarray(v, np.float64) for k, v in sd.items()}
    x = np.asarray(x, np.float64)
    d = x.shape[-1]
    name = {"SelfAttentionV1": "V_proj", "SelfAttentionV2": "proj", "SelfAttentionV3": "proj",
            "SelfAttentionV4": "value", "MultiHeadAttention": "value_linear"}.get(kind, "linear_v")
    v = ref_linear(x, sd[name + ".weight"], sd.get(name + ".bias"))
    return v[..., 2 * d:] if name == "proj" else v


# ============================================================================
# the registry: each attnc class, how to build it, and its document twin


def heads_for(dim):
    """A head count that splits `dim` into heads of >= 2 features (1 if none does)."""
    for h in (4, 3, 2):
        if dim % h == 0 and dim // h >= 2:
            return h
    return 1


MHSA_HEADS, MHSA_DK, MHSA_DV = 3, 2, 3   # dim_k = 6, dim_v = 9: dim_k != dim_v, odd head sizes


@dataclass(frozen=True)
class Model:
    name: str                  # test id
    kind: str                  # attnc class name (ref_forward's `kind`)
    make: Callable             # (dim, heads=None, **kw) -> attnc module (kw: dtype, rng)
    make_torch: Callable       # (dim, heads=None) -> the document's torch module (same state_dict keys)
    masked: bool               # forward takes an attention mask
    heads: Optional[Callable] = None   # dim -> default head count (multi-head classes)
    native_batch: bool = True          # the torch class handles any leading dims
    dropout: bool = False              # attention dropout in training mode

    def n_heads(self, dim):
        return self.heads(dim) if self.heads else None


def _mhsa(d, heads, bias, **kw):
    h = heads or MHSA_HEADS
    return attnc.MultiHeadSelfAttention(d, h * MHSA_DK, h * MHSA_DV, h, bias=bias, **kw)


def _mhsa_doc(d, heads, bias):
    h = heads or MHSA_HEADS
    return _dm().MultiHeadSelfAttention(d, h * MHSA_DK, h * MHSA_DV, h, bias=bias)


MODELS = [
    Model("V1", "SelfAttentionV1", lambda d, heads=None, **kw: attnc.SelfAttentionV1(d, **kw),
          lambda d, heads=None: _dm().SelfAttentionv1(d), masked=False),
    Model("V2", "SelfAttentionV2", lambda d, heads=None, **kw: attnc.SelfAttentionV2(d, **kw),
          lambda d, heads=None: _dm().SelfAttentionv2(d), masked=False),
    Model("V3", "SelfAttentionV3", lambda d, heads=None, **kw: attnc.SelfAttentionV3(d, 0.1, **kw),
          lambda d, heads=None: _dm().SelfAttentionv3(d, 0.1), masked=True, dropout=True),
    Model("V4", "SelfAttentionV4", lambda d, heads=None, **kw: attnc.SelfAttentionV4(d, 0.1, **kw),
          lambda d, heads=None: _dm().SelfAttentionInterview(d, 0.1), masked=True, dropout=True),
    Model("MHA", "MultiHeadAttention",
          lambda d, heads=None, **kw: attnc.MultiHeadAttention(d, heads or heads_for(d), 0.1, **kw),
          lambda d, heads=None: _dm().MuitiHeadAttention(d, heads or heads_for(d), 0.1), masked=True,
          heads=heads_for, native_batch=False, dropout=True),
    Model("SA-bias", "SelfAttention",
          lambda d, heads=None, **kw: attnc.SelfAttention(d, d + 1, d + 2, bias=True, **kw),
          lambda d, heads=None: _dm().SelfAttention(d, d + 1, d + 2, bias=True), masked=True, native_batch=False),
    Model("SA-nobias", "SelfAttention",
          lambda d, heads=None, **kw: attnc.SelfAttention(d, max(1, d - 1), d + 2, **kw),
          lambda d, heads=None: _dm().SelfAttention(d, max(1, d - 1), d + 2, bias=False), masked=True,
          native_batch=False),
    Model("MHSA-bias", "MultiHeadSelfAttention", lambda d, heads=None, **kw: _mhsa(d, heads, True, **kw),
          lambda d, heads=None: _mhsa_doc(d, heads, True), masked=True, heads=lambda d: MHSA_HEADS,
          native_batch=False),
    Model("MHSA-nobias", "MultiHeadSelfAttention", lambda d, heads=None, **kw: _mhsa(d, heads, False, **kw),
          lambda d, heads=None: _mhsa_doc(d, heads, False), masked=True, heads=lambda d: MHSA_HEADS,
          native_batch=False),
]
MODEL_IDS = [m.name for m in MODELS]
MODEL = {m.name: m for m in MODELS}
MASKED_MODELS = [m for m in MODELS if m.masked]
MASKED_IDS = [m.name for m in MASKED_MODELS]
DROPOUT_MODELS = [m for m in MODELS if m.dropout]
DROPOUT_IDS = [m.name for m in DROPOUT_MODELS]


def make_module(name, dim=4, dtype=np.float32, seed=0, heads=None):
    """The registry's model `name` (attnc side) in eval mode, initialised from default_rng(seed)."""
    return MODEL[name].make(dim, heads=heads, dtype=dtype, rng=np.random.default_rng(seed)).eval()


def scores_shape(model, dim, x_shape, heads=None):
    """The shape of the attention scores of `model` for an input of x_shape."""
    lead, s = tuple(x_shape[:-2]), x_shape[-2]
    h = heads or model.n_heads(dim)
    return lead + ((h,) if h else ()) + (s, s)


def random_keep_mask(rng, shape, dtype=np.int64):
    """A 0/1 mask of `shape` whose last axis is never all zero (keeps torch oracles NaN-free)."""
    m = (rng.random(shape) < 0.6)
    m[..., 0] |= ~m.any(axis=-1)
    return m.astype(dtype)


# ============================================================================
# torch runners for the document models


def torch_dtype(dtype):
    import torch
    return torch.float32 if np.dtype(dtype) == np.float32 else torch.float64


def torch_sd(tmodel):
    return {k: v.detach().clone() for k, v in tmodel.state_dict().items()}


def np_sd(tmodel):
    """A torch model's state_dict as float64 NumPy arrays."""
    return {k: v.detach().numpy().astype(np.float64) for k, v in tmodel.state_dict().items()}


def make_pair(model, dim, dtype=np.float32, seed=0):
    """The document's torch model (eval, dtype) and the attnc model loaded with its weights."""
    import torch
    torch.manual_seed(seed)
    tm = model.make_torch(dim).eval()
    if np.dtype(dtype) == np.float64:
        tm = tm.double()
    am = model.make(dim, dtype=dtype, rng=np.random.default_rng(seed + 1000)).eval()
    am.load_state_dict(torch_sd(tm))
    return tm, am


def torch_forward(model, tm, x, mask=None):
    """The document model's output for x of any leading dims (flattened when needed)."""
    import torch
    xt = torch.from_numpy(np.array(x, copy=True))          # writable, contiguous copies
    mt = None if mask is None else torch.from_numpy(np.array(mask, copy=True))
    with torch.no_grad():
        if model.native_batch:
            return (tm(xt) if not model.masked else tm(xt, mt)).numpy()
        lead, (s, d) = x.shape[:-2], x.shape[-2:]
        b = int(np.prod(lead)) if lead else 1
        x3 = xt.reshape(b, s, d)
        m3 = None
        if mt is not None:
            h = model.n_heads(d)
            full = scores_shape(model, d, x.shape)
            m3 = mt.broadcast_to(full).reshape((b,) + ((h,) if h else ()) + (s, s))
        out = tm(x3, m3) if model.masked else tm(x3)
        return out.reshape(tuple(lead) + tuple(out.shape[-2:])).numpy()


# Keys where a vector of mask bytes starts or ends at 16, 32 or 64 bytes, in the first key tile
# and in the second (192 on); the last key of a 77-key row (its last vector overlaps the one
# before) and of a 269-key one (a second tile of 77 keys); the second tile of a 200-key row
# (8 keys, fewer than a vector).
LONE_KEYS = (0, 15, 16, 31, 32, 45, 63, 64, 76, 100, 127, 128, 150, 191, 192, 199, 207, 208, 223, 237, 255, 256,
             268)


def lone_key_masks(layout, lone, L, S):
    """(query, key, mask as passed, mask as the oracle reads it): every key kept (or hidden)
    but one, for each query and key of LONE_KEYS where a tile's mask rows start and end."""
    for key in (j for j in LONE_KEYS if j < S):
        for query in ((q for q in (0, 95, 96, 99, 1) if q < L) if layout != "(S,)" else (0,)):
            keep = np.full((L, S) if layout != "(S,)" else (S,), lone == "hidden")
            keep[(query, key) if layout != "(S,)" else key] = lone != "hidden"
            yield query, key, np.ascontiguousarray(keep.T).T if layout == "(S, L).T" else keep, keep
