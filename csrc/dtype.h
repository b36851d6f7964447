/* The dtype template machinery, in one place.
 *
 * A kernel body written once in NAME_impl.h uses `real` for the type it
 * computes in, `elem` for the type of the caller's arrays (storage.h
 * converts between them), and FN(name) for every function it defines.
 * kernel_bundle.h instantiates every body once per dtype:
 *
 *     #define ATTNC_REAL_F32
 *     #include "dtype.h"
 *     ... the bodies ...
 *     #include "dtype_end.h"
 *
 * and again with ATTNC_REAL_F64, _F16 and _BF16, in each ISA's translation
 * unit, whose ATTNC_ISA (portable, avx2, avx512) is appended to the names too.
 *   dtype     real    elem        ATTNC_COMPUTE_
 *   f32       float   float       F32
 *   f64       double  double      F64
 *   f16       float   attnc_f16   F32
 *   bf16      float   attnc_bf16  F32
 */
#if defined(ATTNC_REAL_F32)
#  define real float
#  define elem float
#  define REAL_SUFFIX f32
#  define ATTNC_COMPUTE_F32
#elif defined(ATTNC_REAL_F64)
#  define real double
#  define elem double
#  define REAL_SUFFIX f64
#  define ATTNC_COMPUTE_F64
#elif defined(ATTNC_REAL_F16)
#  define real float
#  define elem attnc_f16
#  define REAL_SUFFIX f16
#  define ATTNC_COMPUTE_F32
#elif defined(ATTNC_REAL_BF16)
#  define real float
#  define elem attnc_bf16
#  define REAL_SUFFIX bf16
#  define ATTNC_COMPUTE_F32
#else
#  error "define ATTNC_REAL_F32, _F64, _F16 or _BF16 before including dtype.h"
#endif
#ifndef ATTNC_ISA
#  error "define ATTNC_ISA (the translation unit's ISA level) before including dtype.h"
#endif

#define ATTNC_CAT3_(a, b, c) a##_##b##_##c
#define ATTNC_CAT3(a, b, c) ATTNC_CAT3_(a, b, c)
#define FN(name) ATTNC_CAT3(name, REAL_SUFFIX, ATTNC_ISA)
