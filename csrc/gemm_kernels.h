/* The GEMM micro-kernels and the tile shapes they compute.
 *
 * Each kernel computes one register-blocked tile of C, in two forms:
 *   gemm_ukernel_*:        c (MR, NR) += a (kc, MR)^T . b (kc, NR)
 *   gemm_ukernel_store_*:  c (MR, NR)  = init (NR) + a^T . b,
 *                          init being the same row for every row of c
 * c's rows are c_rs apart. b is a packed sliver: for each step p, NR
 * elements of a column of B^T, contiguous and 64-byte aligned (the AVX-512
 * kernels load a whole row of B with aligned loads). a holds, for each
 * step p, MR contiguous elements (only broadcast, never vector-loaded), and
 * steps are a_step apart: MR for a packed sliver, or the row length of a
 * matrix read in place (attention's probabilities). attnc_gemm's first K block stores (init = the bias), so
 * C is never cleared or re-read just to add the bias; later blocks add.
 * MR x NR is as large as the accumulators registers can hold.
 */
#ifndef ATTNC_GEMM_KERNELS_H
#define ATTNC_GEMM_KERNELS_H

#include "attnc.h"

/* x86 with GCC or Clang: the AVX2 and AVX-512 kernels are compiled (and
 * called only when the CPU has the ISA, cpu.c). */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define GEMM_HAVE_AVX2 1
#endif

/* Portable C: 4 x 8 accumulators, which the baseline SSE2 (16 xmm
 * registers) holds for float and nearly holds for double. */
#define GEMM_PORTABLE_MR 4
#define GEMM_PORTABLE_NR 8

/* AVX2: 6 rows x 2 vectors = 12 ymm accumulators, plus 2 for the B row and
 * 1 for the broadcast A element: 15 of the 16 ymm registers. */
#define GEMM_AVX2_MR 6
#define GEMM_AVX2_NR_F32 16
#define GEMM_AVX2_NR_F64 8

/* AVX-512: 12 rows x 2 zmm vectors = 24 accumulators of the 32 registers.
 * On Zen 5 (full-width zmm FMAs) 12 x 32 reaches 240 GFLOP/s per core in
 * cache against 219 for 12 x 16 (half the loads per FMA); on Zen 4 the two
 * measured the same. MR = 12 divides BLOCK_K and NR = 32, 16 divide
 * BLOCK_Q (attention_tiles.h). */
#define GEMM_AVX512_MR 12
#define GEMM_AVX512_NR_F32 32
#define GEMM_AVX512_NR_F64 16

/* The largest NR and MR x NR of any kernel: sizes of edge-tile buffers. */
#define GEMM_MAX_NR GEMM_AVX512_NR_F32
#define GEMM_MAX_TILE (GEMM_AVX512_MR * GEMM_AVX512_NR_F32)

#define GEMM_DECLARE_UKERNELS(real, sfx, isa)                                                \
    void gemm_ukernel_##sfx##_##isa(idx_t kc, const real *a, idx_t a_step, const real *b,     \
                                    real *c, idx_t c_rs);                                      \
    void gemm_ukernel_store_##sfx##_##isa(idx_t kc, const real *a, idx_t a_step,              \
                                          const real *b, real *c, idx_t c_rs,                  \
                                          const real *init);

GEMM_DECLARE_UKERNELS(float, f32, portable)
GEMM_DECLARE_UKERNELS(double, f64, portable)
#ifdef GEMM_HAVE_AVX2
GEMM_DECLARE_UKERNELS(float, f32, avx2)
GEMM_DECLARE_UKERNELS(double, f64, avx2)
GEMM_DECLARE_UKERNELS(float, f32, avx512)
GEMM_DECLARE_UKERNELS(double, f64, avx512)
#endif
#undef GEMM_DECLARE_UKERNELS

/* The two exported forms of a kernel from its tile routine (same arguments,
 * init last), with init fixed at compile time: for the kernel files. */
#define GEMM_DEFINE_UKERNELS(real, sfx, isa, tile)                                                \
    void gemm_ukernel_##sfx##_##isa(idx_t kc, const real *a, idx_t a_step, const real *b,        \
                                    real *c, idx_t c_rs)                                          \
    {                                                                                              \
        tile(kc, a, a_step, b, c, c_rs, NULL);                                                     \
    }                                                                                              \
    void gemm_ukernel_store_##sfx##_##isa(idx_t kc, const real *a, idx_t a_step,                 \
                                          const real *b, real *c, idx_t c_rs, const real *init)  \
    {                                                                                              \
        tile(kc, a, a_step, b, c, c_rs, init);                                                     \
    }

#endif
