/* The column sums of a matrix: a bias's gradient (dtype template; see
 * dtype.h).
 *   g    (rows, n) elem, rows g_rs elements apart, columns adjacent   read
 *   sums (n) elem                                                   written
 * Each column adds its rows in blocks of ATTNC_GEMM_KC, each block in row
 * order from zero, and the blocks' sums in order: the GEMM's order for ones
 * (1, rows) . g, through which the module's backward had summed them (the
 * same bits, but for bfloat16 at the AVX512_BF16 level, whose products
 * went through pairs: now summed as at every other level). In real,
 * rounded to elem once. Tasks are blocks of columns,
 * each reading its part of a row as one run, a row after another (the GEMM
 * had read a column block's 12 elements a row: 0.358 ms for (512, 2304)
 * where NumPy's sum(0) took 0.177; benchmarks/NOTES.md): any thread count
 * gives the same bits. */

#ifndef ATTNC_COLUMN_SUMS_ONCE
#define ATTNC_COLUMN_SUMS_ONCE
/* Columns a task sums at most: two rows of reals on its stack (4 or 8 KB)
 * that stay in L1 while the rows pass. */
#define COLUMN_SUMS_MAX_WIDTH 512
typedef struct {
    const attnc_column_sums_args *args;
    idx_t task_width; /* columns a task sums (the last task's may be fewer) */
} column_sums_job;
#endif

/* dst[0 .. n) += src's n elems, widened */
static inline void FN(add_row)(real *dst, const elem *src, idx_t n)
{
    idx_t i = 0;
    for (; i + VLANES <= n; i += VLANES) vstoreu(dst + i, vloadu(dst + i) + vload_elems(src + i));
    for (; i < n; i++) dst[i] += to_real(src[i]);
}

static void FN(column_sums_task)(void *ctx, idx_t t)
{
    const column_sums_job *job = ctx;
    const attnc_column_sums_args *a = job->args;
    idx_t first = t * job->task_width, width = attnc_min(job->task_width, a->n - first);
    const elem *g = (const elem *)a->g + first;
    real total[COLUMN_SUMS_MAX_WIDTH], block[COLUMN_SUMS_MAX_WIDTH];
    for (idx_t j = 0; j < width; j++) total[j] = 0;
    for (idx_t r0 = 0; r0 < a->rows && !attnc_interrupted(); r0 += ATTNC_GEMM_KC) {
        for (idx_t j = 0; j < width; j++) block[j] = 0;
        for (idx_t r = r0; r < attnc_min(a->rows, r0 + ATTNC_GEMM_KC); r++) FN(add_row)(block, g + r * a->g_rs, width);
        for (idx_t j = 0; j < width; j++) total[j] += block[j];
    }
    FN(store_row)((elem *)a->sums + first, total, width);
}

attnc_status FN(column_sums)(const attnc_column_sums_args *args)
{
    if (args->n == 0) return ATTNC_OK;
    /* two tasks a thread, of whole vectors, at most COLUMN_SUMS_MAX_WIDTH wide */
    idx_t per_task = attnc_ceil_div(args->n, 2 * (idx_t)attnc_running_threads());
    column_sums_job job = {args, attnc_min(COLUMN_SUMS_MAX_WIDTH, attnc_ceil_div(per_task, VLANES) * VLANES)};
    attnc_parallel_for(attnc_ceil_div(args->n, job.task_width), (double)args->rows * (double)args->n,
                       FN(column_sums_task), &job);
    return attnc_interrupted() ? ATTNC_EINTR : ATTNC_OK;
}
