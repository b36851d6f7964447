/* The one include bundle: every kernel body, instantiated for float and
 * double, and the row of the kernel table they make. Included once by each
 * ISA's translation unit (kernels_portable.c, kernels_avx2.c,
 * kernels_avx512.c) after it sets ATTNC_ISA and its target; the bodies see
 * the ISA only through the SIMD vocabulary (simd.h).
 *
 * Adding a kernel: write its body once (NAME_impl.h, against simd.h and
 * dtype.h), include it below, and give it a field in attnc_kernels
 * (attnc.h) and an entry in the row below. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "attnc.h"

#define ATTNC_REAL_F32
#include "dtype.h"
#include "simd.h"
#include "vexp.h"
#include "gemm_impl.h"
#include "attention_tiles.h"
#include "attention_rows.h"
#include "attention_impl.h"
#include "attention_backward_impl.h"
#include "softmax_impl.h"
#include "dropout_impl.h"
#include "dtype_end.h"

#define ATTNC_REAL_F64
#include "dtype.h"
#include "simd.h"
#include "vexp.h"
#include "gemm_impl.h"
#include "attention_tiles.h"
#include "attention_rows.h"
#include "attention_impl.h"
#include "attention_backward_impl.h"
#include "softmax_impl.h"
#include "dropout_impl.h"
#include "dtype_end.h"

#define ATTNC_TABLE_ROW_(isa) attnc_kernels_##isa
#define ATTNC_TABLE_ROW(isa) ATTNC_TABLE_ROW_(isa)
#define ATTNC_KERNELS_OF(sfx, isa)                                                                  \
    {                                                                                               \
        .gemm = gemm_##sfx##_##isa, .attention = attention_##sfx##_##isa,                           \
        .attention_backward = attention_backward_##sfx##_##isa,                                     \
        .softmax = softmax_##sfx##_##isa, .dropout = dropout_##sfx##_##isa,                         \
    }
#define ATTNC_KERNELS_ROW(isa) {ATTNC_KERNELS_OF(f32, isa), ATTNC_KERNELS_OF(f64, isa)}

/* This ISA's row of the table (cpu.c): its kernels by dtype. */
const attnc_kernels ATTNC_TABLE_ROW(ATTNC_ISA)[ATTNC_N_DTYPES] = ATTNC_KERNELS_ROW(ATTNC_ISA);
