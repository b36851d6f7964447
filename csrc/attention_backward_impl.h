/* The attention backward (dtype and ISA template; needs the forward's
 * attention_tiles.h, attention_rows.h and attention_impl.h): flash-style,
 * P recomputed tile by tile from the forward's row log-sum-exp, never the
 * (L, S) matrices (attnc.h gives the formulas).
 *
 *   per item b: Q (L, E), K (S, E), V (S, Ev), O and dO (L, Ev), lse (L)
 *   grad tile (query tile i of BLOCK_Q, key block j of BLOCK_K), transposed
 *   as the forward's score tile (keys, queries):
 *     P^T  (nk, nq) = exp(scale K_j Q_i^T - lse_i)       (score_tile, masked)
 *     dS^T (nk, nq) = P^T * ((V_j dO_i^T) * m - D_i) * scale
 *     dV_j += (P^T * m) dO_i     dK_j += dS^T Q_i     dQ_i += dS K_j
 *
 * Two passes, so that two threads are busy even for one item:
 *   key pass:   one task per (item, key block): dK_j and dV_j over every
 *               query tile, in order;
 *   query pass: one task per (item, query tile): dQ_i over every key
 *               block, in order.
 * With many items the key pass also adds dQ (one task per item, its dQ
 * accumulated over the key blocks in the same order as the query pass
 * would): five tile products per grad tile instead of seven. Every sum is
 * taken in the same order either way, so the bits never depend on the
 * pass plan, the thread count or the batch.
 *
 * A gradient shared by several items (its input broadcast over a batch
 * axis: a batch stride of 0 there) is their sum: the items run in runs of
 * consecutive items, each item's gradient into a scratch of the run's
 * (as large as the shared gradients, or SHARED_SCRATCH_MIN_ELEMS, or one
 * item a thread), then added into the shared one item by item, in item
 * order (sum_task). */

/* One task's buffers (grad_layout), each 64-byte aligned. The query
 * tiles' packs and row factors live in slots: in the fused pass one per
 * query tile of the item, prepared once per task for all its key blocks
 * (query_slot gives a tile's view); in the key and query passes one, each
 * tile prepared in it when used (a key pass task uses each tile once). */
typedef struct {
    FN(tile_buffers) fwd; /* the forward's score-tile buffers: q_pack (a slot's), k_pack, scores_t (P^T) */
    real *do_rows;  /* slot: (BLOCK_Q / NR) slivers of (Ev, NR): dO_i, for V_j dO_i^T */
    real *q_cols;   /* slot: (E_padded / NR) slivers of (qb, NR): Q_i, for dK         */
    real *do_cols;  /* slot: (Ev_padded / NR) slivers of (qb, NR): dO_i, for dV       */
    real *d, *shift, *norm; /* slot: (BLOCK_Q) each: D, and P = exp(s - shift) * norm                */
    real *v_rows;   /* (BLOCK_K / MR) slivers of (Ev, MR): V_j                        */
    real *k_cols;   /* (E_padded / NR) slivers of (kb, NR): K_j, for dQ               */
    real *ds_t;     /* (BLOCK_K, BLOCK_Q): V_j dO_i^T, then dS^T                      */
    real *dk, *dv;  /* (kb, E_padded), (kb, Ev_padded): the key block's               */
    real *dq;       /* (dq_rows, E_padded): the query tile's, or the item's (fused)   */
    idx_t E_padded, Ev_padded;
    idx_t qb, kb;     /* rows of a query tile's and a key block's buffers */
    idx_t slot_elems; /* one slot's size */
} FN(grad_buffers);

/* The layout for an item of L queries and S keys, in one place: carves
 * `work` into t (when not NULL) and returns its size in elements. The
 * buffers hold at most the item's queries (qb per slot) and keys (kb),
 * so the workspace stays within a few times the inputs' size however
 * large the heads. */
static idx_t FN(grad_layout)(real *work, idx_t L, idx_t S, idx_t E, idx_t Ev, idx_t slots, idx_t dq_rows,
                             FN(grad_buffers) *t)
{
    idx_t used = 0, E_padded = ROUND_UP(E, GEMM_NR), Ev_padded = ROUND_UP(Ev, GEMM_NR);
    idx_t qb = FN(padded_queries)(attnc_min(L, BLOCK_Q)), kb = ROUND_UP(attnc_min(S, BLOCK_K), GEMM_MR);
#define PART(field, elems)                          \
    t->field = work ? work + used : NULL;           \
    used += ROUND_UP((elems), BUFFER_ALIGN_ELEMS)
    PART(fwd.q_pack, qb * E); /* slot 0; the other slots follow it */
    PART(do_rows, qb * Ev);
    PART(q_cols, qb * E_padded);
    PART(do_cols, qb * Ev_padded);
    PART(d, BLOCK_Q);
    PART(shift, BLOCK_Q);
    PART(norm, BLOCK_Q);
    t->slot_elems = used;
    used += (slots - 1) * t->slot_elems;
    PART(fwd.k_pack, kb * E);
    PART(fwd.scores_t, BLOCK_K * BLOCK_Q);
    PART(v_rows, kb * Ev);
    PART(k_cols, kb * E_padded);
    PART(ds_t, BLOCK_K * BLOCK_Q);
    PART(dk, kb * E_padded);
    PART(dv, kb * Ev_padded);
    PART(dq, dq_rows * E_padded);
#undef PART
    t->E_padded = E_padded;
    t->Ev_padded = Ev_padded;
    t->fwd.pairs = 0; /* the backward's products take widened operands */
    t->qb = qb;
    t->kb = kb;
    return used;
}

/* t with query tile `tile`'s slot in place of slot 0's. */
static FN(grad_buffers) FN(query_slot)(const FN(grad_buffers) *t, idx_t tile)
{
    FN(grad_buffers) v = *t;
    idx_t offset = tile * t->slot_elems;
    v.fwd.q_pack += offset;
    v.do_rows += offset;
    v.q_cols += offset;
    v.do_cols += offset;
    v.d += offset;
    v.shift += offset;
    v.norm += offset;
    return v;
}

/* Which hidden pairs of an item are skipped (pair_seen), from a first pass
 * (skips_task): flags, SKIP_ ones; with SKIP_BIAS, score_bound bounds the
 * item's scaled q . k (bias_floor's). */
typedef struct {
    int flags;
    real score_bound;
} FN(pair_skips);

/* Where item b's backward operands start (the forward's view, and these). */
typedef struct {
    FN(item_view) fwd; /* q, k, v, mask; out = O */
    const elem *grad_out;
    const real *lse;
    elem *grad_q, *grad_k, *grad_v;
    FN(pair_skips) skips;
    const real *row_stats; /* (L, 2): shift and norm of the rows that take their own (own_stats), or NULL */
} FN(grad_view);

/* skips as grad_job's item_skips holds them (flags 0 for none) */
static FN(grad_view) FN(grad_item_at)(const attnc_attention_backward_args *g, idx_t b, FN(pair_skips) skips)
{
    const idx_t *const strides[4] = {g->grad_out.batch_strides, g->grad_q.batch_strides, g->grad_k.batch_strides,
                                     g->grad_v.batch_strides};
    idx_t at[4];
    attnc_item_offsets(&g->forward.batch, b, 4, strides, at);
    FN(grad_view) view = {
        FN(item_at)(&g->forward, b),
        (const elem *)g->grad_out.data + at[0],
        (const real *)g->lse + b * g->forward.L,
        (elem *)g->grad_q.data + at[1],
        (elem *)g->grad_k.data + at[2],
        (elem *)g->grad_v.data + at[3],
        skips,
        NULL, /* row_stats: the job's (job_item) */
    };
    return view;
}

/* The micro-kernel adding into a key block's rows: c (MR keys, NR) += a
 * (MR keys, kc queries) . b, a read in place from a transposed tile
 * (keys BLOCK_Q apart); of the last block, the m keys left on whole
 * GEMM_MR_STEP rows (gemm_tile_rows: score_product wrote those rows).
 * Out of line, as tile_add. */
static __attribute__((noinline)) void FN(tile_add_keys)(idx_t m, idx_t kc, const real *a, const real *b, real *c,
                                                        idx_t c_rs)
{
    FN(gemm_tile_rows)(m, GEMM_NR, kc, a, BLOCK_Q, 1, b, 0, c, c_rs, NULL, 0, NULL, 0, 0);
}

/* acc (nk, width_padded) += tile_t (nk, BLOCK_Q)[:, :nq] . cols (nq queries
 * packed as column slivers of sliver_rows): dV += (P m)^T dO, dK += dS^T Q */
static void FN(key_product)(real *acc, const real *tile_t, const real *cols, idx_t nk, idx_t nq, idx_t width_padded,
                            idx_t sliver_rows)
{
    for (idx_t j0 = 0; j0 < nk; j0 += GEMM_MR)
        for (idx_t c0 = 0; c0 < width_padded; c0 += GEMM_NR)
            FN(tile_add_keys)(nk - j0, nq, tile_t + j0 * BLOCK_Q, cols + c0 * sliver_rows, acc + j0 * width_padded + c0,
                              width_padded);
}

/* P = exp(s - lse) is off by about |lse| ulps of the dtype (the rounding
 * of lse), and entirely wrong once log(sum) is below lse's rounding (the
 * mask's -1e20 fill, a large negative bias). Beyond this |lse| (an error of
 * 1.5e-5 in float, 1.5e-11 in double) a row's max and sum are recomputed
 * exactly instead (own_stats). */
#define EXACT_LSE_LIMIT (sizeof(real) == sizeof(float) ? 0x1p7 : 0x1p16)

/* 1 when a row's P is exp(s - shift) * norm from its own max and sum
 * (stats_task), not exp(s - lse): its |lse| is beyond EXACT_LSE_LIMIT, or
 * the forward took the rows path, whose scores (and so lse) are summed in
 * another order than the tiles' scores P exponentiates (a key holding a
 * row's whole weight came out 1.00001-1.0005 at float32 scores of 100-1000,
 * 10-25x torch's float32 error, where the tiles' own lse gives exactly 1).
 * Never a row of lse -inf (no key: P = 0) or NaN. */
static inline int FN(own_stats)(const attnc_attention_args *a, real lse)
{
    if (lse == -(real)INFINITY || lse != lse) return 0;
    return attention_takes_rows(a) || lse > (real)EXACT_LSE_LIMIT || lse < -(real)EXACT_LSE_LIMIT;
}

static inline idx_t FN(block_keys)(const attnc_attention_args *a, idx_t j0) { return attnc_min(a->S - j0, BLOCK_K); }

/* max (nq) and sum (nq) of query tile [i0, i0+nq) (its queries packed in
 * t->q_pack): each row's largest score and the sum of exp(s -
 * safe_shift(max)) over every key, from the very scores grad_tile
 * exponentiates (score_tile's), key block by key block as the forward's
 * flash_step keeps its running max and sum (grow_running_max; each block packed into
 * t->k_pack and scored into t->scores_t). (The rows path's scores had
 * served: at scores near 1e18 a row's top score and that max differed by
 * ~100, and its weight was e^100 off.) */
static void FN(tile_stats)(FN(tile_buffers) *t, const attnc_attention_args *a, const FN(item_view) *item, idx_t i0,
                           idx_t nq, real *max, real *sum)
{
    real block[BLOCK_Q], correction[BLOCK_Q]; /* a block's maxima, then the rows' shifts */
    for (idx_t i = 0; i < nq; i++) max[i] = -(real)INFINITY, sum[i] = 0;
    for (idx_t j0 = 0; j0 < a->S && !attnc_interrupted(); j0 += BLOCK_K) {
        idx_t nk = FN(block_keys)(a, j0);
        FN(pack_key_tile)(t, a, item, j0, nk);
        FN(score_tile)(t, a, item, i0, nq, j0, nk, mask_cover(a, item->mask, i0, nq, j0, nk));
        FN(column_max)(block, t->scores_t, nq, nk); /* (NaN skipped, as the forward's) */
        FN(grow_running_max)(max, sum, block, correction, nq);
        FN(column_exp_sum)(t->scores_t, block, sum, nq, nk, 0);
    }
}

/* The query tile's packs, D, and how P is recomputed for each row:
 * exp(s - shift) * norm, with shift = lse and norm 1; a row of -inf (lse
 * -inf) has P = 0 (shift +inf); a row that takes its own max and sum
 * (own_stats) the shift and 1/sum of the item's row_stats. */
static void FN(prepare_queries)(FN(grad_buffers) *t, const attnc_attention_backward_args *g, const FN(grad_view) *item,
                                idx_t i0, idx_t nq)
{
    const attnc_attention_args *a = &g->forward;
    const elem *q = item->fwd.q + i0 * a->q.row_stride, *dout = item->grad_out + i0 * g->grad_out.row_stride;
    idx_t columns = FN(score_columns)(nq);
    FN(pack_row_slivers)(t->fwd.q_pack, q, a->q.row_stride, nq, columns, a->E, GEMM_NR, (real)a->scale, 0);
    FN(pack_row_slivers)(t->do_rows, dout, g->grad_out.row_stride, nq, columns, a->Ev, GEMM_NR, 1, 0);
    FN(pack_column_slivers)(t->q_cols, q, a->q.row_stride, nq, a->E, t->E_padded, GEMM_NR, t->qb, 0);
    FN(pack_column_slivers)(t->do_cols, dout, g->grad_out.row_stride, nq, a->Ev, t->Ev_padded, GEMM_NR, t->qb, 0);
    for (idx_t i = 0; i < nq; i++) {
        const elem *o = item->fwd.out + (i0 + i) * a->out.row_stride, *d_o = dout + i * g->grad_out.row_stride;
        /* D = dO . O by the fused multiply-adds, in the order, of grad_tile's
         * dP = dO . V (score_product): a row whose weight is all on one key
         * has O that key's value, D its dP, and dS = P (dP - D) exactly 0, as
         * in PyTorch (mul-then-add sums had left grad_query and grad_key
         * 2e-5 to 3e-4 off there, for rows of 2-15 queries) */
        real d = 0;
        for (idx_t c = 0; c < a->Ev; c++) d = sfma(to_real(d_o[c]), to_real(o[c]), d);
        t->d[i] = d;
        real lse = item->lse[i0 + i];
        int own = FN(own_stats)(a, lse); /* (row_stats then holds it: stats_task) */
        t->shift[i] = own ? item->row_stats[2 * (i0 + i)] : lse == -(real)INFINITY ? (real)INFINITY : lse;
        t->norm[i] = own ? item->row_stats[2 * (i0 + i) + 1] : 1;
    }
}

/* The key block's packs: keys for the scores, values for V dO^T, and keys
 * as column slivers for dQ when with_dq. */
static void FN(prepare_keys)(FN(grad_buffers) *t, const attnc_attention_backward_args *g, const FN(grad_view) *item,
                             idx_t j0, idx_t nk, int with_dq)
{
    const attnc_attention_args *a = &g->forward;
    const elem *k = item->fwd.k + j0 * a->k.row_stride, *v = item->fwd.v + j0 * a->v.row_stride;
    FN(pack_key_tile)(&t->fwd, a, &item->fwd, j0, nk);
    FN(pack_row_slivers)(t->v_rows, v, a->v.row_stride, nk, ROUND_UP(nk, GEMM_MR), a->Ev, GEMM_MR, 1, 0);
    if (with_dq) FN(pack_column_slivers)(t->k_cols, k, a->k.row_stride, nk, a->E, t->E_padded, GEMM_NR, t->kb, 0);
}

/* The grad tile of queries [i0, i0+nq) and keys [j0, j0+nk) (both
 * prepared; cover: the pair's mask_cover): scores_t <- (P m)^T, ds_t <-
 * dS^T (scale folded in). */
static void FN(grad_tile)(FN(grad_buffers) *t, const attnc_attention_backward_args *g, const FN(grad_view) *item,
                          idx_t b, idx_t i0, idx_t nq, idx_t j0, idx_t nk, attnc_mask_cover cover)
{
    const attnc_attention_args *a = &g->forward;
    real scale = (real)a->scale;
    FN(score_tile)(&t->fwd, a, &item->fwd, i0, nq, j0, nk, cover);
    FN(score_product)(t->ds_t, t->v_rows, NULL, 0, 0, t->do_rows, nk, nq, a->Ev, NULL, 0);
    for (idx_t j = 0; j < nk; j++) FN(exp_shift_row)(t->fwd.scores_t + j * BLOCK_Q, nq, t->shift, t->norm);
    if (a->dropout_p > 0) { /* one mask draw per weight serves dP and P m */
        FN(dropout_mask) mask = FN(dropout_mask_at)(a, b, i0, j0);
        real m[BLOCK_Q];
        for (idx_t j = 0; j < nk; j++) {
            real *p = t->fwd.scores_t + j * BLOCK_Q, *ds = t->ds_t + j * BLOCK_Q;
            FN(column_keep_factors)(m, &mask, nq, j);
            for (idx_t i = 0; i < nq; i++) {
                ds[i] = p[i] * (ds[i] * m[i] - t->d[i]) * scale;
                p[i] *= m[i];
            }
        }
    } else {
        for (idx_t j = 0; j < nk; j++) {
            real *p = t->fwd.scores_t + j * BLOCK_Q, *ds = t->ds_t + j * BLOCK_Q;
            for (idx_t i = 0; i < nq; i++) ds[i] = p[i] * (ds[i] - t->d[i]) * scale;
        }
    }
    if (item->fwd.mask) /* a masked score is the constant fill: no gradient reaches Q or K through it */
        FN(fill_hidden_tile)(t->ds_t, a, item->fwd.mask, i0, nq, j0, nk, cover, 0);
}

/* rows (n, cols) of a padded accumulator (rows acc_rs apart) -> dst */
static void FN(write_grad_rows)(elem *dst, idx_t dst_rs, const real *acc, idx_t acc_rs, idx_t n, idx_t cols)
{
    for (idx_t r = 0; r < n; r++) FN(store_row)(dst + r * dst_rs, acc + r * acc_rs, cols);
}

/* 1 when P = exp(s - lse) of each of the n rows is recomputed from the
 * lse given (no row takes its own stats: |lse| <= EXACT_LSE_LIMIT, the
 * forward on the tiles; not NaN), so that a score far below
 * it (the mask's fill, -1e20; a bias under the bias_floor of the lse) gets
 * P = 0 exactly, whatever lse the caller passed */
static inline int FN(weights_from_lse)(const attnc_attention_args *a, const real *lse, idx_t n)
{
    if (attention_takes_rows(a)) return 0; /* (own_stats) */
    for (idx_t i = 0; i < n; i++)
        if (!(lse[i] >= -(real)EXACT_LSE_LIMIT && lse[i] <= (real)EXACT_LSE_LIMIT)) return 0;
    return 1;
}

/* 1 when no row of the n has a NaN lse (which would make even a -inf
 * score's P NaN) */
static inline int FN(lse_not_nan)(const real *lse, idx_t n)
{
    for (idx_t i = 0; i < n; i++)
        if (lse[i] != lse[i]) return 0;
    return 1;
}

/* Which hidden pairs an item's backward skips (item_skips): those outside
 * the band or hidden by the mask (its scores surely finite), those whose
 * bias hides them (-inf, or at or below the bias_floor of the tile's rows'
 * lse: its scores but for the bias surely finite, and the tile's lse not
 * NaN); either only when dP and D are surely finite, so that dS = 0 * (dP -
 * D) is 0 (skips_task). */
#ifndef ATTNC_GRAD_SKIPS
#define ATTNC_GRAD_SKIPS
enum { SKIP_BAND_AND_MASK = 1, SKIP_BIAS = 2 };
#endif

/* 1 if the pair of the tile at i0 and the block at j0 is computed: some
 * query of the tile sees some key of the block (its band meets the block,
 * the mask does not hide the whole block from the tile, and the bias does
 * not hide it all: -inf, or a finite mask's value far enough below the
 * rows' lse, as the forward's bias_floor of their running maxima, where P =
 * exp(s - lse) with the lse given: weights_from_lse), or the item's
 * hidden pairs are not skipped. A hidden pair adds exact zeros to every
 * gradient (its P is 0, its dS 0, and every number they multiply is
 * finite), so leaving it out changes no bit (but a -0 sum that becomes +0).
 * Both passes ask this of every (tile, block) pair, so they visit the same
 * pairs: the bits never depend on the plan. cover: the pair's mask_cover. */
static inline int FN(pair_seen)(const attnc_attention_args *a, const FN(grad_view) *item, idx_t i0, idx_t j0,
                                attnc_mask_cover cover)
{
    if (!item->skips.flags) return 1;
    idx_t nq = FN(tile_queries)(i0, a->L), nk = FN(block_keys)(a, j0);
    if (item->skips.flags & SKIP_BAND_AND_MASK) {
        if (attnc_band_begin(&a->band, i0, a->S) >= j0 + nk || attnc_band_end(&a->band, i0 + nq - 1, a->S) <= j0)
            return 0;
        if (cover == MASK_HIDES_ALL && FN(weights_from_lse)(a, item->lse + i0, nq)) return 0;
    }
    if (!((item->skips.flags & SKIP_BIAS) && cover == MASK_KEEPS_ALL && FN(lse_not_nan)(item->lse + i0, nq))) return 1;
    /* a finite floor only where P is computed from the lse given (not from a row's own max) */
    real least = FN(weights_from_lse)(a, item->lse + i0, nq) ? FN(least_max)(item->lse + i0, nq) : -(real)INFINITY;
    real floor = FN(bias_floor)(least, item->skips.score_bound);
    return FN(bias_hidden_tail)(a, item->fwd.bias, i0, nq, j0, nk, floor) < nk;
}

/* Every query tile of the item into its slot (the fused pass). */
static void FN(prepare_query_slots)(const FN(grad_buffers) *t, const attnc_attention_backward_args *g,
                                    const FN(grad_view) *item)
{
    for (idx_t i0 = 0; i0 < g->forward.L; i0 += BLOCK_Q) {
        FN(grad_buffers) slot = FN(query_slot)(t, i0 / BLOCK_Q);
        FN(prepare_queries)(&slot, g, item, i0, FN(tile_queries)(i0, g->forward.L));
    }
}

/* dK and dV of key block [j0, j0+nk) of the item over every query tile
 * that sees it, in order; with dq_item (the item's dQ accumulator, L
 * padded rows: the fused pass), dQ of those tiles too, each tile prepared
 * in its slot already; without, each tile prepared in slot 0 here. */
static void FN(key_block_grads)(FN(grad_buffers) *t, const attnc_attention_backward_args *g,
                                const FN(grad_view) *item, idx_t b, idx_t j0, real *dq_item)
{
    const attnc_attention_args *a = &g->forward;
    idx_t nk = FN(block_keys)(a, j0);
    FN(prepare_keys)(t, g, item, j0, nk, dq_item != NULL);
    memset(t->dk, 0, (size_t)(t->kb * t->E_padded) * sizeof(real));
    memset(t->dv, 0, (size_t)(t->kb * t->Ev_padded) * sizeof(real));
    for (idx_t i0 = 0; i0 < a->L && !attnc_interrupted(); i0 += BLOCK_Q) {
        idx_t nq = FN(tile_queries)(i0, a->L);
        attnc_mask_cover cover = mask_cover(a, item->fwd.mask, i0, nq, j0, nk);
        if (!FN(pair_seen)(a, item, i0, j0, cover)) continue;
        FN(grad_buffers) slot = dq_item ? FN(query_slot)(t, i0 / BLOCK_Q) : *t;
        if (!dq_item) FN(prepare_queries)(&slot, g, item, i0, nq);
        FN(grad_tile)(&slot, g, item, b, i0, nq, j0, nk, cover);
        FN(key_product)(t->dv, slot.fwd.scores_t, slot.do_cols, nk, nq, t->Ev_padded, t->qb);
        FN(key_product)(t->dk, slot.ds_t, slot.q_cols, nk, nq, t->E_padded, t->qb);
        if (dq_item)
            FN(value_product)(dq_item + i0 * t->E_padded, slot.ds_t, t->k_cols, NULL, 0, 0, nq, nk,
                              t->E_padded, t->kb, 0);
    }
    FN(write_grad_rows)(item->grad_k + j0 * g->grad_k.row_stride, g->grad_k.row_stride, t->dk, t->E_padded, nk,
                        a->E);
    FN(write_grad_rows)(item->grad_v + j0 * g->grad_v.row_stride, g->grad_v.row_stride, t->dv, t->Ev_padded, nk,
                        a->Ev);
}

/* dQ of query tile [i0, i0+nq) of the item over every key block it sees,
 * in order (the tile in slot 0). */
static void FN(query_tile_grads)(FN(grad_buffers) *t, const attnc_attention_backward_args *g,
                                 const FN(grad_view) *item, idx_t b, idx_t i0)
{
    const attnc_attention_args *a = &g->forward;
    idx_t nq = FN(tile_queries)(i0, a->L);
    FN(prepare_queries)(t, g, item, i0, nq);
    memset(t->dq, 0, (size_t)(t->qb * t->E_padded) * sizeof(real));
    for (idx_t j0 = 0; j0 < a->S && !attnc_interrupted(); j0 += BLOCK_K) {
        idx_t nk = FN(block_keys)(a, j0);
        attnc_mask_cover cover = mask_cover(a, item->fwd.mask, i0, nq, j0, nk);
        if (!FN(pair_seen)(a, item, i0, j0, cover)) continue;
        FN(prepare_keys)(t, g, item, j0, nk, 1);
        FN(grad_tile)(t, g, item, b, i0, nq, j0, nk, cover);
        FN(value_product)(t->dq, t->ds_t, t->k_cols, NULL, 0, 0, nq, nk, t->E_padded, t->kb, 0);
    }
    FN(write_grad_rows)(item->grad_q + i0 * g->grad_q.row_stride, g->grad_q.row_stride, t->dq, t->E_padded, nq, a->E);
}

typedef struct {
    const attnc_attention_backward_args *args;
    idx_t n_key_blocks, n_query_tiles, workspace_elems;
    int pass; /* KEY_PASS, QUERY_PASS or FUSED_PASS */
    atomic_int failed;
    /* with a mask, a bias, or a band that leaves a key block out of a
     * query tile (band_leaves_a_block_out): per item, which hidden pairs
     * are skipped, from a first pass (skips_task); else NULL */
    FN(pair_skips) *item_skips;
    /* (items, L, 2): each row's shift and 1/sum where it takes its own
     * (own_stats), from a first pass (stats_task); else NULL */
    real *row_stats;
    /* the run of items the passes go over: [first_item, first_item + run_items) */
    idx_t first_item, run_items;
    /* per gradient (q, k, v) shared by several items: the run's items' own,
     * one item's (rows, row_stride) after another; NULL: written in place */
    elem *scratch[3];
    idx_t scratch_item[3]; /* one item's elements */
} FN(grad_job);

/* Item b of the run, its shared gradients in the run's scratch. */
static FN(grad_view) FN(job_item)(const FN(grad_job) *job, idx_t b)
{
    FN(grad_view) item = FN(grad_item_at)(job->args, b, job->item_skips ? job->item_skips[b] : (FN(pair_skips)){0, 0});
    item.row_stats = job->row_stats ? job->row_stats + 2 * b * job->args->forward.L : NULL;
    elem **grads[3] = {&item.grad_q, &item.grad_k, &item.grad_v};
    for (int x = 0; x < 3; x++)
        if (job->scratch[x]) *grads[x] = job->scratch[x] + (b - job->first_item) * job->scratch_item[x];
    return item;
}

/* Task (item b, query tile): the item's row_stats of the tile's rows that
 * take their own max and sum (own_stats), from tile_stats, once per row
 * for both passes (a key pass's task per key block had recomputed them
 * each). */
static void FN(stats_task)(void *ctx, idx_t task)
{
    FN(grad_job) *job = ctx;
    const attnc_attention_args *a = &job->args->forward;
    idx_t b = task / job->n_query_tiles, i0 = task % job->n_query_tiles * BLOCK_Q, nq = FN(tile_queries)(i0, a->L);
    const real *lse = (const real *)job->args->lse + b * a->L + i0;
    int any = 0;
    for (idx_t i = 0; i < nq; i++) any |= FN(own_stats)(a, lse[i]);
    if (!any) return;
    idx_t q_elems = ROUND_UP(FN(padded_queries)(attnc_min(a->L, BLOCK_Q)) * a->E, BUFFER_ALIGN_ELEMS);
    idx_t k_elems = ROUND_UP(ROUND_UP(attnc_min(a->S, BLOCK_K), GEMM_MR) * a->E, BUFFER_ALIGN_ELEMS);
    real *work = attnc_malloc((size_t)(q_elems + k_elems + BLOCK_K * BLOCK_Q) * sizeof(real));
    if (!work) {
        atomic_store(&job->failed, 1);
        return;
    }
    FN(tile_buffers) t = {.q_pack = work, .k_pack = work + q_elems, .scores_t = work + q_elems + k_elems, .pairs = 0};
    FN(item_view) item = FN(item_at)(a, b);
    FN(pack_row_slivers)(t.q_pack, item.q + i0 * a->q.row_stride, a->q.row_stride, nq, FN(score_columns)(nq), a->E,
                         GEMM_NR, (real)a->scale, 0);
    real max[BLOCK_Q], sum[BLOCK_Q], *stats = job->row_stats + 2 * (b * a->L + i0);
    FN(tile_stats)(&t, a, &item, i0, nq, max, sum);
    for (idx_t i = 0; i < nq; i++)
        if (FN(own_stats)(a, lse[i])) {
            stats[2 * i] = FN(safe_shift)(max[i]);
            stats[2 * i + 1] = FN(safe_inverse)(sum[i]);
        }
    attnc_free(work);
}

/* 1 when the band leaves some key block wholly out of some query tile, by
 * pair_seen's band test: only then can item_skips skip a pair for the band
 * alone. A tile meets every block when its first row's band begins in the
 * first block and its last row's band ends past the last block's start.
 * CLIP's 77 causal queries (one tile, one block) had paid skips_task's
 * bounds and a parallel step for nothing: 6 % of a 1-thread backward. */
static int FN(band_leaves_a_block_out)(const attnc_attention_args *a)
{
    if (!a->band.on || a->S == 0) return 0;
    idx_t first_end = FN(block_keys)(a, 0), last_start = (a->S - 1) / BLOCK_K * BLOCK_K;
    for (idx_t i0 = 0; i0 < a->L; i0 += BLOCK_Q)
        if (attnc_band_begin(&a->band, i0, a->S) >= first_end ||
            attnc_band_end(&a->band, i0 + FN(tile_queries)(i0, a->L) - 1, a->S) <= last_start)
            return 1;
    return 0;
}

/* The item's entry of item_skips: the band and the mask as the forward's
 * skip_hidden, the bias's -inf as the forward's KEY_TILE_BIASED; both only
 * when dP = dO . V and D = dO . O are bounded (Cauchy-Schwarz, as the
 * scores), so that a hidden pair's dS, 0 * (dP - D), is 0: a NaN or inf in
 * dO or O, or finite ones whose products overflow, reach the hidden pairs'
 * gradients (0 * inf) in PyTorch's math path. */
static void FN(skips_task)(void *ctx, idx_t b)
{
    FN(grad_job) *job = ctx;
    const attnc_attention_backward_args *g = job->args;
    const attnc_attention_args *a = &g->forward;
    FN(grad_view) item = FN(grad_item_at)(g, b, (FN(pair_skips)){0, 0});
    real keys_bound = FN(keys_bound)(a, item.fwd.k, item.fwd.v, a->S);
    real grad_bound = FN(rows_norm_bound)(item.grad_out, g->grad_out.row_stride, a->L, a->Ev);
    int products_bounded =
        grad_bound * FN(rows_norm_bound)(item.fwd.v, a->v.row_stride, a->S, a->Ev) <= SCORE_BOUND &&
        grad_bound * FN(rows_norm_bound)(item.fwd.out, a->out.row_stride, a->L, a->Ev) <= SCORE_BOUND;
    int band_and_mask = (a->band.on || a->mask) && products_bounded &&
                        FN(scores_bounded)(a, FN(queries_bound)(a, &item.fwd, 0, a->L, 0, a->S), keys_bound);
    real q_bound = a->bias ? FN(rows_norm_bound)(item.fwd.q, a->q.row_stride, a->L, a->E) : (real)INFINITY;
    int bias = a->bias && products_bounded && FN(scores_bounded)(a, q_bound, keys_bound);
    job->item_skips[b] = (FN(pair_skips)){(band_and_mask ? SKIP_BAND_AND_MASK : 0) | (bias ? SKIP_BIAS : 0),
                                          bias ? FN(score_bound)(a, q_bound, keys_bound) : 0};
}

#ifndef ATTNC_GRAD_PASSES
#define ATTNC_GRAD_PASSES
enum { KEY_PASS, QUERY_PASS, FUSED_PASS };
#endif

/* Rows of a task's dQ accumulator: the item's (fused) or a query tile's. */
static idx_t FN(dq_rows)(const FN(grad_job) *job)
{
    const attnc_attention_args *a = &job->args->forward;
    return job->pass == FUSED_PASS ? job->n_query_tiles * BLOCK_Q : FN(padded_queries)(attnc_min(a->L, BLOCK_Q));
}

/* A task's workspace in elements (grad_layout): query slots for the item's
 * tiles in the fused pass, one in the others. */
static idx_t FN(task_workspace_elems)(const FN(grad_job) *job, FN(grad_buffers) *t, real *work)
{
    const attnc_attention_args *a = &job->args->forward;
    idx_t slots = job->pass == FUSED_PASS ? job->n_query_tiles : 1;
    return FN(grad_layout)(work, a->L, a->S, a->E, a->Ev, slots, FN(dq_rows)(job), t);
}

static void FN(grad_task)(void *ctx, idx_t task)
{
    FN(grad_job) *job = ctx;
    const attnc_attention_backward_args *g = job->args;
    real *work = attnc_malloc((size_t)job->workspace_elems * sizeof(real));
    if (!work) {
        atomic_store(&job->failed, 1);
        return;
    }
    FN(grad_buffers) t;
    const attnc_attention_args *a = &g->forward;
    FN(task_workspace_elems)(job, &t, work);
    if (job->pass == FUSED_PASS) {
        idx_t b = job->first_item + task;
        FN(grad_view) item = FN(job_item)(job, b);
        memset(t.dq, 0, (size_t)(FN(dq_rows)(job) * t.E_padded) * sizeof(real));
        FN(prepare_query_slots)(&t, g, &item);
        for (idx_t j0 = 0; j0 < a->S && !attnc_interrupted(); j0 += BLOCK_K)
            FN(key_block_grads)(&t, g, &item, b, j0, t.dq);
        FN(write_grad_rows)(item.grad_q, g->grad_q.row_stride, t.dq, t.E_padded, a->L, a->E);
    } else if (job->pass == KEY_PASS) {
        idx_t b = job->first_item + task / job->n_key_blocks, j0 = task % job->n_key_blocks * BLOCK_K;
        FN(grad_view) item = FN(job_item)(job, b);
        FN(key_block_grads)(&t, g, &item, b, j0, NULL);
    } else {
        idx_t b = job->first_item + task / job->n_query_tiles;
        FN(grad_view) item = FN(job_item)(job, b);
        FN(query_tile_grads)(&t, g, &item, b, task % job->n_query_tiles * BLOCK_Q);
    }
    attnc_free(work);
}

/* Items per thread from which the fused pass keeps every thread busy. */
#define FUSED_MIN_ITEMS_PER_THREAD 4
/* The scratch of a run with shared gradients holds at least this many
 * elements' worth of items (4 MiB of float), so that small items run in
 * runs of many, not one by one. */
#define SHARED_SCRATCH_MIN_ELEMS ((idx_t)1 << 20)
/* Rows of a shared gradient per sum_task. */
#define SUM_ROWS 64

/* The passes over the job's run of items: fused from fused_items items
 * on, else the key pass, then the query pass. */
static void FN(run_passes)(FN(grad_job) *job, idx_t fused_items)
{
    const attnc_attention_args *a = &job->args->forward;
    double flops = 2.0 * (double)job->run_items * (double)a->L * (double)a->S * (double)(2 * a->E + 2 * a->Ev);
    FN(grad_buffers) unused;
    if (job->run_items >= fused_items) {
        job->pass = FUSED_PASS;
        job->workspace_elems = FN(task_workspace_elems)(job, &unused, NULL);
        attnc_parallel_for(job->run_items, flops * 1.25, FN(grad_task), job);
        return;
    }
    job->pass = KEY_PASS;
    job->workspace_elems = FN(task_workspace_elems)(job, &unused, NULL);
    attnc_parallel_for(job->run_items * job->n_key_blocks, flops, FN(grad_task), job);
    job->pass = QUERY_PASS;
    if (!atomic_load(&job->failed) && !attnc_interrupted())
        attnc_parallel_for(job->run_items * job->n_query_tiles, flops, FN(grad_task), job);
}

/* The shared gradients (q, k, v), each as (rows, matrix) of an item. */
static const attnc_matrices *FN(grad_matrix)(const attnc_attention_backward_args *g, int x, idx_t *rows)
{
    *rows = x == 0 ? g->forward.L : g->forward.S;
    return x == 0 ? &g->grad_q : x == 1 ? &g->grad_k : &g->grad_v;
}

/* Task: rows [r0, r0 + SUM_ROWS) of shared gradient x (task over every
 * shared gradient's row blocks), the run's items added in item order. */
static void FN(sum_task)(void *ctx, idx_t task)
{
    FN(grad_job) *job = ctx;
    const attnc_attention_backward_args *g = job->args;
    for (int x = 0; x < 3; x++) {
        if (!job->scratch[x]) continue;
        idx_t rows, blocks;
        const attnc_matrices *m = FN(grad_matrix)(g, x, &rows);
        blocks = attnc_ceil_div(rows, SUM_ROWS);
        if (task >= blocks) {
            task -= blocks;
            continue;
        }
        idx_t r0 = task * SUM_ROWS, n = attnc_min(rows - r0, SUM_ROWS) * m->row_stride;
        for (idx_t b = job->first_item; b < job->first_item + job->run_items; b++) {
            elem *dst = (elem *)m->data + attnc_item_offset(&g->forward.batch, m->batch_strides, b) + r0 * m->row_stride;
            const elem *src = job->scratch[x] + (b - job->first_item) * job->scratch_item[x] + r0 * m->row_stride;
            for (idx_t e = 0; e < n; e++) dst[e] = to_elem(to_real(dst[e]) + to_real(src[e]));
        }
        return;
    }
}

/* 1 when several items write gradient m (a batch stride of 0 where the batch has more than one item). */
static int FN(shared_grad)(const attnc_batch *batch, const attnc_matrices *m)
{
    for (int d = 0; d < batch->ndim; d++)
        if (batch->shape[d] > 1 && m->batch_strides[d] == 0) return 1;
    return 0;
}

/* The passes over every item, in runs when a gradient is shared: each
 * run's shared gradients go to a scratch, then are added into theirs. */
static attnc_status FN(run_items)(FN(grad_job) *job, idx_t n_items)
{
    const attnc_attention_backward_args *g = job->args;
    const attnc_attention_args *a = &g->forward;
    idx_t item_elems = 0, shared_elems = 0, sum_tasks = 0;
    for (int x = 0; x < 3; x++) {
        idx_t rows;
        const attnc_matrices *m = FN(grad_matrix)(g, x, &rows);
        if (!FN(shared_grad)(&a->batch, m)) continue;
        idx_t places = 1; /* the distinct gradients: the output holds them all, no overflow */
        for (int d = 0; d < a->batch.ndim; d++) places *= m->batch_strides[d] ? a->batch.shape[d] : 1;
        job->scratch_item[x] = rows * m->row_stride;
        item_elems += job->scratch_item[x];
        shared_elems += places * job->scratch_item[x];
        sum_tasks += attnc_ceil_div(rows, SUM_ROWS);
    }
    idx_t threads = attnc_running_threads();
    if (!item_elems) {
        job->first_item = 0;
        job->run_items = n_items;
        FN(run_passes)(job, FUSED_MIN_ITEMS_PER_THREAD * threads);
        return ATTNC_OK;
    }
    /* a run: as many items as the budget holds, a multiple of the thread
     * count, so that the fused plan gives every thread whole items */
    idx_t budget = shared_elems > SHARED_SCRATCH_MIN_ELEMS ? shared_elems : SHARED_SCRATCH_MIN_ELEMS;
    idx_t run = budget / item_elems;
    run = run < threads ? threads : run - run % threads;
    run = attnc_min(run, n_items);
    elem *scratch = attnc_malloc((size_t)(run * item_elems) * sizeof(elem));
    if (!scratch) return ATTNC_ENOMEM;
    idx_t used = 0;
    for (int x = 0; x < 3; x++)
        if (job->scratch_item[x]) {
            job->scratch[x] = scratch + used * run;
            used += job->scratch_item[x];
        }
    for (idx_t first = 0; first < n_items && !atomic_load(&job->failed) && !attnc_interrupted(); first += run) {
        job->first_item = first;
        job->run_items = attnc_min(run, n_items - first);
        FN(run_passes)(job, threads);
        if (atomic_load(&job->failed) || attnc_interrupted()) break;
        attnc_parallel_for(sum_tasks, (double)job->run_items * (double)item_elems, FN(sum_task), job);
    }
    attnc_free(scratch);
    return ATTNC_OK;
}

/* The backward on g, whose lse is the caller's own copy (attention_backward). */
static attnc_status FN(backward_on_own_lse)(const attnc_attention_backward_args *g, idx_t n_items)
{
    const attnc_attention_args *a = &g->forward;
    FN(grad_job) job = {.args = g, .n_key_blocks = attnc_ceil_div(a->S, BLOCK_K),
                        .n_query_tiles = attnc_ceil_div(a->L, BLOCK_Q), .pass = KEY_PASS};
    idx_t dq_elems;
    if (!attnc_mul_ok(job.n_query_tiles * BLOCK_Q, ROUND_UP(a->E, GEMM_NR), &dq_elems) ||
        (size_t)dq_elems > SIZE_MAX / 4 / sizeof(real))
        return ATTNC_EOVERFLOW;
    idx_t most_tasks; /* the passes' task counts (a run's items times these) fit */
    if (!attnc_mul_ok(n_items, job.n_key_blocks, &most_tasks) || !attnc_mul_ok(n_items, job.n_query_tiles, &most_tasks))
        return ATTNC_EOVERFLOW;
    if (a->mask || a->bias || FN(band_leaves_a_block_out)(a)) {
        if ((size_t)n_items > SIZE_MAX / sizeof *job.item_skips) return ATTNC_EOVERFLOW;
        job.item_skips = attnc_malloc((size_t)n_items * sizeof *job.item_skips);
        if (!job.item_skips) return ATTNC_ENOMEM;
        double reads = (double)a->L * (double)(2 * a->E + 2 * a->Ev + (a->bias ? a->S : 0)) +
                       (double)a->S * (double)(a->E + a->Ev);
        attnc_parallel_for(n_items, (double)n_items * reads, FN(skips_task), &job);
    }
    /* the rows that take their own max and sum, once, before the passes */
    int own = attention_takes_rows(a);
    for (idx_t r = 0; !own && r < n_items * a->L; r++) own = FN(own_stats)(a, ((const real *)g->lse)[r]);
    attnc_status status = ATTNC_OK;
    if (own && (size_t)(n_items * a->L) > SIZE_MAX / 2 / sizeof(real))
        status = ATTNC_EOVERFLOW;
    else if (own && !(job.row_stats = attnc_malloc((size_t)(2 * n_items * a->L) * sizeof(real))))
        status = ATTNC_ENOMEM;
    if (own && status == ATTNC_OK)
        attnc_parallel_for(n_items * job.n_query_tiles, 2.0 * (double)n_items * (double)a->L * (double)a->S * (double)a->E,
                           FN(stats_task), &job);
    if (status == ATTNC_OK && !atomic_load(&job.failed) && !attnc_interrupted()) status = FN(run_items)(&job, n_items);
    attnc_free(job.item_skips);
    attnc_free(job.row_stats);
    if (status == ATTNC_EOVERFLOW) return status;
    if (status != ATTNC_OK || atomic_load(&job.failed)) return ATTNC_ENOMEM;
    return attnc_interrupted() ? ATTNC_EINTR : ATTNC_OK;
}

attnc_status FN(attention_backward)(const attnc_attention_backward_args *g)
{
    const attnc_attention_args *a = &g->forward;
    idx_t n_items = 1; /* the gradients hold them all: no overflow */
    for (int d = 0; d < a->batch.ndim; d++) n_items *= a->batch.shape[d];
    if (n_items == 0 || a->L == 0 || a->S == 0) return ATTNC_OK; /* the caller zero-filled the gradients */
    /* lse decides which rows take their own max and sum (a buffer sized
     * for them) and which tiles are skipped, and is read again by each
     * pass: a copy of its own, so that another thread (or a signal
     * handler run while the call polls for Ctrl-C) writing the caller's
     * array mid-call cannot make one read disagree with another (a row
     * found own_stats after the first pass read a row_stats never
     * allocated: a segfault) */
    if ((size_t)(n_items * a->L) > SIZE_MAX / sizeof(real)) return ATTNC_EOVERFLOW; /* (n_items * L: lse's size) */
    real *lse = attnc_malloc((size_t)(n_items * a->L) * sizeof(real));
    if (!lse) return ATTNC_ENOMEM;
    memcpy(lse, g->lse, (size_t)(n_items * a->L) * sizeof(real));
    attnc_attention_backward_args own = *g;
    own.lse = lse;
    attnc_status status = FN(backward_on_own_lse)(&own, n_items);
    attnc_free(lse);
    return status;
}
#undef FUSED_MIN_ITEMS_PER_THREAD
#undef SHARED_SCRATCH_MIN_ELEMS
#undef SUM_ROWS
