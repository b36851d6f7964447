/* The GEMM micro-kernels for AVX-512 (F, VL, DQ) + FMA, compiled for that
 * ISA here only: gemm.c calls them only when the CPU has it (cpu.c). Per
 * step p, one row of B (two zmm vectors) is loaded with aligned loads and
 * each of the MR = 12 elements of A is broadcast into two FMAs with it:
 * 24 FMAs per 2 loads and 12 broadcasts, 24 + 3 of the 32 zmm registers. */
#include "gemm_kernels.h"

#ifdef GEMM_HAVE_AVX2
#include <immintrin.h>
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma")

#define MR GEMM_AVX512_MR

/* Start loading a C tile row (first and last element: it may straddle
 * cache lines) while the K loop runs: C is read only at the end, often
 * from L3. */
static inline void prefetch_row(const void *first, const void *last)
{
    _mm_prefetch((const char *)first, _MM_HINT_T0);
    _mm_prefetch((const char *)last, _MM_HINT_T0);
}

/* One tile routine per dtype, from one body:
 *   c (12, 2 * LANES) = init (2 * LANES) + a (kc, 12)^T . b (kc, 2 * LANES),
 *   or c += a^T . b when init is NULL.
 * The unroll pragmas keep acc in registers. */
#define DEFINE_TILE(name, real, vec, LANES, sfx)                                                  \
    static inline __attribute__((always_inline)) void                                             \
    name(idx_t kc, const real *a, const real *b, real *c, idx_t c_rs, const real *init)            \
    {                                                                                              \
        vec acc[MR][2];                                                                            \
        _Pragma("GCC unroll 12") for (int i = 0; i < MR; i++)                                      \
        {                                                                                          \
            acc[i][0] = init ? _mm512_loadu_##sfx(init) : _mm512_setzero_##sfx();                  \
            acc[i][1] = init ? _mm512_loadu_##sfx(init + LANES) : _mm512_setzero_##sfx();          \
            prefetch_row(c + i * c_rs, c + i * c_rs + 2 * LANES - 1);                              \
        }                                                                                          \
        for (idx_t p = 0; p < kc; p++, a += MR, b += 2 * LANES) {                                  \
            vec b0 = _mm512_load_##sfx(b), b1 = _mm512_load_##sfx(b + LANES);                      \
            _Pragma("GCC unroll 12") for (int i = 0; i < MR; i++)                                  \
            {                                                                                      \
                vec ai = _mm512_set1_##sfx(a[i]);                                                  \
                acc[i][0] = _mm512_fmadd_##sfx(ai, b0, acc[i][0]);                                 \
                acc[i][1] = _mm512_fmadd_##sfx(ai, b1, acc[i][1]);                                 \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 12") for (int i = 0; i < MR; i++, c += c_rs)                           \
        {                                                                                          \
            if (!init) {                                                                           \
                acc[i][0] = _mm512_add_##sfx(_mm512_loadu_##sfx(c), acc[i][0]);                    \
                acc[i][1] = _mm512_add_##sfx(_mm512_loadu_##sfx(c + LANES), acc[i][1]);            \
            }                                                                                      \
            _mm512_storeu_##sfx(c, acc[i][0]);                                                     \
            _mm512_storeu_##sfx(c + LANES, acc[i][1]);                                             \
        }                                                                                          \
    }

DEFINE_TILE(tile_f32, float, __m512, 16, ps)
DEFINE_TILE(tile_f64, double, __m512d, 8, pd)

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
