# Source of performance.ipynb: plots the stored results of benchmarks/bench.py.
# It never runs the benchmark; it reads benchmarks/results.json.

# %% [markdown]
# # Performance — attnc vs PyTorch vs NumPy
#
# This notebook plots the results that `benchmarks/bench.py` stored in
# `benchmarks/results.json`; it does not run the benchmark (that takes minutes and needs
# PyTorch). To refresh the numbers, run the benchmark (see `benchmarks/README.md`), then
# rebuild this notebook:
#
# ```sh
# env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench.py
# python notebooks/build.py performance
# ```
#
# Every number below is read from the file: the run's settings first, then time against
# sequence length, then every case, then the table with the targets.

# %%
import json
import pathlib

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullLocator
from IPython.display import Markdown, display

plt.rcParams["figure.dpi"] = 110


def find_results(name="results.json"):
    """benchmarks/results.json, from the notebooks folder or the repository root."""
    for folder in (pathlib.Path.cwd().parent, pathlib.Path.cwd()):
        path = folder / "benchmarks" / name
        if path.exists():
            return path
    return None


path = find_results()
results = json.loads(path.read_text()) if path else None
if results is None:
    print("benchmarks/results.json not found: run benchmarks/bench.py first; nothing to plot.")

# %% [markdown]
# The file holds either bench.py's layout (`environment`, `cases` with one entry per
# implementation, `sweep`) or a plain list of records `{"case", "impl", "seq", "median_ms",
# ...}`. Both are turned into one list of records here.

# %%
def records_of(results):
    """One dict per (case, implementation): case, title, shape, impl, median_ms, gflops."""
    if results is None:
        return []
    if isinstance(results, list):
        return [dict(record, title=record.get("title", record["case"]), shape=record.get("shape", "")) for record in results]
    records = []
    for case in results.get("cases", []):
        for impl, numbers in case["impls"].items():
            records.append({"case": str(case["key"]), "title": case["title"], "shape": f"{case['shape']}, {case['dtype']}",
                            "impl": impl, "median_ms": numbers["median_s"] * 1e3, "gflops": numbers.get("gflops")})
    return records


def sweep_of(results):
    """{impl: (sequence lengths, median ms)} and a description of the sweep's shape."""
    if results is None:
        return {}, ""
    if isinstance(results, list):
        curves = {}
        for record in results:
            if record.get("seq") is not None:
                curves.setdefault(record["impl"], []).append((record["seq"], record["median_ms"]))
        return {impl: tuple(map(list, zip(*sorted(points)))) for impl, points in curves.items()}, ""
    sweep = results.get("sweep") or {}
    curves = {impl: (list(sweep["seq"]), [t * 1e3 for t in times]) for impl, times in sweep.get("median_s", {}).items()}
    return curves, sweep.get("shape", "")


records = records_of(results)
curves, sweep_shape = sweep_of(results)
environment = results.get("environment", {}) if isinstance(results, dict) else {}
print(f"{len(records)} timings of {len({r['case'] for r in records})} cases; sweep over {len(curves)} implementations")
for key in ("mode", "threads", "cpus", "python", "numpy", "torch", "attnc", "openblas_core", "load_average_1min",
            "load_average_1min_end", "wall_seconds"):
    if key in environment:
        print(f"  {key}: {environment[key]}")
if environment.get("mode") == "quick":
    print("Note: a --quick run (tiny sizes, few rounds): fixed costs dominate; run the full benchmark for real numbers.")

# %% [markdown]
# ## Time against sequence length
#
# The attention core (`scaled_dot_product_attention`) for growing sequence length `L`,
# median time per call, log-log axes. The work grows as `L²`: once fixed costs no longer
# dominate, the curves approach a slope of 2.

# %%
if curves:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for impl, (seq, ms) in curves.items():
        ax.plot(seq, ms, marker="o", label=impl, linewidth=2.5 if impl == "attnc" else 1.2)
    ax.set(xscale="log", yscale="log", xlabel="sequence length L", ylabel="median time per call (ms)",
           title=f"attention core: {sweep_shape}" if sweep_shape else "time vs sequence length")
    ax.set_xticks(seq, [str(length) for length in seq])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    plt.show()
else:
    print("no sequence-length sweep in the results")

# %% [markdown]
# Relative to NumPy (below 1: faster than NumPy), at each length:

# %%
reference = "numpy" if "numpy" in curves else None
if curves and reference:
    base = np.array(curves[reference][1])
    seq = curves[reference][0]
    width = 0.8 / (len(curves) - 1)
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    others = [impl for impl in curves if impl != reference]
    for i, impl in enumerate(others):
        ratio = np.array(curves[impl][1]) / base
        ax.bar(np.arange(len(seq)) + (i - (len(others) - 1) / 2) * width, ratio, width, label=impl)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set(yscale="log", xlabel="sequence length L", ylabel=f"time / {reference} time",
           title=f"speed relative to {reference}")
    ax.set_xticks(range(len(seq)), [str(length) for length in seq])
    ax.legend(fontsize=8)
    plt.show()

# %% [markdown]
# ## Every case
#
# Median time per call of every implementation, one panel per case (attnc in blue; each
# panel has its own linear scale, and each bar is labelled with its time).

# %%
def fmt_ms(ms):
    return f"{ms * 1e3:.2f} µs" if ms < 0.1 else f"{ms:.3g} ms"


cases = list(dict.fromkeys(r["case"] for r in records))
if cases:
    columns = 3
    rows = -(-len(cases) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 2.3 * rows), squeeze=False, constrained_layout=True)
    for ax, case in zip(axes.flat, cases):
        rows_of_case = [r for r in records if r["case"] == case]
        names = [r["impl"] for r in rows_of_case]
        times = [r["median_ms"] for r in rows_of_case]
        colors = ["tab:blue" if name == "attnc" else "tab:gray" for name in names]
        bars = ax.barh(range(len(names)), times, color=colors)
        ax.bar_label(bars, [fmt_ms(t) for t in times], fontsize=7, padding=2)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(0, max(times) * 1.3)
        ax.set_xlabel("ms per call", fontsize=7)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(f"{case} {rows_of_case[0]['title']}\n{rows_of_case[0]['shape']}", fontsize=8)
    for ax in axes.flat[len(cases):]:
        ax.axis("off")
    plt.show()

# %% [markdown]
# ## Table
#
# attnc against the fastest torch variant and NumPy, with the target of each case and whether
# this run meets it (as `bench.py` computed it).

# %%
if isinstance(results, dict) and results.get("cases"):
    lines = ["| case | shape | attnc | fastest torch | NumPy | attnc / torch | attnc / NumPy | target | result |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for case in results["cases"]:
        impls = case["impls"]
        best = case.get("torch_best")
        lines.append(
            f"| {case['key']} {case['title']} | {case['shape']}, {case['dtype']} "
            f"| {fmt_ms(impls['attnc']['median_s'] * 1e3)} "
            f"| {fmt_ms(impls[best]['median_s'] * 1e3) + f' ({best})' if best in impls else '-'} "
            f"| {fmt_ms(impls['numpy']['median_s'] * 1e3) if 'numpy' in impls else '-'} "
            f"| {case.get('attnc_over_torch_best', float('nan')):.2f} | {case.get('attnc_over_numpy', float('nan')):.2f} "
            f"| {case.get('target', '')} | {'PASS' if case.get('pass') else 'MISS'} |")
    display(Markdown("\n".join(lines)))
elif records:
    lines = ["| case | implementation | median |", "| --- | --- | --- |"]
    lines += [f"| {r['case']} | {r['impl']} | {fmt_ms(r['median_ms'])} |" for r in records]
    display(Markdown("\n".join(lines)))
