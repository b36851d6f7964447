"""Builds the notebooks from their Python sources and executes them in place.

    python notebooks/build.py              # every notebook: build, execute, save
    python notebooks/build.py 003 perf     # only those whose name contains 003 or perf
    python notebooks/build.py --no-execute # build without running (outputs empty)
    python notebooks/build.py --check      # exit 1 if a stored notebook is stale

Sources are notebooks/src/<name>.py in the "percent" format (jupytext's):
`# %%` starts a code cell, `# %% [markdown]` a markdown cell whose lines are
written as comments, and `# %% [include] <file>` pastes notebooks/src/<file> as
a code cell (the plot helpers every notebook shares, so each notebook stays
self-contained). Lines before the first marker are the source's own notes.

Execution uses nbclient with the `python3` kernel of the current environment
(jupyter_client starts it with this interpreter), the notebook's folder as the
working directory, and no network. Outputs are stored so a code host shows
them; timing metadata is not, so rebuilding with the same versions, on a
CPU whose kernels are of the same SIMD level, gives the same files (levels
differ in the last bits of some printed values).
"""
import argparse
import pathlib
import sys
import time

import nbformat

NOTEBOOKS = pathlib.Path(__file__).resolve().parent
SOURCES = NOTEBOOKS / "src"
MARKER = "# %%"


def source_files():
    return sorted(p for p in SOURCES.glob("*.py") if not p.name.startswith("_"))


def _markdown(lines):
    return "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in lines)


def _cell(kind, lines):
    text = "\n".join(lines).strip("\n")
    if kind == "markdown":
        return nbformat.v4.new_markdown_cell(_markdown(text.split("\n")))
    return nbformat.v4.new_code_cell(text)


def parse(path):
    """The notebook described by one percent-format source file."""
    cells, kind, lines = [], None, []
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.startswith(MARKER):
            if kind is not None:
                cells.append(_cell(kind, lines))
            tag = line[len(MARKER):].strip()
            kind, lines = "code", []
            if tag == "[markdown]":
                kind = "markdown"
            elif tag.startswith("[include]"):
                included = SOURCES / tag[len("[include]"):].strip()
                lines = included.read_text(encoding="utf-8").split("\n")
            elif tag:
                raise ValueError(f"{path.name}: unknown cell marker {line!r}")
        elif kind is not None:
            lines.append(line)
    if kind is not None:
        cells.append(_cell(kind, lines))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for index, cell in enumerate(nb.cells):  # stable ids: rebuilding does not churn the files
        cell["id"] = f"{path.stem[:40]}-{index:02d}"
    return nb


def target(path):
    return NOTEBOOKS / (path.stem + ".ipynb")


def execute(nb, timeout=600):
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()
    nb.metadata.pop("widgets", None)
    return nb


def stale(path):
    """Why the stored notebook for `path` does not match its source, or None."""
    stored_path = target(path)
    if not stored_path.exists():
        return f"{stored_path.name} is missing"
    stored = nbformat.read(stored_path, as_version=4)
    fresh = parse(path)
    if [(c.cell_type, c.source) for c in stored.cells] != [(c.cell_type, c.source) for c in fresh.cells]:
        return f"{stored_path.name} differs from src/{path.name}: run python notebooks/build.py"
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="build only sources whose name contains one of these")
    parser.add_argument("--no-execute", action="store_true", help="write the notebooks without running them")
    parser.add_argument("--check", action="store_true", help="only report stored notebooks that are stale")
    args = parser.parse_args(argv)
    paths = [p for p in source_files() if not args.names or any(n in p.stem for n in args.names)]
    if not paths:
        parser.error(f"no source in {SOURCES} matches {args.names}")
    if args.check:
        problems = [reason for reason in map(stale, paths) if reason]
        print("\n".join(problems) or f"{len(paths)} notebooks up to date")
        return 1 if problems else 0
    for path in paths:
        start = time.perf_counter()
        nb = parse(path)
        if not args.no_execute:
            execute(nb)
        nbformat.validate(nb)
        nbformat.write(nb, target(path))
        print(f"{target(path).name}: {len(nb.cells)} cells, {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
