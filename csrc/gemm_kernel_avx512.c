/* The GEMM micro-kernels for AVX-512 (F, VL, DQ) + FMA, compiled for that
 * ISA here only: gemm.c calls them only when the CPU has it (cpu.c). MR =
 * 12 rows x 2 zmm vectors = 24 accumulators, plus 2 for the B row and 1 for
 * the broadcast A element: 27 of the 32 zmm registers (body:
 * gemm_tile_simd.h). */
#include "gemm_kernels.h"

#ifdef GEMM_HAVE_AVX2
#include <immintrin.h>
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma")

#define MR GEMM_AVX512_MR

#include "gemm_tile_simd.h"

GEMM_SIMD_TILE(tile_f32, float, __m512, 512, 16, ps)
GEMM_SIMD_TILE(tile_f64, double, __m512d, 512, 8, pd)
GEMM_DEFINE_UKERNELS(float, f32, avx512, tile_f32)
GEMM_DEFINE_UKERNELS(double, f64, avx512, tile_f64)

#endif
