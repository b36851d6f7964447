/* The same kernels as kernels_portable.c, compiled for AVX-512 (F, VL, DQ)
 * + FMA: the GEMM micro-kernel is the AVX-512 one (ukernel_shape.h) and
 * the compiler vectorises the softmax and exp loops with zmm registers.
 * Only called when the CPU has the ISA (cpu.c); the rest of the extension
 * runs on any x86-64. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma,prefer-vector-width=512")
#define ATTNC_ISA avx512
#define ATTNC_ISA_AVX512

#define ATTNC_REAL_F32
#include "dtype.h"
#include "ukernel_shape.h"
#include "vexp.h"
#include "attention_tiles.h"
#include "attention_impl.h"
#include "softmax_impl.h"
#include "dtype_end.h"

#define ATTNC_REAL_F64
#include "dtype.h"
#include "ukernel_shape.h"
#include "vexp.h"
#include "attention_tiles.h"
#include "attention_impl.h"
#include "softmax_impl.h"
#include "dtype_end.h"

#else /* not x86: the AVX-512 names fall back to the portable kernels */
attnc_status attention_f32_avx512(const attnc_attention_args *a) { return attention_f32_portable(a); }
attnc_status attention_f64_avx512(const attnc_attention_args *a) { return attention_f64_portable(a); }
attnc_status softmax_f32_avx512(float *out, const float *in, idx_t o, idx_t n, idx_t i)
{
    return softmax_f32_portable(out, in, o, n, i);
}
attnc_status softmax_f64_avx512(double *out, const double *in, idx_t o, idx_t n, idx_t i)
{
    return softmax_f64_portable(out, in, o, n, i);
}
#endif
