/* The body of the AVX2 and AVX-512 micro-kernels, for any vector width:
 * include in a translation unit compiled for the ISA, after <immintrin.h>
 * and defining MR. Per step p, one row of B (two vectors) is loaded with
 * aligned loads and each of the MR elements of A is broadcast into two
 * FMAs with it: 2 * MR FMAs per 2 loads and MR broadcasts.
 *
 * GEMM_SIMD_TILE(name, real, vec, BITS, LANES, sfx) defines
 *   name: c (MR, 2 * LANES) = init (2 * LANES) + a (kc, MR)^T . b (kc, 2 * LANES),
 *         or c += a^T . b when init is NULL; a's steps are a_step apart,
 * with the _mm<BITS>_*_<sfx> intrinsics (BITS 256 or 512, sfx ps or pd).
 * The unroll pragmas keep acc in registers (without them GCC 12 spills the
 * array to the stack on every step). */
/* Start loading a C tile row (first and last element: it may straddle
 * cache lines) while the K loop runs: C is read only at the end, often
 * from L3, and waiting for it then cost a sixth of the kernel's time. */
static inline void prefetch_row(const void *first, const void *last)
{
    _mm_prefetch((const char *)first, _MM_HINT_T0);
    _mm_prefetch((const char *)last, _MM_HINT_T0);
}

#define GEMM_SIMD_TILE(name, real, vec, BITS, LANES, sfx)                                         \
    static inline __attribute__((always_inline)) void                                             \
    name(idx_t kc, const real *a, idx_t a_step, const real *b, real *c, idx_t c_rs,                \
         const real *init)                                                                         \
    {                                                                                              \
        vec acc[MR][2];                                                                            \
        _Pragma("GCC unroll 12") for (int i = 0; i < MR; i++)                                      \
        {                                                                                          \
            acc[i][0] = init ? _mm##BITS##_loadu_##sfx(init) : _mm##BITS##_setzero_##sfx();        \
            acc[i][1] = init ? _mm##BITS##_loadu_##sfx(init + LANES) : _mm##BITS##_setzero_##sfx(); \
            prefetch_row(c + i * c_rs, c + i * c_rs + 2 * LANES - 1);                              \
        }                                                                                          \
        for (idx_t p = 0; p < kc; p++, a += a_step, b += 2 * LANES) {                              \
            vec b0 = _mm##BITS##_load_##sfx(b), b1 = _mm##BITS##_load_##sfx(b + LANES);            \
            _Pragma("GCC unroll 12") for (int i = 0; i < MR; i++)                                  \
            {                                                                                      \
                vec ai = _mm##BITS##_set1_##sfx(a[i]);                                             \
                acc[i][0] = _mm##BITS##_fmadd_##sfx(ai, b0, acc[i][0]);                            \
                acc[i][1] = _mm##BITS##_fmadd_##sfx(ai, b1, acc[i][1]);                            \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 12") for (int i = 0; i < MR; i++, c += c_rs)                           \
        {                                                                                          \
            if (!init) {                                                                           \
                acc[i][0] = _mm##BITS##_add_##sfx(_mm##BITS##_loadu_##sfx(c), acc[i][0]);          \
                acc[i][1] = _mm##BITS##_add_##sfx(_mm##BITS##_loadu_##sfx(c + LANES), acc[i][1]);  \
            }                                                                                      \
            _mm##BITS##_storeu_##sfx(c, acc[i][0]);                                                \
            _mm##BITS##_storeu_##sfx(c + LANES, acc[i][1]);                                        \
        }                                                                                          \
    }
