/* The softmax kernel (dtype and ISA template; see dtype.h; needs vexp.h):
 * torch.softmax's semantics (a row of -inf gives NaN, as there). */

/* Rows per task: enough work per task to pay for handing it out. */
#define SOFTMAX_ELEMENTS_PER_TASK 65536

typedef struct {
    elem *out;
    const elem *in;
    idx_t n, inner, n_rows, rows_per_task;
    atomic_int failed;
} FN(softmax_job);

/* Row r = (o, c) of (outer, n, inner) is gathered into a contiguous buffer,
 * so the same stable row code serves every axis. */
static void FN(softmax_task)(void *ctx, idx_t task)
{
    FN(softmax_job) *job = ctx;
    idx_t n = job->n, inner = job->inner;
    real *row = attnc_malloc((size_t)n * sizeof(real));
    if (!row) {
        atomic_store(&job->failed, 1);
        return;
    }
    idx_t first = task * job->rows_per_task;
    idx_t last = first + job->rows_per_task < job->n_rows ? first + job->rows_per_task : job->n_rows;
    for (idx_t r = first; r < last; r++) {
        idx_t base = (r / inner) * n * inner + r % inner;
        for (idx_t j = 0; j < n; j++) row[j] = to_real(job->in[base + j * inner]);
        FN(scale_row)(row, n, 1 / FN(exp_shift_sum)(row, n, FN(row_max)(row, n)));
        for (idx_t j = 0; j < n; j++) job->out[base + j * inner] = to_elem(row[j]);
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
