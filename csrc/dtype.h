/* The float/double template machinery, in one place.
 *
 * A kernel body written once in NAME_impl.h uses `real` for the element type
 * and FN(name) for every function it defines; a .c file instantiates it with
 *
 *     #define ATTNC_REAL_F32
 *     #include "dtype.h"
 *     #include "NAME_impl.h"
 *     #include "dtype_end.h"
 *
 * and again with ATTNC_REAL_F64. ISA-specific translation units also define
 * ATTNC_ISA (e.g. avx2) before including, which is appended to the names.
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
#  define ATTNC_ISA portable
#  define ATTNC_ISA_DEFAULTED
#endif

#define ATTNC_CAT3_(a, b, c) a##_##b##_##c
#define ATTNC_CAT3(a, b, c) ATTNC_CAT3_(a, b, c)
#define FN(name) ATTNC_CAT3(name, REAL_SUFFIX, ATTNC_ISA)
