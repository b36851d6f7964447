/* The attention kernel body (dtype and ISA template; needs dtype.h,
 * ukernel_shape.h, vexp.h and attention_tiles.h).
 *
 * One task = one item (batch element x head) and a run of query tiles of
 * BLOCK_Q queries (tiles_per_task). Two ways through them, chosen by
 * whether the caller wants the weights:
 *   flash:        key tiles of BLOCK_K, each packed once for the task's query
 *                 tiles; online softmax (running max and sum), P.V
 *                 accumulated in a (BLOCK_Q, Ev) buffer per query tile; the
 *                 (L, S) score matrix never exists.
 *   materialised: one query tile per task; the rows of the weights output
 *                 hold the scores: all scores, softmax in place, then P.V
 *                 from them.
 * Both read Q, K, V through row offsets and strides (heads are strides, not
 * copies) and the mask through zero strides (broadcast, never expanded). */
#include <math.h>
#include <stdatomic.h>

typedef struct {
    const attnc_attention_args *args;
    idx_t n_query_tiles, tiles_per_task, tasks_per_item, workspace_elems;
    atomic_int failed; /* a task could not allocate its workspace */
} FN(attention_job);

/* The keys queries [i0, i0 + nq) are computed against: j < key_end. A
 * causal query sees keys j <= i only, so the key loop may stop at the
 * tile's diagonal (skip_hidden), which is exact while the keys and values
 * past it are finite: see flash_queries. */
static idx_t FN(key_end)(const attnc_attention_args *a, int skip_hidden, idx_t i0, idx_t nq)
{
    if (!skip_hidden) return a->S;
    return i0 + nq < a->S ? i0 + nq : a->S;
}

/* 1 if the n rows (cols elements each, rows rs apart) of x are all finite:
 * x * 0 is 0 for a finite x and NaN for NaN or +-inf. Summed in
 * FINITE_LANES independent lanes, which the compiler vectorises. */
#define FINITE_LANES 16
static int FN(rows_finite)(const real *x, idx_t rs, idx_t n, idx_t cols)
{
    real lanes[FINITE_LANES] = {0};
    for (idx_t j = 0; j < n; j++) {
        const real *row = x + j * rs;
        idx_t c = 0;
        for (; c + FINITE_LANES <= cols; c += FINITE_LANES)
            for (int u = 0; u < FINITE_LANES; u++) lanes[u] += row[c + u] * 0;
        for (; c < cols; c++) lanes[0] += row[c] * 0;
    }
    real zero_or_nan = 0;
    for (int u = 0; u < FINITE_LANES; u++) zero_or_nan += lanes[u];
    return zero_or_nan == 0;
}
#undef FINITE_LANES

/* k_pack <- keys [j0, j0+nk) of item b */
static void FN(pack_key_tile)(FN(tile_buffers) *t, const attnc_attention_args *a, idx_t b, idx_t j0, idx_t nk)
{
    const real *k = (const real *)a->k + a->k_off[b] + j0 * a->k_rs;
    FN(pack_row_slivers)(t->k_pack, k, a->k_rs, nk, ROUND_UP(nk, UK_MR), a->E, UK_MR, 1);
}

/* v_pack <- values [j0, j0+nk) of item b */
static void FN(pack_value_tile)(FN(tile_buffers) *t, const attnc_attention_args *a, idx_t b, idx_t j0, idx_t nk)
{
    const real *v = (const real *)a->v + a->v_off[b] + j0 * a->v_rs;
    FN(pack_column_slivers)(t->v_pack, v, a->v_rs, nk, a->Ev, t->Ev_padded, UK_NR);
}

/* Queries in the query tile starting at q0 of a run ending at i1. */
static inline idx_t FN(tile_queries)(idx_t q0, idx_t i1) { return i1 - q0 < BLOCK_Q ? i1 - q0 : BLOCK_Q; }

/* scores_t (nk, BLOCK_Q) of the packed keys [j0, j0+nk) against queries
 * [i0, i0+nq): the product, then -1e20 where the mask is 0 (the documents'
 * masked_fill) and, for keys a causal query may not see, the score plus
 * -inf as in PyTorch's math path: -inf (an exactly-zero weight) for a
 * finite score, NaN for a NaN or +inf one. */
static void FN(score_tile)(FN(tile_buffers) *t, const attnc_attention_args *a, idx_t b, idx_t i0,
                           idx_t nq, idx_t j0, idx_t nk)
{
    FN(score_product)(t->scores_t, t->k_pack, t->q_pack, nk, nq, a->E);
    for (idx_t j = 0; j < nk; j++) {
        real *row = t->scores_t + j * BLOCK_Q;
        if (a->mask) {
            const uint8_t *m = a->mask + a->mask_off[b] + i0 * a->mask_rs + (j0 + j) * a->mask_cs;
            for (idx_t i = 0; i < nq; i++) row[i] = m[i * a->mask_rs] ? row[i] : (real)-1e20;
        }
        if (a->is_causal) /* query i0+i sees key j0+j only when j0+j <= i0+i */
            for (idx_t i = 0; i < nq && i0 + i < j0 + j; i++) row[i] -= (real)INFINITY;
    }
}

/* scores_t (nk, BLOCK_Q) *= (kept ? 1/(1-p) : 0) for item b, keys from j0 */
static void FN(apply_dropout)(real *scores_t, const attnc_attention_args *a, idx_t b, idx_t i0, idx_t nq,
                              idx_t j0, idx_t nk)
{
    real keep_scale = a->dropout_p >= 1 ? 0 : (real)(1.0 / (1.0 - a->dropout_p));
    uint64_t first = ((uint64_t)b * (uint64_t)a->L + (uint64_t)i0) * (uint64_t)a->S + (uint64_t)j0;
    for (idx_t j = 0; j < nk; j++)
        for (idx_t i = 0; i < nq; i++) {
            uint64_t index = first + (uint64_t)i * (uint64_t)a->S + (uint64_t)j;
            scores_t[j * BLOCK_Q + i] *= attnc_uniform(a->seed, index) < a->dropout_p ? 0 : keep_scale;
        }
}

/* out rows [i0, i0+nq) of item b <- acc / row_sum (row_sum NULL: acc) */
static void FN(write_rows)(const attnc_attention_args *a, const FN(tile_buffers) *t, idx_t b, idx_t i0,
                           idx_t nq, const real *row_sum)
{
    real *out = (real *)a->out + a->out_off[b];
    for (idx_t i = 0; i < nq; i++) {
        real *dst = out + (i0 + i) * a->out_rs;
        const real *src = t->acc + i * t->Ev_padded;
        real factor = row_sum && a->S > 0 ? 1 / row_sum[i] : 1;
        for (idx_t c = 0; c < a->Ev; c++) dst[c] = src[c] * factor;
    }
}

/* One step of the online softmax for queries [i0, i0+nq) (the tile's view
 * of the buffers): the scores against the packed key tile [j0, j0+nk),
 * the running max and sum updated (what was accumulated under an older
 * max is rescaled when the max grows), then P.V added to acc. */
static void FN(flash_step)(FN(tile_buffers) *t, const attnc_attention_args *a, idx_t b, idx_t i0, idx_t nq,
                           idx_t j0, idx_t nk)
{
    FN(score_tile)(t, a, b, i0, nq, j0, nk);
    FN(column_max)(t->tile_max, t->scores_t, nq, nk);
    for (idx_t i = 0; i < nq; i++) {
        real new_max = t->tile_max[i] > t->run_max[i] ? t->tile_max[i] : t->run_max[i];
        t->correction[i] = new_max == t->run_max[i] ? 1 : FN(vexp)(t->run_max[i] - new_max);
        t->run_sum[i] *= t->correction[i];
        t->run_max[i] = new_max;
    }
    FN(column_exp_sum)(t->scores_t, t->run_max, t->run_sum, nq, nk);
    if (a->dropout_p > 0) FN(apply_dropout)(t->scores_t, a, b, i0, nq, j0, nk);
    for (idx_t i = 0; i < nq; i++)
        if (t->correction[i] != 1) FN(scale_row)(t->acc + i * t->Ev_padded, t->Ev_padded, t->correction[i]);
    FN(value_product)(t->acc, t->scores_t, t->v_pack, nq, nk, t->Ev_padded);
}

/* Queries [i0, i1) of item b, in tiles of BLOCK_Q, by the online softmax:
 * each key/value tile is packed once and visits every query tile that can
 * see it; the (L, S) score matrix never exists. A causal tile stops at its
 * diagonal when the item's keys and values are finite. Otherwise every key
 * is visited, so that NaN and inf reach every query as in PyTorch's math
 * path (a hidden NaN key makes the score NaN; a hidden NaN value is
 * multiplied by its zero weight). */
static void FN(flash_queries)(FN(tile_buffers) *t, const attnc_attention_args *a, idx_t b, idx_t i0, idx_t i1)
{
    int skip_hidden = a->is_causal &&
                      FN(rows_finite)((const real *)a->k + a->k_off[b], a->k_rs, a->S, a->E) &&
                      FN(rows_finite)((const real *)a->v + a->v_off[b], a->v_rs, a->S, a->Ev);
    idx_t tiles = (i1 - i0 + BLOCK_Q - 1) / BLOCK_Q;
    for (idx_t q = 0; q < tiles * BLOCK_Q; q++) {
        t->run_max[q] = -(real)INFINITY;
        t->run_sum[q] = 0;
    }
    idx_t end = FN(key_end)(a, skip_hidden, i0, i1 - i0);
    for (idx_t j0 = 0; j0 < end; j0 += BLOCK_K) {
        idx_t nk = end - j0 < BLOCK_K ? end - j0 : BLOCK_K;
        FN(pack_key_tile)(t, a, b, j0, nk);
        FN(pack_value_tile)(t, a, b, j0, nk);
        for (idx_t tile = 0; tile < tiles; tile++) {
            idx_t q0 = i0 + tile * BLOCK_Q, nq = FN(tile_queries)(q0, i1);
            idx_t tile_end = FN(key_end)(a, skip_hidden, q0, nq);
            if (j0 >= tile_end) continue; /* causal: no query of the tile sees these keys */
            FN(tile_buffers) view = FN(tile_view)(t, tile, a->E);
            FN(flash_step)(&view, a, b, q0, nq, j0, tile_end - j0 < nk ? tile_end - j0 : nk);
        }
    }
    for (idx_t tile = 0; tile < tiles; tile++) {
        idx_t q0 = i0 + tile * BLOCK_Q, nq = FN(tile_queries)(q0, i1);
        FN(tile_buffers) view = FN(tile_view)(t, tile, a->E);
        FN(write_rows)(a, &view, b, q0, nq, view.run_sum);
    }
}

/* The weights output (nq, S) rows hold the scores: all scores, softmax in
 * place, then dropout(weights) . V. */
static void FN(weights_tile)(FN(tile_buffers) *t, const attnc_attention_args *a, idx_t b, idx_t i0, idx_t nq)
{
    idx_t S = a->S;
    real *w = (real *)a->weights + (b * a->L + i0) * S;
    for (idx_t j0 = 0; j0 < S; j0 += BLOCK_K) { /* pass 1: scores */
        idx_t nk = S - j0 < BLOCK_K ? S - j0 : BLOCK_K;
        FN(pack_key_tile)(t, a, b, j0, nk);
        FN(score_tile)(t, a, b, i0, nq, j0, nk);
        for (idx_t j = 0; j < nk; j++)
            for (idx_t i = 0; i < nq; i++) w[i * S + j0 + j] = t->scores_t[j * BLOCK_Q + i];
    }
    for (idx_t i = 0; i < nq; i++) { /* pass 2: softmax in place */
        real *row = w + i * S;
        FN(scale_row)(row, S, 1 / FN(exp_shift_sum)(row, S, FN(row_max)(row, S)));
    }
    for (idx_t j0 = 0; j0 < S; j0 += BLOCK_K) { /* pass 3: dropout(weights) . V */
        idx_t nk = S - j0 < BLOCK_K ? S - j0 : BLOCK_K;
        for (idx_t j = 0; j < nk; j++)
            for (idx_t i = 0; i < nq; i++) t->scores_t[j * BLOCK_Q + i] = w[i * S + j0 + j];
        if (a->dropout_p > 0) FN(apply_dropout)(t->scores_t, a, b, i0, nq, j0, nk);
        FN(pack_value_tile)(t, a, b, j0, nk);
        FN(value_product)(t->acc, t->scores_t, t->v_pack, nq, nk, t->Ev_padded);
    }
    FN(write_rows)(a, t, b, i0, nq, NULL);
}

/* Task = item b and a run of tiles_per_task query tiles. */
static void FN(attention_task)(void *ctx, idx_t task)
{
    FN(attention_job) *job = ctx;
    const attnc_attention_args *a = job->args;
    idx_t b = task / job->tasks_per_item;
    idx_t first_tile = (task % job->tasks_per_item) * job->tiles_per_task;
    idx_t last_tile = first_tile + job->tiles_per_task;
    if (last_tile > job->n_query_tiles) last_tile = job->n_query_tiles;
    if (first_tile >= last_tile) return;
    idx_t i0 = first_tile * BLOCK_Q, i1 = last_tile * BLOCK_Q < a->L ? last_tile * BLOCK_Q : a->L;
    real *work = attnc_malloc((size_t)job->workspace_elems * sizeof(real));
    if (!work) {
        atomic_store(&job->failed, 1);
        return;
    }
    FN(tile_buffers) t = FN(carve_buffers)(work, a->E, a->Ev, last_tile - first_tile);
    for (idx_t tile = 0; tile < last_tile - first_tile; tile++) {
        idx_t q0 = i0 + tile * BLOCK_Q, nq = FN(tile_queries)(q0, i1);
        FN(tile_buffers) view = FN(tile_view)(&t, tile, a->E);
        for (idx_t i = 0; i < BLOCK_Q * t.Ev_padded; i++) view.acc[i] = 0;
        const real *q = (const real *)a->q + a->q_off[b] + q0 * a->q_rs;
        FN(pack_row_slivers)(view.q_pack, q, a->q_rs, nq, FN(padded_queries)(nq), a->E, UK_NR, (real)a->scale);
        if (a->weights) FN(weights_tile)(&view, a, b, q0, nq);
    }
    if (!a->weights) FN(flash_queries)(&t, a, b, i0, i1);
    attnc_free(work);
}

/* Query tiles per task: up to MAX_TILES_PER_TASK (one when the weights are
 * materialised), fewer when their state would leave L2, and few enough
 * that there are at least 4 tasks per thread. The split never changes a
 * result: every query meets the same key tiles in the same order. */
static idx_t FN(tiles_per_task)(const attnc_attention_args *a, idx_t n_query_tiles)
{
    if (a->weights) return 1;
    /* bytes of one tile's packed queries and accumulator (double: no overflow) */
    double per_tile = (double)BLOCK_Q * ((double)a->E + (double)a->Ev + GEMM_MAX_NR) * (double)sizeof(real);
    idx_t tiles = per_tile * MAX_TILES_PER_TASK <= TASK_STATE_BYTES ? MAX_TILES_PER_TASK
                                                                    : (idx_t)(TASK_STATE_BYTES / per_tile);
    if (tiles < 1) tiles = 1;
    idx_t wanted_tasks = 4 * (idx_t)attnc_get_num_threads();
    /* few items (n_items < wanted_tasks keeps the products small): split finer */
    if (a->n_items > 0 && a->n_items < wanted_tasks &&
        a->n_items * ((n_query_tiles + tiles - 1) / tiles) < wanted_tasks) {
        idx_t per_item = (wanted_tasks + a->n_items - 1) / a->n_items;
        tiles = (n_query_tiles + per_item - 1) / per_item;
    }
    return tiles > 0 ? tiles : 1;
}

attnc_status FN(attention)(const attnc_attention_args *a)
{
    idx_t n_query_tiles = (a->L + BLOCK_Q - 1) / BLOCK_Q;
    idx_t tiles = FN(tiles_per_task)(a, n_query_tiles);
    idx_t elems = attention_workspace_elems(a->E, a->Ev, tiles);
    if (elems < 0 || (size_t)elems > SIZE_MAX / sizeof(real)) return ATTNC_EOVERFLOW;
    FN(attention_job) job = {a, n_query_tiles, tiles, (n_query_tiles + tiles - 1) / tiles, elems, 0};
    idx_t n_tasks;
    if (!attnc_mul_ok(a->n_items, job.tasks_per_item, &n_tasks)) return ATTNC_EOVERFLOW;
    double flops = 2.0 * (double)a->n_items * (double)a->L * (double)a->S * (double)(a->E + a->Ev);
    attnc_parallel_for(n_tasks, flops, FN(attention_task), &job);
    return atomic_load(&job.failed) ? ATTNC_ENOMEM : ATTNC_OK;
}
