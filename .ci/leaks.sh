#!/usr/bin/env bash
# Memory leaks of attnc._C under valgrind: a loop calls every entry point
# (successes, rejected calls and injected allocation failures) many times;
# the script sums the "definitely lost" bytes whose allocation stack passes
# through attnc's extension and fails unless that sum is 0. A stack passes
# through the extension when a frame names a file under csrc/ (valgrind
# prints full source paths here, --fullpath-after=) or, for a frame without
# debug information, the _C*.so itself.
# (Python's own "possibly lost" and still-reachable memory is ignored.)
#
# valgrind cannot execute AVX-512 instructions, so the loop caps the kernels
# at AVX2 (attnc._C.set_simd_level("avx2"), on a CPU that has it) in even
# rounds and runs the portable kernels in odd rounds (every round without AVX2).
#
#   .ci/leaks.sh            # ROUNDS=10 by default; ROUNDS=200 .ci/leaks.sh for more
#
# It builds the extension with -g in a fresh venv, or with ENV_PYTHON (a
# Python that imports attnc already: CI passes its venv's, where the
# README's command built it) runs the loop against that build (frames then
# name the _C*.so, not lines of csrc/).
#
# Every round makes the same calls (the inputs are drawn once, from a fixed
# seed), so a call that leaks loses memory in each round it runs; 10 rounds
# run each kernel level 5 times. (30 rounds took 127 s of valgrind on a
# Zen 3 host, where CI as a whole took 32 minutes.)
#
# Builds a -g copy of the extension in a temporary directory (the in-place
# build is left alone), in a fresh venv with only NumPy.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
rounds="${ROUNDS:-10}"

if ! command -v valgrind > /dev/null || ! command -v gcc > /dev/null; then
    if [[ $(id -u) == 0 ]] && command -v apt-get > /dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind gcc python3-dev python3-venv > /dev/null
    else
        echo "leaks.sh: needs valgrind and gcc" >&2; exit 2
    fi
fi

work="$(mktemp -d /tmp/attnc-leaks.XXXXXX)"
[[ ${KEEP:-0} == 1 ]] || trap 'rm -rf "$work"' EXIT
if [[ -n ${ENV_PYTHON:-} ]]; then
    venv_py="$ENV_PYTHON"
else
    tar -C "$repo" --exclude=./.git --exclude=./build --exclude='*.so' --exclude=__pycache__ \
        --exclude='*.egg-info' -cf - attnc csrc setup.py pyproject.toml README.md | tar -C "$work" -xf -
    "$python" -m venv "$work/venv"
    venv_py="$work/venv/bin/python"
    "$venv_py" -m pip install -q --upgrade pip setuptools wheel 2> /dev/null
    "$venv_py" -m pip install -q "numpy>=2.0" "ml_dtypes>=0.5" 2> /dev/null
    (cd "$work" && CFLAGS="-g -fno-omit-frame-pointer" "$venv_py" setup.py -q build_ext --inplace > build.log 2>&1) \
        || { cat "$work/build.log"; exit 1; }
fi
(cd "$work" && PYTHONPATH="$work" "$venv_py" -c 'import attnc; print("leaks.sh: attnc from", attnc._C.__file__)')

cat > "$work/loop.py" <<'PY'
"""Every entry point, ROUNDS times: results, rejected calls, allocation failures."""
import sys

import ml_dtypes
import numpy as np
from numpy.lib.stride_tricks import as_strided

import attnc
from attnc import functional as F

ROUNDS = int(sys.argv[1])
# valgrind cannot run AVX-512: the kernels are capped at AVX2, and the portable ones run too
if hasattr(attnc._C, "simd_levels"):
    LEVELS = [lv for lv in ("avx2", "portable") if lv in attnc._C.simd_levels()]
else:  # builds before simd_levels() cap a level the CPU lacks
    LEVELS = ["avx2", "portable"]
attnc.set_num_threads(2)
rng = np.random.default_rng(0)
x = rng.standard_normal((2, 70, 16)).astype(np.float32)
x64 = x.astype(np.float64)
mask = rng.integers(0, 2, (2, 70, 70)).astype(bool)
mask_h = mask[:, None]
huge = as_strided(np.zeros(1, np.float32), (2 ** 40, 16), (0, 0))
modules = [
    (attnc.SelfAttentionV1(16), False), (attnc.SelfAttentionV2(16), False),
    (attnc.SelfAttentionV3(16, 0.1), True), (attnc.SelfAttentionV4(16, 0.1), True),
    (attnc.MultiHeadAttention(16, 4, 0.1), "heads"), (attnc.SelfAttention(16, 8, 12, bias=True), True),
    (attnc.MultiHeadSelfAttention(16, 8, 12, 4), "heads"),
]
w = rng.standard_normal((24, 16))
calls = []
for m, masked in modules:
    for train in (False, True):
        def call(m=m, masked=masked, train=train):
            m.train(train)
            args = (x,) if not masked else (x, mask_h if masked == "heads" else mask)
            out = m(*args)
            m(*args, return_weights=True)
            if train:
                m.backward(np.ones_like(out))
        calls.append(call)
out, lse = F.scaled_dot_product_attention(x, x64, x, attn_mask=mask, is_causal=True, return_lse=True)
calls += [
    lambda: F.linear(x, w), lambda: F.linear(x64, w, w[:, 0]), lambda: attnc.Linear(16, 8)(x),
    lambda: F.softmax(x, axis=1), lambda: F.softmax(x64),
    lambda: attnc.Dropout(0.3)(x), lambda: attnc.Dropout(0.3).eval()(x64),
    lambda: F.scaled_dot_product_attention(x, x64, x, attn_mask=mask, is_causal=True, return_weights=True),
    lambda: F.scaled_dot_product_attention(x[:, None], x, x64, dropout_p=0.2),
    lambda: F.scaled_dot_product_attention_backward(out, x, x64, x, out, lse, attn_mask=mask, is_causal=True),
]
x16, xb = x.astype(np.float16), x.astype(ml_dtypes.bfloat16)  # the 16-bit kernels
out16, lse16 = F.scaled_dot_product_attention(x16, x16, x16, return_lse=True)
mha_bf16 = attnc.MultiHeadAttention(16, 4, 0.1, dtype="bfloat16")
calls += [
    lambda: F.linear(x16, w.astype(np.float16)), lambda: F.linear(xb[0], xb[0]),
    lambda: F.scaled_dot_product_attention(x16, x16, x16, attn_mask=mask, is_causal=True, return_weights=True),
    lambda: F.scaled_dot_product_attention(xb[:, :3], xb, xb, return_weights=True, dropout_p=0.2),
    lambda: F.scaled_dot_product_attention_backward(out16, x16, x16, x16, out16, lse16),
    lambda: mha_bf16.backward(np.ones_like(mha_bf16.train()(xb))),
]
optimized = attnc.MultiHeadAttention(16, 4)  # the optimizers' updates (attnc._C.update)
sgd, adamw = attnc.optim.SGD(optimized, lr=1e-3, momentum=0.9), attnc.optim.AdamW(optimized)


def adamw_step_in_copies():  # Fortran-ordered moments: updated in copies written back
    adamw.step()
    for entries in adamw.state.values():
        entries["exp_avg"] = np.asfortranarray(entries["exp_avg"])


calls += [sgd.step, adamw_step_in_copies,
          lambda: attnc.optim.AdamW(attnc.Linear(16, 8, dtype="bfloat16")).step()]
rejected = [
    lambda: attnc._C.update(x, x[:1], (), "sgd", {}, {}), lambda: attnc._C.update(x, x, (x,), "adamw", {}, {}),
    lambda: modules[3][0](x, mask[:, :, :5]), lambda: modules[4][0](x[..., :3]),
    lambda: F.scaled_dot_product_attention(x, x, x[:, :5]), lambda: F.linear(x, w[:, :3]),
    lambda: F.scaled_dot_product_attention(x, x, x, attn_mask=mask.astype(complex)),
    lambda: F.scaled_dot_product_attention(huge, x, x), lambda: modules[0][0](huge[None]),
    lambda: F.softmax(x, axis=7),
    lambda: F.scaled_dot_product_attention_backward(out, x, x64, x, out, lse[:, :5]),
]
levels_run = set()
for r in range(ROUNDS):
    attnc._C.set_simd_level(LEVELS[r % len(LEVELS)])
    levels_run.add(attnc._C.simd_level())
    for call in calls:
        call()
    for call in rejected:
        try:
            call()
        except (ValueError, TypeError, MemoryError):
            pass
        else:
            raise AssertionError("no error")
# every allocation of every call fails once, at each level
for level, call in [(level, call) for level in LEVELS for call in calls]:
    attnc._C.set_simd_level(level)
    for n in range(400):
        attnc._C.fail_alloc_after(n)
        try:
            call()
        except MemoryError:
            continue
        finally:
            attnc._C.fail_alloc_after(-1)
        break
assert "avx512" not in levels_run, levels_run
print("loop done:", ROUNDS, "rounds of", len(calls), "calls and", len(rejected), "rejected calls; kernel levels",
      sorted(levels_run))
PY

echo "leaks.sh: valgrind on $rounds rounds (a few minutes)"
cd "$work"
start=$SECONDS
PYTHONMALLOC=malloc PYTHONPATH="$work" valgrind --tool=memcheck --leak-check=full --show-leak-kinds=definite \
    --num-callers=60 --fullpath-after= --log-file="$work/valgrind.log" "$venv_py" loop.py "$rounds"
echo "leaks.sh: valgrind run took $((SECONDS - start)) s"
grep -E "definitely lost:|indirectly lost:|ERROR SUMMARY" "$work/valgrind.log" | sed 's/^==[0-9]*== /  all of python: /'

# Sum the definitely lost records (and count memcheck errors) whose stack passes through attnc's extension.
"$venv_py" - "$work/valgrind.log" <<'PY'
import re
import sys

text = open(sys.argv[1]).read()
# a frame of attnc's extension: a source file in a csrc/ directory (valgrind prints source paths,
# --fullpath-after=), or the extension's shared object for a frame without debug information
OURS = re.compile(r"\((?:[^():]*/)?csrc/[^:()/]+:\d+\)|\(in [^)]*/attnc/_C[.]cpython[^)]*\)")
records = re.split(r"\n==\d+== \n", text)
attnc_bytes = attnc_records = attnc_errors = 0
for record in records:
    head = re.search(r"([\d,]+) (?:\(([\d,]+) direct, ([\d,]+) indirect\) )?bytes in [\d,]+ blocks are definitely lost", record)
    ours = bool(OURS.search(record))
    if not head:
        if ours and re.search(r"Invalid (read|write|free)|uninitialised|Conditional jump|Mismatched free", record):
            attnc_errors += 1
            print(record)
        continue
    if ours:
        attnc_records += 1
        attnc_bytes += int(head.group(1).replace(",", ""))
        print(record)
print(f"leaks.sh: definitely lost in attnc (csrc/, _C*.so): {attnc_bytes} bytes in {attnc_records} records")
print(f"leaks.sh: memcheck errors (invalid access, uninitialised value) in attnc: {attnc_errors}")
sys.exit(1 if attnc_bytes or attnc_errors else 0)
PY
