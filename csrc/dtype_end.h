/* Undo dtype.h, so the next instantiation starts clean. */
#undef real
#undef REAL_SUFFIX
#undef ATTNC_REAL_F32
#undef ATTNC_REAL_F64
