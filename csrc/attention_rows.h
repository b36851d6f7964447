/* The attention kernel's row path (dtype and ISA template; needs dtype.h,
 * simd.h and vexp.h): one query at a time, straight from the rows of Q, K
 * and V, with no packing. For few queries per item (decode: packing keys
 * and values into slivers for one query costs more than the arithmetic)
 * and for head sizes too large for the flash path's tiles (its workspace
 * is one row of scores, whatever E and Ev).
 *
 *   scores (S) = scale * K (S, E) . q (E)     then bias, mask, band
 *   e (S)      = exp(scores - max)            sum = e's sum (before dropout)
 *   weights    = e / sum                      (written when asked for)
 *   out (Ev)   = dropout(e) . V (S, Ev) / sum
 * A row whose scores are all -inf gets weights 0 and out 0 * V. */

/* sum of x[p] * y[p], in DOT_LANES fixed lanes (the same for any caller
 * and ISA level): lane u adds up p = u, u + 16, ... by fused multiply-adds
 * (DOT_LANES / VLANES vectors), the tail goes to lane 0, then the lanes
 * are added in order. */
#define DOT_LANES 16
static inline real FN(dot)(const real *x, const real *y, idx_t n)
{
    vreal acc[DOT_LANES / VLANES];
    for (int v = 0; v < DOT_LANES / VLANES; v++) acc[v] = vzero();
    idx_t p = 0;
    for (; p + DOT_LANES <= n; p += DOT_LANES)
        for (int v = 0; v < DOT_LANES / VLANES; v++)
            acc[v] = vfma(vloadu(x + p + v * VLANES), vloadu(y + p + v * VLANES), acc[v]);
    real lanes[DOT_LANES];
    for (int v = 0; v < DOT_LANES / VLANES; v++) vstoreu(lanes + v * VLANES, acc[v]);
    for (; p < n; p++) lanes[0] = sfma(x[p], y[p], lanes[0]);
    real sum = 0;
    for (int u = 0; u < DOT_LANES; u++) sum += lanes[u];
    return sum;
}
#undef DOT_LANES

/* Where item b's matrices start. */
typedef struct {
    const real *q, *k, *v;
    const uint8_t *mask;
    const real *bias;
    real *out;
} FN(item_view);

static FN(item_view) FN(item_at)(const attnc_attention_args *a, idx_t b)
{
    const attnc_batch *batch = &a->batch;
    FN(item_view) view = {
        (const real *)a->q.data + attnc_item_offset(batch, a->q.batch_strides, b),
        (const real *)a->k.data + attnc_item_offset(batch, a->k.batch_strides, b),
        (const real *)a->v.data + attnc_item_offset(batch, a->v.batch_strides, b),
        a->mask ? a->mask + attnc_item_offset(batch, a->mask_batch_strides, b) : NULL,
        a->bias ? (const real *)a->bias + attnc_item_offset(batch, a->bias_batch_strides, b) : NULL,
        (real *)a->out.data + attnc_item_offset(batch, a->out.batch_strides, b),
    };
    return view;
}

/* The largest score that is not NaN (-inf for none), as row_max; the shift
 * that keeps exp finite: the max, or 0 for a row of -inf (whose e are then
 * exactly 0 instead of NaN). */
static inline real FN(safe_shift)(real max) { return max == -(real)INFINITY ? 0 : max; }
/* 1 / sum, or 0 for a row whose weights are all 0 */
static inline real FN(safe_inverse)(real sum) { return sum == 0 ? 0 : 1 / sum; }
/* A row's log-sum-exp from its max and its sum of exp(score - safe_shift(max)):
 * -inf for a row of -inf (sum 0) */
static inline real FN(log_sum_exp)(real max, real sum) { return FN(safe_shift)(max) + (real)log((double)sum); }

/* Query i of item b: out row i, and weights row i when asked for.
 * scores is a buffer of S. */
static void FN(attend_row)(const attnc_attention_args *a, const FN(item_view) *item, idx_t b, idx_t i,
                           real *scores)
{
    idx_t S = a->S, Ev = a->Ev;
    const real *q = item->q + i * a->q.row_stride;
    real scale = (real)a->scale;
    for (idx_t j = 0; j < S; j++) scores[j] = FN(dot)(q, item->k + j * a->k.row_stride, a->E) * scale;
    if (item->bias) {
        const real *bias = item->bias + i * a->bias_rs;
        for (idx_t j = 0; j < S; j++) scores[j] += bias[j * a->bias_cs];
    }
    if (item->mask) {
        const uint8_t *m = item->mask + i * a->mask_rs;
        for (idx_t j = 0; j < S; j++) scores[j] = m[j * a->mask_cs] ? scores[j] : (real)-1e20;
    }
    /* keys outside the query's band are hidden: score + -inf */
    for (idx_t j = 0, begin = attnc_band_begin(&a->band, i, S); j < begin; j++) scores[j] -= (real)INFINITY;
    for (idx_t j = attnc_band_end(&a->band, i, S); j < S; j++) scores[j] -= (real)INFINITY;
    real max = FN(row_max)(scores, S), sum = FN(exp_shift_sum)(scores, S, FN(safe_shift)(max));
    real inverse = FN(safe_inverse)(sum);
    if (a->lse) ((real *)a->lse)[b * a->L + i] = FN(log_sum_exp)(max, sum);
    if (a->weights) {
        real *w = (real *)a->weights + (b * a->L + i) * S;
        for (idx_t j = 0; j < S; j++) w[j] = scores[j] * inverse;
    }
    if (a->dropout_p > 0) {
        real keep_scale = a->dropout_p >= 1 ? 0 : (real)(1.0 / (1.0 - a->dropout_p));
        uint64_t first = ((uint64_t)b * (uint64_t)a->L + (uint64_t)i) * (uint64_t)S;
        for (idx_t j = 0; j < S; j++)
            scores[j] *= attnc_uniform(a->seed, first + (uint64_t)j) < a->dropout_p ? 0 : keep_scale;
    }
    /* out[c] = sum over every key j, in order, of e[j] * V[j, c] (every
     * key, so that 0 * NaN reaches out): OUT_VECTORS vectors of out kept
     * in registers over the keys, then the scalar tail */
    real *out = item->out + i * a->out.row_stride;
    const real *v = item->v;
    idx_t vs = a->v.row_stride, c0 = 0;
    enum { OUT_VECTORS = 4 };
    for (; c0 + OUT_VECTORS * VLANES <= Ev; c0 += OUT_VECTORS * VLANES) {
        vreal acc[OUT_VECTORS];
        for (int u = 0; u < OUT_VECTORS; u++) acc[u] = vzero();
        for (idx_t j = 0; j < S; j++) {
            vreal e = vset1(scores[j]);
            for (int u = 0; u < OUT_VECTORS; u++) acc[u] = vfma(e, vloadu(v + j * vs + c0 + u * VLANES), acc[u]);
        }
        for (int u = 0; u < OUT_VECTORS; u++) vstoreu(out + c0 + u * VLANES, acc[u]);
    }
    for (idx_t c = c0; c < Ev; c++) out[c] = 0;
    for (idx_t j = 0; j < S && c0 < Ev; j++)
        for (idx_t c = c0; c < Ev; c++) out[c] = sfma(scores[j], v[j * vs + c], out[c]);
    for (idx_t c = 0; c < Ev; c++) out[c] *= inverse;
}

/* Rows per task: enough arithmetic to pay for handing out a task. */
#ifndef ATTNC_ROW_TASK_FLOPS
#define ATTNC_ROW_TASK_FLOPS 65536.0
#endif

typedef struct {
    const attnc_attention_args *args;
    idx_t n_rows, rows_per_task;
    atomic_int failed;
} FN(rows_job);

/* Task t: rows [t * rows_per_task, ...) of the (n_items * L) query rows. */
static void FN(rows_task)(void *ctx, idx_t t)
{
    FN(rows_job) *job = ctx;
    const attnc_attention_args *a = job->args;
    real *scores = attnc_malloc((size_t)(a->S > 0 ? a->S : 1) * sizeof(real));
    if (!scores) {
        atomic_store(&job->failed, 1);
        return;
    }
    idx_t first = t * job->rows_per_task, last = attnc_min(job->n_rows, first + job->rows_per_task);
    idx_t b = first / a->L;
    FN(item_view) item = FN(item_at)(a, b);
    for (idx_t r = first; r < last && !attnc_interrupted(); r++) {
        if (r / a->L != b) item = FN(item_at)(a, b = r / a->L);
        FN(attend_row)(a, &item, b, r % a->L, scores);
    }
    attnc_free(scores);
}

static attnc_status FN(attention_rows)(const attnc_attention_args *a, idx_t n_items)
{
    if ((size_t)a->S > SIZE_MAX / sizeof(real)) return ATTNC_EOVERFLOW;
    double row_flops = 2.0 * (double)a->S * (double)(a->E + a->Ev) + 1.0;
    idx_t rows_per_task = row_flops >= ATTNC_ROW_TASK_FLOPS ? 1 : (idx_t)(ATTNC_ROW_TASK_FLOPS / row_flops);
    FN(rows_job) job = {a, n_items * a->L, rows_per_task, 0};
    attnc_parallel_for(attnc_ceil_div(job.n_rows, rows_per_task), row_flops * (double)job.n_rows,
                       FN(rows_task), &job);
    return atomic_load(&job.failed) ? ATTNC_ENOMEM : ATTNC_OK;
}
