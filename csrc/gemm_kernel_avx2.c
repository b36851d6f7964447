/* The GEMM micro-kernels for AVX2 + FMA, compiled for that ISA here only:
 * gemm.c calls them only when the CPU has both (cpu.c). MR = 6 rows x 2 ymm
 * vectors = 12 accumulators, plus 2 for the B row and 1 for the broadcast
 * A element: 15 of the 16 ymm registers (body: gemm_tile_simd.h). */
#include "gemm_kernels.h"

#ifdef GEMM_HAVE_AVX2
#pragma GCC target("avx2,fma")
#include <immintrin.h>

#define MR GEMM_AVX2_MR

#include "gemm_tile_simd.h"

GEMM_SIMD_TILE(tile_f32, float, __m256, 256, 8, ps)
GEMM_SIMD_TILE(tile_f64, double, __m256d, 256, 4, pd)
GEMM_DEFINE_UKERNELS(float, f32, avx2, tile_f32)
GEMM_DEFINE_UKERNELS(double, f64, avx2, tile_f64)

#endif
