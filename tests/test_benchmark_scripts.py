"""The benchmark scripts' own handling of their arguments and output (never their timings:
speed goals live in benchmarks/)."""
import importlib
import json
import sys
from pathlib import Path

import attnc

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_bench_training_makes_the_out_directory_before_its_runs(tmp_path, monkeypatch):
    """Regression (2026-12-06): `--out` naming a directory that did not exist raised
    FileNotFoundError after the whole run, its results lost. The runs are replaced by stubs
    here; the results file holds what they returned."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    bench_training = importlib.import_module("bench_training")
    monkeypatch.setattr(bench_training, "run_sdpa", lambda size, causal, rounds: ({}, rounds))
    monkeypatch.setattr(bench_training, "run_mha", lambda size, rounds: ({}, rounds))
    monkeypatch.setattr(bench_training, "time_in_blocks", lambda impls, rounds: {})
    monkeypatch.setattr(bench_training, "report", lambda title, samples, baselines: {"stub": title})
    monkeypatch.setattr(bench_training, "measure_memory", lambda size: (3 * 2**20, None))
    out = tmp_path / "not" / "there"
    monkeypatch.setattr(sys, "argv", ["bench_training.py", "--quick", "--out", str(out)])
    threads = attnc.get_num_threads()
    try:
        bench_training.main()
    finally:
        attnc.set_num_threads(threads)
    results = json.loads((out / "results_training.json").read_text())
    assert results["T3 backward extra memory MiB"] == 3
    assert sum(1 for key in results if key.startswith("T2")) == len(bench_training.SIZES["quick"]["mha"])
