"""float16 and bfloat16 against float32: attnc, torch, ONNX Runtime (float16) and
OpenVINO (bfloat16), side by side in one run (benchmarks, not tests).

Cases and their targets:
  S1  SDPA q, k, v (8, 12, 1024, 64). Targets: attnc bfloat16 <= 0.6x attnc's float32
      time and <= OpenVINO's bfloat16 time; attnc float16 <= 0.75x attnc's float32 time.
  S2  SDPA (2, 4, 256, 64): a short sequence, where fixed costs show.
  D1  decode: q (1, 32, 1, 128) against a bottom-right causal cache k, v (1, 32, 8192, 128).
      Target: attnc with bfloat16 K/V <= 0.6x attnc's float32 decode time.
  D2  the same with grouped-query attention, 8 key/value heads.
Every implementation's output is checked against a float64 oracle computed from the same
rounded inputs before it is timed. Timing: blocks of back-to-back calls after a warm-up
call and a pause, the implementations alternating block by block (bench.time_interleaved);
each figure is the median block. Each library runs on THREADS threads.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_low_precision.py [--out DIR]

bench.py runs the same cases as its case 9 (their table goes into results.md).
"""
import argparse
import json
import os
import platform
import statistics
import sys

import ml_dtypes
import numpy as np

import attnc
from attnc import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import THREADS, _optional, time_interleaved  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
NAMES = {F32: "float32", F16: "float16", BF16: "bfloat16"}
# checked against the float64 oracle: max |error| <= this * max(1, max |oracle|)
CHECK = {F32: 1e-4, F16: 4e-3, BF16: 3e-2}
CASES = {  # name: (q shape, k/v shape, bottom-right causal)
    "S1 SDPA (8, 12, 1024, 64)": ((8, 12, 1024, 64), (8, 12, 1024, 64), False),
    "S2 SDPA (2, 4, 256, 64)": ((2, 4, 256, 64), (2, 4, 256, 64), False),
    "D1 decode q (1, 32, 1, 128), k, v (1, 32, 8192, 128)": ((1, 32, 1, 128), (1, 32, 8192, 128), True),
    "D2 decode GQA, k, v (1, 8, 8192, 128)": ((1, 32, 1, 128), (1, 8, 8192, 128), True),
}


def oracle(q, k, v, causal):
    q, k, v = (np.asarray(a).astype(np.float64) for a in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    L, S = s.shape[-2:]
    if causal:  # bottom-right
        s = np.where(np.arange(S)[None, :] <= np.arange(L)[:, None] + S - L, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def attnc_impl(q, k, v, causal):
    gqa = q.shape[1] != k.shape[1]
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, causal_alignment="bottom_right",
                                                  enable_gqa=gqa)


def torch_impl(q, k, v, causal, dtype):
    import torch
    tq, tk, tv = (torch.from_numpy(np.asarray(a).astype(np.float32)).to(dtype) for a in (q, k, v))
    gqa = q.shape[1] != k.shape[1]
    L, S = q.shape[2], k.shape[2]
    mask = torch.ones(L, S, dtype=torch.bool).tril(S - L) if causal and L > 1 else None
    return lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask,
                                                                    enable_gqa=gqa).float().numpy()


def ort_float16_impl(q, k, v, causal):
    """com.microsoft MultiHeadAttention on float16 (B, L, H*E) queries and BNSH keys and
    values, as bench.ort_sdpa builds it in float32; None when ORT lacks it."""
    onnx, ort = _optional("onnx"), _optional("onnxruntime")
    if onnx is None or ort is None or q.shape[1] != k.shape[1] or causal:
        return None
    helper, f16 = onnx.helper, onnx.TensorProto.FLOAT16
    B, H, L, E = q.shape
    inputs = {name: np.asarray(a).astype(np.float16) for name, a in zip("qkv", (q, k, v))}
    nodes = [helper.make_node("Transpose", ["q"], ["q_bsnh"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["q_bsnh", "bsd"], ["q_bsd"]),
             helper.make_node("MultiHeadAttention", ["q_bsd", "k", "v"], ["out_bsd"], domain="com.microsoft",
                              num_heads=H),
             helper.make_node("Reshape", ["out_bsd", "bsnh"], ["out_bsnh"]),
             helper.make_node("Transpose", ["out_bsnh"], ["out"], perm=[0, 2, 1, 3])]
    shapes = {"bsd": np.array([B, L, H * E], np.int64), "bsnh": np.array([B, L, H, E], np.int64)}
    graph = helper.make_graph(
        nodes, "sdpa16", [helper.make_tensor_value_info(key, f16, list(a.shape)) for key, a in inputs.items()],
        [helper.make_tensor_value_info("out", f16, list(q.shape))],
        [onnx.numpy_helper.from_array(value, key) for key, value in shapes.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        session.run(None, inputs)
    except Exception as error:  # noqa: BLE001 (a refusal is reported, not fatal)
        print(f"  onnxruntime float16 MultiHeadAttention refused: {str(error).splitlines()[0][:160]}")
        return None
    return lambda: session.run(None, inputs)[0]


def openvino_bfloat16_impl(q, k, v, causal):
    """opset13 ScaledDotProductAttention on float32 parameters compiled with inference
    precision bf16 (OpenVINO's 16-bit mode; it reports the precision it kept)."""
    ov = _optional("openvino")
    if ov is None or q.shape[1] != k.shape[1] or causal:
        return None, None
    ops = ov.opset13
    arrays = [np.asarray(a).astype(np.float32) for a in (q, k, v)]
    params = [ops.parameter(list(a.shape), np.float32, name=name) for name, a in zip("qkv", arrays)]
    out = ops.scaled_dot_product_attention(*params, causal=False)
    config = {"INFERENCE_NUM_THREADS": str(THREADS), "NUM_STREAMS": "1", "INFERENCE_PRECISION_HINT": "bf16",
              "PERFORMANCE_HINT": "LATENCY"}
    compiled = ov.Core().compile_model(ov.Model([out], params, "sdpa_bf16"), "CPU", config)
    precision = compiled.get_property("INFERENCE_PRECISION_HINT")
    request = compiled.create_infer_request()
    feeds = dict(enumerate(arrays))
    return (lambda: request.infer(feeds, share_inputs=True, share_outputs=False)[0]), str(precision)


def case_impls(q32, k32, v32, causal):
    """name -> (dtype of the inputs it is given, callable)."""
    import torch
    impls, notes = {}, {}
    rounded = {dt: [a.astype(dt) for a in (q32, k32, v32)] for dt in (F32, F16, BF16)}
    for dt in (F32, F16, BF16):
        impls[f"attnc {NAMES[dt]}"] = (dt, attnc_impl(*rounded[dt], causal))
    for dt, tdt in ((F32, torch.float32), (BF16, torch.bfloat16), (F16, torch.float16)):
        impls[f"torch {NAMES[dt]}"] = (dt, torch_impl(*rounded[dt], causal, tdt))
    ort16 = ort_float16_impl(*rounded[F16], causal)
    if ort16 is not None:
        impls["onnxruntime float16"] = (F16, ort16)
    ov16, precision = openvino_bfloat16_impl(*rounded[BF16], causal)
    if ov16 is not None:
        impls["openvino bfloat16"] = (BF16, ov16)
        notes["openvino bfloat16"] = f"inference precision kept: {precision}"
    return impls, rounded, notes


def run_case(name, rounds):
    q_shape, kv_shape, causal = CASES[name]
    rng = np.random.default_rng(len(name))
    q, k, v = (rng.standard_normal(shape, dtype=np.float32) for shape in (q_shape, kv_shape, kv_shape))
    impls, rounded, notes = case_impls(q, k, v, causal)
    references = {dt: oracle(*rounded[dt], causal) for dt in rounded}
    for label, (dt, fn) in impls.items():  # correctness first: each against the oracle of its own inputs
        out = np.asarray(fn()).astype(np.float64)
        error = float(np.abs(out - references[dt]).max())
        bound = CHECK[dt] * max(1.0, float(np.abs(references[dt]).max()))
        assert error <= bound, f"{name}: {label} differs from the float64 oracle by {error:.3g} > {bound:.3g}"
    one = time_interleaved({label: fn for label, (_, fn) in impls.items()}, 1)  # a first guess of each call's time
    calls = {label: max(1, min(200, int(0.25 / max(samples[0], 1e-6)))) for label, samples in one.items()}
    samples = time_interleaved({label: fn for label, (_, fn) in impls.items()}, rounds, calls)
    return {label: statistics.median(times) * 1e3 for label, times in samples.items()}, notes


def run(rounds):
    """Every case, then the targets: (results, markdown lines, {target: ratio})."""
    results, lines = {}, []
    lines.append(f"machine: {platform.processor() or platform.machine()}, {THREADS} threads, "
                 f"attnc kernel level {attnc._C.simd_level()}")
    lines.append("")
    lines.append("| case | implementation | ms (median block) | / attnc float32 |")
    lines.append("| --- | --- | --- | --- |")
    for name in CASES:
        times, notes = run_case(name, rounds)
        results[name] = {"ms": times, "notes": notes}
        base = times["attnc float32"]
        for label, ms in times.items():
            note = f" ({notes[label]})" if label in notes else ""
            lines.append(f"| {name} | {label}{note} | {ms:.3f} | {ms / base:.2f} |")
        print("\n".join(lines[-len(times):]), flush=True)
    s1 = results["S1 SDPA (8, 12, 1024, 64)"]["ms"]
    d1 = results["D1 decode q (1, 32, 1, 128), k, v (1, 32, 8192, 128)"]["ms"]
    targets = [
        ("S1 attnc bfloat16 <= 0.6x attnc float32", s1["attnc bfloat16"] / s1["attnc float32"], 0.6),
        ("S1 attnc float16 <= 0.75x attnc float32", s1["attnc float16"] / s1["attnc float32"], 0.75),
        ("D1 attnc bfloat16 <= 0.6x attnc float32", d1["attnc bfloat16"] / d1["attnc float32"], 0.6),
    ]
    if "openvino bfloat16" in s1:
        targets.append(("S1 attnc bfloat16 <= OpenVINO bfloat16", s1["attnc bfloat16"] / s1["openvino bfloat16"], 1.0))
    lines += ["", "| target | ratio | |", "| --- | --- | --- |"]
    lines += [f"| {what} | {ratio:.2f} | {'PASS' if ratio <= bound else 'MISS'} |" for what, ratio, bound in targets]
    print("\n".join(lines[-len(targets) - 2:]), flush=True)
    return results, lines, {what: ratio for what, ratio, _ in targets}


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", metavar="DIR", default=os.path.dirname(os.path.abspath(__file__)),
                        help="write results_low_precision.{md,json} into DIR (default: this folder)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per implementation (default: 5)")
    args = parser.parse_args()
    import torch
    torch.set_num_threads(THREADS)
    attnc.set_num_threads(THREADS)
    results, lines, targets = run(args.rounds)
    with open(os.path.join(args.out, "results_low_precision.md"), "w") as md:
        md.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "results_low_precision.json"), "w") as js:
        json.dump({"results": results, "targets": targets, "level": attnc._C.simd_level()}, js, indent=1)


if __name__ == "__main__":
    main()
