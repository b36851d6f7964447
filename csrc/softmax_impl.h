/* The softmax kernel (dtype and ISA template; see dtype.h; needs vexp.h):
 * torch.softmax's semantics (a row of -inf gives NaN, as there). */

/* Rows per task: enough work per task to pay for handing it out. */
#define SOFTMAX_ELEMENTS_PER_TASK 65536
/* A row is taken this many elements at a time, with a question for
 * Ctrl-C between chunks: one row of 2**29 floats had run 4-6 s with no
 * question. 2**20 elements were still up to 94 ms when the host was slow
 * to give fresh pages (a pytest run, 2026-12-07); with 2**18 (1 MB of fresh
 * output, 1-4 ms there) Ctrl-C was 0.11 s late in two CI runs, where up to 16
 * could pass between readings of the clock (interrupt.c). A multiple of ROW_LANES and
 * of every VLANES, so the chunks compute what the whole row would (vexp.h). */
#define SOFTMAX_CHUNK ((idx_t)1 << 16)
_Static_assert(SOFTMAX_CHUNK % ROW_LANES == 0 && SOFTMAX_CHUNK % VLANES == 0, "chunks of whole lanes and vectors");

typedef struct {
    elem *out;
    const elem *in;
    idx_t n, inner, n_rows, rows_per_task;
    atomic_int failed;
} FN(softmax_job);

/* The chunk of a row from element j0: its length */
static inline idx_t FN(chunk_at)(idx_t n, idx_t j0) { return attnc_min(SOFTMAX_CHUNK, n - j0); }

/* out <- the softmax of in, one row of n elements `inner` apart, through
 * the contiguous buffer `row` (so the same stable row code serves every
 * axis), in three passes of chunks: max, exp and sum, scale. `row` may be
 * out's row itself (a contiguous row of reals). 0 if the call was
 * interrupted (the row then unfinished). */
static int FN(softmax_row)(real *row, elem *out, const elem *in, idx_t n, idx_t inner)
{
    real max_lanes[ROW_LANES], sum_lanes[ROW_LANES];
    FN(lanes_fill)(max_lanes, -(real)INFINITY);
    FN(lanes_fill)(sum_lanes, 0);
    for (idx_t j0 = 0; j0 < n; j0 += SOFTMAX_CHUNK) {
        if (j0 && attnc_interrupted()) return 0;
        idx_t end = j0 + FN(chunk_at)(n, j0);
        for (idx_t j = j0; j < end; j++) row[j] = to_real(in[j * inner]);
        FN(max_into_lanes)(max_lanes, row + j0, end - j0);
    }
    real shift = FN(lanes_max)(max_lanes);
    for (idx_t j0 = 0; j0 < n; j0 += SOFTMAX_CHUNK) {
        if (j0 && attnc_interrupted()) return 0;
        idx_t length = FN(chunk_at)(n, j0);
        FN(exp_shift)(row + j0, length, shift);
        FN(sum_into_lanes)(sum_lanes, row + j0, length);
    }
    real factor = 1 / FN(lanes_sum)(sum_lanes);
    for (idx_t j0 = 0; j0 < n; j0 += SOFTMAX_CHUNK) {
        if (j0 && attnc_interrupted()) return 0;
        idx_t end = j0 + FN(chunk_at)(n, j0);
        FN(scale_row)(row + j0, end - j0, factor);
        if ((void *)row != (void *)out)
            for (idx_t j = j0; j < end; j++) out[j * inner] = to_elem(row[j]);
    }
    return 1;
}

/* Row r = (o, c) of (outer, n, inner) starts at (r / inner) * n * inner + r % inner. */
static void FN(softmax_task)(void *ctx, idx_t task)
{
    FN(softmax_job) *job = ctx;
    idx_t n = job->n, inner = job->inner;
    /* a contiguous row of reals is its own buffer: out's row */
    int row_in_out = ELEM_IS_REAL && inner == 1;
    real *row = row_in_out ? NULL : attnc_malloc((size_t)n * sizeof(real));
    if (!row_in_out && !row) {
        atomic_store(&job->failed, 1);
        return;
    }
    idx_t first = task * job->rows_per_task;
    idx_t last = first + job->rows_per_task < job->n_rows ? first + job->rows_per_task : job->n_rows;
    for (idx_t r = first; r < last; r++) {
        idx_t base = (r / inner) * n * inner + r % inner;
        real *buffer = row_in_out ? (real *)(void *)(job->out + base) : row;
        if (!FN(softmax_row)(buffer, job->out + base, job->in + base, n, inner)) break;
    }
    attnc_free(row);
}

/* out (outer, n, inner) <- softmax of in (outer, n, inner) along n;
 * both C-contiguous. outer * n * inner was checked by the caller. */
attnc_status FN(softmax)(void *out, const void *in, idx_t outer, idx_t n, idx_t inner)
{
    if (n == 0 || outer == 0 || inner == 0) return ATTNC_OK;
    if ((size_t)n > SIZE_MAX / sizeof(real)) return ATTNC_EOVERFLOW;
    idx_t n_rows = outer * inner;
    idx_t rows_per_task = SOFTMAX_ELEMENTS_PER_TASK / n + 1;
    FN(softmax_job) job = {out, in, n, inner, n_rows, rows_per_task, 0};
    idx_t n_tasks = (n_rows + rows_per_task - 1) / rows_per_task;
    attnc_parallel_for(n_tasks, 20.0 * (double)n_rows * (double)n, FN(softmax_task), &job);
    if (atomic_load(&job.failed)) return ATTNC_ENOMEM;
    return attnc_interrupted() ? ATTNC_EINTR : ATTNC_OK;
}

#undef SOFTMAX_ELEMENTS_PER_TASK
#undef SOFTMAX_CHUNK
