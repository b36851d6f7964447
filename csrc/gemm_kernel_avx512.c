/* The GEMM micro-kernels for AVX-512 (F, VL, DQ) + FMA, compiled for that
 * ISA here only: gemm.c calls them only when the CPU has it (cpu.c). Per
 * step p, one row of B (one zmm vector) is loaded with an aligned load and
 * each of the MR = 12 elements of A is broadcast into an FMA with it: 12
 * FMAs per load and 12 broadcasts, 12 + 2 of the 32 zmm registers. */
#include "gemm_kernels.h"

#ifdef GEMM_HAVE_AVX2
#include <immintrin.h>
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma")

#define MR GEMM_AVX512_MR

/* Start loading a C tile row (64 bytes: first and last element, as it may
 * straddle two cache lines) while the K loop runs: C is read only at the
 * end, often from L3. */
static inline void prefetch_row(const void *first, const void *last)
{
    _mm_prefetch((const char *)first, _MM_HINT_T0);
    _mm_prefetch((const char *)last, _MM_HINT_T0);
}

/* The unroll pragmas keep acc in registers. */

/* c (12, 16) = init (16) + a (kc, 12)^T . b (kc, 16), or c += a^T . b */
static inline __attribute__((always_inline)) void
tile_f32(idx_t kc, const float *a, const float *b, float *c, idx_t c_rs, const float *init)
{
    __m512 acc[MR];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
        acc[i] = init ? _mm512_loadu_ps(init) : _mm512_setzero_ps();
        prefetch_row(c + i * c_rs, c + i * c_rs + 15);
    }
    for (idx_t p = 0; p < kc; p++, a += MR, b += 16) {
        __m512 b_row = _mm512_load_ps(b);
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(a[i]), b_row, acc[i]);
    }
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++, c += c_rs)
        _mm512_storeu_ps(c, init ? acc[i] : _mm512_add_ps(_mm512_loadu_ps(c), acc[i]));
}

/* c (12, 8) = init (8) + a (kc, 12)^T . b (kc, 8), or c += a^T . b */
static inline __attribute__((always_inline)) void
tile_f64(idx_t kc, const double *a, const double *b, double *c, idx_t c_rs, const double *init)
{
    __m512d acc[MR];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
        acc[i] = init ? _mm512_loadu_pd(init) : _mm512_setzero_pd();
        prefetch_row(c + i * c_rs, c + i * c_rs + 7);
    }
    for (idx_t p = 0; p < kc; p++, a += MR, b += 8) {
        __m512d b_row = _mm512_load_pd(b);
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) acc[i] = _mm512_fmadd_pd(_mm512_set1_pd(a[i]), b_row, acc[i]);
    }
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++, c += c_rs)
        _mm512_storeu_pd(c, init ? acc[i] : _mm512_add_pd(_mm512_loadu_pd(c), acc[i]));
}

/* The exported forms (gemm_kernels.h), with init fixed at compile time. */
void gemm_ukernel_f32_avx512(idx_t kc, const float *a, const float *b, float *c, idx_t c_rs)
{
    tile_f32(kc, a, b, c, c_rs, NULL);
}

void gemm_ukernel_store_f32_avx512(idx_t kc, const float *a, const float *b, float *c,
                                   idx_t c_rs, const float *init)
{
    tile_f32(kc, a, b, c, c_rs, init);
}

void gemm_ukernel_f64_avx512(idx_t kc, const double *a, const double *b, double *c, idx_t c_rs)
{
    tile_f64(kc, a, b, c, c_rs, NULL);
}

void gemm_ukernel_store_f64_avx512(idx_t kc, const double *a, const double *b, double *c,
                                   idx_t c_rs, const double *init)
{
    tile_f64(kc, a, b, c, c_rs, init);
}

#endif
