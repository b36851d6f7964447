/* Element-wise dropout body (dtype template; see dtype.h). The keep
 * decision for element i is a hash of (seed, i): any split into threads or
 * tiles gives the same bits. Multiplying by 0 (not assigning 0) keeps NaN,
 * as PyTorch's input * mask does. */
static void FN(dropout)(real *out, const real *in, idx_t n, double p, uint64_t seed)
{
    real keep_scale = p >= 1 ? 0 : (real)(1.0 / (1.0 - p));
    for (idx_t i = 0; i < n; i++) out[i] = in[i] * (attnc_uniform(seed, (uint64_t)i) < p ? 0 : keep_scale);
}
