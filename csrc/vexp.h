/* The vector exp and the row pieces of a stable softmax (dtype template:
 * include after dtype.h and simd.h). The exp is written in the SIMD
 * vocabulary, lanes at a time (a scalar exp is its first lane, the same
 * bits): left to the compiler's vectorisation of scalar code, its clamps
 * and NaN select became four compares and three masked moves per vector,
 * where one max and one min do (x their second operand, which they return
 * where either is NaN, so a NaN passes them and reaches the result through
 * r: no select).
 *
 * exp: Cody-Waite range reduction x = n*ln2 + r, |r| <= ln2/2, then a
 * polynomial 1 + r + c2 r^2 + ...: for float of degree 6, its c2..c6 fitted
 * to exp's relative error on that interval (minimax, 3.8e-9 with the
 * coefficients rounded to float: a degree-7 Taylor polynomial had 7.1e-9
 * and one more multiply-add); for double the Taylor polynomial of degree
 * 13. Either is below half an ulp; the total error is a few ulp. 2^n is
 * built in the exponent bits from the rounding shifter's own bits (no
 * float-to-int conversion). x is clamped to [EXP_LO, EXP_HI], where n runs
 * from the exponent below the smallest normal (2^n == 0: results below the
 * smallest normal flush to 0 or come out subnormal, an absolute error <
 * 1.2e-38 / 2.3e-308, harmless in a softmax; -inf gives exactly 0) to the
 * one above the largest (2^n == inf: large x gives inf, from x = 88.38 /
 * 709.44 on, where exp overflows only at 88.72 / 709.78: inf for a finite
 * value in that band, which the softmax never asks for, its arguments being
 * differences from a maximum, at most 0). NaN gives NaN: about 15 vector
 * instructions per vector of results.
 *
 * for_bf16 (a constant; float only): the results are rounded to bfloat16
 * right after (the probabilities of BF16_PAIRS' value product, whose
 * rounding error is up to 2^-9 = 2e-3, and the bfloat16 weights the
 * attention stores from the same exponentials), so the polynomial is of degree 4,
 * fitted as above (5.3e-6 relative), and ln2 is one float (r off by at most
 * 127 * 1.9e-9 = 2.4e-7): three multiply-adds fewer, an error 1/350 of the
 * rounding's that follows. PyTorch's CPU flash attention takes an exp of
 * about this accuracy for every dtype (exp_u20). */
#include <math.h>
#include <stdint.h>

#if defined(ATTNC_COMPUTE_F32)
#  define EXP_LO (-88.0f) /* rounds to n = -127: 2^n == 0 */
#  define EXP_HI (88.5f)  /* rounds to n = 128: 2^n == inf (n = 128 from x = 88.38) */
#  define EXP_SHIFTER 12582912.0f /* 1.5 * 2^23: adding it rounds to an integer */
#  define EXP_SHIFTER_BITS 0x4B400000 /* its bits: shifted bits - these = n */
#  define EXP_LN2_HI 0.693145751953125f
#  define EXP_LN2_LO 1.428606765330187e-06f
#  define EXP_LN2 0.6931471805599453f /* ln2 in one float, for_bf16 */
#  define EXP_BIAS 127
#  define EXP_MANT_BITS 23
typedef uint32_t FN(exp_uint);
#else
#  define EXP_LO (-709.0) /* rounds to n = -1023 */
#  define EXP_HI (710.0)  /* rounds to n = 1024 (from x = 709.44) */
#  define EXP_SHIFTER 6755399441055744.0 /* 1.5 * 2^52 */
#  define EXP_SHIFTER_BITS 0x4338000000000000
#  define EXP_LN2_HI 0.6931471803691238
#  define EXP_LN2_LO 1.9082149292705877e-10
#  define EXP_LN2 0.6931471805599453
#  define EXP_BIAS 1023
#  define EXP_MANT_BITS 52
typedef uint64_t FN(exp_uint);
#endif

static inline vreal FN(polynomial_exp)(vreal r, int for_bf16)
{
#if defined(ATTNC_COMPUTE_F32)
    if (for_bf16) {
        vreal p = vset1(0.04127759486436844f);
        p = p * r + 0.1675349771976471f;
        p = p * r + 0.5000511407852173f;
        p = p * r + 1;
        return p * r + 1;
    }
    vreal p = vset1(0.0013814461417496204f);
    p = p * r + 0.008368724957108498f;
    p = p * r + 0.04166838899254799f;
    p = p * r + 0.1666652113199234f;
    p = p * r + 0.4999999403953552f;
    p = p * r + 1;
    return p * r + 1;
#else
    vreal p = vset1(1.0 / 6227020800.0);
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1;
    return p * r + 1;
#endif
}

typedef FN(exp_uint) FN(vexp_uint) __attribute__((vector_size(SIMD_BYTES)));

/* exp of every lane (for_bf16: see the top) */
static inline vreal FN(vexp_lanes)(vreal x, int for_bf16)
{
    for_bf16 = BF16_PAIRS && for_bf16; /* a constant 0 in the other instantiations */
    vreal clamped = vmin(vset1(EXP_HI), vmax(vset1(EXP_LO), x)); /* a NaN x stays (vmax, vmin) */
    vreal shifted = clamped * vset1((real)1.4426950408889634) + vset1(EXP_SHIFTER);
    vreal n = shifted - vset1(EXP_SHIFTER);
    vreal r = clamped - n * vset1(for_bf16 ? EXP_LN2 : EXP_LN2_HI);
    if (!for_bf16) r = r - n * vset1(EXP_LN2_LO);
    /* n + bias in [0, 2 * bias + 1]; unsigned, as a NaN's bits (any, and
     * the product below is NaN) reach it too */
    FN(vexp_uint) bits = ((FN(vexp_uint))shifted - (EXP_SHIFTER_BITS - EXP_BIAS)) << EXP_MANT_BITS;
    return FN(polynomial_exp)(r, for_bf16) * (vreal)bits; /* NaN in, NaN out through r */
}

/* The argument at and below which exp gives exactly 0 (the clamp's 2^n == 0) */
static inline real FN(exp_zero_at_or_below)(void) { return EXP_LO; }

/* exp of one real: the lanes' function, so that it has the same bits */
static inline real FN(vexp)(real x) { return FN(vexp_lanes)(vset1(x), 0)[0]; }

/* x (n) <- exp(x - shift), element by element, times factor when it is
 * not NULL (the backward's weights from the forward's shift and
 * normaliser); whole vectors at once, the last one short (its lanes past n
 * neither read nor stored), each element's bits as alone (vexp) */
static inline void FN(exp_shift_row)(real *x, idx_t n, const real *shift, const real *factor)
{
    idx_t i = 0;
    for (; i + VLANES <= n; i += VLANES) {
        vreal e = FN(vexp_lanes)(vloadu(x + i) - vloadu(shift + i), 0);
        vstoreu(x + i, factor ? e * vloadu(factor + i) : e);
    }
    if (i < n) {
        int lanes = (int)(n - i);
        vreal e = FN(vexp_lanes)(vload_first(x + i, lanes) - vload_first(shift + i, lanes), 0);
        vstore_first(x + i, factor ? e * vload_first(factor + i, lanes) : e, lanes);
    }
}

/* A row's running max and sum are kept in ROW_LANES fixed lanes that the
 * compiler vectorises (element j of a whole group of ROW_LANES in lane j %
 * ROW_LANES, the row's last elements past whole groups in lane 0), so that
 * the result is the same for any thread count, and a long row may be taken
 * a chunk at a time (each but the last a multiple of ROW_LANES long) with
 * the same operations in the same order as all at once (softmax_impl.h). */
#define ROW_LANES 16

static inline void FN(lanes_fill)(real *lanes, real value)
{
    for (int u = 0; u < ROW_LANES; u++) lanes[u] = value;
}

/* lanes <- their max with x (n). NaN is skipped here and reaches the
 * result through the exp-sum, as in PyTorch. */
static inline void FN(max_into_lanes)(real *lanes, const real *x, idx_t n)
{
    idx_t j = 0;
    for (; j + ROW_LANES <= n; j += ROW_LANES)
        for (int u = 0; u < ROW_LANES; u++) lanes[u] = x[j + u] > lanes[u] ? x[j + u] : lanes[u];
    for (; j < n; j++) lanes[0] = x[j] > lanes[0] ? x[j] : lanes[0];
}

static inline real FN(lanes_max)(const real *lanes)
{
    real m = lanes[0];
    for (int u = 1; u < ROW_LANES; u++) m = lanes[u] > m ? lanes[u] : m;
    return m;
}

/* lanes += x (n) */
static inline void FN(sum_into_lanes)(real *lanes, const real *x, idx_t n)
{
    idx_t j = 0;
    for (; j + ROW_LANES <= n; j += ROW_LANES)
        for (int u = 0; u < ROW_LANES; u++) lanes[u] += x[j + u];
    for (; j < n; j++) lanes[0] += x[j];
}

static inline real FN(lanes_sum)(const real *lanes)
{
    real sum = 0;
    for (int u = 0; u < ROW_LANES; u++) sum += lanes[u];
    return sum;
}

/* x (n) <- exp(x - shift), whole vectors at once, the last one short (as
 * exp_shift_row). A key excluded with -inf gives exactly 0. */
static inline void FN(exp_shift)(real *x, idx_t n, real shift)
{
    idx_t i = 0;
    for (; i + VLANES <= n; i += VLANES) vstoreu(x + i, FN(vexp_lanes)(vloadu(x + i) - vset1(shift), 0));
    if (i < n) {
        int lanes = (int)(n - i);
        vstore_first(x + i, FN(vexp_lanes)(vload_first(x + i, lanes) - vset1(shift), 0), lanes);
    }
}

/* Largest element of x (n): -inf for an empty or all -inf row. */
static inline real FN(row_max)(const real *x, idx_t n)
{
    real lanes[ROW_LANES];
    FN(lanes_fill)(lanes, -(real)INFINITY);
    FN(max_into_lanes)(lanes, x, n);
    return FN(lanes_max)(lanes);
}

/* x (n) <- exp(x - shift); returns the sum. */
static inline real FN(exp_shift_sum)(real *x, idx_t n, real shift)
{
    real lanes[ROW_LANES];
    FN(lanes_fill)(lanes, 0);
    FN(exp_shift)(x, n, shift);
    FN(sum_into_lanes)(lanes, x, n);
    return FN(lanes_sum)(lanes);
}

/* x (n) <- x * factor */
static inline void FN(scale_row)(real *x, idx_t n, real factor)
{
    for (idx_t j = 0; j < n; j++) x[j] *= factor;
}

#undef EXP_LO
#undef EXP_HI
#undef EXP_SHIFTER
#undef EXP_SHIFTER_BITS
#undef EXP_LN2_HI
#undef EXP_LN2_LO
#undef EXP_LN2
#undef EXP_BIAS
#undef EXP_MANT_BITS
