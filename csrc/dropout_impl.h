/* Element-wise dropout (dtype template; see dtype.h). The keep decision
 * for element i is a hash of (seed, i): any split into tasks or threads
 * gives the same bits. Multiplying by 0 (not assigning 0) keeps NaN, as
 * PyTorch's input * mask does. */

#ifndef ATTNC_DROPOUT_CHUNK
#define ATTNC_DROPOUT_CHUNK 65536 /* elements per task */
#endif

typedef struct {
    elem *out;
    const elem *in;
    idx_t n;
    double p;
    uint64_t seed;
} FN(dropout_job);

static void FN(dropout_task)(void *ctx, idx_t t)
{
    const FN(dropout_job) *job = ctx;
    real keep_scale = job->p >= 1 ? 0 : (real)(1.0 / (1.0 - job->p));
    idx_t last = attnc_min(job->n, (t + 1) * ATTNC_DROPOUT_CHUNK);
    for (idx_t i = t * ATTNC_DROPOUT_CHUNK; i < last; i++)
        job->out[i] = to_elem(to_real(job->in[i]) * (attnc_uniform(job->seed, (uint64_t)i) < job->p ? 0 : keep_scale));
}

attnc_status FN(dropout)(void *out, const void *in, idx_t n, double p, uint64_t seed)
{
    FN(dropout_job) job = {out, in, n, p, seed};
    attnc_parallel_for(attnc_ceil_div(n, ATTNC_DROPOUT_CHUNK), 10.0 * (double)n, FN(dropout_task), &job);
    return attnc_interrupted() ? ATTNC_EINTR : ATTNC_OK;
}
