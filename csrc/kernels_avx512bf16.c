/* The bfloat16 kernels compiled for AVX512_BF16 on top of kernels_avx512.c's
 * ISA: their products multiply pairs of bfloat16 (vdpbf16ps, BF16_PAIRS in
 * simd.h); the level's other dtypes are the AVX-512 row's (cpu.c). A test
 * build (ATTNC_EMULATE_BF16_DOT=1, .ci/bf16_dot_emulated.sh) compiles them
 * for AVX-512 alone with the instruction emulated, and cpu.c then offers
 * the level on every AVX-512 CPU. */
#include "attnc.h"
#ifdef ATTNC_X86
#ifdef ATTNC_EMULATE_BF16_DOT
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma,f16c,prefer-vector-width=512")
#else
#pragma GCC target("avx512f,avx512vl,avx512dq,avx512bw,avx512bf16,avx2,fma,f16c,prefer-vector-width=512")
#endif
#define ATTNC_ISA avx512bf16
#define ATTNC_ISA_AVX512
#define ATTNC_ISA_AVX512BF16
#include "kernel_bundle.h"
#endif
