#!/usr/bin/env bash
# The AVX512_BF16 level's bfloat16 kernels (kernels_avx512bf16.c: products of
# bfloat16 pairs by vdpbf16ps) on a CPU without AVX512_BF16: a copy of the
# repository is built with that instruction emulated in AVX-512F
# (ATTNC_EMULATE_BF16_DOT=1, simd.h: vdot_pairs), which offers the level on
# any AVX-512 CPU, and the bfloat16 tests run at it. Skipped where the CPU
# has AVX512_BF16 (the README's test command ran them natively) and where it
# has no AVX-512 (nothing can run the level's code).
set -euo pipefail
cd "$(dirname "$0")/.."
levels="$(cd /tmp && python -c 'import attnc; print(" ".join(attnc._C.simd_levels()))')"
case " $levels " in
    *" avx512bf16 "*) echo "-- skipped: this CPU has AVX512_BF16, the suite ran the level natively"; exit 0 ;;
    *" avx512 "*) ;;
    *) echo "-- skipped: this CPU has no AVX-512 to emulate AVX512_BF16 with"; exit 0 ;;
esac
copy="$(mktemp -d)/attnc"
mkdir -p "$copy"
git ls-files -z | xargs -0 cp --parents -t "$copy"
(cd "$copy" && ATTNC_EMULATE_BF16_DOT=1 python setup.py -q build_ext --inplace > build.log 2>&1) ||
    { cat "$copy/build.log"; exit 1; }
echo "-- the AVX512_BF16 level with its dot product emulated"
# (offered as the last level; import chooses it except on Intel's CPUs,
# where it chooses avx512 (cpu.c: chosen_on_intel), so the tests are told it)
(cd "$copy" && python -c 'import attnc; assert attnc._C.simd_levels()[-1] == "avx512bf16", attnc._C.simd_levels()' &&
    ATTNC_TEST_SIMD_LEVEL=avx512bf16 python -m pytest -q -p no:cacheprovider -o addopts= -x tests/test_low_precision.py \
        tests/test_alloc_failure.py tests/test_from_torch.py | tail -2)
