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

/* Item b's dropout mask from weight (i0, j0) on: weight (i0 + i, j0 + j)
 * is kept when attnc_uniform(seed, first + i * S + j) >= p (attnc.h). */
typedef struct {
    uint64_t seed, first, S;
    double p;
    real keep_scale; /* 1/(1-p), or 0 for p == 1 */
} FN(dropout_mask);

static inline FN(dropout_mask) FN(dropout_mask_at)(const attnc_attention_args *a, idx_t b, idx_t i0, idx_t j0)
{
    FN(dropout_mask) mask = {
        a->seed, ((uint64_t)b * (uint64_t)a->L + (uint64_t)i0) * (uint64_t)a->S + (uint64_t)j0, (uint64_t)a->S,
        a->dropout_p, a->dropout_p >= 1 ? 0 : (real)(1.0 / (1.0 - a->dropout_p)),
    };
    return mask;
}

/* The factor of weight (i0 + i, j0 + j): 0 (dropped) or 1/(1-p) (kept). */
static inline real FN(keep_factor)(const FN(dropout_mask) *mask, idx_t i, idx_t j)
{
    uint64_t index = mask->first + (uint64_t)i * mask->S + (uint64_t)j;
    return attnc_uniform(mask->seed, index) < mask->p ? 0 : mask->keep_scale;
}

/* Keys per chunk of the two passes: a chunk of K or V rows stays in L1
 * while every row of the group uses it. Rows per group: query rows that
 * share their keys and values (one item's queries, and the items K and V
 * are broadcast over), read together in one pass. */
#ifndef ATTNC_ROWS_SIZES
#define ATTNC_ROWS_SIZES
#define ROWS_CHUNK 16
#define ROWS_GROUP 16
#endif

/* One query row of a group: its item, its index in the item, its view. */
typedef struct {
    idx_t b, i;
    FN(item_view) item;
    real *scores; /* (S): scores, then e = exp(score - max), dropped out */
    real inverse; /* 1 / the sum of e before dropout (0 for a row of -inf) */
} FN(group_row);

/* scores <- the scores of every row against every key of k (the group's
 * shared keys): each chunk of K rows is read once for the whole group. */
static void FN(group_scores)(const attnc_attention_args *a, FN(group_row) *rows, idx_t n_rows, const real *k)
{
    real scale = (real)a->scale;
    for (idx_t j0 = 0; j0 < a->S; j0 += ROWS_CHUNK) {
        idx_t j1 = attnc_min(j0 + ROWS_CHUNK, a->S);
        for (idx_t r = 0; r < n_rows; r++) {
            const real *q = rows[r].item.q + rows[r].i * a->q.row_stride;
            for (idx_t j = j0; j < j1; j++) rows[r].scores[j] = FN(dot)(q, k + j * a->k.row_stride, a->E) * scale;
        }
    }
}

/* Query i's row of S scaled scores: + bias, the mask's fill, and + -inf
 * for the keys outside its band. */
static void FN(finish_row_scores)(const attnc_attention_args *a, const FN(item_view) *item, idx_t i, real *scores)
{
    idx_t S = a->S;
    if (item->bias) {
        const real *bias = item->bias + i * a->bias_rs;
        for (idx_t j = 0; j < S; j++) scores[j] += bias[j * a->bias_cs];
    }
    if (item->mask) {
        const uint8_t *m = item->mask + i * a->mask_rs;
        for (idx_t j = 0; j < S; j++) scores[j] = m[j * a->mask_cs] ? scores[j] : (real)-1e20;
    }
    for (idx_t j = 0, begin = attnc_band_begin(&a->band, i, S); j < begin; j++) scores[j] -= (real)INFINITY;
    for (idx_t j = attnc_band_end(&a->band, i, S); j < S; j++) scores[j] -= (real)INFINITY;
}

/* One row's softmax in place: the finished scores, then e = exp(s - max),
 * its sum (the lse and weights when asked for), then dropout. */
static void FN(row_softmax)(const attnc_attention_args *a, FN(group_row) *row)
{
    idx_t S = a->S, i = row->i;
    real *scores = row->scores;
    FN(finish_row_scores)(a, &row->item, i, scores);
    real max = FN(row_max)(scores, S), sum = FN(exp_shift_sum)(scores, S, FN(safe_shift)(max));
    row->inverse = FN(safe_inverse)(sum);
    if (a->lse) ((real *)a->lse)[row->b * a->L + i] = FN(log_sum_exp)(max, sum);
    if (a->weights) {
        real *w = (real *)a->weights + (row->b * a->L + i) * S;
        for (idx_t j = 0; j < S; j++) w[j] = scores[j] * row->inverse;
    }
    if (a->dropout_p > 0) {
        FN(dropout_mask) mask = FN(dropout_mask_at)(a, row->b, i, 0);
        for (idx_t j = 0; j < S; j++) scores[j] *= FN(keep_factor)(&mask, 0, j);
    }
}

/* out rows <- sum over every key j, in order, of e[j] * v[j] / sum (every
 * key, so that 0 * NaN reaches out; v: the group's shared values): each
 * chunk of V rows is read once for the whole group; OUT_VECTORS vectors of
 * a row's out are kept in registers over the chunk, then the scalar tail. */
static void FN(group_values)(const attnc_attention_args *a, FN(group_row) *rows, idx_t n_rows, const real *v)
{
    enum { OUT_VECTORS = 4 };
    idx_t Ev = a->Ev, vs = a->v.row_stride, wide = Ev / (OUT_VECTORS * VLANES) * (OUT_VECTORS * VLANES);
    for (idx_t r = 0; r < n_rows; r++) {
        real *out = rows[r].item.out + rows[r].i * a->out.row_stride;
        for (idx_t c = 0; c < Ev; c++) out[c] = 0;
    }
    for (idx_t j0 = 0; j0 < a->S; j0 += ROWS_CHUNK) {
        idx_t j1 = attnc_min(j0 + ROWS_CHUNK, a->S);
        for (idx_t r = 0; r < n_rows; r++) {
            const real *e = rows[r].scores;
            real *out = rows[r].item.out + rows[r].i * a->out.row_stride;
            for (idx_t c0 = 0; c0 < wide; c0 += OUT_VECTORS * VLANES) {
                vreal acc[OUT_VECTORS];
                for (int u = 0; u < OUT_VECTORS; u++) acc[u] = vloadu(out + c0 + u * VLANES);
                for (idx_t j = j0; j < j1; j++) {
                    vreal ej = vset1(e[j]);
                    for (int u = 0; u < OUT_VECTORS; u++)
                        acc[u] = vfma(ej, vloadu(v + j * vs + c0 + u * VLANES), acc[u]);
                }
                for (int u = 0; u < OUT_VECTORS; u++) vstoreu(out + c0 + u * VLANES, acc[u]);
            }
            for (idx_t j = j0; j < j1; j++)
                for (idx_t c = wide; c < Ev; c++) out[c] = sfma(e[j], v[j * vs + c], out[c]);
        }
    }
    for (idx_t r = 0; r < n_rows; r++) {
        real *out = rows[r].item.out + rows[r].i * a->out.row_stride;
        for (idx_t c = 0; c < Ev; c++) out[c] *= rows[r].inverse;
    }
}

typedef struct {
    const attnc_attention_args *args;
    idx_t shared;         /* consecutive items sharing K and V (broadcast over the trailing batch dims) */
    idx_t groups_per_kv;  /* row groups of the shared * L rows of one K/V */
    atomic_int failed;
} FN(rows_job);

/* Items sharing K and V: the product of the trailing batch dims along
 * which key and value do not move (grouped-query attention's views). */
static idx_t FN(items_sharing_kv)(const attnc_attention_args *a)
{
    idx_t shared = 1;
    for (int d = a->batch.ndim - 1; d >= 0 && a->k.batch_strides[d] == 0 && a->v.batch_strides[d] == 0; d--)
        shared *= a->batch.shape[d];
    return shared;
}

/* Task t: row group t, up to ROWS_GROUP rows of one K/V: rows r of the
 * K/V's shared * L rows are query r % L of its item r / L. */
static void FN(rows_task)(void *ctx, idx_t t)
{
    FN(rows_job) *job = ctx;
    const attnc_attention_args *a = job->args;
    idx_t per_kv = job->shared * a->L, first = t % job->groups_per_kv * ROWS_GROUP;
    idx_t n_rows = attnc_min(ROWS_GROUP, per_kv - first), first_item = t / job->groups_per_kv * job->shared;
    real *scores = attnc_malloc((size_t)(n_rows * (a->S > 0 ? a->S : 1)) * sizeof(real));
    if (!scores) {
        atomic_store(&job->failed, 1);
        return;
    }
    FN(group_row) rows[ROWS_GROUP];
    for (idx_t r = 0; r < n_rows; r++) {
        idx_t b = first_item + (first + r) / a->L;
        rows[r] = (FN(group_row)){b, (first + r) % a->L, FN(item_at)(a, b), scores + r * (a->S > 0 ? a->S : 1), 0};
    }
    FN(item_view) shared = FN(item_at)(a, first_item); /* K and V of every row of the group */
    FN(group_scores)(a, rows, n_rows, shared.k);
    for (idx_t r = 0; r < n_rows; r++) FN(row_softmax)(a, &rows[r]);
    if (!attnc_interrupted()) FN(group_values)(a, rows, n_rows, shared.v);
    attnc_free(scores);
}

static attnc_status FN(attention_rows)(const attnc_attention_args *a, idx_t n_items)
{
    idx_t scores_elems;
    if (!attnc_mul_ok(ROWS_GROUP, a->S > 0 ? a->S : 1, &scores_elems) ||
        (size_t)scores_elems > SIZE_MAX / sizeof(real))
        return ATTNC_EOVERFLOW;
    FN(rows_job) job = {a, FN(items_sharing_kv)(a), 0, 0};
    job.groups_per_kv = attnc_ceil_div(job.shared * a->L, ROWS_GROUP);
    idx_t n_tasks = n_items / job.shared * job.groups_per_kv;
    double flops = 2.0 * (double)a->S * (double)(a->E + a->Ev) * (double)n_items * (double)a->L;
    attnc_parallel_for(n_tasks, flops, FN(rows_task), &job);
    return atomic_load(&job.failed) ? ATTNC_ENOMEM : ATTNC_OK;
}
