/* An optimizer's update of one parameter, in place (dtype template; see
 * dtype.h). Shapes, all C-contiguous, n elements each:
 *   param (n) elem     read and written
 *   grad  (n) elem     read
 *   state (n) real     SGD: the momentum buffer (or none); AdamW: m and v
 * Each element's parameter, gradient and state are read once and written
 * once, in the order of operations of torch's single-tensor rules (the
 * formulas in attnc/optim.py's SGD and AdamW docstrings), each rounded to
 * real, multiply-adds fused where the level has FMA (as torch's vector
 * kernels fuse theirs); a 16-bit parameter is widened and rounded back
 * once.
 * Tasks are chunks of elements: any thread count gives the same bits.
 * The update is never stopped midway (the binding's hook does not stop
 * it): a parameter is stepped whole or not at all. */

#ifndef ATTNC_UPDATE_CHUNK
#define ATTNC_UPDATE_CHUNK 16384 /* elements per task */
#endif

#ifdef ATTNC_COMPUTE_F64
#define REAL_SQRT sqrt
#else
#define REAL_SQRT sqrtf
#endif

/* SGD: d = g (+ weight_decay p); with momentum, b = d (a new buffer) or
 * momentum b + d, and d = b; p = p - lr d. */
static void FN(sgd_task)(void *ctx, idx_t t)
{
    const attnc_update_args *a = ctx;
    elem *p = a->param;
    const elem *g = a->grad;
    real *b = a->state[0];
    real lr = (real)a->lr, momentum = (real)a->momentum, weight_decay = (real)a->weight_decay;
    int decays = a->weight_decay != 0; /* else g alone: 0 * p would make an infinite p's step NaN */
    idx_t last = attnc_min(a->n, (t + 1) * ATTNC_UPDATE_CHUNK);
    for (idx_t i = t * ATTNC_UPDATE_CHUNK; i < last; i++) {
        real pi = to_real(p[i]), d = to_real(g[i]);
        if (decays) d = d + weight_decay * pi;
        if (b) d = b[i] = a->start ? d : b[i] * momentum + d;
        p[i] = to_elem(pi - lr * d);
    }
}

/* AdamW: p = p decay; m = lerp(m, g, w); v = beta2 v + (1 - beta2) g g;
 * p = p + (-step_size m) / (sqrt(v) / bias2_sqrt + eps). lerp as
 * torch.lerp: m + w (g - m) for |w| < 0.5, else g - (g - m) (1 - w). */
static void FN(adamw_task)(void *ctx, idx_t t)
{
    const attnc_update_args *a = ctx;
    elem *p = a->param;
    const elem *g = a->grad;
    real *m = a->state[0], *v = a->state[1];
    real decay = (real)a->decay, w = (real)a->lerp_weight, beta2 = (real)a->beta2,
         one_minus_beta2 = (real)(1 - a->beta2), step = (real)-a->step_size, bias2_sqrt = (real)a->bias2_sqrt,
         eps = (real)a->eps, one_minus_w = 1 - w;
    int from_m = w < (real)0.5 && w > (real)-0.5;
    idx_t last = attnc_min(a->n, (t + 1) * ATTNC_UPDATE_CHUNK);
    for (idx_t i = t * ATTNC_UPDATE_CHUNK; i < last; i++) {
        real pi = to_real(p[i]) * decay, gi = to_real(g[i]);
        real mi = from_m ? m[i] + w * (gi - m[i]) : gi - (gi - m[i]) * one_minus_w;
        real vi = v[i] * beta2 + one_minus_beta2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = to_elem(pi + step * mi / (REAL_SQRT(vi) / bias2_sqrt + eps));
    }
}

/* The work of an element, in the pool's flops (attnc_threads_for): AdamW's
 * square root and division weigh about ten multiply-adds each. */
#define SGD_ELEMENT_FLOPS 4.0
#define ADAMW_ELEMENT_FLOPS 40.0

attnc_status FN(update)(const attnc_update_args *args)
{
    int adamw = args->rule == ATTNC_ADAMW;
    attnc_parallel_for(attnc_ceil_div(args->n, ATTNC_UPDATE_CHUNK),
                       (adamw ? ADAMW_ELEMENT_FLOPS : SGD_ELEMENT_FLOPS) * (double)args->n,
                       adamw ? FN(adamw_task) : FN(sgd_task), (void *)args);
    return ATTNC_OK;
}

#undef REAL_SQRT
#undef SGD_ELEMENT_FLOPS
#undef ADAMW_ELEMENT_FLOPS
