/* Dropout's keep factors, and element-wise dropout (dtype and ISA template;
 * needs dtype.h and simd.h). Element i of a dropout is kept when draw i of
 * its stream is (attnc.h: the draw is a hash of (seed, i), so any split
 * into tasks or threads gives the same bits): its factor is then 1/(1-p),
 * else 0. Multiplying by 0 (not assigning 0) keeps NaN, as PyTorch's
 * input * mask does.
 *
 *   factors (n) <- keep_factors: factor l of draw first + l * stride
 *   out (n)     <- in (n) * the factors of draws 0 .. n-1 (dropout)
 */

#ifndef ATTNC_DROPOUT_CHUNK
#define ATTNC_DROPOUT_CHUNK 65536 /* elements per task */
#endif
/* Factors a caller draws at a time into a buffer on its stack. */
#define DROPOUT_RUN 256

typedef struct {
    uint64_t seed, threshold; /* attnc_keep_threshold(p) */
    real keep_scale;          /* 1/(1-p), or 0 for p == 1 */
} FN(dropout_draws);

static inline FN(dropout_draws) FN(dropout_draws_for)(double p, uint64_t seed)
{
    FN(dropout_draws) draws = {seed, attnc_keep_threshold(p), p >= 1 ? 0 : (real)(1.0 / (1.0 - p))};
    return draws;
}

/* A vector of draws: 64-bit integers, half a vector of floats' lanes. */
#define DRAW_LANES (SIMD_BYTES / 8)
typedef uint64_t FN(vdraws) __attribute__((vector_size(SIMD_BYTES)));
typedef int64_t FN(vdraws_signed) __attribute__((vector_size(SIMD_BYTES)));

/* All ones in lane l where the draw whose state is states[l] is kept
 * (kept: bits >= threshold, written bits > threshold - 1 since both are
 * below 2^53: AVX2's vpcmpgtq, where GCC took >= lane by lane). */
static inline FN(vdraws_signed) FN(kept_draws)(const FN(dropout_draws) *draws, FN(vdraws) states)
{
    FN(vdraws) z;
    FN(vdraws_signed) bits = (FN(vdraws_signed))(ATTNC_SPLITMIX64_MIX(z, states) >> 11);
    return bits > ((FN(vdraws_signed)){0} + ((int64_t)draws->threshold - 1));
}

#define EVEN_LANE(l, unused) (2 * (l))

/* factors[l] <- keep_scale where draw first + l * stride is kept, else 0,
 * for l < n: a vector of draws at a time (64-bit multiplies: AVX-512DQ's
 * vpmullq, or the compiler's 32-bit products), two for a vector of floats.
 * One draw at a time in scalar code took about 3.7 ns a weight a thread on
 * a Zen 3 core, and doubled a training forward's SDPA time at dropout 0.1
 * (benchmarks/NOTES.md). */
static void FN(keep_factors)(real *factors, idx_t n, const FN(dropout_draws) *draws, uint64_t first,
                             uint64_t stride)
{
    /* draw first + l * stride's state: seed + (first + 1) * gamma, plus
     * l * stride * gamma (mod 2^64), a multiply-free step a vector */
    static const uint64_t lane_numbers[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    FN(vdraws) lanes;
    memcpy(&lanes, lane_numbers, sizeof lanes);
    const uint64_t gap = stride * ATTNC_SPLITMIX64_GAMMA;
    const FN(vdraws) lane_offsets = lanes * gap;
    uint64_t state = draws->seed + (first + 1) * ATTNC_SPLITMIX64_GAMMA;
    const vlanes_mask keep_scale = (vlanes_mask)vset1(draws->keep_scale);
    for (idx_t l = 0; l < n; l += VLANES, state += (uint64_t)VLANES * gap) {
#if defined(ATTNC_COMPUTE_F32)
        FN(vdraws) first_half = state + lane_offsets, second_half = first_half + DRAW_LANES * gap;
        vlanes_mask kept = __builtin_shuffle((vlanes_mask)FN(kept_draws)(draws, first_half),
                                             (vlanes_mask)FN(kept_draws)(draws, second_half),
                                             (vlanes_mask){LANE_LIST(EVEN_LANE, 0)});
#else
        vlanes_mask kept = (vlanes_mask)FN(kept_draws)(draws, state + lane_offsets);
#endif
        vreal f = (vreal)(kept & keep_scale);
        if (n - l >= VLANES)
            vstoreu(factors + l, f);
        else
            vstore_first(factors + l, f, (int)(n - l));
    }
}

typedef struct {
    elem *out;
    const elem *in;
    idx_t n;
    FN(dropout_draws) draws;
} FN(dropout_job);

static void FN(dropout_task)(void *ctx, idx_t t)
{
    const FN(dropout_job) *job = ctx;
    real factors[DROPOUT_RUN];
    idx_t last = attnc_min(job->n, (t + 1) * ATTNC_DROPOUT_CHUNK);
    for (idx_t i0 = t * ATTNC_DROPOUT_CHUNK; i0 < last; i0 += DROPOUT_RUN) {
        idx_t run = attnc_min(DROPOUT_RUN, last - i0);
        FN(keep_factors)(factors, run, &job->draws, (uint64_t)i0, 1);
        for (idx_t i = 0; i < run; i++) job->out[i0 + i] = to_elem(to_real(job->in[i0 + i]) * factors[i]);
    }
}

attnc_status FN(dropout)(void *out, const void *in, idx_t n, double p, uint64_t seed)
{
    FN(dropout_job) job = {out, in, n, FN(dropout_draws_for)(p, seed)};
    attnc_parallel_for(attnc_ceil_div(n, ATTNC_DROPOUT_CHUNK), 10.0 * (double)n, FN(dropout_task), &job);
    return attnc_interrupted() ? ATTNC_EINTR : ATTNC_OK;
}
