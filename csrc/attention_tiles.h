/* The tile pieces of the attention kernel (dtype and ISA template; needs
 * dtype.h, ukernel_shape.h and vexp.h). Both products of a tile, Q.K^T and
 * P.V, run on the GEMM micro-kernel (UK_MR x UK_NR register tiles) over
 * packed slivers; the packing routines here lay the operands out for it. */
#ifndef ATTNC_ATTENTION_TILES_ONCE
#define ATTNC_ATTENTION_TILES_ONCE

/* Tile sizes. BLOCK_Q queries share each packed key/value tile, so packing
 * costs 1/BLOCK_Q of the products; it is a multiple of every micro-kernel's
 * MR (6 and 4). BLOCK_K keys per step: a multiple of every NR (16 and 8);
 * the (BLOCK_Q, BLOCK_K) score tile and a (BLOCK_K, 64) value tile fit in L2
 * with room to spare. */
#define BLOCK_Q 48
#define BLOCK_K 64
#define ROUND_UP(n, m) (((n) + (m) - 1) / (m) * (m))
/* every buffer starts on a 64-byte boundary, as the micro-kernels load
 * packed slivers with aligned loads */
#define BUFFER_ALIGN_ELEMS 16

/* Elements of one task's workspace, or -1 when that overflows. */
static inline idx_t attention_workspace_elems(idx_t E, idx_t Ev)
{
    idx_t Ev_padded = ROUND_UP(Ev, 16), q_pack, k_pack, v_pack, acc, total = 0;
    if (Ev_padded < Ev || !attnc_mul_ok(BLOCK_Q, E, &q_pack) || !attnc_mul_ok(BLOCK_K, E, &k_pack) ||
        !attnc_mul_ok(BLOCK_K, Ev_padded, &v_pack) || !attnc_mul_ok(BLOCK_Q, Ev_padded, &acc))
        return -1;
    idx_t parts[] = {q_pack, k_pack, BLOCK_Q * BLOCK_K, BLOCK_Q * BLOCK_K, v_pack, acc, BLOCK_Q, BLOCK_Q};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        idx_t part = ROUND_UP(parts[i], BUFFER_ALIGN_ELEMS);
        if (part < parts[i] || total > PTRDIFF_MAX - part) return -1;
        total += part;
    }
    return total;
}
#endif

/* One task's buffers, carved from one allocation. */
typedef struct {
    real *q_pack;  /* (BLOCK_Q / MR) slivers of (E, MR): scaled queries   */
    real *k_pack;  /* (BLOCK_K / NR) slivers of (E, NR): keys              */
    real *scores;  /* (BLOCK_Q, BLOCK_K): scores, then probabilities       */
    real *p_pack;  /* (BLOCK_Q / MR) slivers of (BLOCK_K, MR): probabilities */
    real *v_pack;  /* (Ev_padded / NR) slivers of (BLOCK_K, NR): values    */
    real *acc;     /* (BLOCK_Q, Ev_padded): output accumulator             */
    real *run_max; /* (BLOCK_Q) */
    real *run_sum; /* (BLOCK_Q) */
    idx_t Ev_padded;
} FN(tile_buffers);

static FN(tile_buffers) FN(carve_buffers)(real *work, idx_t E, idx_t Ev)
{
    FN(tile_buffers) t;
    t.Ev_padded = ROUND_UP(Ev, UK_NR);
    idx_t Ev_room = ROUND_UP(Ev, 16);
    real **slots[] = {&t.q_pack, &t.k_pack, &t.scores, &t.p_pack, &t.v_pack, &t.acc, &t.run_max, &t.run_sum};
    idx_t sizes[] = {BLOCK_Q * E, BLOCK_K * E, BLOCK_Q * BLOCK_K, BLOCK_Q * BLOCK_K,
                     BLOCK_K * Ev_room, BLOCK_Q * Ev_room, BLOCK_Q, BLOCK_Q};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *slots[i] = work;
        work += ROUND_UP(sizes[i], BUFFER_ALIGN_ELEMS);
    }
    return t;
}

/* q_pack <- scale * queries (nq, E) in MR-row slivers, zero-padded rows. */
static void FN(pack_queries)(real *q_pack, const real *q, idx_t q_rs, idx_t nq, idx_t E, real scale)
{
    for (idx_t i0 = 0; i0 < nq; i0 += UK_MR) {
        real *sliver = q_pack + i0 * E;
        for (idx_t p = 0; p < E; p++)
            for (idx_t r = 0; r < UK_MR; r++)
                sliver[p * UK_MR + r] = i0 + r < nq ? scale * q[(i0 + r) * q_rs + p] : 0;
    }
}

/* k_pack <- keys (nk, E) in NR-key slivers, zero-padded keys. */
static void FN(pack_keys)(real *k_pack, const real *k, idx_t k_rs, idx_t nk, idx_t E)
{
    for (idx_t j0 = 0; j0 < nk; j0 += UK_NR) {
        real *sliver = k_pack + j0 * E;
        for (idx_t c = 0; c < UK_NR; c++) {
            const real *key = k + (j0 + c) * k_rs;
            if (j0 + c < nk)
                for (idx_t p = 0; p < E; p++) sliver[p * UK_NR + c] = key[p];
            else
                for (idx_t p = 0; p < E; p++) sliver[p * UK_NR + c] = 0;
        }
    }
}

/* v_pack <- values (nk, Ev) in NR-column slivers of BLOCK_K rows. */
static void FN(pack_values)(real *v_pack, const real *v, idx_t v_rs, idx_t nk, idx_t Ev, idx_t Ev_padded)
{
    for (idx_t c0 = 0; c0 < Ev_padded; c0 += UK_NR) {
        real *sliver = v_pack + c0 * BLOCK_K;
        idx_t width = Ev - c0 < UK_NR ? Ev - c0 : UK_NR;
        for (idx_t j = 0; j < nk; j++) {
            const real *row = v + j * v_rs + c0;
            for (idx_t c = 0; c < width; c++) sliver[j * UK_NR + c] = row[c];
            for (idx_t c = width; c < UK_NR; c++) sliver[j * UK_NR + c] = 0;
        }
    }
}

/* p_pack <- probabilities (nq, nk) of `scores` in MR-row slivers. */
static void FN(pack_probabilities)(real *p_pack, const real *scores, idx_t nq, idx_t nk)
{
    for (idx_t i0 = 0; i0 < nq; i0 += UK_MR) {
        real *sliver = p_pack + i0 * BLOCK_K;
        for (idx_t r = 0; r < UK_MR; r++) {
            const real *row = scores + (i0 + r) * BLOCK_K;
            if (i0 + r < nq)
                for (idx_t j = 0; j < nk; j++) sliver[j * UK_MR + r] = row[j];
            else
                for (idx_t j = 0; j < nk; j++) sliver[j * UK_MR + r] = 0;
        }
    }
}

/* scores (nq, BLOCK_K)[:, :nk] <- q_pack . k_pack^T */
static void FN(score_product)(real *scores, const real *q_pack, const real *k_pack, idx_t nq, idx_t nk, idx_t E)
{
    idx_t rows = ROUND_UP(nq, UK_MR), cols = ROUND_UP(nk, UK_NR);
    for (idx_t i = 0; i < rows; i++)
        for (idx_t j = 0; j < cols; j++) scores[i * BLOCK_K + j] = 0;
    for (idx_t i0 = 0; i0 < rows; i0 += UK_MR)
        for (idx_t j0 = 0; j0 < cols; j0 += UK_NR)
            UKERNEL(E, q_pack + i0 * E, k_pack + j0 * E, scores + i0 * BLOCK_K + j0, BLOCK_K);
}

/* acc (nq, Ev_padded) += p_pack . v_pack  (nk keys) */
static void FN(value_product)(real *acc, const real *p_pack, const real *v_pack, idx_t nq, idx_t nk,
                              idx_t Ev_padded)
{
    for (idx_t i0 = 0; i0 < nq; i0 += UK_MR)
        for (idx_t c0 = 0; c0 < Ev_padded; c0 += UK_NR)
            UKERNEL(nk, p_pack + i0 * BLOCK_K, v_pack + c0 * BLOCK_K, acc + i0 * Ev_padded + c0, Ev_padded);
}
