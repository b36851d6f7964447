/* Public entry points that pick the typed kernel: by dtype, and by ISA
 * level (attnc_simd_level: AVX-512, AVX2+FMA or portable). */
#include "kernels.h"

#define ATTNC_REAL_F32
#include "dtype.h"
#include "dropout_impl.h"
#include "dtype_end.h"

#define ATTNC_REAL_F64
#include "dtype.h"
#include "dropout_impl.h"
#include "dtype_end.h"

attnc_status attnc_attention(const attnc_attention_args *a)
{
    /* nothing to write: return before walking a possibly huge empty space */
    int no_output = a->n_items == 0 || a->L == 0 || a->Ev == 0;
    int no_weights = !a->weights || a->S == 0 || a->n_items == 0 || a->L == 0;
    if (no_output && no_weights) return ATTNC_OK;
    int level = attnc_simd_level();
    if (a->dtype == ATTNC_F32)
        return level == ATTNC_SIMD_AVX512 ? attention_f32_avx512(a)
               : level == ATTNC_SIMD_AVX2 ? attention_f32_avx2(a)
                                          : attention_f32_portable(a);
    return level == ATTNC_SIMD_AVX512 ? attention_f64_avx512(a)
           : level == ATTNC_SIMD_AVX2 ? attention_f64_avx2(a)
                                      : attention_f64_portable(a);
}

attnc_status attnc_softmax(attnc_dtype dt, void *out, const void *in, idx_t outer, idx_t n,
                           idx_t inner)
{
    int level = attnc_simd_level();
    if (dt == ATTNC_F32)
        return (level == ATTNC_SIMD_AVX512 ? softmax_f32_avx512
                : level == ATTNC_SIMD_AVX2 ? softmax_f32_avx2
                                           : softmax_f32_portable)(out, in, outer, n, inner);
    return (level == ATTNC_SIMD_AVX512 ? softmax_f64_avx512
            : level == ATTNC_SIMD_AVX2 ? softmax_f64_avx2
                                       : softmax_f64_portable)(out, in, outer, n, inner);
}

void attnc_dropout(attnc_dtype dt, void *out, const void *in, idx_t n, double p, uint64_t seed)
{
    if (dt == ATTNC_F32)
        dropout_f32_portable(out, in, n, p, seed);
    else
        dropout_f64_portable(out, in, n, p, seed);
}
