"""Sphinx configuration of attnc's documentation site.

Build (from the repository root, after `pip install -e ".[docs]"`):

    python -m sphinx -W --keep-going -b html docs docs/_build/html

The API pages are autodoc (numpydoc) over the installed package; the stored
notebooks are rendered by myst-nb as they are, never re-executed.
"""
import filecmp
import pathlib
import shutil

import attnc

DOCS = pathlib.Path(__file__).resolve().parent
REPOSITORY = DOCS.parent

project = "attnc"
author = "the attnc authors"
release = version = attnc.__version__

extensions = [
    "sphinx.ext.autodoc",
    "numpydoc",
    "myst_nb",  # also registers the MyST Markdown parser for the .md pages
]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build"]

# -- API pages ---------------------------------------------------------------
# every public member, documented or not, in the order of the module's
# __all__ (or the source); a class shows what it adds to attnc.Module
# (Module's own methods are on its entry once)
autodoc_default_options = {"members": True, "undoc-members": True, "member-order": "bysource",
                           "inherited-members": "Module"}
autodoc_preserve_defaults = True  # `dtype=np.float32`, not `<class 'numpy.float32'>`
numpydoc_show_class_members = False  # autodoc lists the members; no second table

# -- Markdown and notebooks --------------------------------------------------
myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3  # links such as API.md#functional-layer-attncfunctional
nb_execution_mode = "off"  # the notebooks are stored executed: render their outputs as they are

# -- HTML --------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"attnc {release}"
html_theme_options = {"navigation_depth": 2, "show_toc_level": 2}

# -- The notebooks -----------------------------------------------------------
# Sphinx reads documents only from inside docs/, and the notebooks live in
# notebooks/ (the tests re-execute them there). Symlinks are lost or dangle
# in archives and on some file systems, so each build copies
# notebooks/*.ipynb into docs/notebooks/ (ignored by git) before Sphinx
# looks for sources. A notebook is copied only when its bytes changed, so
# incremental builds stay incremental; a copy whose original is gone is
# removed.
NOTEBOOKS = REPOSITORY / "notebooks"
NOTEBOOK_COPIES = DOCS / "notebooks"


def copy_notebooks(app):
    NOTEBOOK_COPIES.mkdir(exist_ok=True)
    originals = {path.name: path for path in NOTEBOOKS.glob("*.ipynb")}
    for copy in NOTEBOOK_COPIES.glob("*.ipynb"):
        if copy.name not in originals:
            copy.unlink()
    for name, original in originals.items():
        copy = NOTEBOOK_COPIES / name
        if not copy.exists() or not filecmp.cmp(original, copy, shallow=False):
            shutil.copyfile(original, copy)


def setup(app):
    app.connect("builder-inited", copy_notebooks)
