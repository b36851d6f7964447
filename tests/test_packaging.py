"""Importing attnc from a source tree that has no built extension (the
repository root after `pip install .`, or a fresh clone) says what happened
and what to run, instead of a circular-import message."""
import importlib.machinery
import pathlib
import shutil
import subprocess
import sys

import attnc


def _source_copy(tmp_path):
    """attnc's Python files without the extension, as in a clone nobody has built."""
    package = tmp_path / "attnc"
    package.mkdir()
    for source in pathlib.Path(attnc.__file__).parent.glob("*.py"):
        shutil.copy(source, package)
    return package


def _import_first_from(folder):
    """`import attnc` with `folder` first on sys.path, as the current directory is. Without
    site-packages (-S): an editable install's import hook would find attnc._C in its own tree."""
    code = f"import sys; sys.path.insert(0, {str(folder)!r}); import attnc"
    return subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=120)


def test_source_tree_without_extension_says_what_to_run(tmp_path):
    package = _source_copy(tmp_path)
    result = _import_first_from(tmp_path)
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("ImportError: the attnc source directory " + str(package)), result.stderr
    assert "has no compiled extension (attnc/_C" + importlib.machinery.EXTENSION_SUFFIXES[0] in last_line
    assert f"Run `pip install -e .` in {tmp_path} to build the extension there" in last_line
    assert "circular import" not in result.stderr


def test_a_broken_extension_keeps_its_own_error(tmp_path):
    """Only an absent extension gets the message; a present one that fails to load says why."""
    package = _source_copy(tmp_path)
    (package / ("_C" + importlib.machinery.EXTENSION_SUFFIXES[0])).write_bytes(b"not a shared object")
    result = _import_first_from(tmp_path)
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith(f"ImportError: {package / '_C'}"), result.stderr
    assert "pip install -e ." not in result.stderr
