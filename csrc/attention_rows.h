/* The attention kernel's row path (dtype and ISA template; needs dtype.h,
 * simd.h and vexp.h): straight from the rows of Q, K and V, with no
 * packing. For few queries per item (decode: packing keys and values into
 * slivers for a few queries costs more than the arithmetic) and for head
 * sizes too large for the flash path's tiles.
 *
 * Task = a group of up to ROWS_GROUP query rows that share their keys and
 * values (an item's queries, and the items K and V are broadcast over:
 * grouped-query attention) and a split of SPLIT_KEYS keys [s0, s0 + n):
 *   scores (G, n) = scale * Q_g (G, E) . K[s0:s0+n] (n, E)^T   then bias, mask, band
 *   e (G, n)      = exp(scores - m)      m, l: each row's max, sum of e
 *   part (G, Ev)  = dropout(e) . V[s0:s0+n] (n, Ev)
 * K and V are read once per group and split, a chunk at a time while every
 * row uses it. Then each row merges its splits in order:
 *   M = max_c m_c,  f_c = exp(m_c - M),  out = sum_c f_c part_c / sum_c f_c l_c
 *   weights (when asked for) = e * f_c / sum_c f_c l_c   (e kept in reals until then,
 *                                                          so a weight is rounded once)
 * The splits depend on S alone, so the bits depend neither on the thread
 * count nor on the batch. A row whose scores are all -inf gets weights 0
 * and out 0 * V.
 *
 * The file also holds what the flash path (attention_impl.h) and the
 * backward share with the row path: item views, the weights' rows, the
 * softmax's safe shift and log-sum-exp, dropout masks, the finiteness
 * check (first). */

/* The mask's cover of a block of scores: whether the block's mask can be
 * passed over (keeps all), filled at once or left out (hides all); and why
 * a key tile is left out. Not dtype-dependent: once (SIMD_BYTES is the
 * translation unit's). */
#ifndef ATTNC_MASK_COVER
#define ATTNC_MASK_COVER
/* Why a query tile leaves a key tile out of its sums: not at all; the mask
 * hides all of its scores (exact when each row's max ends above the fill:
 * flash_queries checks); or the bias is -inf at all of them (exact). */
enum { KEY_TILE_COMPUTED, KEY_TILE_MASKED, KEY_TILE_BIASED };

/* What an item's mask does to a block of scores (mask_cover). */
typedef enum { MASK_KEEPS_ALL, MASK_HIDES_ALL, MASK_MIXED } attnc_mask_cover;

/* any |= some of the nk bytes m[j * cs] is nonzero, all &= each is */
static inline __attribute__((always_inline)) void mask_row_cover(const uint8_t *m, idx_t cs, idx_t nk, uint8_t *any,
                                                                 uint8_t *all)
{
    for (idx_t j = 0; j < nk; j++) {
        uint8_t kept = m[j * cs] != 0;
        *any |= kept;
        *all &= kept;
    }
}

typedef uint8_t mask_bytes __attribute__((vector_size(SIMD_BYTES)));

/* 1 when some byte of v is nonzero */
static inline int some_byte_set(mask_bytes v)
{
    uint64_t words[SIMD_BYTES / 8], set = 0;
    memcpy(words, &v, sizeof v);
    for (int w = 0; w < SIMD_BYTES / 8; w++) set |= words[w];
    return set != 0;
}

/* How the item's mask covers queries [i0, i0 + nq) x keys [j0, j0 + nk):
 * one row when it is broadcast over the queries (mask_rs 0, a padding
 * mask). Contiguous rows of at least a vector are read a vector at a time
 * (a row's last vector overlapping the one before), their bytes gathered
 * over the block and told apart after its first row (where most mixed
 * blocks show it: a causal mask's diagonal, a random one) and at its end;
 * other rows byte by byte, no more of them once the block is mixed. A
 * block of nothing, or no mask, keeps all. */
static attnc_mask_cover mask_cover(const attnc_attention_args *a, const uint8_t *mask, idx_t i0, idx_t nq, idx_t j0,
                                   idx_t nk)
{
    if (!mask) return MASK_KEEPS_ALL;
    idx_t rows = a->mask_rs ? nq : 1;
    uint8_t any = 0, all = 1;
    if (a->mask_cs == 1 && nk >= SIMD_BYTES) {
        mask_bytes kept = {0}, hidden = {0};
        for (idx_t i = 0; i < rows; i++) {
            const uint8_t *m = mask + (i0 + i) * a->mask_rs + j0;
            for (idx_t j = 0; j < nk; j += SIMD_BYTES) {
                mask_bytes v;
                memcpy(&v, m + attnc_min(j, nk - SIMD_BYTES), sizeof v);
                kept |= v;
                hidden |= (mask_bytes)(v == 0);
            }
            if (i == 0 && some_byte_set(kept) && some_byte_set(hidden)) break;
        }
        any = some_byte_set(kept);
        all = !some_byte_set(hidden);
    } else
        for (idx_t i = 0; i < rows && !(any && !all); i++)
            mask_row_cover(mask + (i0 + i) * a->mask_rs + j0 * a->mask_cs, a->mask_cs, nk, &any, &all);
    return all ? MASK_KEEPS_ALL : any ? MASK_MIXED : MASK_HIDES_ALL;
}

/* 1 when every query of [i0, i0 + nq) keeps at least one key of [j0, j1) */
static int mask_keeps_a_key_each(const attnc_attention_args *a, const uint8_t *mask, idx_t i0, idx_t nq, idx_t j0,
                                 idx_t j1)
{
    for (idx_t i = 0; i < (a->mask_rs ? nq : 1); i++) {
        const uint8_t *m = mask + (i0 + i) * a->mask_rs;
        idx_t j = j0;
        while (j < j1 && !m[j * a->mask_cs]) j++;
        if (j == j1) return 0;
    }
    return 1;
}
#endif

/* Where item b's matrices start. */
typedef struct {
    const elem *q, *k, *v;
    const uint8_t *mask;
    const elem *bias;
    elem *out;
} FN(item_view);

static FN(item_view) FN(item_at)(const attnc_attention_args *a, idx_t b)
{
    const idx_t *const strides[6] = {a->q.batch_strides, a->k.batch_strides,    a->v.batch_strides,
                                     a->mask_batch_strides, a->bias_batch_strides, a->out.batch_strides};
    idx_t at[6];
    attnc_item_offsets(&a->batch, b, 6, strides, at);
    FN(item_view) view = {
        (const elem *)a->q.data + at[0],
        (const elem *)a->k.data + at[1],
        (const elem *)a->v.data + at[2],
        a->mask ? a->mask + at[3] : NULL,
        a->bias ? (const elem *)a->bias + at[4] : NULL,
        (elem *)a->out.data + at[5],
    };
    return view;
}

/* Query i of item b's row of weights (S), from key s0 on. */
static inline elem *FN(weights_at)(const attnc_attention_args *a, idx_t b, idx_t i, idx_t s0)
{
    return (elem *)a->weights + (b * a->L + i) * a->S + s0;
}

/* The largest score that is not NaN (-inf for none), as row_max; the shift
 * that keeps exp finite: the max, or 0 for a row of -inf (whose e are then
 * exactly 0 instead of NaN). */
static inline real FN(safe_shift)(real max) { return max == -(real)INFINITY ? 0 : max; }
/* 1 / sum, or 0 for a row whose weights are all 0 */
static inline real FN(safe_inverse)(real sum) { return sum == 0 ? 0 : 1 / sum; }
/* 1 for a row of -inf scores (sum 0 over S > 0 keys) that a's nan_rows makes NaN */
static inline int FN(nan_row)(const attnc_attention_args *a, real sum) { return sum == 0 && a->nan_rows && a->S > 0; }
/* A row of a's weights = its exp(score - safe_shift(max)) times this: 1 /
 * sum; for a row of -inf 0, or NaN (nan_row) */
static inline real FN(row_inverse)(const attnc_attention_args *a, real sum)
{
    return FN(nan_row)(a, sum) ? (real)NAN : FN(safe_inverse)(sum);
}
/* A row's log-sum-exp from its max and its sum of exp(score - safe_shift(max)):
 * -inf for a row of -inf (sum 0), or NaN (nan_row) */
static inline real FN(log_sum_exp)(const attnc_attention_args *a, real max, real sum)
{
    return FN(nan_row)(a, sum) ? (real)NAN : FN(safe_shift)(max) + (real)log((double)sum);
}

/* Item b's dropout mask from weight (i0, j0) on: weight (i0 + i, j0 + j)
 * is draw first + i * S + j of the seed's stream (attnc.h). */
typedef struct {
    FN(dropout_draws) draws;
    uint64_t first, S;
} FN(dropout_mask);

static inline FN(dropout_mask) FN(dropout_mask_at)(const attnc_attention_args *a, idx_t b, idx_t i0, idx_t j0)
{
    FN(dropout_mask) mask = {
        FN(dropout_draws_for)(a->dropout_p, a->seed),
        ((uint64_t)b * (uint64_t)a->L + (uint64_t)i0) * (uint64_t)a->S + (uint64_t)j0, (uint64_t)a->S,
    };
    return mask;
}

/* factors[i] <- the factor of weight (i0 + i, j0 + j), i < nq (<= BLOCK_Q):
 * 0 (dropped) or 1/(1-p) (kept); a key's column of a query tile */
static inline void FN(column_keep_factors)(real *factors, const FN(dropout_mask) *mask, idx_t nq, idx_t j)
{
    FN(keep_factors)(factors, nq, &mask->draws, mask->first + (uint64_t)j, mask->S);
}

/* The sum over the n rows (cols elements each, rows rs apart) of x of a
 * term per element, in FINITE_LANES independent lanes, which the compiler
 * vectorises: x * x (LANE_SQUARES), x * 0 (LANE_FINITE: 0 for a finite x,
 * NaN for NaN or +-inf), or the same of x with a negative x taken as 0
 * (LANE_BELOW_INF: NaN for NaN or +inf only). */
#define FINITE_LANES 16
#ifndef ATTNC_LANE_TERMS
#define ATTNC_LANE_TERMS
enum { LANE_FINITE, LANE_SQUARES, LANE_BELOW_INF };
#endif
static inline __attribute__((always_inline)) real FN(lane_term)(real v, int term)
{
    return term == LANE_SQUARES ? v * v : (term == LANE_BELOW_INF && v < 0 ? 0 : v) * 0;
}

static inline __attribute__((always_inline)) real FN(rows_lane_sum)(const elem *x, idx_t rs, idx_t n, idx_t cols,
                                                                    int term)
{
    real lanes[FINITE_LANES] = {0};
    for (idx_t j = 0; j < n; j++) {
        const elem *row = x + j * rs;
        idx_t c = 0;
        for (; c + FINITE_LANES <= cols; c += FINITE_LANES)
            for (int u = 0; u < FINITE_LANES; u++) lanes[u] += FN(lane_term)(to_real(row[c + u]), term);
        for (; c < cols; c++) lanes[0] += FN(lane_term)(to_real(row[c]), term);
    }
    real sum = 0;
    for (int u = 0; u < FINITE_LANES; u++) sum += lanes[u];
    return sum;
}

/* 1 if the n rows of x are all finite */
static int FN(rows_finite)(const elem *x, idx_t rs, idx_t n, idx_t cols)
{
    return FN(rows_lane_sum)(x, rs, n, cols, LANE_FINITE) == 0;
}

/* A bound on the 2-norm of each of the n rows: the root of the largest
 * row's sum of squares; +inf or NaN when a number is not finite (or a sum
 * overflows). By Cauchy-Schwarz, no partial sum of a dot product of two
 * such rows exceeds the product of their bounds (scores_bounded). (The root
 * of all the rows' squares at once is larger by up to sqrt(n): for a tile of
 * 96 queries and one of 192 keys, a bound 136 times as large on their
 * products, under which -1e4 masks are not left out.) */
static real FN(rows_norm_bound)(const elem *x, idx_t rs, idx_t n, idx_t cols)
{
    real most = 0;
    for (idx_t j = 0; j < n; j++) {
        real squares = FN(rows_lane_sum)(x + j * rs, 0, 1, cols, LANE_SQUARES);
        most = squares > most || squares != squares ? squares : most;
    }
    return sqrt(most);
}
#undef FINITE_LANES

/* The row path's sizes:
 * ROWS_GROUP        rows per group: a group's scores (ROWS_GROUP x SPLIT_KEYS,
 *                   64 KiB of float) stay in L2 between its passes.
 * SPLIT_KEYS        keys per split: two splits from S = 2048 on keep two
 *                   threads busy on one head; the merge costs Ev operations
 *                   per row and split, under 0.1% of the split's.
 * ROWS_CHUNK        keys per chunk: a chunk of K or V rows (16 KiB of float at
 *                   128 columns) stays in L1 while every row of the group uses it.
 * WAVE_BYTES        the split state (each split's row stats, parts and kept e) one wave
 *                   of groups may hold.
 * ROWS_MAX_QUERIES  the most queries per item the row path takes: more fill
 *                   the flash path's tiles (attention_impl.h).
 * ROW_BLOCK         rows of a register block (below). */
#ifndef ATTNC_ROWS_SIZES
#define ATTNC_ROWS_SIZES
#define ROWS_GROUP 16
#define SPLIT_KEYS 1024
#define ROWS_CHUNK 32
#define WAVE_BYTES (8 << 20)
#define ROWS_MAX_QUERIES 16
#define ROW_BLOCK 4
#define SPLIT_STATS 2 /* per row and split: its max m and sum l */
#endif
/* The register blocks: ROW_BLOCK rows x KEY_BLOCK keys of dot products,
 * ROW_BLOCK rows x VALUE_VECTORS vectors of the parts (16 registers below
 * AVX-512, 32 with it). */
#undef KEY_BLOCK
#undef VALUE_VECTORS
#define KEY_BLOCK (SIMD_BYTES == 64 ? 4 : 2)
#define VALUE_VECTORS (SIMD_BYTES == 64 ? 4 : 2)

/* sums[d] <- the sum of acc[d]'s lanes, added in lane order, so that a dot
 * has the same bits in any block: VLANES accumulators at a time by a
 * transpose and vertical adds, the rest one at a time. */
static inline __attribute__((always_inline)) void FN(lane_sums)(vreal *acc, int n, real *sums)
{
    int d = 0;
    for (; d + VLANES <= n; d += VLANES) {
        vtranspose(acc + d);
        vreal sum = acc[d];
        for (int u = 1; u < VLANES; u++) sum = vadd(sum, acc[d + u]);
        vstoreu(sums + d, sum);
    }
    for (; d < n; d++) {
        real lanes[VLANES];
        vstoreu(lanes, acc[d]);
        real sum = lanes[0];
        for (int u = 1; u < VLANES; u++) sum += lanes[u];
        sums[d] = sum;
    }
}

/* scores[r * ld + j] <- q[r] . k[j] for n_rows rows (scaled queries:
 * scaled_query) x n_keys keys (ks apart): lane u of a dot adds up elements u, u + VLANES, ... by fused
 * multiply-adds, the lanes are summed (lane_sums), then the tail of E.
 * Always inlined with constant sizes: one specialised block per caller. */
static inline __attribute__((always_inline)) void FN(score_block)(int n_rows, int n_keys, const real *const *q,
                                                                  const elem *k, idx_t ks, idx_t E, real *scores,
                                                                  idx_t ld)
{
    vreal acc[ROW_BLOCK * KEY_BLOCK];
    for (int d = 0; d < n_rows * n_keys; d++) acc[d] = vzero();
    idx_t e = 0;
    for (; e + VLANES <= E; e += VLANES) {
        vreal keys[ROW_BLOCK * KEY_BLOCK];
        for (int j = 0; j < n_keys; j++) keys[j] = vload_elems(k + j * ks + e);
        for (int r = 0; r < n_rows; r++) {
            vreal query = vloadu(q[r] + e);
            for (int j = 0; j < n_keys; j++) acc[r * n_keys + j] = vfma(query, keys[j], acc[r * n_keys + j]);
        }
    }
    real dots[ROW_BLOCK * KEY_BLOCK];
    FN(lane_sums)(acc, n_rows * n_keys, dots);
    for (int r = 0; r < n_rows; r++)
        for (int j = 0; j < n_keys; j++) {
            real dot = dots[r * n_keys + j];
            for (idx_t t = e; t < E; t++) dot = sfma(q[r][t], to_real(k[j * ks + t]), dot);
            scores[r * ld + j] = dot;
        }
}

/* Asks for row x (cols elements) to come into L2 (prefetcht1), whose miss
 * buffers keep more lines in flight than L1's: a decoding step over keys
 * and values in memory, (4, 32, 1, 128) over 2048 keys, took 0.72-0.86x
 * the time of asking for L1 on Zen 4 (2 threads; 0.79x on 1), one whose
 * 6 MB stay in L3 1.01-1.02x (benchmarks/NOTES.md). */
static inline void FN(prefetch_row)(const elem *x, idx_t cols) { PREFETCH_ELEMENTS(x, cols, 2); }

/* How far ahead of the row it reads a stream of keys or values asks for
 * rows (prefetch_row): the rows within PREFETCH_AHEAD_BYTES, at least one.
 * On a Xeon (2 threads, keys and values of 134 MB each), decoding steps
 * took 0.85-0.95x the time of asking for the rows a chunk (32 rows, 16 KB
 * at 128 floats) ahead, and a plain read loop ran at 44 GB/s asking 1-2 KB
 * ahead against 41 asking 16 KB ahead (benchmarks/NOTES.md). */
#define PREFETCH_AHEAD_BYTES 2048
static inline idx_t FN(rows_ahead)(idx_t cols)
{
    idx_t bytes = cols * (idx_t)sizeof(elem);
    return bytes == 0 || bytes >= PREFETCH_AHEAD_BYTES ? 1 : PREFETCH_AHEAD_BYTES / bytes; /* (0: E or Ev 0) */
}

/* dst (E reals) <- a->scale * the query row q: the rows' scores are
 * (scale q) . k as the flash path's (its packed queries are scaled), so a
 * score whose unscaled dot would overflow is finite on both paths, as in
 * PyTorch (a (q . k) * scale was inf there: NaN rows) */
static void FN(scaled_query)(real *dst, const attnc_attention_args *a, const elem *q)
{
    FN(load_row)(dst, q, a->E);
    FN(scale_row)(dst, a->E, (real)a->scale);
}

/* Columns [j0, j1) of the scores of n_rows rows: blocks of n_keys keys, then one key at a time;
 * the keys rows_ahead on are asked for, up to key prefetch_end. */
static inline __attribute__((always_inline)) void FN(score_rows)(int n_rows, int n_keys, const real *const *q,
                                                                 const elem *k, idx_t ks, idx_t j0, idx_t j1,
                                                                 idx_t E, real *scores, idx_t ld,
                                                                 idx_t prefetch_end)
{
    idx_t j = j0, d = FN(rows_ahead)(E);
    for (; j + n_keys <= j1; j += n_keys) {
        for (int t = 0; t < n_keys; t++)
            if (j + t + d < prefetch_end) FN(prefetch_row)(k + (j + t + d) * ks, E);
        FN(score_block)(n_rows, n_keys, q, k + j * ks, ks, E, scores + j, ld);
    }
    for (; j < j1; j++) FN(score_block)(n_rows, 1, q, k + j * ks, ks, E, scores + j, ld);
}

/* scores (n_rows, n) <- the scaled query rows q . the n keys of k (rows
 * ks apart): a chunk of keys at a time, ROW_BLOCK rows at a time, the
 * rows left over one at a time against wider blocks of keys. A chunk
 * whose flag in hidden (NULL: none) is set is not read: its scores are 0,
 * for a mask to fill. */
static void FN(group_scores)(const real *const *q, idx_t n_rows, const elem *k, idx_t ks, idx_t n, idx_t E,
                             real *scores, const uint8_t *hidden)
{
    for (idx_t j0 = 0; j0 < n; j0 += ROWS_CHUNK) {
        idx_t j1 = attnc_min(j0 + ROWS_CHUNK, n), r = 0;
        if (hidden && hidden[j0 / ROWS_CHUNK]) {
            for (r = 0; r < n_rows; r++)
                for (idx_t j = j0; j < j1; j++) scores[r * n + j] = 0;
            continue;
        }
        /* the first rows ask for the keys ahead, but not into a hidden chunk */
        idx_t prefetch_end = hidden && j1 < n && hidden[j1 / ROWS_CHUNK] ? j1 : n;
        for (; r + ROW_BLOCK <= n_rows; r += ROW_BLOCK)
            FN(score_rows)(ROW_BLOCK, KEY_BLOCK, q + r, k, ks, j0, j1, E, scores + r * n, n,
                           r == 0 ? prefetch_end : 0);
        for (; r < n_rows; r++)
            FN(score_rows)(1, ROW_BLOCK * KEY_BLOCK, q + r, k, ks, j0, j1, E, scores + r * n, n,
                           r == 0 ? prefetch_end : 0);
    }
}

/* part[r][c0 : c0 + n_vectors * VLANES] += sum over the n keys j, in
 * order, of e[r * ld + j] * v[j] (rows vs apart), for n_rows rows; the
 * value rows rows_ahead on are asked for, up to row prefetch_end (0: none). */
static inline __attribute__((always_inline)) void FN(value_block)(int n_rows, int n_vectors, const real *e, idx_t ld,
                                                                  const elem *v, idx_t vs, idx_t n, real *const *part,
                                                                  idx_t c0, idx_t prefetch_end, idx_t Ev)
{
    vreal acc[ROW_BLOCK * VALUE_VECTORS];
    for (int r = 0; r < n_rows; r++)
        for (int c = 0; c < n_vectors; c++) acc[r * n_vectors + c] = vloadu(part[r] + c0 + c * VLANES);
    idx_t d = FN(rows_ahead)(Ev);
    for (idx_t j = 0; j < n; j++) {
        if (j + d < prefetch_end) FN(prefetch_row)(v + (j + d) * vs, Ev);
        vreal values[ROW_BLOCK * VALUE_VECTORS];
        for (int c = 0; c < n_vectors; c++) values[c] = vload_elems(v + j * vs + c0 + c * VLANES);
        for (int r = 0; r < n_rows; r++) {
            vreal weight = vset1(e[r * ld + j]);
            for (int c = 0; c < n_vectors; c++) acc[r * n_vectors + c] = vfma(weight, values[c], acc[r * n_vectors + c]);
        }
    }
    for (int r = 0; r < n_rows; r++)
        for (int c = 0; c < n_vectors; c++) vstoreu(part[r] + c0 + c * VLANES, acc[r * n_vectors + c]);
}

/* Every column of n_rows parts: blocks of n_vectors vectors, then one
 * block each of halving widths, then single vectors, then single columns
 * (the same fused multiply-adds in the same order, so the same bits). The
 * halving widths keep a row narrower than n_vectors in independent chains:
 * one row of Ev = 128 floats at AVX-512 (16 vectors a block) ran 8 chains
 * of one accumulator each, one dependent multiply-add after another (90 %
 * of a decoding step's value loop). */
static inline __attribute__((always_inline)) void FN(value_rows)(int n_rows, int n_vectors, const real *e, idx_t ld,
                                                                 const elem *v, idx_t vs, idx_t n, real *const *part,
                                                                 idx_t Ev, idx_t prefetch_end)
{
    idx_t c0 = 0;
    for (; c0 + n_vectors * VLANES <= Ev; c0 += n_vectors * VLANES)
        FN(value_block)(n_rows, n_vectors, e, ld, v, vs, n, part, c0, c0 == 0 ? prefetch_end : 0, Ev);
#define VALUE_ROWS_HALVING(width)                                                                          \
    if (n_vectors > (width) && c0 + (width) * VLANES <= Ev) {                                              \
        FN(value_block)(n_rows, (width), e, ld, v, vs, n, part, c0, c0 == 0 ? prefetch_end : 0, Ev);      \
        c0 += (width) * VLANES;                                                                            \
    }
    VALUE_ROWS_HALVING(8)
    VALUE_ROWS_HALVING(4)
    VALUE_ROWS_HALVING(2)
#undef VALUE_ROWS_HALVING
    for (; c0 + VLANES <= Ev; c0 += VLANES)
        FN(value_block)(n_rows, 1, e, ld, v, vs, n, part, c0, c0 == 0 ? prefetch_end : 0, Ev);
    for (; c0 < Ev; c0++)
        for (int r = 0; r < n_rows; r++)
            for (idx_t j = 0; j < n; j++) part[r][c0] = sfma(e[r * ld + j], to_real(v[j * vs + c0]), part[r][c0]);
}

/* part rows (n_rows, Ev) <- e (n_rows, n) . the n values of v (rows vs
 * apart): a chunk of values at a time, ROW_BLOCK rows at a time, the rows
 * left over one at a time with wider blocks of columns. */
static void FN(group_values)(const real *e, idx_t n_rows, idx_t n, const elem *v, idx_t vs, idx_t Ev,
                             real *const *part)
{
    for (idx_t r = 0; r < n_rows; r++)
        for (idx_t c = 0; c < Ev; c++) part[r][c] = 0;
    for (idx_t j0 = 0; j0 < n; j0 += ROWS_CHUNK) {
        idx_t nk = attnc_min(ROWS_CHUNK, n - j0), r = 0;
        /* the first rows ask for the values ahead, into the next chunk */
        idx_t prefetch_end = nk + attnc_min(ROWS_CHUNK, n - j0 - nk);
        for (; r + ROW_BLOCK <= n_rows; r += ROW_BLOCK)
            FN(value_rows)(ROW_BLOCK, VALUE_VECTORS, e + r * n + j0, n, v + j0 * vs, vs, nk, part + r, Ev,
                           r == 0 ? prefetch_end : 0);
        for (; r < n_rows; r++)
            FN(value_rows)(1, ROW_BLOCK * VALUE_VECTORS, e + r * n + j0, n, v + j0 * vs, vs, nk, part + r, Ev,
                           r == 0 ? prefetch_end : 0);
    }
}

/* Query i's scores against keys [s0, s0 + n): + bias, the mask's fill,
 * and + -inf for the keys outside its band. */
static void FN(finish_row_scores)(const attnc_attention_args *a, const FN(item_view) *item, idx_t i, idx_t s0,
                                  idx_t n, real *scores)
{
    if (item->bias) {
        const elem *bias = item->bias + i * a->bias_rs + s0 * a->bias_cs;
        for (idx_t j = 0; j < n; j++) scores[j] += to_real(bias[j * a->bias_cs]);
    }
    if (item->mask) {
        const uint8_t *m = item->mask + i * a->mask_rs + s0 * a->mask_cs;
        for (idx_t j = 0; j < n; j++) scores[j] = m[j * a->mask_cs] ? scores[j] : (real)-1e20;
    }
    idx_t begin = attnc_band_begin(&a->band, i, a->S) - s0, end = attnc_band_end(&a->band, i, a->S) - s0;
    for (idx_t j = 0; j < n && j < begin; j++) scores[j] -= (real)INFINITY;
    for (idx_t j = end > 0 ? end : 0; j < n; j++) scores[j] -= (real)INFINITY;
}

typedef struct {
    const attnc_attention_args *args;
    idx_t shared;              /* consecutive items sharing K and V (broadcast over the trailing batch dims) */
    idx_t groups_per_kv;       /* row groups of the shared * L rows of one K/V */
    idx_t group_rows;          /* rows of a full group */
    idx_t n_splits;            /* key splits of SPLIT_KEYS */
    idx_t first_group, n_groups; /* the wave's groups */
    real *stats;               /* (n_groups, group_rows, n_splits, SPLIT_STATS): each split's row m and l */
    real *parts;               /* (n_groups, group_rows, n_splits, Ev): each split's part (NULL: the
                                  one split's part is out's row, out being reals) */
    real *e_kept;              /* (n_groups, group_rows, n_splits, SPLIT_KEYS): each split's e, for
                                  the weights (NULL when they are not asked for) */
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

/* Row r of group g (of all the groups): query *i of item *b. A K/V's rows
 * are query r % L of its item r / L. */
static void FN(row_of_group)(const FN(rows_job) *job, idx_t g, idx_t r, idx_t *b, idx_t *i)
{
    idx_t L = job->args->L, row = g % job->groups_per_kv * job->group_rows + r;
    *b = g / job->groups_per_kv * job->shared + row / L;
    *i = row % L;
}

static idx_t FN(rows_in_group)(const FN(rows_job) *job, idx_t g)
{
    return attnc_min(job->group_rows, job->shared * job->args->L - g % job->groups_per_kv * job->group_rows);
}

/* Split c of row r of the wave's group w: its stats (m, l), and its part:
 * the row of out itself when there is one split and out holds reals. */
static real *FN(split_stats)(const FN(rows_job) *job, idx_t w, idx_t r, idx_t c)
{
    return job->stats + ((w * job->group_rows + r) * job->n_splits + c) * SPLIT_STATS;
}

static real *FN(split_part)(const FN(rows_job) *job, idx_t w, idx_t r, idx_t c, elem *out_row)
{
    if (!job->parts) return (real *)out_row;
    return job->parts + ((w * job->group_rows + r) * job->n_splits + c) * job->args->Ev;
}

static real *FN(split_e)(const FN(rows_job) *job, idx_t w, idx_t r, idx_t c)
{
    return job->e_kept + ((w * job->group_rows + r) * job->n_splits + c) * SPLIT_KEYS;
}

/* 1 if rows [i0, i1) of the item's bias over keys [j0, j1) have no NaN
 * and no +inf, or it has none; a broadcast row or column is read once. A
 * -inf (torch's padding) may be there: a score under it is -inf, and so
 * is that plus the band's -inf. */
static int FN(bias_below_inf)(const attnc_attention_args *a, const elem *bias, idx_t i0, idx_t i1, idx_t j0,
                              idx_t j1)
{
    if (!bias || i0 >= i1 || j0 >= j1) return 1;
    idx_t rows = a->bias_rs ? i1 - i0 : 1, keys = a->bias_cs ? j1 - j0 : 1;
    bias += i0 * a->bias_rs + j0 * a->bias_cs;
    if (a->bias_cs == 1) return FN(rows_lane_sum)(bias, a->bias_rs, rows, keys, LANE_BELOW_INF) == 0;
    for (idx_t i = 0; i < rows; i++)
        if (FN(rows_lane_sum)(bias + i * a->bias_rs, a->bias_cs, keys, 1, LANE_BELOW_INF) != 0) return 0;
    return 1;
}

/* Whether the scores of queries [i0, i1) against the item's keys are
 * surely finite or -inf, so that a hidden one (band: + -inf; a -inf bias) is
 * surely -inf and weighs exactly 0: every number they are made of finite
 * (the keys and values, the queries; their bias over keys [j0, j1) finite
 * or -inf: bias_below_inf), and no product or partial sum able to overflow (scores_bounded, from
 * keys_bound and queries_bound: bounds on the rows' 2-norms, +inf or NaN
 * when a number is not finite). Only then may the hidden keys be skipped
 * (flash_queries, the backward and the rows path's split_hidden): a hidden
 * NaN or inf must still reach the row, as in PyTorch's math path, where
 * the band adds -inf to the score (a NaN or +inf score stays NaN; a hidden
 * NaN value is multiplied by its zero weight). */
/* A bound under which no score's product or partial sum overflows (in the
 * dtype of its use). */
#ifndef SCORE_BOUND
#define SCORE_BOUND ((real)(sizeof(real) == sizeof(float) ? 1e37 : 1e307))
#endif
static real FN(keys_bound)(const attnc_attention_args *a, const elem *k, const elem *v, idx_t n)
{
    return FN(rows_finite)(v, a->v.row_stride, n, a->Ev) ? FN(rows_norm_bound)(k, a->k.row_stride, n, a->E)
                                                         : (real)INFINITY;
}

static real FN(queries_bound)(const attnc_attention_args *a, const FN(item_view) *item, idx_t i0, idx_t i1, idx_t j0,
                              idx_t j1)
{
    return FN(bias_below_inf)(a, item->bias, i0, i1, j0, j1)
               ? FN(rows_norm_bound)(item->q + i0 * a->q.row_stride, a->q.row_stride, i1 - i0, a->E)
               : (real)INFINITY;
}

/* A bound on |scale * q . k| for rows of q and k within these 2-norm bounds
 * (Cauchy-Schwarz); the scale may be negative. */
static inline real FN(score_bound)(const attnc_attention_args *a, real q_bound, real k_bound)
{
    return q_bound * k_bound * (real)fabs(a->scale);
}

static inline int FN(scores_bounded)(const attnc_attention_args *a, real q_bound, real k_bound)
{
    return FN(score_bound)(a, q_bound, k_bound) <= SCORE_BOUND; /* false for inf or NaN */
}

/* 1 when computing the split would give every row of the group e = 0
 * exactly, and it is skipped: the split has no key, or no row of the group
 * sees one of its keys and its scores are surely finite (scores_bounded:
 * the group's queries, their bias over the split, the keys and the values).
 * A hidden NaN or inf must still reach out, as in PyTorch's math path (see
 * flash_queries), whichever rows share the group. */
static int FN(split_hidden)(const attnc_attention_args *a, const FN(item_view) *items, const idx_t *queries,
                            idx_t n_rows, idx_t s0, idx_t n, const elem *k, const elem *v)
{
    if (n == 0) return 1;
    if (!a->band.on) return 0;
    for (idx_t r = 0; r < n_rows; r++)
        if (attnc_band_begin(&a->band, queries[r], a->S) < s0 + n && attnc_band_end(&a->band, queries[r], a->S) > s0)
            return 0;
    real q_bound = 0;
    for (idx_t r = 0; r < n_rows; r++) {
        real bound = FN(queries_bound)(a, &items[r], queries[r], queries[r] + 1, s0, s0 + n);
        q_bound = bound > q_bound || bound != bound ? bound : q_bound; /* a NaN row's NaN stays */
    }
    return FN(scores_bounded)(a, q_bound, FN(keys_bound)(a, k, v, n));
}

/* Row (b, i)'s e over the split from its scores: bias, mask, band, then
 * e = exp(s - m) and stats (m, l); e copied to e_kept (the weights' rows,
 * when asked for: NULL otherwise), then dropped out. */
static void FN(split_softmax)(const attnc_attention_args *a, const FN(item_view) *item, idx_t b, idx_t i, idx_t s0,
                              idx_t n, real *scores, real *stats, real *e_kept)
{
    FN(finish_row_scores)(a, item, i, s0, n, scores);
    stats[0] = FN(row_max)(scores, n);
    stats[1] = FN(exp_shift_sum)(scores, n, FN(safe_shift)(stats[0]));
    if (e_kept) memcpy(e_kept, scores, (size_t)n * sizeof(real));
    if (a->dropout_p > 0) {
        FN(dropout_mask) mask = FN(dropout_mask_at)(a, b, i, s0);
        real factors[DROPOUT_RUN];
        for (idx_t j0 = 0; j0 < n; j0 += DROPOUT_RUN) {
            idx_t run = attnc_min(DROPOUT_RUN, n - j0);
            FN(keep_factors)(factors, run, &mask.draws, mask.first + (uint64_t)j0, 1);
            for (idx_t j = 0; j < run; j++) scores[j0 + j] *= factors[j];
        }
    }
}

/* Row r of the wave's group w: out, lse and weights from its splits, in
 * split order (f_c replaces m_c in the stats). */
static void FN(merge_row)(const FN(rows_job) *job, idx_t w, idx_t r)
{
    const attnc_attention_args *a = job->args;
    idx_t b, i, Ev = a->Ev, n_splits = job->n_splits;
    FN(row_of_group)(job, job->first_group + w, r, &b, &i);
    elem *out = (elem *)a->out.data + attnc_item_offset(&a->batch, a->out.batch_strides, b) + i * a->out.row_stride;
    real max = -(real)INFINITY, sum = 0;
    for (idx_t c = 0; c < n_splits; c++) {
        real m = FN(split_stats)(job, w, r, c)[0];
        max = m > max ? m : max;
    }
    for (idx_t c = 0; c < n_splits; c++) {
        real *stats = FN(split_stats)(job, w, r, c);
        stats[0] = stats[0] == max ? 1 : FN(vexp)(stats[0] - max);
        sum = sfma(stats[0], stats[1], sum);
    }
    /* the parts summed into the first one, scaled, then written to out */
    real inverse = FN(row_inverse)(a, sum), *total = FN(split_part)(job, w, r, 0, out);
    for (idx_t c = 0; c < n_splits; c++) {
        real factor = FN(split_stats)(job, w, r, c)[0];
        const real *part = FN(split_part)(job, w, r, c, out);
        if (c == 0)
            for (idx_t col = 0; col < Ev; col++) total[col] = factor * part[col];
        else
            for (idx_t col = 0; col < Ev; col++) total[col] = sfma(factor, part[col], total[col]);
    }
    if (job->parts) /* total is a part's buffer: scaled as it is stored, else it is out */
        FN(store_row_scaled)(out, total, Ev, inverse);
    else
        FN(scale_row)(total, Ev, inverse);
    if (a->lse) ((real *)a->lse)[b * a->L + i] = FN(log_sum_exp)(a, max, sum);
    for (idx_t c = 0; job->e_kept && c < n_splits; c++) { /* the weights: e f_c / sum, rounded once */
        idx_t n = attnc_min(SPLIT_KEYS, a->S - c * SPLIT_KEYS);
        real *e = FN(split_e)(job, w, r, c);
        FN(store_row_scaled)(FN(weights_at)(a, b, i, c * SPLIT_KEYS), e, n, FN(split_stats)(job, w, r, c)[0] * inverse);
    }
}

/* Task t: split t / n_groups of the wave's group t % n_groups (a split's
 * groups run together: they share its keys and values); with one split,
 * the task also finishes its rows. */
static void FN(split_task)(void *ctx, idx_t t)
{
    FN(rows_job) *job = ctx;
    const attnc_attention_args *a = job->args;
    idx_t w = t % job->n_groups, c = t / job->n_groups, g = job->first_group + w;
    idx_t n_rows = FN(rows_in_group)(job, g), s0 = c * SPLIT_KEYS, n = attnc_min(SPLIT_KEYS, a->S - s0);
    FN(item_view) items[ROWS_GROUP];
    idx_t item_of[ROWS_GROUP], query_of[ROWS_GROUP];
    const real *q[ROWS_GROUP];
    real *part[ROWS_GROUP];
    for (idx_t r = 0; r < n_rows; r++) {
        FN(row_of_group)(job, g, r, &item_of[r], &query_of[r]);
        items[r] = r > 0 && item_of[r] == item_of[r - 1] ? items[r - 1] : FN(item_at)(a, item_of[r]);
        part[r] = FN(split_part)(job, w, r, c, items[r].out + query_of[r] * a->out.row_stride);
    }
    /* the K and V of the group's rows: those of the first item of its K/V */
    FN(item_view) kv_item = FN(item_at)(a, g / job->groups_per_kv * job->shared);
    const elem *k = kv_item.k + s0 * a->k.row_stride, *v = kv_item.v + s0 * a->v.row_stride;
    if (FN(split_hidden)(a, items, query_of, n_rows, s0, n, k, v)) {
        for (idx_t r = 0; r < n_rows; r++) {
            real *stats = FN(split_stats)(job, w, r, c);
            stats[0] = -(real)INFINITY;
            stats[1] = 0;
            for (idx_t col = 0; col < a->Ev; col++) part[r][col] = 0;
            if (job->e_kept) memset(FN(split_e)(job, w, r, c), 0, (size_t)n * sizeof(real));
        }
    } else {
        /* the scores (n_rows, n), then the queries scaled (n_rows, E) */
        real *scores = attnc_malloc((size_t)(n_rows * (n + a->E)) * sizeof(real));
        if (!scores) {
            atomic_store(&job->failed, 1);
            return;
        }
        for (idx_t r = 0; r < n_rows; r++) {
            real *scaled = scores + n_rows * n + r * a->E;
            FN(scaled_query)(scaled, a, items[r].q + query_of[r] * a->q.row_stride);
            q[r] = scaled;
        }
        /* the chunks of keys the mask hides from every row: their scores are the fill whatever the keys */
        _Static_assert(SPLIT_KEYS % ROWS_CHUNK == 0, "a flag for every chunk of a split");
        uint8_t hidden[SPLIT_KEYS / ROWS_CHUNK], any_hidden = 0;
        for (idx_t j0 = 0; j0 < n && a->mask; j0 += ROWS_CHUNK) {
            uint8_t all_rows = 1;
            for (idx_t r = 0; r < n_rows && all_rows; r++)
                all_rows = mask_cover(a, items[r].mask, query_of[r], 1, s0 + j0, attnc_min(ROWS_CHUNK, n - j0)) ==
                           MASK_HIDES_ALL;
            hidden[j0 / ROWS_CHUNK] = all_rows;
            any_hidden |= all_rows;
        }
        FN(group_scores)(q, n_rows, k, a->k.row_stride, n, a->E, scores, any_hidden ? hidden : NULL);
        for (idx_t r = 0; r < n_rows; r++)
            FN(split_softmax)(a, &items[r], item_of[r], query_of[r], s0, n, scores + r * n, FN(split_stats)(job, w, r, c),
                              job->e_kept ? FN(split_e)(job, w, r, c) : NULL);
        if (!attnc_interrupted()) FN(group_values)(scores, n_rows, n, v, a->v.row_stride, a->Ev, part);
        attnc_free(scores);
    }
    if (job->n_splits == 1)
        for (idx_t r = 0; r < n_rows; r++) FN(merge_row)(job, w, r);
}

/* Task w: the rows of the wave's group w merged (several splits). */
static void FN(merge_task)(void *ctx, idx_t w)
{
    FN(rows_job) *job = ctx;
    for (idx_t r = 0, n = FN(rows_in_group)(job, job->first_group + w); r < n; r++) FN(merge_row)(job, w, r);
}

/* The groups in waves whose split state fits in WAVE_BYTES (at least one
 * group: a group's state is at most ROWS_GROUP / SPLIT_KEYS of its values,
 * plus, with the weights, as many reals as its weights). */
static attnc_status FN(attention_rows)(const attnc_attention_args *a, idx_t n_items)
{
    FN(rows_job) job = {.args = a, .shared = FN(items_sharing_kv)(a)};
    job.group_rows = attnc_min(ROWS_GROUP, job.shared * a->L);
    job.groups_per_kv = attnc_ceil_div(job.shared * a->L, ROWS_GROUP);
    job.n_splits = a->S > 0 ? attnc_ceil_div(a->S, SPLIT_KEYS) : 1;
    int own_parts = job.n_splits > 1 || !ELEM_IS_REAL; /* else each part is out's row */
    idx_t n_groups = n_items / job.shared * job.groups_per_kv;
    idx_t per_split = SPLIT_STATS + (own_parts ? a->Ev : 0) + (a->weights ? SPLIT_KEYS : 0);
    idx_t per_group; /* elements of a group's split state */
    if (!attnc_mul_ok(job.group_rows * job.n_splits, per_split, &per_group) ||
        (size_t)per_group > SIZE_MAX / sizeof(real))
        return ATTNC_EOVERFLOW;
    idx_t fit = WAVE_BYTES / ((idx_t)sizeof(real) * per_group), wave = attnc_min(n_groups, fit > 0 ? fit : 1);
    job.stats = attnc_malloc((size_t)(wave * job.group_rows * job.n_splits * SPLIT_STATS) * sizeof(real));
    job.parts = own_parts ? attnc_malloc((size_t)(wave * job.group_rows * job.n_splits * a->Ev) * sizeof(real)) : NULL;
    job.e_kept = a->weights ? attnc_malloc((size_t)(wave * job.group_rows * job.n_splits * SPLIT_KEYS) * sizeof(real))
                            : NULL;
    attnc_status status = ATTNC_OK;
    if (!job.stats || (own_parts && !job.parts) || (a->weights && !job.e_kept)) status = ATTNC_ENOMEM;
    for (job.first_group = 0; status == ATTNC_OK && job.first_group < n_groups && !attnc_interrupted();
         job.first_group += wave) {
        job.n_groups = attnc_min(wave, n_groups - job.first_group);
        double flops = 2.0 * (double)(job.n_groups * job.group_rows) * (double)a->S * (double)(a->E + a->Ev);
        attnc_parallel_for(job.n_groups * job.n_splits, flops, FN(split_task), &job);
        if (atomic_load(&job.failed)) status = ATTNC_ENOMEM;
        else if (job.n_splits > 1)
            attnc_parallel_for(job.n_groups, (double)(job.n_groups * per_group) * 2, FN(merge_task), &job);
    }
    attnc_free(job.stats);
    attnc_free(job.parts);
    attnc_free(job.e_kept);
    return status;
}
