/* Undo dtype.h, so the next instantiation starts clean. */
#undef real
#undef elem
#undef REAL_SUFFIX
#undef ATTNC_COMPUTE_F32
#undef ATTNC_COMPUTE_F64
#undef ATTNC_REAL_F32
#undef ATTNC_REAL_F64
#undef ATTNC_REAL_F16
#undef ATTNC_REAL_BF16
