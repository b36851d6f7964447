"""attnc against PyTorch, plain NumPy, ONNX Runtime and OpenVINO, side by side in one run.

Every implementation runs in this one process, interleaved round by round (the
order rotates each round) so that machine noise hits all of them equally, on the
same weights and inputs; outputs are checked against the NumPy implementation
before any timing. Peak memory is measured one implementation at a time in a
fresh subprocess. Writes results.json, results.md and plot.png to --out.

Cases 7 and 8 sweep the small and medium sizes users run (MultiHeadAttention;
SDPA, causal and decode-like shapes included) against torch, ONNX Runtime and
OpenVINO; each output is checked against a float64 NumPy reference first, and
each sample is a block of back-to-back calls. A peer that is not installed is
skipped with a note. Case 9 is float16 and bfloat16 against float32 (attnc,
torch, ONNX Runtime float16, OpenVINO bfloat16): bench_low_precision.py.

Run it as (see README.md: the two OpenBLAS variables slow a current NumPy down):
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench.py [--quick]
"""
import argparse
import dataclasses
import functools
import gc
import importlib
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

import attnc

try:
    import threadpoolctl
except ImportError:  # NumPy then keeps OpenBLAS's own thread count; recorded in the results
    threadpoolctl = None

THREADS = 2
FP32_PEAK_PER_CORE = 90.0  # GFLOP/s, a Zen 3 core's FMA peak: the fallback without threadpoolctl
MIB = 2**20
TOLERANCE = {np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-10}  # relative to max(1, max|ref|)
# Memory children: large blocks are mmapped and given back on free, so that the
# warm-up call's freed buffers cannot hide the measured call's allocations.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}

ATTNC = "attnc"
# a module frozen for inference (module.freeze()): its weights packed once, as a peer's session has them
ATTNC_FROZEN = "attnc frozen"
TORCH_MODULE = "torch module"
TORCH_NN_MHA = "torch nn.MultiheadAttention"
TORCH_SDPA = "torch SDPA"
TORCH_LINEAR = "torch F.linear"
NUMPY = "numpy"
TORCH_FUSED = "torch F.linear + SDPA"  # one fused QKV F.linear, F.scaled_dot_product_attention, F.linear
ORT = "onnxruntime"
OPENVINO = "openvino"

# Shapes: mha (B, T, C, heads); sdpa/long (B, H, L, E); tiny (B, T, C);
# tiny_calls (batches, calls per batch); linear (rows, in, out), linear_decode: two more, with
# the rows of a decoding step (a model's QKV projection); sweep: L values;
# repeats: timed rounds per case (--repeats overrides), sweep_repeats: per sweep point;
# peer_block_s: the length of one timed block of back-to-back calls in cases 7 and 8.
SIZES = {
    "full": dict(mha=(8, 512, 768, 12), sdpa=(8, 12, 1024, 64), long=(1, 8, 8192, 64), tiny=(3, 2, 4),
                 tiny_calls=(20, 1000), linear=(4096, 768, 2304), linear_decode=((1, 768, 2304), (1, 4096, 4096)),
                 sweep=(256, 512, 1024, 2048), gemm=2048,
                 repeats=5, sweep_repeats=3, peer_block_s=0.1),
    "quick": dict(mha=(2, 128, 128, 4), sdpa=(2, 4, 256, 32), long=(1, 2, 2048, 32), tiny=(3, 2, 4),
                  tiny_calls=(10, 200), linear=(256, 256, 768), linear_decode=((1, 256, 768), (1, 768, 2304)),
                  sweep=(64, 128, 256, 512), gemm=512,
                  repeats=3, sweep_repeats=2, peer_block_s=0.02),
}
# Cases 7 and 8, the sizes users run, the same in quick runs (which only time fewer and
# shorter blocks): MultiHeadAttention (B, L, D, heads); SDPA (B, H, L, S, E, causal), where
# L = 1 against S keys is a decoding step.
# The last three: CLIP's text encoder (77 tokens, 512 wide), a short sequence 1024 wide, a
# prompt of 8 tokens 768 wide.
PEER_MHA = ((1, 32, 256, 4), (2, 128, 256, 4), (8, 128, 512, 8), (1, 512, 768, 12), (4, 256, 1024, 16),
            (8, 512, 768, 12), (1, 77, 512, 8), (1, 50, 1024, 16), (1, 8, 768, 12))
PEER_SDPA = ((1, 4, 64, 64, 64, False), (2, 4, 256, 256, 64, False), (1, 12, 512, 512, 64, False),
             (4, 16, 256, 256, 128, False), (8, 12, 1024, 1024, 64, False), (8, 12, 1024, 1024, 64, True))
PEER_DECODE = ((1, 12, 1, 1024, 64, False), (4, 32, 1, 2048, 128, False))
# The smaller SDPA sizes causal too, after the decoding steps so that the earlier rows keep their keys.
PEER_SDPA_CAUSAL = ((1, 4, 64, 64, 64, True), (2, 4, 256, 256, 64, True), (1, 12, 512, 512, 64, True),
                    (4, 16, 256, 256, 128, True))
MAX_CALLS_PER_BLOCK = 10000
PEER_TARGET = "attnc <= fastest peer"  # cases 7 and 8 (the plain module or call; frozen is shown beside)
ORT_FORM_TRIALS = 9  # alternated calls of each ONNX Runtime attention form, the best of each chooses the faster
# Case 5's decoding steps: each sample is this many back-to-back calls, as in a
# decoding loop (one call after a pause measured the threads waking: 4.3 ms for
# torch's 0.14 ms linear of one row).
DECODE_CALLS = 200


# ----------------------------------------------------------------------------
# PyTorch, imported only by the implementations that need it (a memory child
# measuring attnc or NumPy never pays for it).

@functools.cache
def _torch():
    import torch
    torch.set_num_threads(THREADS)
    torch.set_grad_enabled(False)  # every torch call here runs as under torch.no_grad()
    return torch


def _tensors(*arrays):
    return [_torch().from_numpy(a) for a in arrays]


def _load_torch_module(module, weights, dtype):
    torch = _torch()
    module.to(getattr(torch, np.dtype(dtype).name)).eval()
    module.load_state_dict({key: torch.from_numpy(value) for key, value in weights.items()})
    return module


@functools.cache
def doc_classes():
    """000's SelfAttentionv1 and 001's MuitiHeadAttention as the documents write them
    (debugging prints removed)."""
    torch = _torch()
    nn = torch.nn

    class SelfAttentionv1(nn.Module):
        def __init__(self, hidden_dim=728):
            super().__init__()
            self.hidden_dim = hidden_dim
            self.Q_proj = nn.Linear(hidden_dim, hidden_dim)
            self.K_proj = nn.Linear(hidden_dim, hidden_dim)
            self.V_proj = nn.Linear(hidden_dim, hidden_dim)

        def forward(self, X):
            Q, K, V = self.Q_proj(X), self.K_proj(X), self.V_proj(X)
            attention_scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.hidden_dim)
            attention_weights = torch.softmax(attention_scores, dim=-1)
            return torch.matmul(attention_weights, V)

    class MuitiHeadAttention(nn.Module):
        def __init__(self, hidden_dim, head_num, dropout=0.1):
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
            Q, K, V = self.query_linear(X), self.key_linear(X), self.value_linear(X)
            q_state = Q.view(batch_size, seq_len, self.head_num, self.head_dim).transpose(1, 2)
            k_state = K.view(batch_size, seq_len, self.head_num, self.head_dim).transpose(1, 2)
            v_state = V.view(batch_size, seq_len, self.head_num, self.head_dim).transpose(1, 2)
            attention_weight = torch.matmul(q_state, k_state.transpose(-1, 2)) / math.sqrt(self.head_dim)
            if attention_mask is not None:
                attention_weight = attention_weight.masked_fill(attention_mask == 0, float("-1e20"))
            attention_weight = torch.softmax(attention_weight, dim=-1)
            attention_weight = self.dropout(attention_weight)
            output_mid = (attention_weight @ v_state).transpose(1, 2).contiguous()
            return self.output_linear(output_mid.view(batch_size, seq_len, -1))

    return SelfAttentionv1, MuitiHeadAttention


# ----------------------------------------------------------------------------
# The careful NumPy baseline: one fused QKV GEMM, heads batched through
# reshape/transpose and np.matmul, a stable softmax done in place.

def numpy_core(q, k, v, scale, exclude=None):
    """softmax(q k^T * scale) v; q, k, v are (..., L, E); exclude (L, S) is True where masked."""
    scores = np.matmul(q * scale, k.swapaxes(-1, -2))  # (..., L, S)
    if exclude is not None:
        np.copyto(scores, -np.inf, where=exclude)
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    denominator = scores.sum(axis=-1, keepdims=True)
    out = np.matmul(scores, v)  # normalising the (L, E) output is cheaper than the (L, S) weights
    out /= denominator
    return out


def numpy_self_attention(x, w_qkv, b_qkv, heads, out_proj=None):
    """x (B, T, C); w_qkv (3C, C) stacks Q, K, V; out_proj is (weight, bias) or None."""
    B, T, C = x.shape
    head_dim = C // heads
    qkv = (x.reshape(B * T, C) @ w_qkv.T + b_qkv).reshape(B, T, 3, heads, head_dim)
    q, k, v = qkv.transpose(2, 0, 3, 1, 4)  # each (B, heads, T, head_dim)
    out = numpy_core(q, k, v, 1 / math.sqrt(head_dim)).transpose(0, 2, 1, 3).reshape(B * T, C)
    if out_proj is not None:
        out = out @ out_proj[0].T + out_proj[1]
    return out.reshape(B, T, C)


# ----------------------------------------------------------------------------
# Inputs and weights, drawn once and shared by every implementation.

def random_array(rng, shape, dtype):
    return rng.standard_normal(shape, dtype=np.dtype(dtype).type)


def linear_weights(rng, names, in_features, out_features, dtype):
    """torch.nn.Linear's init, uniform in [-1/sqrt(in), 1/sqrt(in)], keyed as a state_dict."""
    bound = 1 / math.sqrt(in_features)
    weights = {}
    for name in names:
        weights[f"{name}.weight"] = rng.uniform(-bound, bound, (out_features, in_features)).astype(dtype)
        weights[f"{name}.bias"] = rng.uniform(-bound, bound, out_features).astype(dtype)
    return weights


def stacked(weights, names):
    """The fused (3C, C) weight and (3C,) bias of three projections."""
    return (np.concatenate([weights[f"{n}.weight"] for n in names]),
            np.concatenate([weights[f"{n}.bias"] for n in names]))


def load_attnc_module(module, weights):
    module.eval().load_state_dict(weights)
    return module


# ----------------------------------------------------------------------------
# Implementations. Each factory takes the shared inputs and returns a
# zero-argument callable: the thing that is timed.

MHA_NAMES = ("query_linear", "key_linear", "value_linear", "output_linear")


def attnc_mha(x, weights, heads):
    module = load_attnc_module(attnc.MultiHeadAttention(x.shape[-1], heads, dtype=x.dtype), weights)
    return lambda: module(x)


def attnc_frozen_mha(x, weights, heads):
    frozen = load_attnc_module(attnc.MultiHeadAttention(x.shape[-1], heads, dtype=x.dtype), weights).freeze()
    return lambda: frozen(x)


def torch_doc_mha(x, weights, heads):
    module = _load_torch_module(doc_classes()[1](x.shape[-1], heads), weights, x.dtype)
    (tx,) = _tensors(x)
    return lambda: module(tx)


def torch_nn_mha(x, weights, heads):
    torch = _torch()
    module = torch.nn.MultiheadAttention(x.shape[-1], heads, dropout=0.1, batch_first=True)
    w_qkv, b_qkv = stacked(weights, MHA_NAMES[:3])
    state = {"in_proj_weight": w_qkv, "in_proj_bias": b_qkv,
             "out_proj.weight": weights["output_linear.weight"], "out_proj.bias": weights["output_linear.bias"]}
    module = _load_torch_module(module, state, x.dtype)
    (tx,) = _tensors(x)
    return lambda: module(tx, tx, tx, need_weights=False)[0]


def torch_sdpa_mha(x, weights, heads):
    """The document's module with its attention core replaced by torch's fused SDPA."""
    F = _torch().nn.functional
    (tx,) = _tensors(x)
    w = dict(zip(weights, _tensors(*weights.values())))
    B, T, C = x.shape

    def split_heads(name):
        return F.linear(tx, w[f"{name}.weight"], w[f"{name}.bias"]).view(B, T, heads, C // heads).transpose(1, 2)

    def forward():
        q, k, v = (split_heads(name) for name in MHA_NAMES[:3])
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        return F.linear(out, w["output_linear.weight"], w["output_linear.bias"])

    return forward


def numpy_mha(x, weights, heads):
    w_qkv, b_qkv = stacked(weights, MHA_NAMES[:3])
    out_proj = (weights["output_linear.weight"], weights["output_linear.bias"])
    return lambda: numpy_self_attention(x, w_qkv, b_qkv, heads, out_proj)


def causal_exclusion(queries, keys=None):
    """(L, S) True above the diagonal (S = L by default): the keys a causal query may not see."""
    return np.triu(np.ones((queries, queries if keys is None else keys), dtype=bool), k=1)


def attnc_sdpa(q, k, v, causal):
    sdpa = attnc.functional.scaled_dot_product_attention
    return lambda: sdpa(q, k, v, is_causal=causal)


def torch_sdpa(q, k, v, causal):
    F = _torch().nn.functional
    tq, tk, tv = _tensors(q, k, v)
    return lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)


def torch_doc_core(q, k, v, causal):
    """The documents' attention core in torch: matmul, scale, masked_fill(mask == 0, -1e20), softmax, matmul."""
    torch = _torch()
    tq, tk, tv = _tensors(q, k, v)
    mask = torch.from_numpy(~causal_exclusion(q.shape[-2])) if causal else None
    scale = math.sqrt(q.shape[-1])

    def forward():
        scores = torch.matmul(tq, tk.transpose(-2, -1)) / scale
        if mask is not None:
            scores = scores.masked_fill(mask == 0, float("-1e20"))
        return torch.matmul(torch.softmax(scores, dim=-1), tv)

    return forward


def numpy_sdpa(q, k, v, causal):
    exclude = causal_exclusion(q.shape[-2], k.shape[-2]) if causal else None
    scale = 1 / math.sqrt(q.shape[-1])
    return lambda: numpy_core(q, k, v, scale, exclude)


V1_NAMES = ("Q_proj", "K_proj", "V_proj")


def attnc_v1(x, weights):
    module = load_attnc_module(attnc.SelfAttentionV1(x.shape[-1], dtype=x.dtype), weights)
    return lambda: module(x)


def torch_doc_v1(x, weights):
    module = _load_torch_module(doc_classes()[0](x.shape[-1]), weights, x.dtype)
    (tx,) = _tensors(x)
    return lambda: module(tx)


def numpy_v1(x, weights):
    w_qkv, b_qkv = stacked(weights, V1_NAMES)
    return lambda: numpy_self_attention(x, w_qkv, b_qkv, heads=1)


def attnc_linear(x, weight, bias):
    return lambda: attnc.functional.linear(x, weight, bias)


def torch_linear(x, weight, bias):
    F = _torch().nn.functional
    tx, tw, tb = _tensors(x, weight, bias)
    return lambda: F.linear(tx, tw, tb)


def numpy_linear(x, weight, bias):
    return lambda: x @ weight.T + bias


def torch_fused_mha(x, weights, heads):
    """torch's fastest plain formulation: one fused QKV F.linear, F.scaled_dot_product_attention, F.linear."""
    F = _torch().nn.functional
    (tx,) = _tensors(x)
    w_qkv, b_qkv, w_out, b_out = _tensors(*stacked(weights, MHA_NAMES[:3]), weights["output_linear.weight"],
                                          weights["output_linear.bias"])
    B, T, C = x.shape

    def forward():
        q, k, v = F.linear(tx, w_qkv, b_qkv).view(B, T, 3, heads, C // heads).permute(2, 0, 3, 1, 4)
        return F.linear(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, C), w_out, b_out)

    return forward


# ----------------------------------------------------------------------------
# ONNX Runtime and OpenVINO, the peers of cases 7 and 8: imported only there,
# and optional (a peer whose package is missing is skipped with a note). Each
# factory's callable carries `.ops`, the operators it runs, for the results.

ONNX_OPSET = 17  # ai.onnx opset of the graphs built here
ONNX_ATTENTION_OPSET = 23  # the first with the standard Attention op
ONNX_IR_VERSIONS = {ONNX_OPSET: 10, ONNX_ATTENTION_OPSET: 11}  # the IR version each opset's graphs declare
OPENVINO_CONFIG = {  # f32 forced: on a CPU with AVX512_BF16 the plugin's default precision is bf16
    "INFERENCE_NUM_THREADS": THREADS, "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}
PEER_SETTINGS = {}  # what the peers were run with, as they report it: written into the results


@functools.cache
def _optional(module):
    """The module, or None, with a printed note, when it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        print(f"note: {module} is not installed ({error}); the peer that needs it is skipped "
              f"(pip install -e '.[bench]')", flush=True)
        return None


def peer_available(name):
    if name == ORT:
        return _optional("onnxruntime") is not None and _optional("onnx") is not None
    if name == OPENVINO:
        return _optional("openvino") is not None
    return True


def described(fn, ops):
    fn.ops = ops
    return fn


def ort_runner(nodes, inputs, output_shape, initializers, name, opset=ONNX_OPSET):
    """An ONNX graph built in code (onnx.helper) with ai.onnx `opset`, run by a CPU
    InferenceSession on THREADS intra-op threads, one inter-op thread, sequential, all graph
    optimisations."""
    onnx, ort = _optional("onnx"), _optional("onnxruntime")
    helper, f32 = onnx.helper, onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info(key, f32, list(a.shape)) for key, a in inputs.items()],
        [helper.make_tensor_value_info("out", f32, list(output_shape))],
        [onnx.numpy_helper.from_array(np.ascontiguousarray(value), key) for key, value in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = ONNX_IR_VERSIONS[opset]
    onnx.checker.check_model(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    PEER_SETTINGS.setdefault(ORT, {
        "version": ort.__version__, "onnx": onnx.__version__, "providers": session.get_providers(),
        "intra_op_num_threads": options.intra_op_num_threads, "inter_op_num_threads": options.inter_op_num_threads,
        "execution_mode": str(options.execution_mode), "graph_optimization_level": str(options.graph_optimization_level),
        "opset": ONNX_OPSET, "ir_version": ONNX_IR_VERSIONS[ONNX_OPSET],
        "attention_opset": ONNX_ATTENTION_OPSET, "attention_ir_version": ONNX_IR_VERSIONS[ONNX_ATTENTION_OPSET]})
    return lambda: session.run(None, inputs)[0]  # the inputs are bound on every call


def ort_mha(x, weights, heads):
    """com.microsoft Attention: fused QKV weight (D, 3D), bias (3D), num_heads; then MatMul + Add."""
    helper = _optional("onnx").helper
    w_qkv, b_qkv = stacked(weights, MHA_NAMES[:3])
    nodes = [helper.make_node("Attention", ["x", "w_qkv", "b_qkv"], ["attention"], domain="com.microsoft",
                              num_heads=heads),
             helper.make_node("MatMul", ["attention", "w_out"], ["projected"]),
             helper.make_node("Add", ["projected", "b_out"], ["out"])]
    initializers = {"w_qkv": w_qkv.T, "b_qkv": b_qkv, "w_out": weights["output_linear.weight"].T,
                    "b_out": weights["output_linear.bias"]}
    return described(ort_runner(nodes, {"x": x}, x.shape, initializers, "mha"),
                     "com.microsoft Attention (fused QKV, num_heads) + MatMul + Add")


def ort_sdpa(q, k, v, causal):
    """ONNX Runtime's attention in the faster of its two forms for this shape (best of
    ORT_FORM_TRIALS calls each, after a warm-up): the standard Attention op (opset 23), which
    takes q, k, v as (B, H, L, E) as the other libraries do, and com.microsoft
    MultiHeadAttention with K and V in BNSH, whose query must be (B, L, H*E), so q is
    transposed and reshaped to it, and the output back, inside the graph (faster at some
    decoding steps). If both refuse the shape: a plain MatMul/Softmax/MatMul graph."""
    helper = _optional("onnx").helper
    B, H, L, E = q.shape
    inputs = {"q": q, "k": k, "v": v}
    standard = ([helper.make_node("Attention", ["q", "k", "v"], ["out"], is_causal=int(causal))], {},
                ONNX_ATTENTION_OPSET, f"ai.onnx Attention (opset {ONNX_ATTENTION_OPSET}; q, k, v BHLE"
                + (", is_causal=1)" if causal else ")"))
    contrib = ([helper.make_node("Transpose", ["q"], ["q_bsnh"], perm=[0, 2, 1, 3]),
                helper.make_node("Reshape", ["q_bsnh", "bsd"], ["q_bsd"]),
                helper.make_node("MultiHeadAttention", ["q_bsd", "k", "v"], ["out_bsd"], domain="com.microsoft",
                                 num_heads=H, unidirectional=int(causal)),
                helper.make_node("Reshape", ["out_bsd", "bsnh"], ["out_bsnh"]),
                helper.make_node("Transpose", ["out_bsnh"], ["out"], perm=[0, 2, 1, 3])],
               {"bsd": np.array([B, L, H * E], np.int64), "bsnh": np.array([B, L, H, E], np.int64)}, ONNX_OPSET,
               "com.microsoft MultiHeadAttention (K, V BNSH; q Transpose+Reshape to BSD and back"
               + (", unidirectional=1)" if causal else ")"))
    forms, refusals = {}, []
    for nodes, constants, opset, ops in (standard, contrib):
        try:
            run = ort_runner(nodes, inputs, q.shape, constants, "sdpa", opset)
            run()  # a refused shape may only show when the kernel runs (and the warm-up)
            forms[ops] = run
        except Exception as error:  # noqa: BLE001 (any refusal leaves the other forms)
            refusals.append(f"{ops.split(' (')[0]}: {type(error).__name__}: {str(error).strip().splitlines()[0][:200]}")
            print(f"  onnxruntime refused {q.shape} against {k.shape}: {refusals[-1]}", flush=True)
    if forms:
        best = {ops: math.inf for ops in forms}
        for _ in range(ORT_FORM_TRIALS):  # alternated, so that a slow moment falls on both
            for ops, run in forms.items():
                best[ops] = min(best[ops], timed(run))
        ops = min(best, key=best.get)
        return described(forms[ops], ops + (f"; the faster of {len(forms)} forms here" if len(forms) > 1 else ""))
    refusal = "; ".join(refusals)
    print("  plain MatMul/Softmax/MatMul graph instead", flush=True)
    nodes = [helper.make_node("Transpose", ["k"], ["k_t"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "k_t"], ["scores"]),
             helper.make_node("Mul", ["scores", "scale"], ["scaled"])]
    constants = {"scale": np.array(1 / math.sqrt(E), np.float32)}
    if causal:
        nodes.append(helper.make_node("Add", ["scaled", "mask"], ["masked"]))
        constants["mask"] = np.where(causal_exclusion(L, k.shape[2]), -np.inf, 0).astype(np.float32)
    nodes += [helper.make_node("Softmax", ["masked" if causal else "scaled"], ["weights"], axis=-1),
              helper.make_node("MatMul", ["weights", "v"], ["out"])]
    return described(ort_runner(nodes, inputs, q.shape, constants, "sdpa_plain"),
                     f"plain Transpose/MatMul/Mul/{'Add/' if causal else ''}Softmax/MatMul "
                     f"(the attention ops refused: {refusal})")


def ov_runner(parameters, output, name):
    """An OpenVINO model compiled for CPU with OPENVINO_CONFIG, called through one reused infer
    request; each call sets the inputs (share_inputs: the tensors wrap the arrays, no copy),
    runs, and returns a copy of the output (share_outputs=False), so each call gives a fresh array."""
    ov = _optional("openvino")
    compiled = ov.Core().compile_model(ov.Model([output], [p for p, _ in parameters], name), "CPU", OPENVINO_CONFIG)
    settings = {key: compiled.get_property(key) for key in (*OPENVINO_CONFIG, "NUM_STREAMS")}
    settings = {key: value.get_type_name() if hasattr(value, "get_type_name") else str(value)
                for key, value in settings.items()}  # the precision is an ov.Type
    if settings["INFERENCE_PRECISION_HINT"] != "f32":
        raise RuntimeError(f"OpenVINO kept inference precision {settings['INFERENCE_PRECISION_HINT']}, not f32")
    PEER_SETTINGS.setdefault(OPENVINO, {"version": ov.__version__, "device": "CPU", **settings})
    layers = sorted({op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ordered_ops()}
                    - {"Input", "Output", "Const"})
    request = compiled.create_infer_request()
    feeds = {index: array for index, (_, array) in enumerate(parameters)}

    def forward():
        return request.infer(feeds, share_inputs=True, share_outputs=False)[0]

    forward.layers = layers
    return forward


def ov_constant(values):
    return _optional("openvino").opset13.constant(np.asarray(values))


def ov_mha(x, weights, heads):
    """MatMul (fused QKV weight) + Add, Reshape, Transpose, Split, Squeeze into (B, H, L, E),
    opset13 ScaledDotProductAttention, Transpose, Reshape, MatMul + Add."""
    ops = _optional("openvino").opset13
    B, T, C = x.shape
    w_qkv, b_qkv = stacked(weights, MHA_NAMES[:3])
    data = ops.parameter([B, T, C], np.float32, name="x")
    qkv = ops.add(ops.matmul(data, ov_constant(w_qkv), False, True), ov_constant(b_qkv))
    qkv = ops.transpose(ops.reshape(qkv, ov_constant(np.array([B, T, 3, heads, C // heads], np.int64)), False),
                        ov_constant(np.array([2, 0, 3, 1, 4], np.int64)))
    q, k, v = (ops.squeeze(part, ov_constant(np.array([0], np.int64)))
               for part in ops.split(qkv, ov_constant(np.int64(0)), 3).outputs())
    out = ops.transpose(ops.scaled_dot_product_attention(q, k, v, causal=False), ov_constant(np.array([0, 2, 1, 3], np.int64)))
    out = ops.reshape(out, ov_constant(np.array([B, T, C], np.int64)), False)
    out = ops.add(ops.matmul(out, ov_constant(weights["output_linear.weight"]), False, True),
                  ov_constant(weights["output_linear.bias"]))
    run = ov_runner([(data, x)], out, "mha")
    return described(run, "MatMul(fused QKV)+Add, Reshape, Transpose, Split, Squeeze, opset13 "
                          "ScaledDotProductAttention, Transpose, Reshape, MatMul+Add; CPU runtime layers: "
                          + ", ".join(run.layers))


def ov_sdpa(q, k, v, causal):
    """opset13 ScaledDotProductAttention on (B, H, L, E) q and (B, H, S, E) k, v."""
    ops = _optional("openvino").opset13
    parameters = [(ops.parameter(list(a.shape), np.float32, name=name), a) for name, a in zip("qkv", (q, k, v))]
    out = ops.scaled_dot_product_attention(*(p for p, _ in parameters), causal=causal)
    run = ov_runner(parameters, out, "sdpa")
    return described(run, f"opset13 ScaledDotProductAttention{'(causal)' if causal else ''}; CPU runtime layers: "
                          + ", ".join(run.layers))


# ----------------------------------------------------------------------------
# The cases. Each builds its inputs and the requested implementations.

@dataclasses.dataclass
class Bench:
    shape: str
    flops: float  # useful floating-point operations of one call (None: latency case)
    input_bytes: int
    impls: dict  # name -> zero-argument callable


def case_mha(size, dtype, names):
    """Cases 1 and 6: MultiHeadAttention(C, heads) on x (B, T, C)."""
    B, T, C, heads = size
    rng = np.random.default_rng(1)
    x = random_array(rng, (B, T, C), dtype)
    weights = linear_weights(rng, MHA_NAMES, C, C, dtype)
    factories = {ATTNC: attnc_mha, TORCH_MODULE: torch_doc_mha, TORCH_NN_MHA: torch_nn_mha,
                 TORCH_SDPA: torch_sdpa_mha, NUMPY: numpy_mha}
    flops = 4 * 2 * B * T * C * C + 2 * 2 * B * T * T * C  # four projections; Q K^T and P V
    return Bench(f"x ({B}, {T}, {C}), {heads} heads", flops, x.nbytes,
                 {name: factories[name](x, weights, heads) for name in names})


def case_sdpa(size, dtype, causal, names):
    """Cases 2, 3 and 6: attention core on q, k, v (B, H, L, E)."""
    B, H, L, E = size
    rng = np.random.default_rng(2)
    q, k, v = (random_array(rng, size, dtype) for _ in range(3))
    factories = {ATTNC: attnc_sdpa, TORCH_SDPA: torch_sdpa, TORCH_MODULE: torch_doc_core, NUMPY: numpy_sdpa}
    pairs = L * (L + 1) // 2 if causal else L * L  # causal: only the (query, key) pairs computed
    return Bench(f"q, k, v ({B}, {H}, {L}, {E})" + (", causal" if causal else ""), 2 * 2 * B * H * pairs * E,
                 3 * q.nbytes, {name: factories[name](q, k, v, causal) for name in names})


def case_tiny(size, dtype, names):
    """Case 4: SelfAttentionV1(C) on x (B, T, C), a latency case."""
    B, T, C = size
    rng = np.random.default_rng(4)
    x = random_array(rng, size, dtype)
    weights = linear_weights(rng, V1_NAMES, C, C, dtype)
    factories = {ATTNC: attnc_v1, TORCH_MODULE: torch_doc_v1, NUMPY: numpy_v1}
    return Bench(f"x ({B}, {T}, {C})", None, x.nbytes, {name: factories[name](x, weights) for name in names})


def case_linear(size, dtype, names):
    """Case 5: Linear(in, out) on x (rows, in)."""
    rows, in_features, out_features = size
    rng = np.random.default_rng(5)
    x = random_array(rng, (rows, in_features), dtype)
    weights = linear_weights(rng, ["linear"], in_features, out_features, dtype)
    weight, bias = weights["linear.weight"], weights["linear.bias"]
    factories = {ATTNC: attnc_linear, TORCH_LINEAR: torch_linear, NUMPY: numpy_linear}
    return Bench(f"x ({rows}, {in_features}) -> {out_features}", 2 * rows * in_features * out_features,
                 x.nbytes + weight.nbytes + bias.nbytes, {name: factories[name](x, weight, bias) for name in names})


@dataclasses.dataclass
class PeerBench:
    shape: str
    flops: float
    reference: np.ndarray  # float64: what every output is checked against
    impls: dict  # name -> zero-argument callable, for those that could be built
    skipped: dict  # name -> why it does not run (not installed, could not be built)


def build_impls(factories, names, inputs):
    impls, skipped = {}, {}
    for name in names:
        if not peer_available(name):
            skipped[name] = "not installed"
            continue
        try:
            impls[name] = factories[name](*inputs)
        except Exception as error:  # noqa: BLE001 (a peer that cannot run this shape is reported, not fatal)
            skipped[name] = f"could not run: {type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"
            print(f"  {name}: {skipped[name]}", flush=True)
    return impls, skipped


def as_float64(*arrays):
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def case_peer_mha(size, names):
    """Case 7: MultiHeadAttention(D, heads) on x (B, L, D) against torch, ONNX Runtime, OpenVINO and NumPy."""
    B, T, C, heads = size
    rng = np.random.default_rng(7)
    x = random_array(rng, (B, T, C), np.float32)
    module = load_attnc_module(attnc.MultiHeadAttention(C, heads, dtype=np.float32),
                               linear_weights(rng, MHA_NAMES, C, C, np.float32))
    weights = {key: np.ascontiguousarray(value) for key, value in module.state_dict().items()}  # every peer's
    w_qkv, b_qkv = stacked(weights, MHA_NAMES[:3])
    reference = numpy_self_attention(*as_float64(x, w_qkv, b_qkv), heads,
                                     as_float64(weights["output_linear.weight"], weights["output_linear.bias"]))
    factories = {ATTNC: attnc_mha, ATTNC_FROZEN: attnc_frozen_mha, TORCH_NN_MHA: torch_nn_mha,
                 TORCH_FUSED: torch_fused_mha, ORT: ort_mha, OPENVINO: ov_mha, NUMPY: numpy_mha}
    impls, skipped = build_impls(factories, names, (x, weights, heads))
    flops = 4 * 2 * B * T * C * C + 2 * 2 * B * T * T * C
    return PeerBench(f"x ({B}, {T}, {C}), {heads} heads", flops, reference, impls, skipped)


def case_peer_sdpa(size, names):
    """Case 8: attention core, q (B, H, L, E) against k, v (B, H, S, E); L = 1 is a decoding step."""
    B, H, L, S, E, causal = size
    rng = np.random.default_rng(8)
    q = random_array(rng, (B, H, L, E), np.float32)
    k, v = (random_array(rng, (B, H, S, E), np.float32) for _ in range(2))
    exclude = causal_exclusion(L, S) if causal else None
    reference = numpy_core(*as_float64(q, k, v), 1 / math.sqrt(E), exclude)
    factories = {ATTNC: attnc_sdpa, TORCH_SDPA: torch_sdpa, ORT: ort_sdpa, OPENVINO: ov_sdpa, NUMPY: numpy_sdpa}
    impls, skipped = build_impls(factories, names, (q, k, v, causal))
    pairs = L * (L + 1) // 2 if causal else L * S
    shape = f"q ({B}, {H}, {L}, {E})" + (f", k, v ({B}, {H}, {S}, {E})" if S != L else ", k, v alike")
    return PeerBench(shape + (", causal" if causal else ""), 2 * 2 * B * H * pairs * E, reference, impls, skipped)


# ----------------------------------------------------------------------------
# Targets: each takes a row's results and says whether attnc meets it.

def target_beat_all(row):
    ok = row["attnc_over_torch_best"] <= 0.8 and row["attnc_over_numpy"] <= 0.8
    return ok, "attnc <= 0.8x torch-best and <= 0.8x numpy"


def target_long(row):
    limit = 1.5 * row["output_bytes"] + 64 * MIB
    extra = row["impls"][ATTNC]["peak_rss_delta_bytes"]
    ok = row["attnc_over_torch_best"] <= 1.0 and extra is not None and extra <= limit
    return ok, f"attnc <= torch-best time and peak RSS delta <= 1.5x output + 64 MiB ({limit / MIB:.0f} MiB)"


def target_tiny(row):
    ratio = row["impls"][ATTNC]["median_s"] / row["impls"][TORCH_MODULE]["median_s"]
    return ratio <= 0.25, "attnc <= 0.25x torch module latency"


def target_linear(row):
    return row["attnc_over_numpy"] <= 1 / 0.95, "attnc >= 0.95x numpy GFLOP/s"


@dataclasses.dataclass
class Row:
    key: str
    case: int
    title: str
    dtype: type
    names: tuple
    build: object  # names -> Bench
    target: object
    latency: bool = False
    calls: int = 1  # back-to-back calls per timed sample (a decoding step is a call in a loop)


def rows(sizes):
    f32, f64 = np.float32, np.float64
    mha_names = (ATTNC, TORCH_MODULE, TORCH_NN_MHA, TORCH_SDPA, NUMPY)
    core_names = (ATTNC, TORCH_SDPA, TORCH_MODULE, NUMPY)
    mha, sdpa = functools.partial(case_mha, sizes["mha"]), functools.partial(case_sdpa, sizes["sdpa"])
    return [
        Row("1", 1, "MultiHeadAttention", f32, mha_names, functools.partial(mha, f32), target_beat_all),
        Row("2", 2, "SDPA core", f32, core_names, functools.partial(sdpa, f32, False), target_beat_all),
        Row("2c", 2, "SDPA core, causal", f32, core_names, functools.partial(sdpa, f32, True), target_beat_all),
        Row("3", 3, "long-sequence SDPA", f32, core_names,
            functools.partial(case_sdpa, sizes["long"], f32, False), target_long),
        Row("4", 4, "tiny SelfAttentionV1 latency", f32, (ATTNC, TORCH_MODULE, NUMPY),
            functools.partial(case_tiny, sizes["tiny"], f32), target_tiny, latency=True),
        Row("5", 5, "Linear", f32, (ATTNC, TORCH_LINEAR, NUMPY),
            functools.partial(case_linear, sizes["linear"], f32), target_linear),
        *(Row(f"5-d{i}", 5, "Linear, a decoding step", f32, (ATTNC, TORCH_LINEAR, NUMPY),
              functools.partial(case_linear, size, f32), target_linear, calls=DECODE_CALLS)
          for i, size in enumerate(sizes["linear_decode"], 1)),
        Row("6-1", 6, "MultiHeadAttention float64", f64, mha_names, functools.partial(mha, f64), target_beat_all),
        Row("6-2", 6, "SDPA core float64", f64, core_names, functools.partial(sdpa, f64, False), target_beat_all),
        Row("6-2c", 6, "SDPA core float64, causal", f64, core_names, functools.partial(sdpa, f64, True),
            target_beat_all),
    ]


@dataclasses.dataclass
class PeerRow:
    """A row of cases 7 and 8: attnc and its peers, timed; the target: attnc (the plain
    module or call) <= the fastest peer (PEER_TARGET)."""
    key: str
    case: int
    title: str
    names: tuple
    build: object  # names -> PeerBench


def peer_rows():
    mha_names = (ATTNC, ATTNC_FROZEN, TORCH_NN_MHA, TORCH_FUSED, ORT, OPENVINO, NUMPY)
    core_names = (ATTNC, TORCH_SDPA, ORT, OPENVINO, NUMPY)
    result = [PeerRow(f"7-{i}", 7, "MultiHeadAttention sweep", mha_names, functools.partial(case_peer_mha, size))
              for i, size in enumerate(PEER_MHA, 1)]
    for i, size in enumerate(PEER_SDPA + PEER_DECODE + PEER_SDPA_CAUSAL, 1):
        title = "SDPA decode step" if size[2] == 1 else "SDPA sweep" + (", causal" if size[5] else "")
        result.append(PeerRow(f"8-{i}", 8, title, core_names, functools.partial(case_peer_sdpa, size)))
    return result


# ----------------------------------------------------------------------------
# Measuring: interleaved timing, output agreement, peak memory.

# Idle time before each timed sample. OpenBLAS's worker threads keep spinning
# after a NumPy call (its default THREAD_TIMEOUT is 2^28 cycles, about 0.07 s
# here), and a spinning thread takes a core from whatever runs next: without
# this pause, attnc timed right after NumPy lost a third of its Linear speed
# (benchmarks/NOTES.md). After the pause, one untimed call of the same
# implementation wakes its own threads (the first call after idle ran 7-9%
# slower for attnc and torch alike), so every timed call is a steady-state
# call, as in a user's loop, with no other library's threads running.
SETTLE_S = 0.25


def time_interleaved(impls, rounds, calls=1):
    """Seconds per call of each implementation, one sample per round; every
    round calls all implementations, in an order rotated by one each round,
    each after SETTLE_S of idle time and one untimed call. A sample is a block
    of `calls` back-to-back calls: one number, or a dict with one per implementation."""
    names = list(impls)
    samples = {name: [] for name in names}
    gc.disable()
    try:
        for round_index in range(rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                fn = impls[name]
                time.sleep(SETTLE_S)
                fn()
                count = calls[name] if isinstance(calls, dict) else calls
                start = time.perf_counter()
                for _ in range(count):
                    fn()
                samples[name].append((time.perf_counter() - start) / count)
    finally:
        gc.enable()
    return samples


def check_outputs(impls, dtype):
    """Calls each implementation once (the warm-up), returns its max abs diff
    to the NumPy output, and asserts agreement within float tolerance."""
    outputs = {name: np.asarray(fn()) for name, fn in impls.items()}
    reference = outputs[NUMPY]
    tolerance = TOLERANCE[np.dtype(dtype)] * max(1.0, float(np.abs(reference).max()))
    diffs = {}
    for name, output in outputs.items():
        assert output.shape == reference.shape and output.dtype == reference.dtype, (name, output.shape, output.dtype)
        diffs[name] = float(np.abs(output.astype(np.float64) - reference).max())
        assert diffs[name] <= tolerance, f"{name} differs from numpy by {diffs[name]:.3g} > {tolerance:.3g}"
    return diffs, reference.nbytes


def proc_status_kib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def peak_rss_delta(fn):
    """Peak RSS growth, in bytes, of one warm call of fn (its output included)."""
    # one-time initialisation (thread pools, BLAS buffers) is not the call's memory; the warm
    # call's output is held through the measured call, so that its memory cannot serve the
    # measured output (attnc's allocator keeps a freed output's block for the next call)
    warm_output = fn()
    gc.collect()
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # resets VmHWM to the current RSS
    before = proc_status_kib("VmRSS")
    output = fn()
    del warm_output
    return (proc_status_kib("VmHWM") - before) * 1024, np.asarray(output).nbytes


def memory_child(row, name):
    """Entry point of a fresh subprocess: measure one implementation of one row."""
    delta, output_bytes = peak_rss_delta(row.build((name,)).impls[name])
    print(json.dumps({"peak_rss_delta_bytes": delta, "output_bytes": output_bytes}))


def measure_memory_in_child(row, name, quick):
    command = [sys.executable, os.path.abspath(__file__), "--memory-child", row.key, name]
    command += ["--quick"] if quick else []
    done = subprocess.run(command, env={**os.environ, **MALLOC_ENV}, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"  memory child {row.key}/{name} failed: {done.stderr.strip().splitlines()[-1:]}", flush=True)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_delta_bytes"]


# ----------------------------------------------------------------------------
# Running a row and the sequence-length sweep.

def peak_for(dtype, args):
    return args.peak_gflops if np.dtype(dtype) == np.float32 else args.peak_gflops_fp64


def set_peaks(args, gemms):
    """The rates '% peak' divides by: --peak-gflops (fp64: half of it), else
    NumPy/OpenBLAS's 2048^3 GEMM rates of this run on THREADS threads (the
    machine kind changes between sessions: a Zen 3 figure is wrong on a Zen
    5), else a Zen 3 core's FMA peak (FP32_PEAK_PER_CORE)."""
    def measured(dtype):
        return next((rate for name, rate in gemms.items()
                     if name.startswith(f"numpy {dtype} ") and name.endswith(f", {THREADS} thread(s)")), None)

    if args.peak_gflops is not None:
        args.peak_gflops_fp64 = args.peak_gflops / 2
        args.peak_source = f"--peak-gflops {args.peak_gflops:g} (fp64: half)"
    elif measured("float32") and measured("float64"):
        args.peak_gflops, args.peak_gflops_fp64 = measured("float32"), measured("float64")
        args.peak_source = f"NumPy/OpenBLAS 2048^3 GEMM rate of this run on {THREADS} threads, per dtype"
    else:
        args.peak_gflops = FP32_PEAK_PER_CORE * THREADS
        args.peak_gflops_fp64 = args.peak_gflops / 2
        args.peak_source = (f"documented machine peak {FP32_PEAK_PER_CORE:g} GFLOP/s/core fp32 "
                            f"({FP32_PEAK_PER_CORE / 2:g} fp64) x {THREADS} threads")


def run_row(row, sizes, args):
    bench = row.build(row.names)
    diffs, output_bytes = check_outputs(bench.impls, row.dtype)
    if row.latency:
        batches, calls = sizes["tiny_calls"]
        samples = time_interleaved(bench.impls, batches, calls)
    else:
        samples = time_interleaved(bench.impls, args.repeats, row.calls)
    measure_memory = not row.latency and (not args.quick or row.case == 3)
    peak = peak_for(row.dtype, args)
    impls = {}
    for name in row.names:
        median = statistics.median(samples[name])
        gflops = bench.flops / median / 1e9 if bench.flops else None
        impls[name] = {
            "median_s": median, "samples_s": samples[name], "gflops": gflops,
            "fraction_of_peak": gflops / peak if gflops else None, "max_abs_diff": diffs[name],
            "peak_rss_delta_bytes": measure_memory_in_child(row, name, args.quick) if measure_memory else None,
        }
    torch_times = {name: v["median_s"] for name, v in impls.items() if name.startswith("torch")}
    torch_best = min(torch_times, key=torch_times.get)
    result = {
        "key": row.key, "case": row.case, "title": row.title, "dtype": np.dtype(row.dtype).name,
        "shape": bench.shape, "flops": bench.flops, "input_bytes": bench.input_bytes, "output_bytes": output_bytes,
        "peak_gflops": peak, "impls": impls, "torch_best": torch_best,
        "attnc_over_torch_best": impls[ATTNC]["median_s"] / torch_times[torch_best],
        "attnc_over_numpy": impls[ATTNC]["median_s"] / impls[NUMPY]["median_s"],
    }
    result["pass"], result["target"] = row.target(result)
    return result


def run_sweep(sizes):
    """SDPA core (non-causal, float32) median time per implementation at each sequence length."""
    B, H, _, E = sizes["sdpa"]
    names = (ATTNC, TORCH_SDPA, TORCH_MODULE, NUMPY)
    sweep = {"shape": f"q, k, v ({B}, {H}, L, {E}), float32", "seq": list(sizes["sweep"]),
             "median_s": {name: [] for name in names}}
    for length in sizes["sweep"]:
        bench = case_sdpa((B, H, length, E), np.float32, False, names)
        check_outputs(bench.impls, np.float32)
        samples = time_interleaved(bench.impls, sizes["sweep_repeats"])
        for name in names:
            sweep["median_s"][name].append(statistics.median(samples[name]))
        print(f"  sweep L={length}: " + ", ".join(f"{n} {sweep['median_s'][n][-1] * 1e3:.2f} ms" for n in names),
              flush=True)
    return sweep


def calls_per_block(fn, block_s):
    """How many back-to-back calls of fn fill block_s: from the fastest of the untimed
    calls made in about half a block, after the same pause and wake-up call as a timed block."""
    time.sleep(SETTLE_S)
    fn()
    samples = [timed(fn)]
    while (sum(samples) < block_s / 2 or len(samples) < 3 and min(samples) < block_s) and len(samples) < 1000:
        samples.append(timed(fn))  # at least 3 calls unless one fills a block: a stray slow call is common
    return max(1, min(MAX_CALLS_PER_BLOCK, round(block_s / min(samples))))


def run_peer_row(row, sizes, args):
    """Checks every implementation's output against the float64 reference (its
    warm-up call): one that fails is reported and not timed. Then interleaved
    rounds of blocks, as time_interleaved does, each block about peer_block_s long."""
    bench = row.build(row.names)
    tolerance = TOLERANCE[np.dtype(np.float32)] * max(1.0, float(np.abs(bench.reference).max()))
    impls, timed_impls = {}, {}
    for name, fn in bench.impls.items():
        output = np.asarray(fn())
        fits = output.shape == bench.reference.shape and output.dtype == np.float32
        diff = float(np.abs(output.astype(np.float64) - bench.reference).max()) if fits else None
        passed = fits and diff <= tolerance  # a NaN fails
        impls[name] = {"check": "pass" if passed else "FAIL", "max_abs_diff": diff, "ops": getattr(fn, "ops", None),
                       "median_s": None, "samples_s": [], "calls_per_sample": None, "gflops": None}
        if passed:
            timed_impls[name] = fn
        else:
            print(f"  {name} FAILS its check, not timed: " + (f"max abs diff {diff:.3g} > {tolerance:.3g}" if fits
                  else f"output {output.shape} {output.dtype}, expected {bench.reference.shape} float32"), flush=True)
    calls = {name: calls_per_block(fn, sizes["peer_block_s"]) for name, fn in timed_impls.items()}
    samples = time_interleaved(timed_impls, args.repeats, calls)
    for name in timed_impls:
        median = statistics.median(samples[name])
        impls[name].update(median_s=median, samples_s=samples[name], calls_per_sample=calls[name],
                           gflops=bench.flops / median / 1e9)
    times = {name: impls[name]["median_s"] for name in timed_impls}
    torch_times = {name: t for name, t in times.items() if name.startswith("torch")}
    peer_times = {name: t for name, t in times.items() if name not in (ATTNC, ATTNC_FROZEN)}
    fastest = min(peer_times, key=peer_times.get) if peer_times else None
    ratio = times[ATTNC] / peer_times[fastest] if fastest and ATTNC in times else None
    return {
        "key": row.key, "case": row.case, "title": row.title, "dtype": "float32", "shape": bench.shape,
        "flops": bench.flops, "tolerance": tolerance, "impls": impls, "skipped": bench.skipped,
        "torch_best": min(torch_times, key=torch_times.get) if torch_times else None, "fastest_peer": fastest,
        "attnc_over_fastest_peer": ratio,
        # a MISS too when attnc failed its check; None (no verdict) when no peer was timed
        "target": PEER_TARGET, "pass": None if fastest is None and ATTNC in times else ratio is not None and ratio <= 1.0,
        "frozen_over_fastest_peer": times[ATTNC_FROZEN] / peer_times[fastest]
        if fastest and ATTNC_FROZEN in times else None,
    }


def reference_gemm(size, dtype, threads, repeats=3):
    """NumPy's GEMM GFLOP/s on a size^3 matmul, with OpenBLAS pinned to `threads`."""
    rng = np.random.default_rng(0)
    a, b = random_array(rng, (size, size), dtype), random_array(rng, (size, size), dtype)
    with threadpoolctl.threadpool_limits(limits=threads, user_api="blas"):
        a @ b
        seconds = statistics.median(timed(lambda: a @ b) for _ in range(repeats))
    return 2 * size**3 / seconds / 1e9


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def reference_gemms(size):
    if threadpoolctl is None:
        return {}
    return {f"numpy {dtype} gemm {size}^3, {threads} thread(s)": reference_gemm(size, dtype, threads)
            for dtype, threads in (("float32", 1), ("float32", THREADS), ("float64", THREADS))}


# ----------------------------------------------------------------------------
# Environment and outputs.

def pin_threads():
    """attnc and NumPy's OpenBLAS to THREADS (torch: in _torch); the BLAS limit holds until restored."""
    attnc.set_num_threads(THREADS)
    if threadpoolctl is None:
        print("threadpoolctl is not installed: NumPy's OpenBLAS keeps its default thread count", flush=True)
    else:
        threadpoolctl.threadpool_limits(limits=THREADS, user_api="blas")


def extension_built_time():
    """When the loaded attnc extension file was built (a rebuild during a run shows in the results)."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(os.path.getmtime(attnc._C.__file__)))


def environment(args, sizes):
    libraries = threadpoolctl.threadpool_info() if threadpoolctl is not None else []
    openblas = [lib for lib in libraries if lib.get("internal_api") == "openblas"]
    return {
        "mode": "quick" if args.quick else "full", "threads": THREADS, "repeats": args.repeats,
        "python": platform.python_version(), "numpy": np.__version__, "torch": _torch().__version__,
        "attnc": attnc.__version__,
        "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "peak_gflops_fp32": args.peak_gflops, "peak_gflops_fp64": args.peak_gflops_fp64,
        "peak_source": args.peak_source,
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
        "OPENBLAS_L2_SIZE": os.environ.get("OPENBLAS_L2_SIZE"),
        "threadpoolctl": threadpoolctl is not None,
        "openblas_core": [lib.get("architecture") for lib in openblas],
        "threadpools": [{key: lib.get(key) for key in ("internal_api", "architecture", "num_threads", "version")}
                        | {"library": os.path.basename(lib.get("filepath", ""))} for lib in libraries],
        "timing": "median of interleaved rounds; each timed call follows a 0.25 s idle pause and one untimed call "
                  "of the same implementation",
        "memory": "peak RSS delta of one warm call (output included) in a fresh subprocess per implementation, "
                  "VmHWM reset via /proc/self/clear_refs" + ("; quick mode: case 3 only" if args.quick else ""),
        "peer_versions": {package: package_version(package) for package in ("onnxruntime", "onnx", "openvino")},
        "peer_settings": PEER_SETTINGS,
        "peer_timing": "cases 7 and 8: median of interleaved rounds; each sample is a block of back-to-back calls "
                       f"(about {sizes['peer_block_s']:g} s, at least one call) that follows a {SETTLE_S:g} s idle "
                       "pause and one untimed call of the same implementation; outputs checked against a float64 "
                       "NumPy reference before timing",
    }


def package_version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def fmt_ms(seconds):
    return f"{seconds * 1e3:.3f}" if seconds < 0.01 else f"{seconds * 1e3:.1f}"


def fmt_mib(nbytes):
    return "-" if nbytes is None else f"{nbytes / MIB:.1f}"


def fmt_opt(value, spec):
    return "-" if value is None else format(value, spec)


def latency_cell(impl):
    return f"{impl['median_s'] * 1e6:.2f} us"


def time_cell(row, name):
    impl = row["impls"][name]
    return latency_cell(impl) if row["flops"] is None else f"{fmt_ms(impl['median_s'])} ms"


def markdown(env, gemms, results, peer_results=()):
    libraries = "attnc, torch, NumPy's OpenBLAS, ONNX Runtime and OpenVINO" if peer_results else \
        "attnc, torch and NumPy's OpenBLAS"
    lines = [f"# attnc benchmark ({env['mode']} run)", "",
             f"{env['threads']} threads for {libraries}; float32 unless said; eval mode; "
             f"{env['timing']}. Peak for '% peak': {env['peak_source']}. "
             f"Load average (1 min) at the start: {env['load_average_1min']:.2f}, at the end: "
             f"{env['load_average_1min_end']:.2f} (busy processes on the {env['cpus']} CPUs disturb timings).",
             "",
             f"numpy {env['numpy']}, torch {env['torch']}, attnc {env['attnc']}, python {env['python']}; "
             f"OpenBLAS core: {', '.join(map(str, env['openblas_core'])) or 'unknown (no threadpoolctl)'}; "
             f"OPENBLAS_CORETYPE={env['OPENBLAS_CORETYPE']}, OPENBLAS_L2_SIZE={env['OPENBLAS_L2_SIZE']}.", ""]
    if gemms:
        lines += ["Reference: " + "; ".join(f"{name}: {value:.1f} GFLOP/s" for name, value in gemms.items()) + ".", ""]
    if results:
        lines += markdown_cases(env, results)
    if peer_results:
        lines += markdown_peers(env, peer_results)
    return "\n".join(lines)


def markdown_cases(env, results):
    lines = ["| case | shape | attnc | torch best | numpy | attnc/torch-best | attnc/numpy | attnc GFLOP/s "
              "| % peak | attnc peak RSS delta MiB | target | result |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in results:
        attnc_impl = row["impls"][ATTNC]
        percent = None if attnc_impl["fraction_of_peak"] is None else 100 * attnc_impl["fraction_of_peak"]
        lines.append(
            f"| {row['key']} {row['title']} | {row['shape']}, {row['dtype']} | {time_cell(row, ATTNC)} "
            f"| {time_cell(row, row['torch_best'])} ({row['torch_best']}) | {time_cell(row, NUMPY)} "
            f"| {row['attnc_over_torch_best']:.2f} | {row['attnc_over_numpy']:.2f} "
            f"| {fmt_opt(attnc_impl['gflops'], '.1f')} | {fmt_opt(percent, '.0f')} "
            f"| {fmt_mib(attnc_impl['peak_rss_delta_bytes'])} | {row['target']} "
            f"| {'PASS' if row['pass'] else 'MISS'} |")
    lines += ["", "## Every implementation", "",
              "| case | implementation | time | GFLOP/s | % peak | peak RSS delta MiB | max abs diff vs numpy |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in results:
        for name, impl in row["impls"].items():
            percent = None if impl["fraction_of_peak"] is None else 100 * impl["fraction_of_peak"]
            lines.append(f"| {row['key']} | {name} | {time_cell(row, name)} | {fmt_opt(impl['gflops'], '.1f')} "
                         f"| {fmt_opt(percent, '.0f')} | {fmt_mib(impl['peak_rss_delta_bytes'])} "
                         f"| {impl['max_abs_diff']:.2e} |")
    lines += ["", "Sizes (MiB): " + "; ".join(
        f"case {row['key']}: inputs {fmt_mib(row['input_bytes'])}, output {fmt_mib(row['output_bytes'])}"
        for row in results), "", f"Memory: {env['memory']}.", ""]
    return lines


PEER_COLUMNS = (("torch", lambda name: name.startswith("torch")), ("ONNX Runtime", lambda name: name == ORT),
                ("OpenVINO", lambda name: name == OPENVINO), ("NumPy", lambda name: name == NUMPY))


def peer_cell(row, matches):
    """A library's time in a row of cases 7 and 8: its fastest variant that passed its check,
    else why it has none."""
    names = [name for name in (*row["impls"], *row["skipped"]) if matches(name)]
    timed = [name for name in names if name in row["impls"] and row["impls"][name]["median_s"] is not None]
    if timed:
        best = min(timed, key=lambda name: row["impls"][name]["median_s"])
        variant = f" ({best})" if len(names) > 1 else ""
        return f"{fmt_ms(row['impls'][best]['median_s'])} ms{variant}"
    if not names:
        return "-"
    name = names[0]
    if name in row["skipped"]:
        return row["skipped"][name]
    return f"fails check (max abs diff {fmt_opt(row['impls'][name]['max_abs_diff'], '.2e')})"


def markdown_peers(env, peer_results):
    def settings(name):
        used = env.get("peer_settings", {}).get(name)
        return ", ".join(f"{key}={value}" for key, value in used.items() if key not in ("version", "onnx")) \
            if used else "not run"

    versions = env["peer_versions"]
    lines = ["## attnc against torch, ONNX Runtime, OpenVINO and NumPy (cases 7 and 8)", "",
             f"{env['peer_timing']}; tolerance: 1e-4 x max(1, max|reference|). "
             f"onnxruntime {versions['onnxruntime']} (onnx {versions['onnx']}): {settings(ORT)}. "
             f"openvino {versions['openvino']}: {settings(OPENVINO)}.", "",
             "| case | shape | attnc | attnc frozen | " + " | ".join(title for title, _ in PEER_COLUMNS)
             + f" | fastest peer | attnc / fastest peer | attnc frozen / fastest peer | {PEER_TARGET} |",
             "| --- | --- | --- | --- | " + " | ".join("---" for _ in PEER_COLUMNS) + " | --- | --- | --- | --- |"]
    for row in peer_results:
        ratio, frozen_ratio = row["attnc_over_fastest_peer"], row.get("frozen_over_fastest_peer")
        lines.append(f"| {row['key']} {row['title']} | {row['shape']}, {row['dtype']} "
                     f"| {peer_cell(row, lambda name: name == ATTNC)} "
                     f"| {peer_cell(row, lambda name: name == ATTNC_FROZEN)} | "
                     + " | ".join(peer_cell(row, matches) for _, matches in PEER_COLUMNS)
                     + f" | {row['fastest_peer'] or '-'} | {fmt_opt(ratio, '.2f')} | {fmt_opt(frozen_ratio, '.2f')} "
                     f"| {peer_verdict(row)} |")
    lines += ["", "### Every implementation (cases 7 and 8)", "",
              "| case | implementation | ms per call | calls per block | GFLOP/s | max abs diff vs float64 | check |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    operators = {}
    for row in peer_results:
        for name, impl in row["impls"].items():
            median = impl["median_s"]
            lines.append(f"| {row['key']} | {name} | {'-' if median is None else fmt_ms(median)} "
                         f"| {impl['calls_per_sample'] or '-'} | {fmt_opt(impl['gflops'], '.1f')} "
                         f"| {fmt_opt(impl['max_abs_diff'], '.2e')} | {impl['check']} |")
            if impl["ops"]:
                operators.setdefault((name, impl["ops"]), []).append(row["key"])
        for name, why in row["skipped"].items():
            lines.append(f"| {row['key']} | {name} | - | - | - | - | {why} |")
    lines += ["", "Operators run:", ""]
    lines += [f"- {name}, cases {', '.join(keys)}: {ops}" for (name, ops), keys in operators.items()]
    return lines + [""]




def plot(sweep, path):
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, times in sweep["median_s"].items():
        axes.plot(sweep["seq"], [t * 1e3 for t in times], marker="o", label=name)
    axes.set_xscale("log", base=2)
    axes.set(yscale="log", xlabel="sequence length L", ylabel="median time per call (ms)",
             title=f"SDPA core, {sweep['shape']}, {THREADS} threads")
    axes.set_xticks(sweep["seq"], [str(length) for length in sweep["seq"]], minor=False)
    axes.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def print_row(row):
    times = ", ".join(f"{name} {time_cell(row, name)}" for name in row["impls"])
    diffs = ", ".join(f"{name} {impl['max_abs_diff']:.1e}" for name, impl in row["impls"].items())
    print(f"  {times}\n  max abs diff vs numpy: {diffs}\n  attnc/torch-best {row['attnc_over_torch_best']:.2f}, "
          f"attnc/numpy {row['attnc_over_numpy']:.2f}: {'PASS' if row['pass'] else 'MISS'} ({row['target']})",
          flush=True)


def peer_verdict(row):
    """PASS or MISS of a case 7 or 8 row (PEER_TARGET); results stored before the target
    had none: '-'."""
    return {True: "PASS", False: "MISS"}.get(row.get("pass"), "-")


def print_peer_row(row):
    cells = [f"{name} " + ("-" if impl["median_s"] is None else f"{fmt_ms(impl['median_s'])} ms")
             for name, impl in row["impls"].items()]
    diffs = ", ".join(f"{name} {fmt_opt(impl['max_abs_diff'], '.1e')} ({impl['check']})"
                      for name, impl in row["impls"].items())
    skipped = "".join(f"\n  {name}: {why}" for name, why in row["skipped"].items())
    ratio, frozen_ratio = row["attnc_over_fastest_peer"], row.get("frozen_over_fastest_peer")
    frozen = f", attnc frozen / fastest peer: {fmt_opt(frozen_ratio, '.2f')}" if frozen_ratio is not None else ""
    print(f"  {row['shape']}: {', '.join(cells)}\n  max abs diff vs float64: {diffs}{skipped}\n"
          f"  attnc / fastest peer ({row['fastest_peer']}): {fmt_opt(ratio, '.2f')}{frozen}: {peer_verdict(row)}",
          flush=True)


# ----------------------------------------------------------------------------

def parse_args(argv):
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes and few repeats (cases 7, 8 and 9 keep their sizes: a few minutes)")
    parser.add_argument("--cases", default="1,2,3,4,5,6,7,8,9",
                        help="comma-separated case numbers (default: all); 7: MultiHeadAttention sweep and 8: SDPA "
                             "sweep with decode steps, against torch, ONNX Runtime, OpenVINO and NumPy; 9: float16 and "
                             "bfloat16 (bench_low_precision.py)")
    parser.add_argument("--repeats", type=int, help="timed rounds per case (default: 5, quick: 3)")
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)), help="output directory")
    parser.add_argument("--peak-gflops", type=float,
                        help="fp32 peak for %% of peak (fp64: half; default: NumPy's GEMM rate measured in the run)")
    parser.add_argument("--memory-child", nargs=2, metavar=("ROW", "IMPL"),
                        help="internal: measure one implementation's peak memory (run in a subprocess)")
    args = parser.parse_args(argv)
    sizes = SIZES["quick" if args.quick else "full"]
    args.repeats = args.repeats or sizes["repeats"]
    args.cases = {int(case) for case in args.cases.split(",")}
    return args, sizes


def main(argv=None):
    args, sizes = parse_args(argv)
    pin_threads()
    all_rows = rows(sizes)
    if args.memory_child:
        key, name = args.memory_child
        return memory_child(next(row for row in all_rows if row.key == key), name)
    started, load_at_start, built = time.perf_counter(), os.getloadavg()[0], extension_built_time()
    if load_at_start > 0.5:
        print(f"warning: load average {load_at_start:.2f}: other processes will disturb the timings", flush=True)
    gemms = reference_gemms(sizes["gemm"])
    set_peaks(args, gemms)
    for name, value in gemms.items():
        print(f"reference: {name}: {value:.1f} GFLOP/s", flush=True)
    results = []
    for row in (row for row in all_rows if row.case in args.cases):
        print(f"case {row.key}: {row.title}", flush=True)
        results.append(run_row(row, sizes, args))
        print_row(results[-1])
    sweep = run_sweep(sizes) if 2 in args.cases else None
    peer_results = []
    for row in (row for row in peer_rows() if row.case in args.cases):
        print(f"case {row.key}: {row.title}", flush=True)
        peer_results.append(run_peer_row(row, sizes, args))
        print_peer_row(peer_results[-1])
    low_precision = None
    if 9 in args.cases:
        print("case 9: float16 and bfloat16 against float32", flush=True)
        import bench_low_precision  # noqa: E402 (only case 9 needs ml_dtypes)
        low_precision = bench_low_precision.run(args.repeats)
    env = environment(args, sizes) | {"attnc_extension_built": built, "load_average_1min": load_at_start,
                               "load_average_1min_end": os.getloadavg()[0],
                               "wall_seconds": time.perf_counter() - started}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as out:
        json.dump({"environment": env, "reference_gemm_gflops": gemms, "cases": results, "sweep": sweep,
                   "peer_cases": peer_results,
                   "low_precision": low_precision and {"results": low_precision[0], "targets": low_precision[2]}},
                  out, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as out:
        out.write(markdown(env, gemms, results, peer_results))
        if low_precision:
            out.write("\n".join(["", "## float16 and bfloat16 against float32 (case 9)", "", *low_precision[1], ""]))
    if sweep:
        plot(sweep, os.path.join(args.out, "plot.png"))
    print(f"wrote {args.out}/results.json, results.md" + (", plot.png" if sweep else "")
          + f" in {env['wall_seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
