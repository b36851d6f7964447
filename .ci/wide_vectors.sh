#!/usr/bin/env bash
# The AVX-512 kernels' shapes (16 floats or 8 doubles per vector, 12 x 2
# vector micro-kernel) and the AVX2 ones (8 / 4, 6 x 2), run on any CPU: a
# copy of the repository is built with its portable kernels at those vector
# widths (plain vector code, no AVX-512 instruction), and the kernel tests run
# at that level alone (ATTNC_TEST_SIMD_LEVEL: the copy's other levels are this
# CPU's own kernels, which the README's command ran). A CPU without AVX-512 (and valgrind, which cannot run it)
# otherwise never executes the logic of the wide tiles and transposes.
# The width of this CPU's best level is skipped: the README's test command
# ran every kernel test at that level's own shapes, natively. A width below
# it that the CPU also runs (AVX2's on an AVX-512 CPU) is not built either:
# the README's command ran the simd_mode tests at that level; the fuzzing and
# the modules against torch, which run at the default level only, run at it
# here. (Its portable build took 430 s of a 1682 s CI on a model 207 host,
# 2026-12-07, its lane the last to end.)
# (Built without the kernels this CPU cannot run: ATTNC_SKIP_UNRUNNABLE_KERNELS.)
set -euo pipefail
cd "$(dirname "$0")/.."
levels="$(cd /tmp && python -c 'import attnc; print(" ".join(attnc._C.simd_levels()))')"
best="${levels##* }"
copies="$(mktemp -d)"
trap 'rm -rf "$copies"' EXIT
for bytes in 64 32; do
    # avx512bf16 is AVX-512 with the bfloat16 dot products: the same 64-byte shapes
    native=$([ "$bytes" = 64 ] && echo avx512 || echo avx2)
    if [ "${best%bf16}" = "$native" ]; then
        echo "-- $bytes-byte vectors: skipped, this CPU's best level ($best) ran the whole suite natively at that width"
        continue
    fi
    if [[ " $levels " == *" $native "* ]]; then
        echo "-- $bytes-byte vectors: this CPU's $native kernels (the suite ran its simd_mode tests at them)"
        ATTNC_TEST_SIMD_LEVEL=$native python -m pytest -q -p no:cacheprovider -o addopts= -x \
            tests/test_fuzz.py tests/test_modules_vs_torch.py | tail -2
        continue
    fi
    copy="$copies/$bytes/attnc"
    mkdir -p "$copy"
    git ls-files -z | xargs -0 cp --parents -t "$copy"
    (cd "$copy" && ATTNC_PORTABLE_VECTOR_BYTES=$bytes ATTNC_SKIP_UNRUNNABLE_KERNELS=1 python setup.py -q build_ext --inplace > build.log 2>&1) ||
        { cat "$copy/build.log"; exit 1; }
    echo "-- portable kernels at $bytes-byte vectors"
    (cd "$copy" && ATTNC_TEST_SIMD_LEVEL=portable python -m pytest -q -p no:cacheprovider -o addopts= -x \
        tests/test_simd_levels.py tests/test_stacked_projection.py tests/test_functional.py tests/test_layouts.py \
        tests/test_masks.py tests/test_threads_determinism.py tests/test_fuzz.py tests/test_modules_vs_torch.py \
        tests/test_kernel_regressions.py tests/test_backward_attention.py tests/test_sdpa_options.py \
        tests/test_decode.py tests/test_low_precision.py -k "not sigint and not peak_memory" | tail -2)
done
