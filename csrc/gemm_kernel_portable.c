/* The GEMM micro-kernels for any CPU: plain C that the compiler unrolls
 * and vectorises with the baseline ISA. One body, defined per type. */
#include "gemm_kernels.h"

#define MR GEMM_PORTABLE_MR
#define NR GEMM_PORTABLE_NR

/* c (MR, NR) = init (NR) + a (kc, MR)^T . b (kc, NR), or c += a^T . b
 * when init is NULL (a's steps a_step apart); the two exported forms fix
 * init at compile time. */
#define DEFINE_PORTABLE_UKERNELS(real, sfx)                                                \
    static inline void tile_##sfx(idx_t kc, const real *a, idx_t a_step, const real *b,    \
                                  real *c, idx_t c_rs, const real *init)                   \
    {                                                                                      \
        real acc[MR][NR];                                                                  \
        for (int i = 0; i < MR; i++)                                                       \
            for (int j = 0; j < NR; j++) acc[i][j] = init ? init[j] : 0;                   \
        for (idx_t p = 0; p < kc; p++, a += a_step, b += NR)                               \
            for (int i = 0; i < MR; i++)                                                   \
                for (int j = 0; j < NR; j++) acc[i][j] += a[i] * b[j];                     \
        for (int i = 0; i < MR; i++)                                                       \
            for (int j = 0; j < NR; j++)                                                   \
                c[i * c_rs + j] = init ? acc[i][j] : c[i * c_rs + j] + acc[i][j];          \
    }                                                                                      \
    GEMM_DEFINE_UKERNELS(real, sfx, portable, tile_##sfx)

DEFINE_PORTABLE_UKERNELS(float, f32)
DEFINE_PORTABLE_UKERNELS(double, f64)
