/* The GEMM micro-kernel of the current dtype and ISA (see dtype.h), and
 * the tile it computes: UK_MR rows x UK_NR columns. Include after dtype.h;
 * a translation unit compiled for AVX2 (AVX-512) defines ATTNC_ISA_AVX2
 * (ATTNC_ISA_AVX512) first. */
#include "gemm_kernels.h"

#undef UK_MR
#undef UK_NR
#if defined(ATTNC_ISA_AVX512)
#  define UK_MR GEMM_AVX512_MR
#  if defined(ATTNC_REAL_F32)
#    define UK_NR GEMM_AVX512_NR_F32
#  else
#    define UK_NR GEMM_AVX512_NR_F64
#  endif
#elif defined(ATTNC_ISA_AVX2)
#  define UK_MR GEMM_AVX2_MR
#  if defined(ATTNC_REAL_F32)
#    define UK_NR GEMM_AVX2_NR_F32
#  else
#    define UK_NR GEMM_AVX2_NR_F64
#  endif
#else
#  define UK_MR GEMM_PORTABLE_MR
#  define UK_NR GEMM_PORTABLE_NR
#endif
#define UKERNEL FN(gemm_ukernel)
#define UKERNEL_STORE FN(gemm_ukernel_store)
