/* The GEMM micro-kernels for AVX2 + FMA, compiled for that ISA here only:
 * gemm.c calls them only when the CPU has both (cpu.c). Per step p, one row
 * of B (two vectors) is loaded and each of the MR elements of A is broadcast
 * into an FMA with it: 2 * MR FMAs per 2 loads and MR broadcasts. */
#include "gemm_kernels.h"

#ifdef GEMM_HAVE_AVX2
#pragma GCC target("avx2,fma")
#include <immintrin.h>

#define MR GEMM_AVX2_MR

/* Start loading a C tile row (first and last element: it may straddle two
 * cache lines) while the K loop runs: C is read only at the end, often
 * from L3, and waiting for it then cost a sixth of the kernel's time. */
static inline void prefetch_row(const void *first, const void *last)
{
    _mm_prefetch((const char *)first, _MM_HINT_T0);
    _mm_prefetch((const char *)last, _MM_HINT_T0);
}

/* The unroll pragmas keep acc in registers (without them GCC 12 spills
 * the array to the stack on every step). */

/* c (6, 16) = init (16) + a (kc, 6)^T . b (kc, 16), or c += a^T . b */
static inline __attribute__((always_inline)) void
tile_f32(idx_t kc, const float *a, const float *b, float *c, idx_t c_rs, const float *init)
{
    __m256 acc[MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++) {
        acc[i][0] = init ? _mm256_loadu_ps(init) : _mm256_setzero_ps();
        acc[i][1] = init ? _mm256_loadu_ps(init + 8) : _mm256_setzero_ps();
        prefetch_row(c + i * c_rs, c + i * c_rs + 15);
    }
    for (idx_t p = 0; p < kc; p++, a += MR, b += 16) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            __m256 ai = _mm256_broadcast_ss(a + i);
            acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++, c += c_rs) {
        if (!init) {
            acc[i][0] = _mm256_add_ps(_mm256_loadu_ps(c), acc[i][0]);
            acc[i][1] = _mm256_add_ps(_mm256_loadu_ps(c + 8), acc[i][1]);
        }
        _mm256_storeu_ps(c, acc[i][0]);
        _mm256_storeu_ps(c + 8, acc[i][1]);
    }
}

/* c (6, 8) = init (8) + a (kc, 6)^T . b (kc, 8), or c += a^T . b */
static inline __attribute__((always_inline)) void
tile_f64(idx_t kc, const double *a, const double *b, double *c, idx_t c_rs, const double *init)
{
    __m256d acc[MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++) {
        acc[i][0] = init ? _mm256_loadu_pd(init) : _mm256_setzero_pd();
        acc[i][1] = init ? _mm256_loadu_pd(init + 4) : _mm256_setzero_pd();
        prefetch_row(c + i * c_rs, c + i * c_rs + 7);
    }
    for (idx_t p = 0; p < kc; p++, a += MR, b += 8) {
        __m256d b0 = _mm256_load_pd(b), b1 = _mm256_load_pd(b + 4);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            __m256d ai = _mm256_broadcast_sd(a + i);
            acc[i][0] = _mm256_fmadd_pd(ai, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_pd(ai, b1, acc[i][1]);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++, c += c_rs) {
        if (!init) {
            acc[i][0] = _mm256_add_pd(_mm256_loadu_pd(c), acc[i][0]);
            acc[i][1] = _mm256_add_pd(_mm256_loadu_pd(c + 4), acc[i][1]);
        }
        _mm256_storeu_pd(c, acc[i][0]);
        _mm256_storeu_pd(c + 4, acc[i][1]);
    }
}

/* The exported forms (gemm_kernels.h), with init fixed at compile time. */
void gemm_ukernel_f32_avx2(idx_t kc, const float *a, const float *b, float *c, idx_t c_rs)
{
    tile_f32(kc, a, b, c, c_rs, NULL);
}

void gemm_ukernel_store_f32_avx2(idx_t kc, const float *a, const float *b, float *c, idx_t c_rs,
                                 const float *init)
{
    tile_f32(kc, a, b, c, c_rs, init);
}

void gemm_ukernel_f64_avx2(idx_t kc, const double *a, const double *b, double *c, idx_t c_rs)
{
    tile_f64(kc, a, b, c, c_rs, NULL);
}

void gemm_ukernel_store_f64_avx2(idx_t kc, const double *a, const double *b, double *c,
                                 idx_t c_rs, const double *init)
{
    tile_f64(kc, a, b, c, c_rs, init);
}

#endif
