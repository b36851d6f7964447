/* The float/double template machinery, in one place.
 *
 * A kernel body written once in NAME_impl.h uses `real` for the element type
 * and FN(name) for every function it defines. kernel_bundle.h instantiates
 * every body once per dtype:
 *
 *     #define ATTNC_REAL_F32
 *     #include "dtype.h"
 *     ... the bodies ...
 *     #include "dtype_end.h"
 *
 * and again with ATTNC_REAL_F64, in each ISA's translation unit, whose
 * ATTNC_ISA (portable, avx2, avx512) is appended to the names too.
 */
#if defined(ATTNC_REAL_F32)
#  define real float
#  define REAL_SUFFIX f32
#elif defined(ATTNC_REAL_F64)
#  define real double
#  define REAL_SUFFIX f64
#else
#  error "define ATTNC_REAL_F32 or ATTNC_REAL_F64 before including dtype.h"
#endif
#ifndef ATTNC_ISA
#  error "define ATTNC_ISA (the translation unit's ISA level) before including dtype.h"
#endif

#define ATTNC_CAT3_(a, b, c) a##_##b##_##c
#define ATTNC_CAT3(a, b, c) ATTNC_CAT3_(a, b, c)
#define FN(name) ATTNC_CAT3(name, REAL_SUFFIX, ATTNC_ISA)
