#!/usr/bin/env bash
# CI: build the documentation site with every warning an error, in the
# current environment (which needs `pip install -e ".[docs]"`). -E reads
# every page afresh, so objects an earlier build recorded never linger
# (Sphinx would report them as duplicates).
set -euo pipefail
cd "$(dirname "$0")/.."

python -m sphinx -W --keep-going -E -b html docs docs/_build/html
