/* The one include bundle: every kernel body, instantiated for each dtype
 * (float, double, float16, bfloat16), and the row of the kernel table
 * they make. Included once by each
 * ISA's translation unit (kernels_portable.c, kernels_avx2.c,
 * kernels_avx512.c; kernels_avx512bf16.c: bfloat16 only) after it sets
 * ATTNC_ISA and its target; the bodies see the ISA only through the SIMD
 * vocabulary (simd.h).
 *
 * Adding a kernel: write its body once (NAME_impl.h, against simd.h,
 * dtype.h and storage.h), include it in kernel_bodies.h, and give it a field in attnc_kernels
 * (attnc.h) and an entry in the row below. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "attnc.h"

#ifndef ATTNC_ISA_AVX512BF16
#define ATTNC_REAL_F32
#include "kernel_bodies.h"
#define ATTNC_REAL_F64
#include "kernel_bodies.h"
#define ATTNC_REAL_F16
#include "kernel_bodies.h"
#endif
#define ATTNC_REAL_BF16
#include "kernel_bodies.h"

#define ATTNC_TABLE_ROW_(isa) attnc_kernels_##isa
#define ATTNC_TABLE_ROW(isa) ATTNC_TABLE_ROW_(isa)
#define ATTNC_KERNELS_OF(sfx, isa)                                                                  \
    {                                                                                               \
        .gemm = gemm_##sfx##_##isa, .pack_weights = pack_weights_##sfx##_##isa,                     \
        .attention = attention_##sfx##_##isa,                                                       \
        .attention_backward = attention_backward_##sfx##_##isa,                                     \
        .softmax = softmax_##sfx##_##isa, .dropout = dropout_##sfx##_##isa,                         \
        .update = update_##sfx##_##isa, .column_sums = column_sums_##sfx##_##isa,                   \
        .vector_bytes = SIMD_BYTES,                                                                 \
    }
#define ATTNC_KERNELS_ROW(isa)                                                                      \
    {ATTNC_KERNELS_OF(f32, isa), ATTNC_KERNELS_OF(f64, isa), ATTNC_KERNELS_OF(f16, isa),           \
     ATTNC_KERNELS_OF(bf16, isa)}

#ifdef ATTNC_ISA_AVX512BF16
/* The AVX512_BF16 level adds bfloat16 kernels only (its instructions
 * multiply bfloat16): cpu.c takes its other dtypes' from the AVX-512 row. */
#define ATTNC_BF16_KERNELS(isa) ATTNC_KERNELS_OF(bf16, isa) /* isa expanded */
const attnc_kernels attnc_kernels_avx512bf16_bf16 = ATTNC_BF16_KERNELS(ATTNC_ISA);
#else
/* This ISA's row of the table (cpu.c): its kernels by dtype. */
const attnc_kernels ATTNC_TABLE_ROW(ATTNC_ISA)[ATTNC_N_DTYPES] = ATTNC_KERNELS_ROW(ATTNC_ISA);
#endif
