"""Every public name of attnc has a numpydoc docstring, and every example in
the package runs.

The public names come from the package itself: each public module's
__all__ and the public classes and functions it defines, and every public
method of those classes (inherited ones included), so a name added without
documentation fails here. A docstring needs a one-line summary, a
Parameters section naming each parameter of the signature, and, for a
class or a function, an Examples section; the examples run as doctests.
"""
import ast
import doctest
import importlib
import inspect
import pathlib
import pkgutil

import pytest

import attnc

MODULES = ["attnc"] + sorted(info.name for info in pkgutil.walk_packages(attnc.__path__, "attnc."))


# -- the examples ------------------------------------------------------------
@pytest.mark.parametrize("module_name", MODULES)
def test_examples_run(module_name):
    module = importlib.import_module(module_name)
    report = []
    runner = doctest.DocTestRunner()
    for test in doctest.DocTestFinder().find(module, module_name):
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


def test_examples_are_found():
    """The doctest collection above really reaches the docstrings' examples."""
    attempted = 0
    for module_name in MODULES:
        runner = doctest.DocTestRunner()
        for test in doctest.DocTestFinder().find(importlib.import_module(module_name), module_name):
            attempted += len(test.examples)
    assert attempted > 100


# -- the public names --------------------------------------------------------
def _public_names(module):
    """A module's __all__ with the public names it defines itself."""
    defined = {name for name, value in vars(module).items()
               if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__}
    return set(getattr(module, "__all__", ())) | defined


def _public_objects():
    """(dotted name, object, kind) for every public class, function and
    method, each object once, under its shortest name (attnc.Linear, not
    attnc.nn.Linear; a method under the class that defines it when that
    class is public)."""
    found = {}
    for module_name in MODULES:
        if any(part.startswith("_") for part in module_name.split(".")):
            continue
        module = importlib.import_module(module_name)
        for name in _public_names(module):
            value = getattr(module, name)
            if inspect.ismodule(value) or not callable(value):
                continue  # submodules are walked themselves; __version__ is a string
            kind = "class" if inspect.isclass(value) else "function"
            found.setdefault(id(value), []).append((f"{module_name}.{name}", value, kind))
            if kind == "class":
                for method_name in dir(value):
                    method = getattr(value, method_name)
                    public = not method_name.startswith("_") or method_name == "__call__"
                    if public and callable(method) and getattr(method, "__module__", "").startswith("attnc"):
                        found.setdefault(id(method), []).append(
                            (f"{module_name}.{name}.{method_name}", method, "method"))
    def preference(entry):
        name, value, _ = entry
        return not name.endswith("." + value.__qualname__), len(name), name
    return sorted(min(names, key=preference) for names in found.values())


PUBLIC = _public_objects()


def _sections(doc):
    """{section title: its lines} of a numpydoc docstring (a title is a line
    underlined by as many dashes)."""
    lines = doc.splitlines()
    starts = [i for i in range(1, len(lines))
              if lines[i].strip() and set(lines[i].strip()) == {"-"}
              and len(lines[i].strip()) == len(lines[i - 1].strip())]
    ends = [start - 1 for start in starts[1:]] + [len(lines)]
    return {lines[start - 1].strip(): lines[start + 1:end] for start, end in zip(starts, ends)}


def _documented_parameters(section):
    """The names a Parameters section documents: its entries' lines,
    ``name : type`` or ``name1, name2 : type`` or ``*args, **kwargs``."""
    names = set()
    for line in section:
        if line.strip() and not line[0].isspace():
            names.update(part.strip().lstrip("*") for part in line.split(" : ")[0].split(","))
    return names


def _parameters(value, kind):
    """The parameter names a caller passes (not self; a class's are its constructor's)."""
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):  # a C function without a text signature
        return None
    return [name for name in signature.parameters if not (kind == "method" and name == "self")]


def test_public_names_are_found():
    names = {name for name, _, _ in PUBLIC}
    expected = {"attnc.MultiHeadAttention", "attnc.MultiHeadAttention.forward", "attnc.Module.load_state_dict",
                "attnc.functional.scaled_dot_product_attention", "attnc.nn.MultiheadAttention.backward",
                "attnc.optim.AdamW", "attnc.from_torch", "attnc.manual_seed", "attnc.set_num_threads"}
    assert expected <= names, expected - names


@pytest.mark.parametrize("name, value, kind", [pytest.param(*entry, id=entry[0]) for entry in PUBLIC])
def test_numpydoc_docstring(name, value, kind):
    doc = inspect.getdoc(value)
    assert doc, f"{name} has no docstring"
    lines = doc.splitlines()
    assert lines[0].strip() and (len(lines) == 1 or not lines[1].strip()), \
        f"{name}: the summary must be one line followed by a blank line, got {lines[:2]}"
    sections = _sections(doc)
    parameters = _parameters(value, kind)
    if parameters:
        assert "Parameters" in sections, f"{name}: no Parameters section for {parameters}"
        missing = set(parameters) - _documented_parameters(sections["Parameters"])
        assert not missing, f"{name}: Parameters does not document {sorted(missing)}"
    if kind != "method":
        examples = sections.get("Examples", [])
        assert any(line.lstrip().startswith(">>>") for line in examples), f"{name}: no Examples with >>> lines"


# -- the extension's type stub -------------------------------------------------
def stub_functions():
    """The functions and constants attnc/_C.pyi declares: name -> parameter names (None for a constant)."""
    declared = {}
    for node in ast.parse(pathlib.Path(attnc.__file__).with_name("_C.pyi").read_text()).body:
        if isinstance(node, ast.FunctionDef):
            arguments = node.args
            order = [*arguments.posonlyargs, *arguments.args, arguments.vararg, *arguments.kwonlyargs,
                     arguments.kwarg]
            declared[node.name] = [a.arg for a in order if a is not None]
        elif isinstance(node, ast.AnnAssign) and not node.target.id.startswith("_"):
            declared[node.target.id] = None
    return declared


def test_the_stub_declares_every_name_of_the_extension_with_its_parameters():
    from attnc import _C
    declared = stub_functions()
    exported = {name for name in dir(_C) if not name.startswith("__")}
    assert sorted(exported - set(declared)) == [], "exported by the extension, missing in _C.pyi"
    assert sorted(set(declared) - exported) == [], "declared in _C.pyi, not exported"
    for name, parameters in declared.items():
        if parameters is not None:
            assert list(inspect.signature(getattr(_C, name)).parameters) == parameters, name
