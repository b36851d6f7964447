/* The attention kernel (dtype and ISA template; needs dtype.h, simd.h,
 * storage.h, vexp.h, gemm_impl.h, attention_tiles.h and attention_rows.h).
 *
 * Two paths, chosen by the item's sizes alone (never by the batch, the
 * thread count or whether the weights are wanted, so an output's bits
 * never depend on those):
 *   flash (tiles): one task = one item (batch element x head) and a run of
 *          query tiles of BLOCK_Q queries; key tiles of BLOCK_K, each
 *          packed once for the task's query tiles; online softmax (running
 *          max and sum), P.V accumulated per query tile; the (L, S) score
 *          matrix never exists. When the weights are wanted, each tile's
 *          exponentials are also stored into the weights rows, and once a
 *          query tile's max and sum are final, each is rescaled to the
 *          final max and divided by the sum in place (the numbers the
 *          output is normalised by).
 *   rows (attention_rows.h): no packing, the key range split into fixed
 *          splits merged by their log-sum-exp: few queries per item
 *          (decode), or head sizes too large for the tiles.
 * Both read Q, K, V through batch strides (heads are strides, not copies)
 * and the mask through zero strides (broadcast, never expanded). */

/* The rows path takes items of at most ROWS_MAX_QUERIES queries
 * (attention_rows.h), and head sizes E + Ev above FLASH_MAX_HEAD (the
 * tiles' workspace grows with them). */
#ifndef ATTNC_ATTENTION_PATHS
#define ATTNC_ATTENTION_PATHS
#define FLASH_MAX_HEAD 2048
/* 1 when the forward takes the rows path for a's items */
static inline int attention_takes_rows(const attnc_attention_args *a)
{
    return a->L <= ROWS_MAX_QUERIES || a->E > FLASH_MAX_HEAD || a->Ev > FLASH_MAX_HEAD - a->E;
}

/* With the weights (start_weight_rows, weights_from_tiles): rows of S
 * weights between two questions for Ctrl-C, about
 * WEIGHT_QUESTION_ELEMS weights, and at least a row. A question costs about
 * 100 instructions (two thread-locals through __tls_get_addr): asked for
 * each row of 64 keys, they were 28 K of the 102 K instructions the weights
 * added to a (1, 4, 64, 64) call (callgrind). */
#define WEIGHT_QUESTION_ELEMS 65536
static inline idx_t weight_rows_per_question(idx_t S)
{
    return S > 0 && S < WEIGHT_QUESTION_ELEMS ? WEIGHT_QUESTION_ELEMS / S : 1;
}
#endif

typedef struct {
    const attnc_attention_args *args;
    idx_t n_query_tiles, tiles_per_task, tasks_per_item, workspace_elems;
    /* with the weights, after a task's workspace, per query tile: the maxes (key tiles, BLOCK_Q),
     * then elems' weights rows (BLOCK_Q, S); in all weights_per_tile elements a tile */
    idx_t maxes_per_tile, weights_per_tile;
    atomic_int failed; /* a task could not allocate its workspace */
} FN(attention_job);

/* The keys queries [i0, i0 + nq) are computed against: [*begin, *end).
 * A query sees only the keys of its band, so the key loop may skip the
 * tiles outside the band of every query of the tile (skip_hidden), which
 * is exact while the numbers those scores are made of are finite: see
 * flash_queries. */
static void FN(key_range)(const attnc_attention_args *a, int skip_hidden, idx_t i0, idx_t nq, idx_t *begin,
                          idx_t *end)
{
    *begin = skip_hidden ? attnc_band_begin(&a->band, i0, a->S) : 0;
    *end = skip_hidden ? attnc_band_end(&a->band, i0 + nq - 1, a->S) : a->S;
}

/* The keys of the tile from j0 that the score product reads in place, in
 * whole MR slivers: float and double keys (neither widened nor paired), in
 * every sliver that ends within the item's S keys (rows past a tile's last
 * key are computed and never used: they may be any key, not past S). The
 * same for any tile length, so that packing and products agree. */
static idx_t FN(keys_in_place)(const FN(tile_buffers) *t, const attnc_attention_args *a, idx_t j0)
{
    return ELEM_IS_REAL && !t->pairs ? (a->S - j0) / GEMM_MR * GEMM_MR : 0;
}

/* k_pack <- keys [j0, j0+nk) of the item not read in place (keys_in_place) */
static void FN(pack_key_tile)(FN(tile_buffers) *t, const attnc_attention_args *a, const FN(item_view) *item,
                              idx_t j0, idx_t nk)
{
    idx_t first = attnc_min(FN(keys_in_place)(t, a, j0), nk);
    const elem *k = item->k + (j0 + first) * a->k.row_stride;
    FN(pack_row_slivers)(t->k_pack, k, a->k.row_stride, nk - first, ROUND_UP(nk - first, GEMM_MR), a->E, GEMM_MR, 1,
                         t->pairs);
}

/* The value columns the value product reads in place, in whole NR
 * slivers: float and double values' (neither widened nor paired) where an
 * item has one query tile, the only one to read them (on a Xeon core, SDPA
 * of 50-77 queries 0.95-0.96x the time on one thread); with more, each
 * reads the packed slivers (SDPA (8, 12, 1024, 64) took 1.02-1.04x the
 * time with the values read in place; benchmarks/NOTES.md). Not values
 * whose rows are one row (a zero row stride, a broadcast): the
 * micro-kernel's b_rs 0 names a packed sliver, so it would read that row
 * as one (past its end); packed, they give the same bits. */
static idx_t FN(values_in_place)(const FN(tile_buffers) *t, const attnc_attention_args *a)
{
    return ELEM_IS_REAL && !t->pairs && a->L <= BLOCK_Q && a->v.row_stride != 0 ? a->Ev / GEMM_NR * GEMM_NR : 0;
}

/* v_pack <- the columns of values [j0, j0+nk) of the item not read in
 * place (values_in_place) */
static void FN(pack_value_tile)(FN(tile_buffers) *t, const attnc_attention_args *a, const FN(item_view) *item,
                                idx_t j0, idx_t nk)
{
    idx_t first = FN(values_in_place)(t, a);
    const elem *v = item->v + j0 * a->v.row_stride + first;
    FN(pack_column_slivers)(t->v_pack, v, a->v.row_stride, nk, a->Ev - first, t->Ev_padded - first, GEMM_NR, BLOCK_K,
                            t->pairs);
}

/* q_pack <- the scaled queries [q0, q0+nq) of the item (as pairs
 * unscaled: score_product scales their scores) */
static void FN(pack_query_tile)(FN(tile_buffers) *t, const attnc_attention_args *a, const FN(item_view) *item,
                                idx_t q0, idx_t nq)
{
    const elem *q = item->q + q0 * a->q.row_stride;
    FN(pack_row_slivers)(t->q_pack, q, a->q.row_stride, nq, FN(score_columns)(nq), a->E, GEMM_NR,
                         BF16_PAIRS && t->pairs ? 1 : (real)a->scale, t->pairs);
}

/* Queries in the query tile starting at q0 of a run ending at i1. */
static inline idx_t FN(tile_queries)(idx_t q0, idx_t i1) { return i1 - q0 < BLOCK_Q ? i1 - q0 : BLOCK_Q; }

/* value where keep is nonzero, else fill, by selecting bits: no branch
 * to mispredict on a mask that changes from one query to the next (a
 * random mask with half its positions hidden took 2.3x an unmasked
 * attention's time with the select a branch) */
static inline real FN(masked_fill)(real value, uint8_t keep, real fill)
{
    FN(exp_uint) kept_bits, fill_bits, select = (FN(exp_uint))0 - (FN(exp_uint))(keep != 0);
    memcpy(&kept_bits, &value, sizeof kept_bits);
    memcpy(&fill_bits, &fill, sizeof fill_bits);
    kept_bits = (kept_bits & select) | (fill_bits & ~select);
    memcpy(&value, &kept_bits, sizeof value);
    return value;
}

/* row (nq: queries [i0, i0+nq) against key j, a row of a transposed tile)
 * <- fill where the item's mask hides the key from the query, as `cover`
 * (the tile's mask_cover) allows: nothing, all, the whole row of a mask
 * broadcast over the queries, or position by position */
static inline void FN(fill_hidden)(real *row, const attnc_attention_args *a, const uint8_t *mask, idx_t i0, idx_t nq,
                                   idx_t j, attnc_mask_cover cover, real fill)
{
    if (cover == MASK_KEEPS_ALL) return;
    const uint8_t *m = mask + i0 * a->mask_rs + j * a->mask_cs;
    if (cover == MASK_HIDES_ALL || (!a->mask_rs && !m[0]))
        for (idx_t i = 0; i < nq; i++) row[i] = fill;
    else if (a->mask_rs)
        for (idx_t i = 0; i < nq; i++) row[i] = FN(masked_fill)(row[i], m[i * a->mask_rs], fill);
}

/* scores_t (nk keys from j0, a whole number of vectors; nq queries from
 * i0) <- fill where a mask of rows of keys (one per query, contiguous
 * along the keys: an (L, S) mask of torch's kind) hides the key: each
 * query's VLANES bytes widened to a lane mask, the VLANES x VLANES block
 * turned in registers, the group of queries past nq reading the last
 * query's bytes again and storing nothing; the same select as
 * masked_fill. Position by position, with a byte load per score from a
 * row S bytes away, a random (B, 1, 512, 512) mask took 1.30-1.39x an unmasked
 * (8, 12, 512, 64) attention's time on a Zen 3 core. A group of queries
 * takes every key before the next group, so that each line of their rows
 * is read whole while in L1, as add_bias does (benchmarks/NOTES.md). */
static void FN(fill_hidden_turned)(real *scores_t, const attnc_attention_args *a, const uint8_t *mask, idx_t i0,
                                   idx_t nq, idx_t j0, idx_t nk, real fill)
{
    const vlanes_mask fill_bits = (vlanes_mask)vset1(fill);
    for (idx_t g = 0; g < nq; g += VLANES) {
        int lanes = (int)attnc_min(VLANES, nq - g);
        const uint8_t *query_rows[VLANES];
        for (int l = 0; l < VLANES; l++) query_rows[l] = mask + (i0 + g + (l < lanes ? l : lanes - 1)) * a->mask_rs + j0;
        for (idx_t j = 0; j < nk; j += VLANES) {
            vreal block[VLANES];
            for (int l = 0; l < VLANES; l++) block[l] = (vreal)vnonzero_bytes(query_rows[l] + j);
            vtranspose(block);
            for (int l = 0; l < VLANES; l++) {
                real *row = scores_t + (j + l) * BLOCK_Q + g;
                vlanes_mask keep = (vlanes_mask)block[l];
                vstore_first(row, (vreal)(((vlanes_mask)vloadu(row) & keep) | (fill_bits & ~keep)), lanes);
            }
        }
    }
}

/* scores_t (nk, BLOCK_Q) <- fill where the item's mask hides keys [j0,
 * j0+nk) from queries [i0, i0+nq) (fill_hidden), whole vectors of keys
 * turned in registers where the mask's rows are contiguous along the keys */
static void FN(fill_hidden_tile)(real *scores_t, const attnc_attention_args *a, const uint8_t *mask, idx_t i0,
                                 idx_t nq, idx_t j0, idx_t nk, attnc_mask_cover cover, real fill)
{
    idx_t turned = cover == MASK_MIXED && a->mask_rs && a->mask_cs == 1 ? nk / VLANES * VLANES : 0;
    if (turned) FN(fill_hidden_turned)(scores_t, a, mask, i0, nq, j0, turned, fill);
    for (idx_t j = turned; j < nk; j++) FN(fill_hidden)(scores_t + j * BLOCK_Q, a, mask, i0, nq, j0 + j, cover, fill);
}

/* scores_t (nk, BLOCK_Q) += the item's bias at queries [i0, i0+nq) x keys
 * [j0, j0+nk). A bias of rows of keys (a bias per query, contiguous
 * along the keys: an (L, S) mask of torch's kind) is read VLANES x VLANES
 * at a time and turned in registers (load_turned), the group of queries
 * past nq reading the last query's row again and storing nothing; added
 * one by one, with a load per score from a row S elements away, it took
 * 42 % of a (2, 12, 512, 64) attention's samples. A group of queries
 * takes every key of the tile before the next group, so that each line
 * of their rows is used whole: by keys first, the tile's 96 rows (S
 * apart: one L1 set for S = 1024 floats) had evicted each line before
 * its second half was read, 1.11x the time at (1, 12, 1024, 64) on one
 * thread (benchmarks/NOTES.md). */
static void FN(add_bias)(real *scores_t, const attnc_attention_args *a, const elem *bias, idx_t i0, idx_t nq,
                         idx_t j0, idx_t nk)
{
    const elem *first = bias + i0 * a->bias_rs + j0 * a->bias_cs;
    idx_t turned = a->bias_rs && a->bias_cs == 1 ? nk / VLANES * VLANES : 0; /* the keys turned in registers */
    for (idx_t g = 0; g < nq && turned; g += VLANES) {
        int lanes = (int)attnc_min(VLANES, nq - g);
        const elem *rows[VLANES];
        for (int l = 0; l < VLANES; l++) rows[l] = first + (g + (l < lanes ? l : lanes - 1)) * a->bias_rs;
        for (idx_t j = 0; j < turned; j += VLANES) {
            vreal block[VLANES];
            FN(load_turned)(block, rows, 0, j, SIMD_BYTES == 32); /* by blocks at AVX2 only (not measured at AVX-512) */
            for (int l = 0; l < VLANES; l++) {
                real *row = scores_t + (j + l) * BLOCK_Q + g;
                vstore_first(row, vloadu(row) + block[l], lanes);
            }
        }
    }
    for (idx_t j = turned; j < nk; j++) {
        real *row = scores_t + j * BLOCK_Q;
        const elem *b = first + j * a->bias_cs;
        if (!a->bias_rs) { /* broadcast over the queries: one value, held (it may alias the row) */
            real add = to_real(b[0]);
            for (idx_t i = 0; i < nq; i++) row[i] += add;
        } else {
            for (idx_t i = 0; i < nq; i++) row[i] += to_real(b[i * a->bias_rs]);
        }
    }
}

/* scores_t (nk, BLOCK_Q) of the packed keys [j0, j0+nk) against queries
 * [i0, i0+nq): the product, plus the bias, then -1e20 where the mask is 0
 * (the documents' masked_fill) and, for keys outside a query's band, the
 * score plus -inf as in PyTorch's math path: -inf (an exactly-zero weight)
 * for a finite score, NaN for a NaN or +inf one. cover: the mask's cover
 * (mask_cover) of the tile or of a block that holds it (a block's cover
 * holds for each of its parts, MASK_MIXED for any). */
static void FN(score_tile)(FN(tile_buffers) *t, const attnc_attention_args *a, const FN(item_view) *item, idx_t i0,
                           idx_t nq, idx_t j0, idx_t nk, attnc_mask_cover cover)
{
    real scale = (real)a->scale; /* pairs' scores are scaled as they are stored */
    const real *k_rows = (const real *)(const void *)(item->k + j0 * a->k.row_stride); /* (read if ELEM_IS_REAL) */
    FN(score_product)(t->scores_t, t->k_pack, k_rows, a->k.row_stride, FN(keys_in_place)(t, a, j0), t->q_pack, nk, nq,
                      a->E, &scale, t->pairs);
    const attnc_band *band = &a->band;
    if (item->bias) FN(add_bias)(t->scores_t, a, item->bias, i0, nq, j0, nk);
    if (item->mask) FN(fill_hidden_tile)(t->scores_t, a, item->mask, i0, nq, j0, nk, cover, (real)-1e20);
    if (band->on)
        for (idx_t j = 0; j < nk; j++) {
            /* key j0+j is in the band of queries [j0+j - offset - right, j0+j - offset + left] */
            real *row = t->scores_t + j * BLOCK_Q;
            idx_t first = j0 + j - band->offset - band->right - i0, last = j0 + j - band->offset + band->left - i0;
            for (idx_t i = 0; i < nq && i < first; i++) row[i] -= (real)INFINITY;
            for (idx_t i = last + 1 > 0 ? last + 1 : 0; i < nq; i++) row[i] -= (real)INFINITY;
        }
}

/* scores_t (nk, BLOCK_Q) *= (kept ? 1/(1-p) : 0) for item b, keys from j0 */
static void FN(apply_dropout)(real *scores_t, const attnc_attention_args *a, idx_t b, idx_t i0, idx_t nq,
                              idx_t j0, idx_t nk)
{
    FN(dropout_mask) mask = FN(dropout_mask_at)(a, b, i0, j0);
    real factors[BLOCK_Q];
    for (idx_t j = 0; j < nk; j++) {
        FN(column_keep_factors)(factors, &mask, nq, j);
        for (idx_t i = 0; i < nq; i++) scores_t[j * BLOCK_Q + i] *= factors[i];
    }
}

/* out rows [i0, i0+nq) of item b <- acc / row_sum (0 for a row whose
 * scores were all -inf: its weights are all 0; NaN with nan_rows); their
 * lse when asked for */
static void FN(write_rows)(const attnc_attention_args *a, const FN(tile_buffers) *t, const FN(item_view) *item,
                           idx_t b, idx_t i0, idx_t nq)
{
    for (idx_t i = 0; i < nq; i++) {
        elem *dst = item->out + (i0 + i) * a->out.row_stride;
        FN(store_row_scaled)(dst, t->acc + i * t->Ev_padded, a->Ev, FN(row_inverse)(a, t->run_sum[i]));
    }
    if (a->lse)
        for (idx_t i = 0; i < nq; i++)
            ((real *)a->lse)[b * a->L + i0 + i] = FN(log_sum_exp)(a, t->run_max[i], t->run_sum[i]);
}

/* One step of the online softmax for queries [i0, i0+nq) (the tile's view
 * of the buffers): the scores against the packed key tile [j0, j0+nk),
 * the running max and sum updated (what was accumulated under an older
 * max is rescaled when the max grows), then P.V added to acc. A row whose
 * scores so far are all -inf or NaN keeps max -inf and shift 0: its e are
 * 0 (or NaN), so its sum and acc are +0 (or NaN, also from 0 * inf), which the
 * correction exp(-inf) = 0 would leave as they are: it is not applied
 * (for S <= BLOCK_K, no row is ever rescaled). */
/* The running max and sum of nq rows after a key tile whose column maxima
 * are tile_max: each max grown to the tile's, its sum scaled by
 * exp(old max - new max) (correction, 1 where the max stayed or was -inf),
 * tile_max overwritten with each row's shift for this tile. (The backward's
 * tile_stats keeps its rows' max and sum the same way.) A vector of rows at
 * a time (the last one short), each lane's exp with the bits of vexp: a row
 * at a time (a branch and a vector exp for each), it had 1.5 % of the
 * samples of SDPA (4, 12, 1024, 64) on a Xeon (AVX-512, 2 threads), now
 * 0.14 % (benchmarks/NOTES.md). */
static void FN(grow_running_max)(real *run_max, real *run_sum, real *tile_max, real *correction, idx_t nq)
{
    const vreal minus_inf = vset1(-(real)INFINITY);
    for (idx_t i = 0; i < nq; i += VLANES) {
        int lanes = (int)attnc_min(VLANES, nq - i);
        vreal old_max = vload_first(run_max + i, lanes), tile = vload_first(tile_max + i, lanes);
        vreal new_max = vselect(tile > old_max, tile, old_max);
        vreal factor = vselect((new_max == old_max) | (old_max == minus_inf), vset1(1),
                               FN(vexp_lanes)(old_max - new_max, 0));
        vstore_first(correction + i, factor, lanes);
        vstore_first(run_sum + i, vload_first(run_sum + i, lanes) * factor, lanes);
        vstore_first(run_max + i, new_max, lanes);
        /* now the shift of this step (safe_shift) */
        vstore_first(tile_max + i, vselect(new_max == minus_inf, vzero(), new_max), lanes);
    }
}

/* w (nq, nk: rows S apart) <- scores_t (nk, BLOCK_Q) turned, VLANES keys x
 * VLANES queries at a time in registers; a group past nk reads rows of
 * scores_t past it (BLOCK_K rows are there) and stores only nk's, a group
 * past nq stores only nq's rows. One score at a time, written S apart,
 * the copy took 35 % of a (2, 12, 512, 64) attention's samples with the
 * weights asked for. A group of queries takes every key before the next
 * group, so that each line of its rows is written whole (as add_bias
 * reads): by keys first, a call with the weights took 1.04-1.08x as long
 * (benchmarks/NOTES.md). */
static void FN(store_scores_turned)(real *w, idx_t S, const real *scores_t, idx_t nq, idx_t nk)
{
    for (idx_t i = 0; i < nq; i += VLANES) {
        int queries = (int)attnc_min(VLANES, nq - i);
        for (idx_t j = 0; j < nk; j += VLANES) {
            int keys = (int)attnc_min(VLANES, nk - j);
            vreal block[VLANES];
            for (int l = 0; l < VLANES; l++) block[l] = vloadu(scores_t + (j + l) * BLOCK_Q + i);
            vtranspose(block);
            for (int l = 0; l < queries; l++) {
                if (keys == VLANES)
                    vstoreu(w + (i + l) * S + j, block[l]);
                else
                    vstore_first(w + (i + l) * S + j, block[l], keys);
            }
        }
    }
}

/* With the weights: a query tile's rows start as 0 and its maxes as -inf,
 * weight_rows_per_question rows at a time with a question for Ctrl-C
 * between them. The flash pass stores over them the key tiles it computes
 * (keep_weight_tile); a key it leaves out (a band, a mask or a bias:
 * key_range, key_tile_left_out) keeps the 0 its weight is. The rows' pages
 * are touched here first: the flash pass, storing a key tile into every row
 * of the task, had zeroed up to 400 MB of fresh (huge) pages between two
 * questions (0.5 s after SIGINT with 65536 keys). */
static void FN(start_weight_rows)(const FN(tile_buffers) *t, idx_t nq)
{
    idx_t S = t->weight_stride, rows = weight_rows_per_question(S);
    for (idx_t run = 0; run < nq && !attnc_interrupted(); run += rows)
        for (idx_t i = run; i < attnc_min(nq, run + rows); i++)
            for (idx_t j = 0; j < S; j++) t->weight_rows[i * S + j] = 0;
    for (idx_t i = 0; i < attnc_ceil_div(S, BLOCK_K) * BLOCK_Q; i++) t->weight_maxes[i] = -(real)INFINITY;
}

/* The exponentials of the key tile from j0 (its first nk keys: the rest,
 * left out, stay 0) into the weights rows, and the running max they were
 * taken under (scores_t holds exp(score - safe_shift(run_max))). */
static void FN(keep_weight_tile)(const FN(tile_buffers) *t, idx_t nq, idx_t j0, idx_t nk)
{
    FN(store_scores_turned)(t->weight_rows + j0, t->weight_stride, t->scores_t, nq, nk);
    for (idx_t i = 0; i < nq; i++) t->weight_maxes[j0 / BLOCK_K * BLOCK_Q + i] = t->run_max[i];
}

/* The weights rows [q0, q0+nq) of item b from their key tiles'
 * exponentials, once the query tile's max and sum are final: each times
 * exp(its tile's max - safe_shift(final max)) (1 for a tile whose max is
 * the final one, as a single key tile's; 0 for one whose max was -inf) and
 * the row's 1 / sum (the factor write_rows gives the output), rounded once
 * into the weights. */
static void FN(weights_from_tiles)(const attnc_attention_args *a, const FN(tile_buffers) *t, idx_t b, idx_t q0,
                                   idx_t nq)
{
    idx_t S = a->S, rows = weight_rows_per_question(S);
    for (idx_t run = 0; run < nq && !attnc_interrupted(); run += rows)
        for (idx_t i = run; i < attnc_min(nq, run + rows); i++) {
            const real *e = t->weight_rows + i * S;
            elem *w = FN(weights_at)(a, b, q0 + i, 0); /* the same row as e for float and double */
            real shift = FN(safe_shift)(t->run_max[i]), inverse = FN(row_inverse)(a, t->run_sum[i]);
            for (idx_t j0 = 0; j0 < S; j0 += BLOCK_K) {
                real factor = FN(vexp)(t->weight_maxes[j0 / BLOCK_K * BLOCK_Q + i] - shift) * inverse;
                FN(store_row_scaled)(w + j0, e + j0, attnc_min(S - j0, BLOCK_K), factor);
            }
        }
}

static void FN(flash_step)(FN(tile_buffers) *t, const attnc_attention_args *a, const FN(item_view) *item,
                           idx_t b, idx_t i0, idx_t nq, idx_t j0, idx_t nk, attnc_mask_cover cover)
{
    FN(score_tile)(t, a, item, i0, nq, j0, nk, cover);
    FN(column_max)(t->tile_max, t->scores_t, nq, nk);
    FN(grow_running_max)(t->run_max, t->run_sum, t->tile_max, t->correction, nq);
    FN(column_exp_sum)(t->scores_t, t->tile_max, t->run_sum, nq, nk, t->pairs);
    if (t->weight_rows) FN(keep_weight_tile)(t, nq, j0, nk);
    if (a->dropout_p > 0) FN(apply_dropout)(t->scores_t, a, b, i0, nq, j0, nk);
    for (idx_t i = 0; i < nq; i++)
        if (t->correction[i] != 1) FN(scale_row)(t->acc + i * t->Ev_padded, t->Ev_padded, t->correction[i]);
#if BF16_PAIRS
    if (t->pairs) FN(pair_probabilities)(t->scores_t, ROUND_UP(nq, GEMM_MR_STEP), nk);
#endif
    const real *v_rows = (const real *)(const void *)(item->v + j0 * a->v.row_stride); /* (read if ELEM_IS_REAL) */
    FN(value_product)(t->acc, t->scores_t, t->v_pack, v_rows, a->v.row_stride, FN(values_in_place)(t, a), nq, nk,
                      t->Ev_padded, BLOCK_K, t->pairs);
}

/* A query tile's state before its first key tile: zero sums, max -inf. */
static void FN(start_tile)(FN(tile_buffers) *view, idx_t nq)
{
    idx_t acc_rows = ROUND_UP(nq, GEMM_MR_STEP); /* the rows value_product adds to */
    for (idx_t i = 0; i < acc_rows * view->Ev_padded; i++) view->acc[i] = 0;
    for (idx_t i = 0; i < BLOCK_Q; i++) {
        view->run_max[i] = -(real)INFINITY;
        view->run_sum[i] = 0;
    }
}

/* How many of the last `most` keys of a bias row (n keys, stride cs) are at
 * or below `floor`, counted back from its end until one is not (NaN never
 * is). Contiguous, the whole stretch is first compared at once, in vectors:
 * checking a key tile hidden whole took 14 % of an attention's samples one
 * key at a time. */
static idx_t FN(row_hidden_tail)(const elem *row, idx_t cs, idx_t n, idx_t most, real floor)
{
    if (most == 0 || !(to_real(row[(n - 1) * cs]) <= floor)) return 0;
    if (cs == 1 && most >= VLANES) {
        vreal floors = vset1(floor);
        vlanes_mask below = floors == floors; /* every lane set */
        idx_t j = n - most;
        int all = 1;
        for (; j + VLANES <= n; j += VLANES) below &= vload_elems(row + j) <= floors;
        for (; j < n; j++) all &= to_real(row[j]) <= floor;
        for (int l = 0; l < VLANES; l++) all &= below[l] != 0;
        if (all) return most;
    }
    idx_t tail = 1;
    while (tail < most && to_real(row[(n - 1 - tail) * cs]) <= floor) tail++;
    return tail;
}

/* Of the keys [j0, j0+nk) of queries [i0, i0+nq), how many at the end the
 * item's bias is at or below `floor` for, at every query (-inf: a padding or
 * causal mask in torch's convention, as a bias): nk when it hides the whole
 * block. Rows from the last (a causal mask's shortest tail first), each read
 * only as far as the shortest tail so far. */
static idx_t FN(bias_hidden_tail)(const attnc_attention_args *a, const elem *bias, idx_t i0, idx_t nq, idx_t j0,
                                  idx_t nk, real floor)
{
    idx_t keys = a->bias_cs ? nk : 1, tail = keys; /* a bias broadcast over the keys: one value a row */
    for (idx_t r = a->bias_rs ? nq : 1; r-- > 0 && tail > 0;)
        tail = FN(row_hidden_tail)(bias + (i0 + r) * a->bias_rs + j0 * a->bias_cs, a->bias_cs, keys, tail, floor);
    return a->bias_cs ? tail : tail * nk;
}

/* The smallest of the n rows' maxima (the forward's running maxima, the
 * backward's lse); NaN if one is NaN */
static real FN(least_max)(const real *maxima, idx_t n)
{
    real least = (real)INFINITY;
    for (idx_t i = 0; i < n; i++) least = maxima[i] < least || maxima[i] != maxima[i] ? maxima[i] : least;
    return least;
}

/* The bias at or below which a key weighs exactly 0 in rows whose maximum
 * score is at least `least` (least_max), when no key's scaled q . k exceeds
 * score_bound in size (a Cauchy-Schwarz bound, doubled below for the
 * products' rounding): the key's score, at most floor + 2 score_bound, is
 * then below the row's maximum by at least 8 |exp_zero_at_or_below| plus a
 * quarter of the least maximum's size (margins far above every rounding on
 * the way, of scores and maxima up to 1e38 too), so that its exp(score -
 * max) is clamped to exactly 0, however the max grows later; and a key tile
 * of such keys leaves the max as it was.
 * -inf (only -inf biases hide keys) while a row has seen no key (its max
 * -inf) or has a NaN one. torch.finfo(dtype).min, -1e9 or -1e4 masks (Hugging
 * Face's, BERT's) hide their keys this way once a row has seen a kept key. */
static real FN(bias_floor)(real least, real score_bound)
{
    real floor = least - 8 * score_bound + 8 * FN(exp_zero_at_or_below)() - (least < 0 ? -least : least) / 4;
    return floor > -(real)INFINITY ? floor : -(real)INFINITY; /* NaN: a NaN max, every max +inf, or no score_bound */
}

/* The largest bias of query i within its band, NaN skipped (a NaN row's
 * out is NaN whatever its keys), -inf for none; contiguous, in vectors. */
static real FN(band_bias_max)(const attnc_attention_args *a, const elem *bias, idx_t i)
{
    idx_t begin = attnc_band_begin(&a->band, i, a->S), end = attnc_band_end(&a->band, i, a->S);
    idx_t cs = a->bias_cs, n = end > begin ? (cs ? end - begin : 1) : 0, j = 0;
    const elem *row = bias + i * a->bias_rs + begin * cs;
    real most = -(real)INFINITY;
    if (cs == 1 && n >= VLANES) {
        vreal lanes = vset1(most);
        for (; j + VLANES <= n; j += VLANES) lanes = vmax(vload_elems(row + j), lanes); /* a NaN keeps the lane */
        for (int l = 0; l < VLANES; l++) most = lanes[l] > most ? lanes[l] : most;
    }
    for (; j < n; j++) most = to_real(row[j * cs]) > most ? to_real(row[j * cs]) : most;
    return most;
}

/* A least maximum score (as least_max's) that the bias makes sure of for
 * queries [q0, q0+nq): each row sees the key of its largest bias within its
 * band (the item has no mask to hide it, and no floor is above it), whose
 * score is at least that bias less the bound on |scale q . k| (q_bound: the
 * queries' rows_norm_bound, keys_norm: every key's). A key whose bias is at
 * or below the bias_floor of it weighs exactly 0 once the row's max is final.
 * Computed under a lower max (left padding: the keys before a row's first
 * kept one), what it adds to the row's sums, their rounding included, is
 * scaled by exp(that max - the final one), below exp(7 x
 * exp_zero_at_or_below), to exactly 0 by the end: leaving it out gives the
 * same bits (but for the sign of an exact zero), except where computing it
 * left a residue PyTorch's math path has not (values near the largest,
 * whose sum overflowed: inf x 0 = NaN; a subnormal out's last unit, which a
 * rescale by more than 1/2 keeps): there it gives the math path's. */
static real FN(bias_least_max)(const attnc_attention_args *a, const FN(item_view) *item, idx_t q0, idx_t nq,
                               real q_bound, real keys_norm)
{
    real least = (real)INFINITY;
    for (idx_t r = 0; r < (a->bias_rs || a->band.on ? nq : 1); r++) {
        real most = FN(band_bias_max)(a, item->bias, q0 + r);
        least = most < least ? most : least;
    }
    return least - FN(score_bound)(a, q_bound, keys_norm);
}

/* Whether the query tile [q0, q0+nq) has a bias_least_max worth its cost
 * (a pass over the tile's bias), decided at the first key tile [j0, j0+nk)
 * it meets while a row of it has seen no key (run_max -inf: only then is it
 * above least_max) with the bias of its last query at the tile's last key
 * finite (-inf hides whatever the max): computed if that bias is at or below
 * the bias_floor of its row's largest bias (no bias_least_max is above it),
 * else -inf, as with a mask. Returns 1 once decided (*least set); keys_norm:
 * every key's rows_norm_bound, computed on first use, -1 until then. */
static int FN(tile_bias_least)(const attnc_attention_args *a, const FN(item_view) *item, const real *run_max,
                               idx_t q0, idx_t nq, idx_t j0, idx_t nk, real q_bound, real *keys_norm, real *least)
{
    *least = -(real)INFINITY;
    if (!item->bias || item->mask || !(q_bound < (real)INFINITY) || FN(least_max)(run_max, nq) > -(real)INFINITY)
        return 1;
    idx_t last = q0 + nq - 1;
    real probe = to_real(item->bias[last * a->bias_rs + (j0 + nk - 1) * a->bias_cs]);
    if (probe == -(real)INFINITY) return 0;
    if (!(probe <= FN(bias_floor)(FN(band_bias_max)(a, item->bias, last), 0))) return 1;
    if (*keys_norm < 0) *keys_norm = FN(rows_norm_bound)(item->k, a->k.row_stride, a->S, a->E);
    *least = FN(bias_least_max)(a, item, q0, nq, q_bound, *keys_norm);
    return 1;
}

/* Whether the query tile [q0, q0+nq) leaves out the key tile at j0 (nk of
 * its key_tile_keys keys within the tile's band), and how many of its first
 * keys it computes (*kept, when it does not): KEY_TILE_MASKED when the mask
 * hides the whole block, the tile's rows are mask_skippable (each keeps a
 * key) and the values are finite (0 * inf would be NaN); KEY_TILE_BIASED when
 * the mask hides none of it and the bias hides all of it: -inf everywhere
 * (every score -inf, weighing exactly 0), or at or below the bias_floor of
 * the tile's rows' running maxima (run_max) or of bias_least (the tile's
 * bias_least_max), whichever is larger, with the values finite and no
 * score overflowing (scores_bounded; q_bound: the tile's queries'
 * rows_norm_bound, key_bound: the key tile's keys', computed on first use, -1
 * until then); under the same conditions, keys at the block's end that the
 * bias hides from every query of the tile are not computed either (*kept <
 * nk: a causal mask as a bias). values_finite: 1, 0, or -1 until the key
 * tile's values have been read (all key_tile_keys of them, as for key_bound:
 * the query tiles share them). cover: the block's mask_cover. */
static int FN(key_tile_left_out)(const attnc_attention_args *a, const FN(item_view) *item, attnc_mask_cover cover,
                                 int mask_skippable, real q_bound, real bias_least, const real *run_max, idx_t q0,
                                 idx_t nq, idx_t j0, idx_t nk, idx_t key_tile_keys, int *values_finite,
                                 real *key_bound, idx_t *kept)
{
    *kept = nk;
    int biased = item->bias && q_bound < (real)INFINITY;
    if (!mask_skippable && !biased) return KEY_TILE_COMPUTED;
    int masked = mask_skippable && cover == MASK_HIDES_ALL;
    real least = biased && cover == MASK_KEEPS_ALL ? FN(least_max)(run_max, nq) : -(real)INFINITY;
    if (bias_least > least) least = bias_least; /* the keys before a row's first kept one */
    /* the last query's last key above the floor with no score bound yet: no key at the end is hidden */
    int bias_may_hide = biased && cover == MASK_KEEPS_ALL &&
                        FN(row_hidden_tail)(item->bias + (q0 + nq - 1) * a->bias_rs + j0 * a->bias_cs, a->bias_cs,
                                            nk, 1, FN(bias_floor)(least, 0));
    if (!masked && !bias_may_hide) return KEY_TILE_COMPUTED;
    if (*values_finite < 0)
        *values_finite = FN(rows_finite)(item->v + j0 * a->v.row_stride, a->v.row_stride, key_tile_keys, a->Ev);
    if (!*values_finite) return KEY_TILE_COMPUTED;
    if (masked) return KEY_TILE_MASKED;
    if (*key_bound < 0)
        *key_bound = FN(rows_norm_bound)(item->k + j0 * a->k.row_stride, a->k.row_stride, key_tile_keys, a->E);
    if (!FN(scores_bounded)(a, q_bound, *key_bound)) return KEY_TILE_COMPUTED;
    real floor = FN(bias_floor)(least, FN(score_bound)(a, q_bound, *key_bound));
    idx_t hidden_tail = FN(bias_hidden_tail)(a, item->bias, q0, nq, j0, nk, floor);
    *kept = nk - hidden_tail;
    return hidden_tail == nk ? KEY_TILE_BIASED : KEY_TILE_COMPUTED;
}

/* 1 when every row of the tile ended with a max above the mask's fill
 * (-1e20), so that its hidden scores' weights were exactly 0. */
static int FN(rows_above_fill)(const FN(tile_buffers) *view, idx_t nq)
{
    for (idx_t i = 0; i < nq; i++)
        if (!(view->run_max[i] > (real)-1e20)) return 0;
    return 1;
}

/* Query tile `tile` of flash_queries ([q0, q0 + nq)) again from the
 * start, over every key tile of its range, packed as flash_queries packs
 * them (nk up to the task's end): the sums it would have had with no key
 * tile left out. */
static void FN(tile_again)(FN(tile_buffers) *t, const attnc_attention_args *a, const FN(item_view) *item, idx_t b,
                           idx_t tile, idx_t q0, idx_t nq, int skip_hidden, idx_t end)
{
    FN(tile_buffers) view = FN(tile_view)(t, tile, a->E);
    FN(start_tile)(&view, nq);
    idx_t tile_begin, tile_end;
    FN(key_range)(a, skip_hidden, q0, nq, &tile_begin, &tile_end);
    for (idx_t j0 = tile_begin / BLOCK_K * BLOCK_K; j0 < tile_end && !attnc_interrupted(); j0 += BLOCK_K) {
        idx_t nk = attnc_min(end - j0, BLOCK_K); /* packed as the task's loop packs it */
        FN(pack_key_tile)(t, a, item, j0, nk);
        FN(pack_value_tile)(t, a, item, j0, nk);
        idx_t tile_nk = attnc_min(tile_end - j0, nk);
        FN(flash_step)(&view, a, item, b, q0, nq, j0, tile_nk,
                       mask_cover(a, item->mask, q0, nq, j0, tile_nk));
    }
}

/* Queries [i0, i1) of item b, in tiles of BLOCK_Q, by the online softmax:
 * each key/value tile is packed once and visits every query tile that can
 * see it. With a band (causal, window), a query tile skips the key tiles
 * outside it when its scores are surely finite (scores_bounded: the
 * numbers they are made of finite, none overflowing); otherwise it visits
 * every key, so that NaN and inf reach its rows as in PyTorch's math path. With a mask, a
 * query tile whose every row keeps a key leaves out the key tiles the mask
 * hides from all its rows (padding) when their values are finite: their
 * weights would be exp(-1e20 - max) = 0 exactly, adding nothing (but a
 * -0 where a sum was exactly -0), so the result is the same; if a row's max
 * ends at or below the fill (its scores that large and negative, or NaN),
 * that is not so, and the tile is computed again with every key tile
 * (tile_again). With a bias, a query tile leaves out the key tiles whose
 * bias hides all of its positions (torch-style padding), and the keys at a
 * key tile's end whose bias hides them from all its queries (a causal mask
 * as a bias), when their weights are surely exactly 0 (key_tile_left_out):
 * -inf, whatever the max, or a finite value far below every row's max so
 * far or the max its largest bias makes sure of (bias_floor, bias_least_max:
 * left padding too). Decided per query tile, so a row's bits never depend on which
 * rows share its task. */
static void FN(flash_queries)(FN(tile_buffers) *t, const attnc_attention_args *a, const FN(item_view) *item,
                              idx_t b, idx_t i0, idx_t i1)
{
    int skip_hidden[MAX_TILES_PER_TASK]; /* tiles_per_task never exceeds it */
    int mask_skippable[MAX_TILES_PER_TASK], mask_skipped[MAX_TILES_PER_TASK];
    real q_bound[MAX_TILES_PER_TASK]; /* with a bias: the tile's rows_norm_bound (key_tile_left_out) */
    real bias_least[MAX_TILES_PER_TASK]; /* the tile's bias_least_max or -inf, once decided (tile_bias_least) */
    int bias_least_decided[MAX_TILES_PER_TASK];
    real keys_bound = -1, keys_norm = -1; /* keys_bound: found when a tile's band first leaves keys out */
    idx_t tiles = attnc_ceil_div(i1 - i0, BLOCK_Q);
    /* key tiles on the BLOCK_K grid from 0, whatever the band: a query
     * tile meets the same key tiles however the queries are split into tasks */
    idx_t begin = a->S, end = 0, tile_begin, tile_end;
    for (idx_t tile = 0; tile < tiles; tile++) {
        idx_t q0 = i0 + tile * BLOCK_Q, nq = FN(tile_queries)(q0, i1);
        FN(key_range)(a, a->band.on, q0, nq, &tile_begin, &tile_end);
        skip_hidden[tile] = 0;
        if (tile_begin >= BLOCK_K || tile_end < a->S) { /* the band leaves a key out of the tile's range */
            if (keys_bound < 0) keys_bound = FN(keys_bound)(a, item->k, item->v, a->S);
            skip_hidden[tile] = FN(scores_bounded)(a, FN(queries_bound)(a, item, q0, q0 + nq, 0, a->S), keys_bound);
        }
        FN(tile_buffers) view = FN(tile_view)(t, tile, a->E);
        FN(pack_query_tile)(&view, a, item, q0, nq);
        FN(start_tile)(&view, nq);
        if (view.weight_rows) FN(start_weight_rows)(&view, nq);
        FN(key_range)(a, skip_hidden[tile], q0, nq, &tile_begin, &tile_end);
        begin = attnc_min(begin, tile_begin);
        end = tile_end > end ? tile_end : end;
        mask_skippable[tile] = item->mask && mask_keeps_a_key_each(a, item->mask, q0, nq, tile_begin, tile_end);
        mask_skipped[tile] = 0;
        q_bound[tile] = item->bias ? FN(rows_norm_bound)(item->q + q0 * a->q.row_stride, a->q.row_stride, nq, a->E)
                                   : (real)INFINITY;
        bias_least[tile] = -(real)INFINITY;
        bias_least_decided[tile] = 0;
    }
    for (idx_t j0 = begin / BLOCK_K * BLOCK_K; j0 < end && !attnc_interrupted(); j0 += BLOCK_K) {
        idx_t nk = attnc_min(end - j0, BLOCK_K);
        int packed = 0, values_finite = -1;
        real key_bound = -1;
        for (idx_t tile = 0; tile < tiles; tile++) {
            idx_t q0 = i0 + tile * BLOCK_Q, nq = FN(tile_queries)(q0, i1);
            FN(key_range)(a, skip_hidden[tile], q0, nq, &tile_begin, &tile_end);
            if (j0 >= tile_end || j0 + BLOCK_K <= tile_begin) continue; /* outside every band of the tile */
            idx_t tile_nk = attnc_min(tile_end - j0, nk);
            FN(tile_buffers) view = FN(tile_view)(t, tile, a->E);
            if (!bias_least_decided[tile])
                bias_least_decided[tile] = FN(tile_bias_least)(a, item, view.run_max, q0, nq, j0, tile_nk, q_bound[tile],
                                                               &keys_norm, &bias_least[tile]);
            attnc_mask_cover cover = mask_cover(a, item->mask, q0, nq, j0, tile_nk);
            int left_out = FN(key_tile_left_out)(a, item, cover, mask_skippable[tile], q_bound[tile], bias_least[tile],
                                                 view.run_max, q0, nq, j0, tile_nk, nk, &values_finite, &key_bound,
                                                 &tile_nk);
            if (left_out != KEY_TILE_COMPUTED) {
                mask_skipped[tile] |= left_out == KEY_TILE_MASKED;
                continue;
            }
            if (!packed) {
                FN(pack_key_tile)(t, a, item, j0, nk);
                FN(pack_value_tile)(t, a, item, j0, nk);
                packed = 1;
            }
            /* (a tile_nk cut short at a bias-hidden end was a block the mask keeps whole) */
            FN(flash_step)(&view, a, item, b, q0, nq, j0, tile_nk, cover);
        }
    }
    for (idx_t tile = 0; tile < tiles; tile++) {
        idx_t q0 = i0 + tile * BLOCK_Q, nq = FN(tile_queries)(q0, i1);
        FN(tile_buffers) view = FN(tile_view)(t, tile, a->E);
        if (mask_skipped[tile] && !FN(rows_above_fill)(&view, nq))
            FN(tile_again)(t, a, item, b, tile, q0, nq, skip_hidden[tile], end);
        FN(write_rows)(a, &view, item, b, q0, nq);
        if (view.weight_rows) FN(weights_from_tiles)(a, &view, b, q0, nq);
    }
}

/* Task = item b and a run of tiles_per_task query tiles: the output and
 * (when wanted) the weights of the same queries. */
static void FN(attention_task)(void *ctx, idx_t task)
{
    FN(attention_job) *job = ctx;
    const attnc_attention_args *a = job->args;
    idx_t b = task / job->tasks_per_item;
    idx_t first_tile = (task % job->tasks_per_item) * job->tiles_per_task;
    idx_t last_tile = attnc_min(first_tile + job->tiles_per_task, job->n_query_tiles);
    if (first_tile >= last_tile) return;
    idx_t i0 = first_tile * BLOCK_Q, i1 = attnc_min(last_tile * BLOCK_Q, a->L);
    idx_t tiles = last_tile - first_tile;
    real *work = attnc_malloc((size_t)(job->workspace_elems + tiles * job->weights_per_tile) * sizeof(real));
    if (!work) {
        atomic_store(&job->failed, 1);
        return;
    }
    FN(tile_buffers) t;
    FN(tile_layout)(work, a->E, a->Ev, tiles, &t);
    if (a->weights) { /* after the workspace: the maxes, then elems' rows (float and double: the weights) */
        t.weight_maxes = work + job->workspace_elems;
        t.weight_rows = ELEM_IS_REAL ? (real *)FN(weights_at)(a, b, i0, 0) : t.weight_maxes + tiles * job->maxes_per_tile;
        t.weight_stride = a->S;
    }
    FN(item_view) item = FN(item_at)(a, b);
    FN(flash_queries)(&t, a, &item, b, i0, i1);
    attnc_free(work);
}

/* Query tiles per task: up to MAX_TILES_PER_TASK, fewer when their state
 * would leave L2, and few enough that there are at least 4 tasks per
 * thread. The split never changes a result: every query meets the same
 * key tiles in the same order. */
static idx_t FN(tiles_per_task)(const attnc_attention_args *a, idx_t n_items, idx_t n_query_tiles)
{
    /* bytes of one tile's packed queries and accumulator */
    double per_tile = (double)BLOCK_Q * ((double)a->E + (double)a->Ev + GEMM_NR) * (double)sizeof(real);
    idx_t tiles = per_tile * MAX_TILES_PER_TASK <= TASK_STATE_BYTES ? MAX_TILES_PER_TASK
                                                                    : (idx_t)(TASK_STATE_BYTES / per_tile);
    if (tiles < 1) tiles = 1;
    idx_t wanted_tasks = 4 * (idx_t)attnc_get_num_threads();
    /* few items (n_items < wanted_tasks keeps the products small): split finer */
    if (n_items < wanted_tasks && n_items * attnc_ceil_div(n_query_tiles, tiles) < wanted_tasks) {
        idx_t per_item = attnc_ceil_div(wanted_tasks, n_items);
        tiles = attnc_ceil_div(n_query_tiles, per_item);
    }
    return tiles > 0 ? tiles : 1;
}

static attnc_status FN(attention_tiles)(const attnc_attention_args *a, idx_t n_items)
{
    idx_t n_query_tiles = attnc_ceil_div(a->L, BLOCK_Q);
    idx_t tiles = FN(tiles_per_task)(a, n_items, n_query_tiles);
    FN(tile_buffers) unused;
    FN(attention_job) job = {a, n_query_tiles, tiles, attnc_ceil_div(n_query_tiles, tiles),
                             FN(tile_layout)(NULL, a->E, a->Ev, tiles, &unused), 0, 0, 0};
    /* a task's allocation, at most tiles_per_task tiles: checked here, made by each task */
    idx_t n_tasks, elem_rows = 0, task_weights, task_bytes;
    if (!attnc_mul_ok(n_items, job.tasks_per_item, &n_tasks)) return ATTNC_EOVERFLOW;
    if (a->weights &&
        (!attnc_mul_ok(BLOCK_Q, attnc_ceil_div(a->S, BLOCK_K), &job.maxes_per_tile) ||
         (!ELEM_IS_REAL && !attnc_mul_ok(BLOCK_Q, a->S, &elem_rows)) ||
         !attnc_mul_ok(tiles, job.maxes_per_tile + elem_rows, &task_weights) ||
         !attnc_mul_ok(task_weights + job.workspace_elems, sizeof(real), &task_bytes)))
        return ATTNC_EOVERFLOW;
    job.weights_per_tile = job.maxes_per_tile + elem_rows;
    double flops = 2.0 * (double)n_items * (double)a->L * (double)a->S * (double)(a->E + a->Ev);
    attnc_parallel_for(n_tasks, flops, FN(attention_task), &job);
    return atomic_load(&job.failed) ? ATTNC_ENOMEM : ATTNC_OK;
}

attnc_status FN(attention)(const attnc_attention_args *a)
{
    /* nothing to write: return before walking a possibly huge empty space */
    int empty = a->L == 0;
    for (int d = 0; d < a->batch.ndim; d++) empty |= a->batch.shape[d] == 0;
    if (empty || (a->Ev == 0 && !a->lse && (!a->weights || a->S == 0))) return ATTNC_OK;
    idx_t n_items = 1; /* the output or the weights hold them all: no overflow */
    for (int d = 0; d < a->batch.ndim; d++) n_items *= a->batch.shape[d];
    attnc_status status = attention_takes_rows(a) ? FN(attention_rows)(a, n_items) : FN(attention_tiles)(a, n_items);
    return status == ATTNC_OK && attnc_interrupted() ? ATTNC_EINTR : status;
}
