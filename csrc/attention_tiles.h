/* The tile pieces of the attention kernel's flash path (dtype and ISA
 * template; needs dtype.h, simd.h, storage.h, vexp.h and gemm_impl.h).
 *
 * Both products of a tile run on the GEMM micro-kernel (GEMM_MR x GEMM_NR
 * register tiles). Scores are computed transposed, scores_t (keys,
 * queries) = K . Q^T over packed slivers, so that every softmax step (max,
 * exp, sum, rescale) runs along contiguous rows across queries, and P.V
 * reads the probabilities of GEMM_MR queries straight from each key's row
 * of scores_t (the micro-kernel's a_step), with no packing or transpose. */
#ifndef ATTNC_ATTENTION_TILES_ONCE
#define ATTNC_ATTENTION_TILES_ONCE

/* Tile sizes. BLOCK_Q queries share each packed key/value tile (packing
 * costs 1/BLOCK_Q of the products) and span whole slivers of every
 * micro-kernel (a multiple of every GEMM_NR: 32, 16, 8, 4, and GEMM_MR: 12,
 * 6, 4). BLOCK_K keys per step, a multiple of every GEMM_MR; the longer it
 * is, the fewer times the accumulator is rescaled and reloaded. The
 * (BLOCK_K, BLOCK_Q) score tile is 72 KiB in float: with the value tile and
 * the accumulator it stays in L2. Chosen by measurement (benchmarks/NOTES.md). */
#define BLOCK_Q 96
#define BLOCK_K 192
#define ROUND_UP(n, m) (((n) + (m) - 1) / (m) * (m))
/* every buffer starts on a 64-byte boundary, as the micro-kernels load
 * packed slivers with aligned loads */
#define BUFFER_ALIGN_ELEMS 16
/* Query tiles per task: a task packs each key/value tile once for all of
 * its query tiles (up to 12 x 96 = 1152 queries: an item of 1024 queries
 * in one task, its keys and values packed once), while their packed
 * queries and accumulators stay within TASK_STATE_BYTES (in a 1 MB L2,
 * beside the key and value tiles). With 8 tiles in 512 KB, SDPA (8, 12,
 * 1024, 64) took 1.006x the time on a Zen 4 core pair, causal 1.014x,
 * other shapes the same (benchmarks/NOTES.md). */
#define MAX_TILES_PER_TASK 12
#define TASK_STATE_BYTES (768 * 1024)
#endif

_Static_assert(BLOCK_Q % GEMM_NR == 0 && BLOCK_Q % GEMM_MR == 0 && BLOCK_K % GEMM_MR == 0,
               "tiles are whole slivers of the micro-kernel");

/* One task's buffers, carved from one allocation (tile_layout); q_pack, acc
 * and the run_ arrays hold one part per query tile of the task, the rest
 * is shared by its tiles. */
typedef struct {
    real *q_pack;   /* per tile: (BLOCK_Q / NR) slivers of (E, NR): scaled queries */
    real *k_pack;   /* (BLOCK_K / MR) slivers of (E, MR): keys not read in place   */
    real *scores_t; /* (BLOCK_K, BLOCK_Q): scores, then probabilities, by key      */
    real *v_pack;   /* (Ev_padded / NR) slivers of (BLOCK_K, NR): values           */
    real *acc;      /* per tile: (BLOCK_Q, Ev_padded): output accumulator          */
    real *run_max, *run_sum; /* per tile: (BLOCK_Q) each                           */
    real *tile_max, *correction; /* (BLOCK_Q) each                                */
    /* with the weights (attention_impl.h), per tile: weight_rows, BLOCK_Q
     * rows weight_stride (S) apart, each key tile's exponentials, then the
     * weights; weight_maxes, (key tiles of S, BLOCK_Q), each row's running
     * max they were taken under. NULL without the weights. */
    real *weight_rows, *weight_maxes;
    idx_t weight_stride;
    idx_t Ev_padded;
    /* BF16_PAIRS' forward: queries, keys and values are packed as pairs of
     * bfloat16 along the products' K (storage.h), so their slivers are
     * ceil(E / 2) and ceil(BLOCK_K / 2) steps deep, queries unscaled, and
     * the probabilities in scores_t are rounded to pairs of keys before
     * the value product */
    int pairs;
} FN(tile_buffers);

/* The workspace layout, in one place: carves `work` into t (when work is
 * not NULL) and returns its size in elements, each part 64-byte aligned.
 * The flash path runs only for head sizes that keep this small
 * (attention_impl.h), so it cannot overflow. */
static idx_t FN(tile_layout)(real *work, idx_t E, idx_t Ev, idx_t tiles, FN(tile_buffers) *t)
{
    t->pairs = BF16_PAIRS;
    idx_t used = 0, Ev_padded = ROUND_UP(Ev, GEMM_NR);
#define PART(field, elems)                          \
    t->field = work ? work + used : NULL;           \
    used += ROUND_UP((elems), BUFFER_ALIGN_ELEMS)
    PART(q_pack, tiles * BLOCK_Q * E);
    PART(k_pack, BLOCK_K * E);
    PART(scores_t, BLOCK_K * BLOCK_Q);
    PART(v_pack, BLOCK_K * Ev_padded);
    PART(acc, tiles * BLOCK_Q * Ev_padded);
    PART(run_max, tiles * BLOCK_Q);
    PART(run_sum, tiles * BLOCK_Q);
    PART(tile_max, BLOCK_Q);
    PART(correction, BLOCK_Q);
#undef PART
    t->weight_rows = t->weight_maxes = NULL;
    t->weight_stride = 0;
    t->Ev_padded = Ev_padded;
    return used;
}

/* The buffers of query tile `tile` of the task: its packed queries,
 * accumulator, running max and sum and weight rows in place of the first
 * tile's. */
static FN(tile_buffers) FN(tile_view)(const FN(tile_buffers) *t, idx_t tile, idx_t E)
{
    FN(tile_buffers) v = *t;
    v.q_pack += tile * BLOCK_Q * E;
    v.acc += tile * BLOCK_Q * t->Ev_padded;
    v.run_max += tile * BLOCK_Q;
    v.run_sum += tile * BLOCK_Q;
    if (v.weight_rows) {
        v.weight_rows += tile * BLOCK_Q * t->weight_stride;
        v.weight_maxes += tile * BLOCK_Q * attnc_ceil_div(t->weight_stride, BLOCK_K);
    }
    return v;
}

/* The queries a tile's buffers are sized for, nq queries rounded to whole
 * MR runs of the value product (which reads probabilities straight from
 * the score tile) and to whole NR slivers. The score columns past nq that
 * score_product computes (from the zero-padded queries) are read only by
 * vector loads whose lanes past nq are dropped (column_max,
 * column_exp_sum) and by accumulator rows past nq, never written out. */
static inline idx_t FN(padded_queries)(idx_t nq) { return ROUND_UP(ROUND_UP(nq, GEMM_MR), GEMM_NR); }

/* The query columns packed for the score product (the rows of packed
 * queries and dO): whole NR slivers. It computes them all but in a last
 * sliver of at most VLANES queries, where it computes one vector. */
static inline idx_t FN(score_columns)(idx_t nq) { return ROUND_UP(nq, GEMM_NR); }

/* dst <- scale * rows (n, E) of src (rows src_rs apart), transposed into
 * slivers of `width` rows: sliver s is (steps, width); rows n to padded_n
 * (a multiple of width) are zeros. Queries and dO (width NR, the scale
 * folded into the queries), keys and values (width MR). With pairs, a
 * step is a pair of elements (an odd E's last is (x, 0)), not scaled.
 * VLANES steps of VLANES rows at a time go through turn_rows
 * (gemm_impl.h), the steps past their whole vectors one by one. */
static void FN(pack_row_slivers)(real *dst, const elem *src, idx_t src_rs, idx_t n, idx_t padded_n, idx_t E,
                                 idx_t width, real scale, int pairs)
{
    pairs = BF16_PAIRS && pairs; /* a constant 0 in the other instantiations */
    idx_t steps = FN(product_steps)(E, pairs), whole = FN(whole_steps)(E, pairs);
    for (idx_t r0 = 0; r0 < padded_n; r0 += width)
        for (idx_t g = 0; g < width; g += VLANES) {
            real *run = dst + r0 * steps + g;
            int lanes = (int)attnc_min(VLANES, width - g);
            const elem *rows[VLANES]; /* NULL: a padding row */
            for (int l = 0; l < VLANES; l++) rows[l] = l < lanes && r0 + g + l < n ? src + (r0 + g + l) * src_rs : NULL;
            idx_t p = 0;
            for (; p + VLANES <= whole; p += VLANES) FN(turn_rows)(run + p * width, rows, lanes, p, width, scale, pairs);
            for (; p < steps; p++)
                for (int l = 0; l < lanes; l++) {
                    real *slot = run + p * width + l;
#if BF16_PAIRS
                    if (pairs) {
                        *slot = rows[l] ? FN(pair_at)(rows[l], p, 1, E) : 0;
                        continue;
                    }
#endif
                    *slot = rows[l] ? scale * to_real(rows[l][p]) : 0;
                }
        }
}

/* dst <- columns [0, cols) of src (n, cols; rows src_rs apart) cut into
 * slivers of `width` columns: sliver s is (sliver_rows >= steps, width),
 * zero-padded up to padded_cols; steps is n, or with pairs ceil(n / 2):
 * step j pairs rows 2j and 2j + 1 (an odd n's last with zeros). Values
 * (width NR). */
static void FN(pack_column_slivers)(real *dst, const elem *src, idx_t src_rs, idx_t n, idx_t cols,
                                    idx_t padded_cols, idx_t width, idx_t sliver_rows, int pairs)
{
    pairs = BF16_PAIRS && pairs; /* a constant 0 in the other instantiations */
    idx_t steps = FN(product_steps)(n, pairs);
    for (idx_t c0 = 0; c0 < padded_cols; c0 += width) {
        real *sliver = dst + c0 * sliver_rows;
        idx_t valid = cols - c0 < width ? cols - c0 : width;
        for (idx_t j = 0; j < steps; j++) {
            real *step = sliver + j * width;
#if BF16_PAIRS
            if (pairs) {
                const elem *first = src + 2 * j * src_rs + c0, *second = 2 * j + 1 < n ? first + src_rs : NULL;
                idx_t c = 0;
                for (; c + VLANES <= valid; c += VLANES)
                    vstoreu(step + c, FN(vpair_rows)(first + c, second ? second + c : NULL));
                for (; c < valid; c++) step[c] = FN(pair_of)(first + c, second ? second + c : NULL);
            } else
#endif
                FN(load_row)(step, src + j * src_rs + c0, valid);
            for (idx_t c = valid; c < width; c++) step[c] = 0;
        }
    }
}

/* The init row of the micro-kernel's store form: tiles start from zero. */
static const real FN(zero_row)[64];

/* The micro-kernel (gemm_impl.h) in its two forms, one out-of-line copy
 * each, called once per register tile by the two products below (E or nk
 * steps of up to 2 * GEMM_MR FMAs each, so the call costs nothing; m and
 * n: the rows and columns left from the tile's first, gemm_tile_rows), as before the
 * SIMD vocabulary. Inlined, the value product's tile sat inside
 * attention_task with everything flash_step inlines, and its setup reloaded
 * the tile's row pointers from the stack; out of line, the float SDPA cases
 * measured 1-4% faster on Zen 3 (AVX2), the double ones unchanged. Their
 * K loops start on a 64-byte boundary (TILE_LOOPS_ALIGNED): where they
 * fell (a change elsewhere moves them), a loop of ~136 bytes took 4 of
 * the op cache's 64-byte windows instead of 3, and float SDPA (1, 12, 512,
 * 64) took 1.09x the time on a Zen 3 core (benchmarks/NOTES.md). */
#define TILE_LOOPS_ALIGNED __attribute__((noinline, optimize("align-loops=64")))
static TILE_LOOPS_ALIGNED void FN(tile_store)(idx_t m, idx_t n, idx_t kc, const real *a, idx_t a_rs, idx_t a_step,
                                              const real *b, real *c, idx_t c_rs, const real *scale, int pairs)
{
    if (BF16_PAIRS && pairs)
        FN(gemm_tile_rows)(m, n, kc, a, a_rs, a_step, b, 0, c, c_rs, FN(zero_row), 0, scale, 0, 1);
    else
        FN(gemm_tile_rows)(m, n, kc, a, a_rs, a_step, b, 0, c, c_rs, FN(zero_row), 0, NULL, 0, 0);
}

static TILE_LOOPS_ALIGNED void FN(tile_add)(idx_t m, idx_t kc, const real *a, idx_t a_step, const real *b,
                                            idx_t b_rs, real *c, idx_t c_rs, int pairs)
{
    if (BF16_PAIRS && pairs)
        FN(gemm_tile_rows)(m, GEMM_NR, kc, a, 1, a_step, b, 0, c, c_rs, NULL, 0, NULL, 0, 1);
    else if (b_rs) /* (two loops: a constant 0 keeps the packed one's aligned loads) */
        FN(gemm_tile_rows)(m, GEMM_NR, kc, a, 1, a_step, b, b_rs, c, c_rs, NULL, 0, NULL, 0, 0);
    else
        FN(gemm_tile_rows)(m, GEMM_NR, kc, a, 1, a_step, b, 0, c, c_rs, NULL, 0, NULL, 0, 0);
}

/* scores_t (nk, BLOCK_Q)[:, :ROUND_UP(nq, VLANES)] <- keys . q_pack^T
 * (stored, not added: the tile is never cleared first), over E elements
 * packed as product_steps(E, pairs) steps; with pairs, times *scale as they
 * are stored (pairs are packed unscaled). Keys in MR-row slivers: the first
 * k_in_place keys (whole slivers) read in place from k_rows (rows k_rs
 * apart, E reals each), the rest from k_pack's slivers; the last sliver on
 * whole GEMM_MR_STEP rows (gemm_tile_rows: the rows past those are not
 * written; those past nk, made of whatever keys follow or of the packed
 * zeros, are never used). Read in place, SDPA over 50 to 128 keys (packed
 * keys shared by no other query tile) took 0.95-0.97x the time on a Xeon
 * core (AVX-512, 1 thread), over 256 and 1024 keys the same
 * (benchmarks/NOTES.md). The products run over the NR slivers up to nq,
 * the last on one vector of columns when that holds the queries left
 * (gemm_tile_rows: the sliver's columns past it neither computed nor
 * written). What reads the tile reads its queries up to nq (the backward's
 * rows and key products), up to a whole vector (column_max,
 * column_exp_sum, add_bias, fill_hidden_turned, store_scores_turned) or
 * whole runs of GEMM_MR_STEP (the value products, pair_probabilities):
 * all within the columns computed. One vector for
 * the last 13 of 77 queries: SDPA (1, 8, 77, 64) took 0.93x the time on a
 * Zen 4 core, 1 and 2 threads; (2, 4, 100, 64) 0.95x and 0.97x
 * (benchmarks/NOTES.md). */
_Static_assert(VLANES % GEMM_MR_STEP == 0, "a vector holds whole runs of GEMM_MR_STEP queries");

static void FN(score_product)(real *scores_t, const real *k_pack, const real *k_rows, idx_t k_rs, idx_t k_in_place,
                              const real *q_pack, idx_t nk, idx_t nq, idx_t E, const real *scale, int pairs)
{
    idx_t rows = ROUND_UP(nk, GEMM_MR), cols = FN(score_columns)(nq), steps = FN(product_steps)(E, pairs);
    for (idx_t j0 = 0; j0 < rows; j0 += GEMM_MR) {
        int in_place = j0 < k_in_place;
        const real *k = in_place ? k_rows + j0 * k_rs : k_pack + (j0 - k_in_place) * steps;
        for (idx_t i0 = 0; i0 < cols; i0 += GEMM_NR)
            FN(tile_store)(nk - j0, nq - i0, steps, k, in_place ? k_rs : 1, in_place ? 1 : GEMM_MR,
                           q_pack + i0 * steps, scores_t + j0 * BLOCK_Q + i0, BLOCK_Q, scale, pairs);
    }
}

/* acc (nq, Ev_padded) += probabilities^T . values (nk keys): the first
 * v_in_place columns (whole NR slivers) read in place from v_rows (rows
 * v_rs apart), the rest from v_pack's column slivers (of sliver_rows
 * rows). The micro-kernel reads the probabilities of MR queries from each
 * key's row of scores_t (nk, BLOCK_Q) in place, BLOCK_Q apart, with no
 * packing. With pairs, scores_t holds the rows of pair_probabilities and
 * v_pack pairs of keys: ceil(nk / 2) steps. */
static void FN(value_product)(real *acc, const real *scores_t, const real *v_pack, const real *v_rows, idx_t v_rs,
                              idx_t v_in_place, idx_t nq, idx_t nk, idx_t Ev_padded, idx_t sliver_rows, int pairs)
{
    for (idx_t i0 = 0; i0 < nq; i0 += GEMM_MR)
        for (idx_t c0 = 0; c0 < Ev_padded; c0 += GEMM_NR) {
            int in_place = c0 < v_in_place;
            const real *v = in_place ? v_rows + c0 : v_pack + (c0 - v_in_place) * sliver_rows;
            FN(tile_add)(nq - i0, FN(product_steps)(nk, pairs), scores_t + i0, BLOCK_Q, v, in_place ? v_rs : 0,
                         acc + i0 * Ev_padded + c0, Ev_padded, pairs);
        }
}

#if BF16_PAIRS
/* Row j of scores_t (nk, BLOCK_Q)[:, :cols] <- the probabilities of keys
 * 2j and 2j + 1 rounded to a pair of bfloat16 (an odd nk's last with 0),
 * in place: row j is written after rows 2j and 2j + 1 are read, and rows
 * before them were read already. */
static void FN(pair_probabilities)(real *scores_t, idx_t cols, idx_t nk)
{
    for (idx_t j = 0; j < FN(product_steps)(nk, 1); j++) {
        const real *first = scores_t + 2 * j * BLOCK_Q, *second = 2 * j + 1 < nk ? first + BLOCK_Q : NULL;
        real *dst = scores_t + j * BLOCK_Q;
        idx_t i = 0;
        for (; i + VLANES <= cols; i += VLANES) vstoreu(dst + i, FN(vround_pairs)(first + i, second ? second + i : NULL));
        for (; i < cols; i++) {
            elem low = FN(round_for_pairs)(first[i]), high = second ? FN(round_for_pairs)(second[i]) : (elem){0};
            dst[i] = FN(pair_of)(&low, &high);
        }
    }
}
#endif

/* tile_max[i, i + vectors * VLANES) <- those columns' maxima down the nk
 * keys of scores_t, the maxima held in registers (vectors a constant):
 * each column's keys in order, so a max of +0 and -0 is the one first met */
static inline __attribute__((always_inline)) void FN(columns_max)(real *tile_max, const real *scores_t, idx_t i,
                                                                  idx_t nk, int vectors)
{
    vreal m[BLOCK_Q / VLANES];
    for (int c = 0; c < vectors; c++) m[c] = vset1(-(real)INFINITY);
    for (idx_t j = 0; j < nk; j++)
        for (int c = 0; c < vectors; c++) m[c] = vmax(vloadu(scores_t + j * BLOCK_Q + i + c * VLANES), m[c]);
    for (int c = 0; c < vectors; c++) vstoreu(tile_max + i + c * VLANES, m[c]);
}

/* tile_max (nq) <- column maxima of scores_t (nk, BLOCK_Q); NaN is skipped
 * (vmax keeps its second operand) and reaches the result through the sum,
 * as in PyTorch. A whole tile's columns at once (independent maxima: a
 * column at a time waited on each max, and a stored tile_max on each
 * store); a short tile's a vector at a time, its last vector short: it
 * reads the tile's columns past nq (scores_t's rows and tile_max hold
 * BLOCK_Q reals, a multiple of VLANES) and stores their maxima too, which
 * column_exp_sum reads only into lanes it never stores. */
static void FN(column_max)(real *tile_max, const real *scores_t, idx_t nq, idx_t nk)
{
    if (nq == BLOCK_Q) {
        FN(columns_max)(tile_max, scores_t, 0, nk, BLOCK_Q / VLANES);
        return;
    }
    for (idx_t i = 0; i < nq; i += VLANES) FN(columns_max)(tile_max, scores_t, i, nk, 1);
}

/* scores_t[j, i] <- exp(scores_t[j, i] - shift[i]); sums (nq) += column
 * sums, added key by key in order (the same for any thread count). A
 * vector of columns at a time, down the keys, its shift and sums held in
 * registers; the last vector short: its lanes past nq read the tile's
 * columns past nq (scores_t's rows, shift and sums hold BLOCK_Q reals, a
 * multiple of VLANES; past nq, whatever they held, even unset) and are
 * never stored. Each lane's exp is the one
 * vexp gives its column alone (the last 13 columns of a 77-query tile had
 * taken a vector exp each, one column at a time: benchmarks/NOTES.md).
 * With pairs, the exp for probabilities rounded to bfloat16 next (vexp.h). */
static void FN(column_exp_sum)(real *scores_t, const real *shift, real *sums, idx_t nq, idx_t nk, int pairs)
{
    for (idx_t i = 0; i < nq; i += VLANES) {
        int lanes = (int)attnc_min(VLANES, nq - i);
        vreal column_shift = vloadu(shift + i), sum = vloadu(sums + i);
        for (idx_t j = 0; j < nk; j++) {
            real *x = scores_t + j * BLOCK_Q + i;
            vreal e = FN(vexp_lanes)(vloadu(x) - column_shift, pairs);
            vstore_first(x, e, lanes);
            sum = sum + e;
        }
        vstore_first(sums + i, sum, lanes);
    }
}
