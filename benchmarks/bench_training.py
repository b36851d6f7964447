"""attnc's training against PyTorch autograd, side by side in one process.

Cases and their targets (benchmarks, never pass/fail tests):
  T1  SDPA forward + backward, q, k, v (8, 12, 1024, 64) float32, plain and
      causal: attnc (return_lse, then scaled_dot_product_attention_backward)
      against torch (F.scaled_dot_product_attention, then .backward()).
      Target: attnc <= 0.8x torch.
  T2  One training step of MultiHeadAttention(768, 12), dropout 0.1, on x
      (8, 512, 768) and (4, 128, 768) float32: forward, backward, AdamW
      step. torch runs the document's module and the fastest torch form of
      the same model (one fused QKV F.linear, F.scaled_dot_product_attention
      with dropout, F.linear), each with torch.optim.AdamW. Target: attnc <=
      0.8x the faster torch.
  T3  SDPA backward peak extra memory on (1, 8, 8192, 64) float32, in a fresh
      subprocess: RSS growth of one warm backward call beyond its three
      gradients. Target: <= 64 MiB (O(L + S), never (L, S)).
Every implementation's gradients are checked against the other's before
timing (float32 within 1e-4 of scale); each sample is a block of
back-to-back calls (at least 0.1 s) after a pause and one untimed call,
blocks alternate.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_training.py [--quick] [--out DIR]
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys

import numpy as np

import attnc
from attnc import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import MALLOC_ENV, MIB, THREADS, calls_per_block, peak_rss_delta, time_interleaved  # noqa: E402

SIZES = {
    "full": dict(sdpa=(8, 12, 1024, 64), mha=[(8, 512, 768, 12), (4, 128, 768, 12)], memory=(1, 8, 8192, 64),
                 rounds=5),
    "quick": dict(sdpa=(2, 4, 256, 64), mha=[(2, 128, 256, 4)], memory=(1, 2, 2048, 64), rounds=3),
}
TOLERANCE = 1e-4
BLOCK_S = 0.1  # each timed sample: back-to-back calls filling this long (one call of a longer step)


def _torch():
    import torch
    torch.set_num_threads(THREADS)
    return torch


def check_close(name, got, expected):
    for g, e in zip(got, expected):
        scale = max(1.0, float(np.abs(e).max()))
        error = float(np.abs(np.asarray(g, np.float64) - e).max()) / scale
        assert error <= TOLERANCE, f"{name}: gradients differ by {error:.3g} of scale"


# ----------------------------------------------------------------------------
# T1: SDPA forward + backward

def sdpa_inputs(size):
    rng = np.random.default_rng(11)
    q, k, v, grad = (rng.standard_normal(size, dtype=np.float32) for _ in range(4))
    return q, k, v, grad


def attnc_sdpa_step(q, k, v, grad, causal):
    def step():
        out, lse = F.scaled_dot_product_attention(q, k, v, is_causal=causal, return_lse=True)
        return F.scaled_dot_product_attention_backward(grad, q, k, v, out, lse, is_causal=causal)
    return step


def torch_sdpa_step(q, k, v, grad, causal):
    torch = _torch()
    tq, tk, tv = (torch.from_numpy(a.copy()).requires_grad_() for a in (q, k, v))
    tgrad = torch.from_numpy(grad)

    def step():
        for t in (tq, tk, tv):
            t.grad = None
        torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).backward(tgrad)
        return tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()
    return step


def run_sdpa(size, causal, rounds):
    inputs = sdpa_inputs(size)
    impls = {"attnc": attnc_sdpa_step(*inputs, causal), "torch": torch_sdpa_step(*inputs, causal)}
    check_close("SDPA backward", impls["attnc"](), [np.asarray(g, np.float64) for g in impls["torch"]()])
    return impls, rounds


# ----------------------------------------------------------------------------
# T2: a MultiHeadAttention training step

def mha_setup(size):
    B, T, C, heads = size
    rng = np.random.default_rng(12)
    x = rng.standard_normal((B, T, C), dtype=np.float32)
    grad = rng.standard_normal((B, T, C), dtype=np.float32) / math.sqrt(B * T * C)
    module = attnc.MultiHeadAttention(C, heads, 0.1, rng=np.random.default_rng(13))
    return x, grad, module


def attnc_mha_step(x, grad, module):
    optimizer = attnc.optim.AdamW(module, lr=1e-4)

    def step():
        optimizer.zero_grad()
        module(x)
        grad_x = module.backward(grad)
        optimizer.step()
        return grad_x
    return step


def torch_doc_mha_step(x, grad, module):
    """The document's MuitiHeadAttention (torch.nn layers, dropout on the weights)."""
    torch = _torch()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    import doc_models
    heads = module.head_num
    tm = doc_models.MuitiHeadAttention(module.hidden_dim, heads, 0.1)
    tm.load_state_dict({key: torch.from_numpy(value.copy()) for key, value in module.state_dict().items()})
    optimizer = torch.optim.AdamW(tm.parameters(), lr=1e-4)
    tx, tgrad = torch.from_numpy(x).requires_grad_(), torch.from_numpy(grad)

    def step():
        optimizer.zero_grad()
        tx.grad = None
        tm(tx).backward(tgrad)
        optimizer.step()
        return tx.grad.numpy()
    return step


def torch_fused_mha_step(x, grad, module):
    """The same model in torch's fastest form: one fused QKV projection,
    F.scaled_dot_product_attention (dropout 0.1 on the weights), F.linear."""
    torch = _torch()
    nnf = torch.nn.functional
    sd = {key: torch.from_numpy(value.copy()) for key, value in module.state_dict().items()}
    w_qkv = torch.cat([sd[f"{n}.weight"] for n in ("query_linear", "key_linear", "value_linear")]).requires_grad_()
    b_qkv = torch.cat([sd[f"{n}.bias"] for n in ("query_linear", "key_linear", "value_linear")]).requires_grad_()
    w_out, b_out = sd["output_linear.weight"].requires_grad_(), sd["output_linear.bias"].requires_grad_()
    optimizer = torch.optim.AdamW([w_qkv, b_qkv, w_out, b_out], lr=1e-4)
    tx, tgrad = torch.from_numpy(x).requires_grad_(), torch.from_numpy(grad)
    B, T, C = x.shape
    heads = module.head_num

    def step():
        optimizer.zero_grad()
        tx.grad = None
        q, k, v = nnf.linear(tx, w_qkv, b_qkv).view(B, T, 3, heads, C // heads).permute(2, 0, 3, 1, 4)
        merged = nnf.scaled_dot_product_attention(q, k, v, dropout_p=0.1).transpose(1, 2).reshape(B, T, C)
        nnf.linear(merged, w_out, b_out).backward(tgrad)
        optimizer.step()
        return tx.grad.numpy()
    return step


def check_mha_gradients(size):
    """With dropout 0, attnc's module gradients equal torch's (the timed steps
    drop out different weights, so they are checked without dropout)."""
    x, grad, module = mha_setup(size)
    module.dropout.p = 0.0
    torch = _torch()
    module(x)
    grad_x = module.backward(grad)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    import doc_models
    tm = doc_models.MuitiHeadAttention(module.hidden_dim, module.head_num, 0.0)
    tm.load_state_dict({key: torch.from_numpy(value.copy()) for key, value in module.state_dict().items()})
    tx = torch.from_numpy(x).requires_grad_()
    tm(tx).backward(torch.from_numpy(grad))
    grads = dict(tm.named_parameters())
    check_close("MultiHeadAttention backward", [grad_x] + [g for _, g in module.named_grads()],
                [tx.grad.double().numpy()] + [grads[n].grad.double().numpy() for n, _ in module.named_grads()])


def run_mha(size, rounds):
    check_mha_gradients(size)
    inputs = mha_setup(size)
    impls = {"attnc": attnc_mha_step(*inputs), "torch document module": torch_doc_mha_step(*mha_setup(size)),
             "torch F.linear + SDPA": torch_fused_mha_step(*mha_setup(size))}
    return impls, rounds


# ----------------------------------------------------------------------------
# T3: backward peak memory, in a fresh subprocess

def memory_child(size):
    q, k, v, grad = sdpa_inputs(size)
    out, lse = F.scaled_dot_product_attention(q, k, v, return_lse=True)
    delta, grads_bytes = peak_rss_delta(lambda: F.scaled_dot_product_attention_backward(grad, q, k, v, out, lse))
    print(json.dumps({"peak_rss_delta_bytes": delta, "gradient_bytes": grads_bytes}))


def measure_memory(size):
    command = [sys.executable, os.path.abspath(__file__), "--memory-child", ",".join(map(str, size))]
    done = subprocess.run(command, env={**os.environ, **MALLOC_ENV}, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    extra = result["peak_rss_delta_bytes"] - result["gradient_bytes"]
    return extra, result


# ----------------------------------------------------------------------------

def time_in_blocks(impls, rounds):
    """time_interleaved's samples, each a block of back-to-back calls filling BLOCK_S."""
    return time_interleaved(impls, rounds, {name: calls_per_block(fn, BLOCK_S) for name, fn in impls.items()})


def report(title, samples, baseline_names):
    medians = {name: statistics.median(times) for name, times in samples.items()}
    best_torch = min(medians[name] for name in baseline_names)
    lines = [f"{title}"]
    for name, median in medians.items():
        lines.append(f"  {name:24s} {median * 1e3:9.2f} ms")
    ratio = medians["attnc"] / best_torch
    lines.append(f"  attnc / fastest torch: {ratio:.2f} (target <= 0.8: {'met' if ratio <= 0.8 else 'missed'})")
    print("\n".join(lines), flush=True)
    return {"median_ms": {n: m * 1e3 for n, m in medians.items()}, "attnc_over_torch": ratio}


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and fewer rounds (a minute or two)")
    parser.add_argument("--memory-child", metavar="B,H,L,E",
                        help="internal: measure one backward's peak memory (run in a subprocess)")
    parser.add_argument("--out", metavar="DIR",
                        help="write results_training.json into DIR, as bench.py writes its results "
                             "(default: print only)")
    args = parser.parse_args()
    attnc.set_num_threads(THREADS)
    if args.memory_child:
        memory_child(tuple(int(n) for n in args.memory_child.split(",")))
        return
    if args.out:
        os.makedirs(args.out, exist_ok=True)  # before the runs: a missing one had raised after them
    sizes = SIZES["quick" if args.quick else "full"]
    results = {"machine": os.uname().machine, "threads": THREADS}
    for causal in (False, True):
        impls, rounds = run_sdpa(sizes["sdpa"], causal, sizes["rounds"])
        title = f"T1 SDPA forward + backward {sizes['sdpa']}" + (", causal" if causal else "")
        results[title] = report(title, time_in_blocks(impls, rounds), ["torch"])
    for size in sizes["mha"]:
        impls, rounds = run_mha(size, sizes["rounds"])
        title = f"T2 MultiHeadAttention training step x {size[:3]}, {size[3]} heads"
        results[title] = report(title, time_in_blocks(impls, rounds), [n for n in impls if n != "attnc"])
    extra, raw = measure_memory(sizes["memory"])
    print(f"T3 SDPA backward {sizes['memory']}: peak RSS beyond the gradients {extra / MIB:.1f} MiB "
          f"(target <= 64 MiB: {'met' if extra <= 64 * MIB else 'missed'})", flush=True)
    results["T3 backward extra memory MiB"] = extra / MIB
    if args.out:
        with open(os.path.join(args.out, "results_training.json"), "w") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    main()
