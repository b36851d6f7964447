/* The typed, per-ISA kernel entry points behind the dtype dispatch. */
#ifndef ATTNC_KERNELS_H
#define ATTNC_KERNELS_H

#include "attnc.h"

#define ATTNC_DECLARE_KERNELS(sfx, isa)                                                  \
    attnc_status attention_##sfx##_##isa(const attnc_attention_args *a);               \
    attnc_status softmax_##sfx##_##isa(sfx##_t *out, const sfx##_t *in, idx_t outer,  \
                                       idx_t n, idx_t inner);

typedef float f32_t;
typedef double f64_t;
ATTNC_DECLARE_KERNELS(f32, portable)
ATTNC_DECLARE_KERNELS(f64, portable)
ATTNC_DECLARE_KERNELS(f32, avx2)
ATTNC_DECLARE_KERNELS(f64, avx2)
ATTNC_DECLARE_KERNELS(f32, avx512)
ATTNC_DECLARE_KERNELS(f64, avx512)
#undef ATTNC_DECLARE_KERNELS

#endif
