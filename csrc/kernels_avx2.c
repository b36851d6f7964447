/* The kernels compiled for AVX2 + FMA + F16C; cpu.c calls them only when the CPU has all three. */
#include "attnc.h"
#ifdef ATTNC_X86
#pragma GCC target("avx2,fma,f16c")
#define ATTNC_ISA avx2
#define ATTNC_ISA_AVX2
#include "kernel_bundle.h"
#endif
