/* attnc_gemm: C = A . B^T [+ bias]. The dtype picks the instantiation of
 * gemm_impl.h, the CPU (attnc_simd_level) picks its micro-kernel. */
#include "attnc.h"
#include "gemm_kernels.h"

#define ATTNC_REAL_F32
#include "dtype.h"
#include "gemm_impl.h"
#include "dtype_end.h"

#define ATTNC_REAL_F64
#include "dtype.h"
#include "gemm_impl.h"
#include "dtype_end.h"

static gemm_tile_kernel_f32_portable kernel_f32(int level)
{
#ifdef GEMM_HAVE_AVX2
    if (level == ATTNC_SIMD_AVX512)
        return (gemm_tile_kernel_f32_portable){GEMM_AVX512_MR, GEMM_AVX512_NR_F32,
                                               gemm_ukernel_f32_avx512,
                                               gemm_ukernel_store_f32_avx512};
    if (level == ATTNC_SIMD_AVX2)
        return (gemm_tile_kernel_f32_portable){GEMM_AVX2_MR, GEMM_AVX2_NR_F32,
                                               gemm_ukernel_f32_avx2, gemm_ukernel_store_f32_avx2};
#endif
    return (gemm_tile_kernel_f32_portable){GEMM_PORTABLE_MR, GEMM_PORTABLE_NR,
                                           gemm_ukernel_f32_portable,
                                           gemm_ukernel_store_f32_portable};
}

static gemm_tile_kernel_f64_portable kernel_f64(int level)
{
#ifdef GEMM_HAVE_AVX2
    if (level == ATTNC_SIMD_AVX512)
        return (gemm_tile_kernel_f64_portable){GEMM_AVX512_MR, GEMM_AVX512_NR_F64,
                                               gemm_ukernel_f64_avx512,
                                               gemm_ukernel_store_f64_avx512};
    if (level == ATTNC_SIMD_AVX2)
        return (gemm_tile_kernel_f64_portable){GEMM_AVX2_MR, GEMM_AVX2_NR_F64,
                                               gemm_ukernel_f64_avx2, gemm_ukernel_store_f64_avx2};
#endif
    return (gemm_tile_kernel_f64_portable){GEMM_PORTABLE_MR, GEMM_PORTABLE_NR,
                                           gemm_ukernel_f64_portable,
                                           gemm_ukernel_store_f64_portable};
}

attnc_status attnc_gemm(attnc_dtype dt, idx_t M, idx_t N, idx_t K,
                        const void *a, idx_t a_rs, idx_t a_cs,
                        const void *b, idx_t b_rs, idx_t b_cs,
                        const void *bias, void *c, idx_t c_rs)
{
    int level = attnc_simd_level();
    if (dt == ATTNC_F64)
        return gemm_f64_portable(kernel_f64(level), M, N, K,
                                 (gemm_operand_f64_portable){a, a_rs, a_cs},
                                 (gemm_operand_f64_portable){b, b_rs, b_cs}, bias, c, c_rs);
    return gemm_f32_portable(kernel_f32(level), M, N, K, (gemm_operand_f32_portable){a, a_rs, a_cs},
                             (gemm_operand_f32_portable){b, b_rs, b_cs}, bias, c, c_rs);
}
