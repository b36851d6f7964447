#!/usr/bin/env bash
# The whole test suite against an AddressSanitizer + UBSan build of attnc._C.
#
# Builds into a temporary copy of the repository (the normal in-place build
# and any installed attnc are left alone), in a fresh virtual environment,
# then runs `python -m pytest tests` with the ASan runtime preloaded (CPython
# itself is not instrumented). Passes only with zero sanitizer reports.
#
#   .ci/sanitize.sh                  # whole suite
#   .ci/sanitize.sh tests/test_fuzz.py -x   # extra arguments go to pytest
#
# Environment: PYTHON (default python3), KEEP=1 keeps the temporary directory.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"

# -- what a fresh Debian machine lacks (only when root and apt exists) --------
need=()
command -v gcc > /dev/null || need+=(gcc)
"$python" -c 'import venv, ensurepip' 2> /dev/null || need+=(python3-venv)
"$python" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
    || need+=(python3-dev)
if ((${#need[@]})); then
    if [[ $(id -u) == 0 ]] && command -v apt-get > /dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" libasan8 > /dev/null
    else
        echo "sanitize.sh: missing ${need[*]}; install them first" >&2
        exit 2
    fi
fi
asan="$(gcc -print-file-name=libasan.so)"
[[ -f $asan ]] || { echo "sanitize.sh: no ASan runtime ($asan)" >&2; exit 2; }

# -- a temporary copy of the sources ------------------------------------------
work="$(mktemp -d /tmp/attnc-sanitize.XXXXXX)"
[[ ${KEEP:-0} == 1 ]] || trap 'rm -rf "$work"' EXIT
tar -C "$repo" --exclude=./.git --exclude=./build --exclude='*.so' --exclude=__pycache__ \
    --exclude='*.egg-info' --exclude=.pytest_cache --exclude=.hypothesis -cf - . | tar -C "$work" -xf -
mkdir -p "$work/venv"

# -- a fresh venv with the test dependencies (pip's own config/caches apply) ---
"$python" -m venv "$work/venv"
venv_py="$work/venv/bin/python"
"$venv_py" -m pip install -q --upgrade pip setuptools wheel
"$venv_py" -m pip install -q "numpy>=2.0" pytest hypothesis "torch==2.13.0"

# -- the sanitized build, in place in the copy --------------------------------
cd "$work"
ATTNC_SANITIZE=1 "$venv_py" setup.py -q build_ext --inplace > build.log 2>&1 || { cat build.log; exit 1; }
symbols="$(nm -D attnc/_C*.so)"
[[ $symbols == *__asan_init* && $symbols == *__ubsan_handle* ]] || {
    echo "sanitize.sh: the extension is not instrumented" >&2; exit 1; }

# -- run the suite -------------------------------------------------------------
log="$work/sanitizer"
export LD_PRELOAD="$asan"
# detect_leaks=0: CPython leaks at exit (.ci/leaks.sh checks attnc's leaks);
# allocator_may_return_null=1: the tests ask for impossible sizes and expect
# MemoryError, which needs malloc to return NULL instead of ASan aborting.
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:abort_on_error=1:log_path=$log:print_summary=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$log"
export PYTHONPATH="$work" PYTHONDONTWRITEBYTECODE=1 PYTHONFAULTHANDLER=1
start=$SECONDS
set +e
"$venv_py" -m pytest -q -p no:cacheprovider tests "$@"
status=$?
set -e
unset LD_PRELOAD
echo "sanitize.sh: pytest exit $status after $((SECONDS - start)) s"
reports=$(cat "$log".* 2> /dev/null | grep -c -E "ERROR: (AddressSanitizer|UndefinedBehaviorSanitizer)|runtime error:" || true)
if compgen -G "$log.*" > /dev/null; then
    echo "sanitize.sh: sanitizer reports:"; cat "$log".*
fi
echo "sanitize.sh: $reports sanitizer reports"
[[ $reports == 0 && $status == 0 ]]
