/* The kernels compiled for AVX-512 (F, VL, DQ) + FMA; cpu.c calls them only
 * when the CPU has it (and F16C, which every AVX-512 CPU has). */
#include "attnc.h"
#ifdef ATTNC_X86
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma,f16c,prefer-vector-width=512")
#define ATTNC_ISA avx512
#define ATTNC_ISA_AVX512
#include "kernel_bundle.h"
#endif
