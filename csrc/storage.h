/* Storage and compute types (dtype and ISA template; include after dtype.h
 * and simd.h). A kernel reads the caller's arrays (elem) into reals and
 * writes reals back as elems:
 *
 *   to_real(x)          one elem, widened (exact)
 *   to_elem(x)          one real, rounded to the nearest elem, ties to even
 *   vload_elems(p)      VLANES elems from any p, as a vreal
 *   vstore_elems(p, v)  v rounded into VLANES elems at any p
 *   load_row, store_row n of them, between elems and reals
 *   store_row_scaled    store_row of the reals times a factor
 *   ELEM_IS_REAL        1 for float and double (all four are plain loads
 *                       and stores), 0 for the 16-bit dtypes
 * and, for bfloat16 where BF16_PAIRS (simd.h), the pairs of elements that
 * vdot_pairs multiplies: vload_pairs, vpair_rows, vround_pairs, pair_of,
 * pair_at, round_for_pairs.
 *
 * float16 uses the CPU's F16C conversions at the AVX2 and AVX-512 levels
 * (cpu.c requires F16C for them) and bit operations at the portable level;
 * bfloat16 is the top half of a float: a shift to widen, a rounding add to
 * narrow. Both round the same way at every level, and NaN stays a (quiet)
 * NaN of the same sign, so results do not depend on the level. */
#ifndef ATTNC_STORAGE_ONCE
#define ATTNC_STORAGE_ONCE
#include <float.h>
#include <math.h>

/* Asks for every 64-byte line the n elements from pointer x touch (the
 * last one too, where they start past a line's start) to come into the
 * cache of `locality` (__builtin_prefetch's constant: 3 L1, 2 L2), forming
 * no address outside them; n 0 asks for nothing. */
#define PREFETCH_ELEMENTS(x, n, locality)                                                                   \
    do {                                                                                                    \
        const char *prefetch_at_ = (const char *)(x);                                                       \
        size_t prefetch_bytes_ = (size_t)(n) * sizeof *(x);                                                 \
        for (size_t offset_ = 0; offset_ < prefetch_bytes_; offset_ += 64)                                  \
            __builtin_prefetch(prefetch_at_ + offset_, 0, locality);                                        \
        if (prefetch_bytes_ && (uintptr_t)prefetch_at_ % 64 + (prefetch_bytes_ - 1) % 64 >= 64)             \
            __builtin_prefetch(prefetch_at_ + prefetch_bytes_ - 1, 0, locality);                            \
    } while (0)

static inline uint32_t attnc_float_bits(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits;
}

static inline float attnc_bits_float(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#if defined(ATTNC_ISA_AVX2) || defined(ATTNC_ISA_AVX512)
static inline float attnc_half_to_float(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t attnc_float_to_half(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
#else
static inline float attnc_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff, bits;
    if (exponent == 0x1f) /* inf, or NaN made quiet as F16C does */
        bits = sign | 0x7f800000 | (mantissa ? 0x400000 | mantissa << 13 : 0);
    else if (exponent) /* normal: rebias the exponent 15 -> 127 */
        bits = sign | (exponent + 112) << 23 | mantissa << 13;
    else { /* zero or subnormal: mantissa * 2^-24, exact in float */
        float magnitude = (float)mantissa * 0x1p-24f;
        return sign ? -magnitude : magnitude;
    }
    return attnc_bits_float(bits);
}

static inline uint16_t attnc_float_to_half(float f)
{
    uint32_t x = attnc_float_bits(f) & 0x7fffffff;
    uint16_t sign = (uint16_t)(attnc_float_bits(f) >> 16 & 0x8000);
    if (x > 0x7f800000) return sign | 0x7e00 | (uint16_t)(x >> 13 & 0x3ff); /* NaN, quiet */
    if (x >= 0x477ff000) return sign | 0x7c00;                          /* 65520 and up round to inf */
    if (x >= 0x38800000) /* a normal half: round the mantissa at bit 13, ties to even, and rebias */
        return sign | (uint16_t)((x + 0xfff + (x >> 13 & 1) - 0x38000000) >> 13);
    if (x <= 0x33000000) return sign; /* at most 2^-25 (half the smallest subnormal): 0 */
    /* a subnormal half: units of 2^-24, ties to even */
    uint32_t mantissa = (x & 0x7fffff) | 0x800000, shift = 126 - (x >> 23);
    uint32_t units = mantissa >> shift, rest = mantissa & ((1u << shift) - 1), half = 1u << (shift - 1);
    units += rest > half || (rest == half && (units & 1));
    return sign | (uint16_t)units;
}
#endif

static inline float attnc_bfloat_to_float(uint16_t h) { return attnc_bits_float((uint32_t)h << 16); }

static inline uint16_t attnc_float_to_bfloat(float f)
{
    uint32_t x = attnc_float_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)(x >> 16 | 0x40); /* NaN, quiet */
    return (uint16_t)((x + 0x7fff + (x >> 16 & 1)) >> 16);
}
#endif

#undef ELEM_IS_REAL
#define to_real FN(to_real)
#define to_elem FN(to_elem)
#define vload_elems FN(vload_elems)
#define vstore_elems FN(vstore_elems)

#if defined(ATTNC_REAL_F32) || defined(ATTNC_REAL_F64)
#  define ELEM_IS_REAL 1
static inline real to_real(elem x) { return x; }
static inline elem to_elem(real x) { return x; }
static inline vreal vload_elems(const elem *p) { return vloadu(p); }
static inline void vstore_elems(elem *p, vreal v) { vstoreu(p, v); }

#elif defined(ATTNC_REAL_F16)
#  define ELEM_IS_REAL 0
static inline real to_real(elem x) { return attnc_half_to_float(x.bits); }
static inline elem to_elem(real x) { return (elem){attnc_float_to_half(x)}; }
#  if defined(ATTNC_ISA_AVX512)
static inline vreal vload_elems(const elem *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline void vstore_elems(elem *p, vreal v)
{
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#  elif defined(ATTNC_ISA_AVX2)
static inline vreal vload_elems(const elem *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline void vstore_elems(elem *p, vreal v)
{
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#  else
static inline vreal vload_elems(const elem *p)
{
    real lanes[VLANES];
    for (int l = 0; l < VLANES; l++) lanes[l] = to_real(p[l]);
    return vloadu(lanes);
}
static inline void vstore_elems(elem *p, vreal v)
{
    real lanes[VLANES];
    vstoreu(lanes, v);
    for (int l = 0; l < VLANES; l++) p[l] = to_elem(lanes[l]);
}
#  endif

#else /* bfloat16: the same bit operations as the scalar ones, in vector extensions (and AVX2/AVX-512
        * widening moves) */
#  define ELEM_IS_REAL 0
typedef uint16_t FN(vbits16) __attribute__((vector_size(SIMD_BYTES / 2)));
typedef uint32_t FN(vbits32) __attribute__((vector_size(SIMD_BYTES)));
static inline real to_real(elem x) { return attnc_bfloat_to_float(x.bits); }
static inline elem to_elem(real x) { return (elem){attnc_float_to_bfloat(x)}; }
#  if defined(ATTNC_ISA_AVX512) /* one widening move and a shift (GCC splits the generic form in halves) */
static inline vreal vload_elems(const elem *p)
{
    return (vreal)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16);
}
#  elif defined(ATTNC_ISA_AVX2)
static inline vreal vload_elems(const elem *p)
{
    return (vreal)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16);
}
#  else
static inline vreal vload_elems(const elem *p)
{
    FN(vbits16) h;
    memcpy(&h, p, sizeof h);
    return (vreal)(__builtin_convertvector(h, FN(vbits32)) << 16);
}
#  endif
/* Each lane of v rounded to bfloat16, as to_elem does: its bits in the lane's low half. */
static inline FN(vbits32) FN(vround_bits)(vreal v)
{
    FN(vbits32) x = (FN(vbits32))v;
    FN(vbits32) nan = (FN(vbits32))((x & 0x7fffffff) > 0x7f800000); /* all ones in a NaN's lane */
    FN(vbits32) rounded = (x + 0x7fff + (x >> 16 & 1)) >> 16, quiet = x >> 16 | 0x40;
    return (rounded & ~nan) | (quiet & nan);
}
static inline void vstore_elems(elem *p, vreal v)
{
    FN(vbits16) h = __builtin_convertvector(FN(vround_bits)(v), FN(vbits16));
    memcpy(p, &h, sizeof h);
}
#  if BF16_PAIRS
/* The operands of vdot_pairs (simd.h): a pair of bfloat16 per 32-bit lane,
 * the first in the low half, held in reals' bits (packed like them). */
/* VLANES pairs of consecutive elems from p (2 * VLANES elems) */
static inline vreal FN(vload_pairs)(const elem *p)
{
    vreal v;
    memcpy(&v, p, sizeof v);
    return v;
}
/* VLANES pairs (first[c], second[c]) of two rows; second NULL: zeros */
static inline vreal FN(vpair_rows)(const elem *first, const elem *second)
{
    FN(vbits32) words = (FN(vbits32))vload_elems(first) >> 16;
    return (vreal)(second ? words | (FN(vbits32))vload_elems(second) : words);
}
/* Each lane of v rounded to bfloat16 by vcvtneps2bf16, as to_elem does
 * but for subnormals, which it takes as zeros (of their sign), as
 * vdot_pairs does: its bits in the lane's low half. */
static inline FN(vbits32) FN(vround_bits_for_pairs)(vreal v)
{
#    if defined(ATTNC_EMULATE_BF16_DOT)
    return FN(vround_bits)((vreal)FN(flush_subnormals)((FN(vbits32))v));
#    else
    return (FN(vbits32))_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v));
#    endif
}
/* x rounded as a lane of vround_bits_for_pairs */
static inline elem FN(round_for_pairs)(real x) { return to_elem(fabsf(x) < FLT_MIN ? copysignf(0, x) : x); }
/* VLANES pairs (first[c], second[c]) of two rows of reals, each rounded */
static inline vreal FN(vround_pairs)(const real *first, const real *second)
{
#    if defined(ATTNC_EMULATE_BF16_DOT)
    FN(vbits32) words = FN(vround_bits_for_pairs)(vloadu(first));
    return (vreal)(second ? words | FN(vround_bits_for_pairs)(vloadu(second)) << 16 : words);
#    else
    /* both rows rounded by one vcvtne2ps2bf16 (first's 16 words, then
     * second's), then interleaved by one vpermw */
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                                22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512bh both = _mm512_cvtne2ps_pbh(second ? vloadu(second) : vzero(), vloadu(first));
    return (vreal)_mm512_permutexvar_epi16(interleave, (__m512i)both);
#    endif
}
/* The pair (first, second) as a real's bits; second NULL: zero */
static inline real FN(pair_of)(const elem *first, const elem *second)
{
    uint32_t bits = first->bits | (second ? (uint32_t)second->bits << 16 : 0);
    real pair;
    memcpy(&pair, &bits, sizeof pair);
    return pair;
}
/* Step p of a row of n elements cs apart: the pair of elements 2p and
 * 2p + 1, or (2p, 0) when 2p + 1 is past the row's end */
static inline real FN(pair_at)(const elem *row, idx_t p, idx_t cs, idx_t n)
{
    return FN(pair_of)(row + 2 * p * cs, 2 * p + 1 < n ? row + (2 * p + 1) * cs : NULL);
}
#  endif
#endif

/* Row l of src (VLANES rows, or GEMM_LANES_COLUMNS): src[l], or with rs
 * (not 0: rows rs elements apart, a constant 0 otherwise) src[l - l % 4] +
 * (l % 4) * rs, so that the rows are addressed from a base per four rows
 * and three offsets, where sixteen row pointers spilled from the
 * registers. */
static inline __attribute__((always_inline)) const elem *FN(row_of)(const elem *const *src, int l, idx_t rs)
{
    return rs ? src[l - l % 4] + (l % 4) * rs : src[l];
}

/* rows[s] <- element p + s of each of the VLANES rows src[l] (row_of, rs),
 * in lane l (s < VLANES): a VLANES x VLANES block of the rows turned in
 * registers. With by_blocks (reals at AVX2 and AVX-512 only), the rows
 * are loaded a 16-byte block at a time (vload_blocks): vector BL c + j (BL
 * lanes a block) holds, in its block b, row BL b + j's elements from p +
 * BL c, so the transpose's steps across blocks are done by the loads and
 * vtranspose_in_blocks finishes it. Otherwise whole vectors are loaded
 * (16-bit elems widened) and turned by vtranspose. */
static inline __attribute__((always_inline)) void FN(load_turned)(vreal rows[VLANES], const elem *const src[VLANES],
                                                                  idx_t rs, idx_t p, int by_blocks)
{
#if ELEM_IS_REAL && defined(VLOAD_BLOCKS)
    if (by_blocks) {
        const int block_lanes = VLANES / VLOAD_BLOCKS;
        for (int c = 0; c < VLOAD_BLOCKS; c++)
            for (int j = 0; j < block_lanes; j++) {
                const real *at[VLOAD_BLOCKS];
                for (int b = 0; b < VLOAD_BLOCKS; b++)
                    at[b] = FN(row_of)(src, block_lanes * b + j, rs) + p + block_lanes * c;
                rows[block_lanes * c + j] = vload_blocks(at);
            }
        vtranspose_in_blocks(rows);
        return;
    }
#endif
    (void)by_blocks;
    for (int l = 0; l < VLANES; l++) rows[l] = vload_elems(FN(row_of)(src, l, rs) + p);
    vtranspose(rows);
}

/* n elems widened into reals, and n reals rounded into elems. */
static inline void FN(load_row)(real *dst, const elem *src, idx_t n)
{
    idx_t i = 0;
    for (; i + VLANES <= n; i += VLANES) vstoreu(dst + i, vload_elems(src + i));
#if ELEM_IS_REAL
    if (i < n) vstore_first(dst + i, vload_first(src + i, (int)(n - i)), (int)(n - i));
#else
    for (; i < n; i++) dst[i] = to_real(src[i]);
#endif
}

static inline void FN(store_row)(elem *dst, const real *src, idx_t n)
{
    idx_t i = 0;
    for (; i + VLANES <= n; i += VLANES) vstore_elems(dst + i, vloadu(src + i));
    for (; i < n; i++) dst[i] = to_elem(src[i]);
}

/* n reals times factor, rounded into elems (a scale_row then a store_row in
 * one pass: the same bits, without writing the reals back first) */
static inline void FN(store_row_scaled)(elem *dst, const real *src, idx_t n, real factor)
{
    vreal f = vset1(factor);
    idx_t i = 0;
    for (; i + VLANES <= n; i += VLANES) vstore_elems(dst + i, vloadu(src + i) * f);
    for (; i < n; i++) dst[i] = to_elem(src[i] * factor);
}
