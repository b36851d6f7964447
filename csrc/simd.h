/* The SIMD vocabulary the kernel bodies are written against, once for
 * every ISA level (dtype and ISA template: include after dtype.h, in a
 * translation unit whose ISA macro, ATTNC_ISA_AVX2 or ATTNC_ISA_AVX512, is
 * set by kernel_bundle.h's includer; neither means portable C).
 *
 *   vreal              a vector of VLANES reals
 *   vzero(), vset1(x)  all zeros, x in every lane
 *   vload(p)           from p aligned to the vector's size
 *   vloadu(p)          from any p;  vstoreu(p, v) to any p
 *   vstore_first(p, v, n)  lanes [0, n) of v to p (n <= VLANES), and
 *                      nothing past them: a masked store at AVX-512,
 *                      plain stores of the bytes at AVX2 (see there)
 *   vload_first(p, n)  lanes [0, n) from p (n <= VLANES), the rest 0,
 *                      and nothing read past them: a masked load at AVX2
 *                      and AVX-512
 *   vnonzero_bytes(p)  a lane mask: lane l all ones where byte p[l] is
 *                      nonzero, else 0 (VLANES bytes read)
 *   vadd(a, b)         a + b
 *   vselect(mask, a, b)  a in the lanes where mask (a compare's lanes of
 *                      all ones) is set, else b
 *   vmax(a, b), vmin(a, b)  a > b ? a : b, a < b ? a : b in each lane (b
 *                      where either is NaN, as x86's max and min)
 *   vfma(a, b, c)      a * b + c, fused where the ISA has FMA
 *   sfma(a, b, c)      the scalar twin of vfma: the same rounding, so a
 *                      scalar loop gets the micro-kernel's bits
 *   vtranspose(rows)   rows[VLANES] <- its transpose (a VLANES x VLANES
 *                      block, in registers)
 *   vload_blocks(at)   a vector's 16-byte blocks, block b from at[b]
 *                      (AVX2 and AVX-512: VLOAD_BLOCKS): loads that do
 *                      vtranspose's steps across blocks, so that
 *                      vtranspose_in_blocks finishes it
 *   vmac(pairs, a, b, acc)  the micro-kernel's step: vfma(a, b, acc), or
 *                      with pairs (BF16_PAIRS only) vdot_pairs(a, b, acc):
 *                      a and b hold a pair of bfloat16 per 32-bit lane
 *   GEMM_MR            rows of the GEMM micro-kernel (its columns are
 *                      GEMM_NR = 2 vectors): as many accumulators as the
 *                      registers hold
 * Vectors are GCC/Clang vector extensions of the ISA's width (16 bytes at
 * the portable level: SSE2 on x86-64, NEON elsewhere), so every operation
 * but the fused multiply-add, max and min, the lane masks and the loads and
 * stores of a vector's first lanes is written once. The row
 * reductions are scalar code the compiler vectorises; the exp is written in
 * this vocabulary (vexp.h). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifndef ATTNC_SIMD_NAMES
#define ATTNC_SIMD_NAMES
#define vreal FN(vreal)
#define vzero FN(vzero)
#define vset1 FN(vset1)
#define vload FN(vload)
#define vloadu FN(vloadu)
#define vstoreu FN(vstoreu)
#define vstore_first FN(vstore_first)
#define vload_first FN(vload_first)
#define vnonzero_bytes FN(vnonzero_bytes)
#define vadd FN(vadd)
#define vselect FN(vselect)
#define vmax FN(vmax)
#define vmin FN(vmin)
#define vfma FN(vfma)
#define sfma FN(sfma)
#define vlanes_mask FN(vlanes_mask)
#define vtranspose FN(vtranspose)
#define vtranspose_in_blocks FN(vtranspose_in_blocks)
#define vload_blocks FN(vload_blocks)
#define vload_block_pair FN(vload_block_pair)
#define vdot_pairs FN(vdot_pairs)
#define vmac FN(vmac)
#define VLANES ((int)(sizeof(vreal) / sizeof(real)))
#define GEMM_NR (2 * VLANES)
#endif

#if defined(ATTNC_ISA_AVX512) || defined(ATTNC_ISA_AVX2)
#include <immintrin.h>
#endif

/* BF16_PAIRS: this instantiation (bfloat16 at the AVX512_BF16 level,
 * kernels_avx512bf16.c) multiplies bfloat16 pairs by vdot_pairs, twice the
 * products of vfma per instruction. */
#undef BF16_PAIRS
#if defined(ATTNC_ISA_AVX512BF16) && defined(ATTNC_REAL_BF16)
#  define BF16_PAIRS 1
#else
#  define BF16_PAIRS 0
#endif

/* Per ISA: the vector's width, the micro-kernel's rows, and the operations
 * the vector extensions do not spell well: a multiply-add that is fused at
 * every optimisation level (the compiler's contraction of a * b + c is not,
 * and sfma must match it bit for bit), a broadcast (GCC turns (vreal){0} + x
 * into an add and a shuffle), and max and min (a select in vector code, one
 * instruction each here). */
#undef SIMD_BYTES
#undef SIMD_LANES
#undef LANE_LIST
#undef GEMM_MR
#undef FUSED_MULTIPLY_ADD
#undef BROADCAST
#undef LANE_MAX
#undef LANE_MIN
#if defined(ATTNC_ISA_AVX512)
/* 12 rows x 2 zmm = 24 accumulators of the 32 registers, + 2 for B and 1
 * for the broadcast A element. On Zen 5 (full-width zmm FMAs) 12 x 32
 * floats reach 240 GFLOP/s per core in cache against 219 for 12 x 16. */
#  define SIMD_BYTES 64
#  define GEMM_MR 12
#  define FUSED_MULTIPLY_ADD(sfx) _mm512_fmadd_##sfx
#  define BROADCAST(sfx) _mm512_set1_##sfx
#  define LANE_MAX(sfx) _mm512_max_##sfx
#  define LANE_MIN(sfx) _mm512_min_##sfx
#elif defined(ATTNC_ISA_AVX2)
/* 6 rows x 2 ymm = 12 accumulators, + 2 for B and 1 for the broadcast A
 * element: 15 of the 16 registers. */
#  define SIMD_BYTES 32
#  define GEMM_MR 6
#  define FUSED_MULTIPLY_ADD(sfx) _mm256_fmadd_##sfx
#  define BROADCAST(sfx) _mm256_set1_##sfx
#  define LANE_MAX(sfx) _mm256_max_##sfx
#  define LANE_MIN(sfx) _mm256_min_##sfx
#else
/* 4 rows x 2 vectors of 16 bytes: 8 accumulators of the 16 SSE2 registers.
 * ATTNC_PORTABLE_BYTES=32 or 64 (setup.py: ATTNC_PORTABLE_VECTOR_BYTES)
 * gives this level the AVX2 or AVX-512 shapes in plain vector code, so
 * every kernel's logic at those widths is tested on any CPU
 * (.ci/wide_vectors.sh). */
#  ifndef ATTNC_PORTABLE_BYTES
#    define ATTNC_PORTABLE_BYTES 16
#  endif
#  define SIMD_BYTES ATTNC_PORTABLE_BYTES
#  define GEMM_MR (SIMD_BYTES == 64 ? 12 : SIMD_BYTES == 32 ? 6 : 4)
#endif

/* VLANES for the preprocessor, and F(lane, arg) for every lane, in order:
 * the shuffle masks below must be constants */
#if defined(ATTNC_COMPUTE_F32)
#  define SIMD_LANES (SIMD_BYTES / 4)
#else
#  define SIMD_LANES (SIMD_BYTES / 8)
#endif
#if SIMD_LANES == 2
#  define LANE_LIST(F, d) F(0, d), F(1, d)
#elif SIMD_LANES == 4
#  define LANE_LIST(F, d) F(0, d), F(1, d), F(2, d), F(3, d)
#elif SIMD_LANES == 8
#  define LANE_LIST(F, d) F(0, d), F(1, d), F(2, d), F(3, d), F(4, d), F(5, d), F(6, d), F(7, d)
#else
#  define LANE_LIST(F, d)                                                                        \
      F(0, d), F(1, d), F(2, d), F(3, d), F(4, d), F(5, d), F(6, d), F(7, d), F(8, d), F(9, d),  \
      F(10, d), F(11, d), F(12, d), F(13, d), F(14, d), F(15, d)
#endif

/* the same type as the ISA's __m128/__m256/__m512 (or their double forms) */
typedef real vreal __attribute__((vector_size(SIMD_BYTES)));

static inline vreal vzero(void) { return (vreal){0}; }
static inline vreal vload(const real *p) { return *(const vreal *)p; }
static inline vreal vloadu(const real *p)
{
    vreal v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void vstoreu(real *p, vreal v) { memcpy(p, &v, sizeof v); }
static inline vreal vadd(vreal a, vreal b) { return a + b; }

/* Shuffle masks: lane indices below VLANES pick from the first vector,
 * the others from the second. */
#if defined(ATTNC_COMPUTE_F32)
typedef int32_t vlanes_mask __attribute__((vector_size(SIMD_BYTES)));
#else
typedef int64_t vlanes_mask __attribute__((vector_size(SIMD_BYTES)));
#endif
/* The transpose is built from one kind of step, even/odd: lanes are cut
 * into spans of `span` lanes, each span into units of g lanes; from rows a
 * and b, the even step keeps the even units of a's span, then of b's (the
 * odd step, the odd units). Two such steps over spans of four units (rows
 * d = 1 and 2 apart, or 4 and 8) transpose a 4 x 4 grid of units; one over
 * two units (span 2g) a 2 x 2 grid. Each is one x86 instruction (shufps,
 * unpcklpd, vperm2f128, vshuff32x4, vshuff64x2) or NEON's uzp1 / uzp2,
 * where the swaps of halving blocks this replaced needed two-source
 * permutes (vpermt2ps): a (1, 768) x (2304, 768)^T `linear` (weights
 * turned in registers) took 0.93x the time on a Zen 4 core
 * (benchmarks/NOTES.md). Lane l of a step: */
#define UNITS(span, g) ((span) / (g))
#define EVEN_ODD_LANE(l, g, span, odd)                                                                    \
    ((l) - (l) % (span) + ((l) % (span) / (g) % (UNITS(span, g) / 2) * 2 + (odd)) * (g) + (l) % (g) + \
     ((l) % (span) / (g) >= UNITS(span, g) / 2 ? SIMD_LANES : 0))
/* the two kinds of spans: each 16-byte block (units of one lane), and the
 * whole vector (units of a block) */
#if defined(ATTNC_COMPUTE_F32)
#  define BLOCK_LANES 4
#else
#  define BLOCK_LANES 2
#endif
#define IN_BLOCK(l, odd) EVEN_ODD_LANE(l, 1, BLOCK_LANES, odd)
#define OF_BLOCKS(l, odd) EVEN_ODD_LANE(l, BLOCK_LANES, SIMD_LANES, odd)
/* rows i and i + d (bit d of i clear) <- the even and odd steps of them */
#define EVEN_ODD_STEPS(d, LANE)                                                         \
    for (int i = 0; i < SIMD_LANES; i++)                                                \
        if (!(i & (d))) {                                                               \
            vreal a = rows[i], b = rows[i + (d)];                                       \
            rows[i] = __builtin_shuffle(a, b, (vlanes_mask){LANE_LIST(LANE, 0)});       \
            rows[i + (d)] = __builtin_shuffle(a, b, (vlanes_mask){LANE_LIST(LANE, 1)}); \
        }
/* Each 16-byte block column of every BLOCK_LANES rows transposed in place;
 * with vtranspose's steps across blocks (which commute with these), the
 * whole block. */
static inline __attribute__((always_inline)) void vtranspose_in_blocks(vreal rows[SIMD_LANES])
{
    EVEN_ODD_STEPS(1, IN_BLOCK)
#if BLOCK_LANES == 4
    EVEN_ODD_STEPS(2, IN_BLOCK)
#endif
}

static inline __attribute__((always_inline)) void vtranspose(vreal rows[SIMD_LANES])
{
    vtranspose_in_blocks(rows);
#if SIMD_LANES > BLOCK_LANES /* two blocks: one step; four: two */
    EVEN_ODD_STEPS(BLOCK_LANES, OF_BLOCKS)
#endif
#if SIMD_LANES > 2 * BLOCK_LANES
    EVEN_ODD_STEPS(2 * BLOCK_LANES, OF_BLOCKS)
#endif
}
#undef EVEN_ODD_STEPS
#undef OF_BLOCKS
#undef IN_BLOCK
#undef EVEN_ODD_LANE
#undef UNITS

/* A vector of 16-byte blocks, block b loaded from at[b], at AVX2 and
 * AVX-512 (VLOAD_BLOCKS: the blocks a vector holds): two blocks are joined
 * by an insert from memory, which needs no shuffle port, and at AVX-512 two
 * such halves by one insert. Rows loaded a block at a time so need only
 * vtranspose's steps within blocks: the steps across blocks are in the
 * loads' addresses (load_turned). At AVX-512 that is half the shuffles of
 * whole loads turned by vtranspose, whose shuffles share a port with the
 * multiply-adds (GEMM_FEW_ROWS_BY_BLOCKS_FROM). The portable level has no
 * such instruction (SSE2 builds a float vector from halves through the
 * stack). */
#undef VLOAD_BLOCKS
#if defined(ATTNC_ISA_AVX2) || defined(ATTNC_ISA_AVX512)
#  define VLOAD_BLOCKS (SIMD_BYTES / 16)
#endif
#if defined(VLOAD_BLOCKS) && defined(ATTNC_COMPUTE_F32)
static inline __m256 vload_block_pair(const real *low, const real *high)
{
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(low)), _mm_loadu_ps(high), 1);
}
#elif defined(VLOAD_BLOCKS)
static inline __m256d vload_block_pair(const real *low, const real *high)
{
    return _mm256_insertf128_pd(_mm256_castpd128_pd256(_mm_loadu_pd(low)), _mm_loadu_pd(high), 1);
}
#endif
#if defined(VLOAD_BLOCKS) && VLOAD_BLOCKS == 4 && defined(ATTNC_COMPUTE_F32)
static inline vreal vload_blocks(const real *const at[VLOAD_BLOCKS])
{
    return _mm512_insertf32x8(_mm512_castps256_ps512(vload_block_pair(at[0], at[1])), vload_block_pair(at[2], at[3]),
                              1);
}
#elif defined(VLOAD_BLOCKS) && VLOAD_BLOCKS == 4
static inline vreal vload_blocks(const real *const at[VLOAD_BLOCKS])
{
    return _mm512_insertf64x4(_mm512_castpd256_pd512(vload_block_pair(at[0], at[1])), vload_block_pair(at[2], at[3]),
                              1);
}
#elif defined(VLOAD_BLOCKS)
static inline vreal vload_blocks(const real *const at[VLOAD_BLOCKS]) { return vload_block_pair(at[0], at[1]); }
#endif
#undef BLOCK_LANES

#if defined(FUSED_MULTIPLY_ADD) && defined(ATTNC_COMPUTE_F32)
static inline vreal vset1(real x) { return BROADCAST(ps)(x); }
static inline vreal vfma(vreal a, vreal b, vreal c) { return FUSED_MULTIPLY_ADD(ps)(a, b, c); }
static inline real sfma(real a, real b, real c) { return fmaf(a, b, c); }
#elif defined(FUSED_MULTIPLY_ADD)
static inline vreal vset1(real x) { return BROADCAST(pd)(x); }
static inline vreal vfma(vreal a, vreal b, vreal c) { return FUSED_MULTIPLY_ADD(pd)(a, b, c); }
static inline real sfma(real a, real b, real c) { return fma(a, b, c); }
#else /* no FMA instruction at the baseline: both round the product */
static inline vreal vset1(real x) { return (vreal){0} + x; }
static inline vreal vfma(vreal a, vreal b, vreal c) { return a * b + c; }
static inline real sfma(real a, real b, real c) { return a * b + c; }
#endif

/* take_a's lanes of a, the others of b (a compare gives a lane of all ones) */
static inline vreal vselect(vlanes_mask take_a, vreal a, vreal b)
{
    return (vreal)(((vlanes_mask)a & take_a) | ((vlanes_mask)b & ~take_a));
}

/* x86's max and min at the AVX2 and AVX-512 levels; the same selects in
 * vector code at the portable level */
#if defined(LANE_MAX) && defined(ATTNC_COMPUTE_F32)
static inline vreal vmax(vreal a, vreal b) { return LANE_MAX(ps)(a, b); }
static inline vreal vmin(vreal a, vreal b) { return LANE_MIN(ps)(a, b); }
#elif defined(LANE_MAX)
static inline vreal vmax(vreal a, vreal b) { return LANE_MAX(pd)(a, b); }
static inline vreal vmin(vreal a, vreal b) { return LANE_MIN(pd)(a, b); }
#else
static inline vreal vmax(vreal a, vreal b) { return vselect(a > b, a, b); }
static inline vreal vmin(vreal a, vreal b) { return vselect(a < b, a, b); }
#endif

#if defined(ATTNC_ISA_AVX512) && defined(ATTNC_COMPUTE_F32)
static inline void vstore_first(real *p, vreal v, int n) { _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), v); }
#elif defined(ATTNC_ISA_AVX512)
static inline void vstore_first(real *p, vreal v, int n) { _mm512_mask_storeu_pd(p, (__mmask8)((1u << n) - 1), v); }
#elif defined(ATTNC_ISA_AVX2)
/* Not AVX2's masked store: vmaskmovps/pd to memory is microcoded on AMD's
 * Zen 1-3 (about one per 12 cycles), and half of packing a GEMM's 6-row A
 * slivers waited on it (benchmarks/NOTES.md). The n * sizeof(real) bytes go
 * out as plain stores of 16, 8 and 4 bytes by the bits of that count, each
 * from the low end of what is left of v; float and double alike. */
static inline void vstore_first(real *p, vreal v, int n)
{
    size_t bytes = (size_t)n * sizeof(real);
    if (bytes == sizeof(vreal)) {
        vstoreu(p, v);
        return;
    }
    char *dst = (char *)p;
    __m128 rest = _mm256_castps256_ps128((__m256)v);
    if (bytes & 16) {
        _mm_storeu_ps((float *)dst, rest);
        dst += 16;
        rest = _mm256_extractf128_ps((__m256)v, 1);
    }
    if (bytes & 8) {
        _mm_storel_epi64((__m128i *)dst, _mm_castps_si128(rest));
        dst += 8;
        rest = _mm_movehl_ps(rest, rest);
    }
    if (bytes & 4) _mm_store_ss((float *)dst, rest);
}
#else
static inline void vstore_first(real *p, vreal v, int n) { memcpy(p, &v, (size_t)n * sizeof(real)); }
#endif

#if defined(ATTNC_ISA_AVX512) && defined(ATTNC_COMPUTE_F32)
static inline vreal vload_first(const real *p, int n) { return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p); }
#elif defined(ATTNC_ISA_AVX512)
static inline vreal vload_first(const real *p, int n) { return _mm512_maskz_loadu_pd((__mmask8)((1u << n) - 1), p); }
#elif defined(ATTNC_ISA_AVX2) && defined(ATTNC_COMPUTE_F32)
/* (AVX2's masked load, unlike its store, is not microcoded on AMD) */
static inline vreal vload_first(const real *p, int n)
{
    return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}
#elif defined(ATTNC_ISA_AVX2)
static inline vreal vload_first(const real *p, int n)
{
    return _mm256_maskload_pd(p, _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), _mm256_setr_epi64x(0, 1, 2, 3)));
}
#else
static inline vreal vload_first(const real *p, int n)
{
    vreal v = vzero();
    memcpy(&v, p, (size_t)n * sizeof(real));
    return v;
}
#endif

/* One zero-extending load where the ISA has it (at AVX2's double, 4 bytes
 * through memcpy and movd, which GCC folds into it): GCC 12 widened a
 * vector of 8 bytes (__builtin_convertvector) one byte at a time, about 25
 * scalar instructions for 8 lanes. An (L, S) boolean mask on (2, 4, 128,
 * 64) then added 0.71 M instructions to a call's 5.29 M; now 0.23 M, and
 * 0.88-0.92x the time (benchmarks/NOTES.md). */
#if defined(ATTNC_ISA_AVX512) && defined(ATTNC_COMPUTE_F32)
static inline vlanes_mask vnonzero_bytes(const uint8_t *p)
{
    return (vlanes_mask)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)) != 0;
}
#elif defined(ATTNC_ISA_AVX512)
static inline vlanes_mask vnonzero_bytes(const uint8_t *p)
{
    return (vlanes_mask)_mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)p)) != 0;
}
#elif defined(ATTNC_ISA_AVX2) && defined(ATTNC_COMPUTE_F32)
static inline vlanes_mask vnonzero_bytes(const uint8_t *p)
{
    return (vlanes_mask)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)) != 0;
}
#elif defined(ATTNC_ISA_AVX2)
static inline vlanes_mask vnonzero_bytes(const uint8_t *p)
{
    int32_t four;
    memcpy(&four, p, sizeof four);
    return (vlanes_mask)_mm256_cvtepu8_epi64(_mm_cvtsi32_si128(four)) != 0;
}
#else
static inline vlanes_mask vnonzero_bytes(const uint8_t *p)
{
    typedef uint8_t lanes_bytes __attribute__((vector_size(SIMD_LANES)));
    lanes_bytes bytes;
    memcpy(&bytes, p, sizeof bytes);
    return __builtin_convertvector(bytes, vlanes_mask) != 0;
}
#endif

#if BF16_PAIRS
/* acc + a.first * b.first + a.second * b.second in each lane, where a lane
 * of a and of b holds a pair of bfloat16 (the first in its low half):
 * AVX512_BF16's vdpbf16ps. A test build (ATTNC_EMULATE_BF16_DOT,
 * .ci/bf16_dot_emulated.sh) runs the kernels on any AVX-512 CPU with the
 * instruction emulated as Intel's pseudo-code for it reads: the second
 * products added first, then the first, each sum rounded (a product of two
 * bfloat16 is exact in float), subnormal inputs taken as zeros and
 * subnormal sums flushed to zeros (both keep their sign). */
#  if defined(ATTNC_EMULATE_BF16_DOT)
typedef uint32_t FN(lanes32) __attribute__((vector_size(SIMD_BYTES)));
/* x with every subnormal lane made a zero of its sign */
static inline FN(lanes32) FN(flush_subnormals)(FN(lanes32) x)
{
    return x & ((FN(lanes32))((x & 0x7f800000u) != 0) | 0x80000000u);
}
static inline vreal vdot_pairs(vreal a, vreal b, vreal acc)
{
    FN(lanes32) x = (FN(lanes32))a, y = (FN(lanes32))b;
    vreal sum = vfma((vreal)FN(flush_subnormals)(x & 0xffff0000u), (vreal)FN(flush_subnormals)(y & 0xffff0000u),
                     (vreal)FN(flush_subnormals)((FN(lanes32))acc));
    sum = (vreal)FN(flush_subnormals)((FN(lanes32))sum);
    sum = vfma((vreal)FN(flush_subnormals)(x << 16), (vreal)FN(flush_subnormals)(y << 16), sum);
    return (vreal)FN(flush_subnormals)((FN(lanes32))sum);
}
#  else
static inline vreal vdot_pairs(vreal a, vreal b, vreal acc) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }
#  endif
#endif

static inline __attribute__((always_inline)) vreal vmac(int pairs, vreal a, vreal b, vreal acc)
{
#if BF16_PAIRS
    if (pairs) return vdot_pairs(a, b, acc);
#endif
    return vfma(a, b, acc);
}
