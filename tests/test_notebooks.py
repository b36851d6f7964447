"""The notebooks in notebooks/: stored in sync with their sources in notebooks/src, stored
executed (outputs and figures), with no error. Re-running them is nbmake's job:
    python -m pytest --nbmake notebooks
"""
import importlib.util
import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
_spec = importlib.util.spec_from_file_location("notebooks_build", NOTEBOOKS / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)

SOURCES = build.source_files()
DOCUMENTS = ["000_four_levels", "001_attention_module", "002_line_by_line", "003_hand_derivation",
             "004_self_attention"]


def test_one_notebook_per_document_the_performance_one_and_the_training_one():
    assert [p.stem for p in SOURCES] == DOCUMENTS + ["performance", "training"]


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_stored_notebook_matches_its_source(source):
    assert build.stale(source) is None


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_stored_notebook_is_executed_without_errors(source):
    nb = nbformat.read(build.target(source), as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(cell.execution_count is not None for cell in code), "run python notebooks/build.py"
    outputs = [output for cell in code for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure stored"


@pytest.mark.parametrize("name", DOCUMENTS)
def test_document_notebook_ends_with_the_torch_cross_check(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    last = [cell for cell in nb.cells if cell.cell_type == "code"][-1]
    assert "except ImportError" in last.source and "load_state_dict" in last.source
    text = "".join(o.get("text", "") for o in last.outputs)
    assert "max |attnc - torch|" in text, "the stored run skipped the cross-check: build it where torch is installed"


def test_training_notebook_ends_with_the_loss_comparison():
    """Its last cell asserts the attnc and torch loss curves agree; the stored run learned the task."""
    nb = nbformat.read(NOTEBOOKS / "training.ipynb", as_version=4)
    last = [cell for cell in nb.cells if cell.cell_type == "code"][-1]
    assert "assert loss_difference < 1e-9" in last.source
    text = "".join(o.get("text", "") for o in last.outputs)
    assert "sequence accuracy 1.000" in text
    assert "max |attnc - torch| loss" in text, "the stored run skipped the comparison: build it with torch installed"


def test_performance_notebook_shows_the_stored_results():
    """Regression (a docs audit, 2026-12-02, and a review before it): the benchmark results
    were stored anew (results.json, results.md, the README's tables) without the performance
    notebook executed again, so the documentation site's notebook showed an older run (case 2
    passing there, missing in results.md). Its stored outputs print the run's environment:
    they must be those of benchmarks/results.json (python notebooks/build.py perf)."""
    import json
    environment = json.loads((NOTEBOOKS.parent / "benchmarks" / "results.json").read_text())["environment"]
    nb = nbformat.read(NOTEBOOKS / "performance.ipynb", as_version=4)
    text = "".join(o.get("text", "") for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs)
    for key in ("attnc", "wall_seconds", "load_average_1min"):
        assert f"  {key}: {environment[key]}\n" in text, f"{key}: run python notebooks/build.py perf"
