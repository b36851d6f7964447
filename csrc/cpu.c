/* Run-time choice of kernels: AVX2+FMA where the CPU has it, portable C
 * everywhere else (and whenever a test forces it). */
#include <stdatomic.h>

#include "attnc.h"

static atomic_int simd_enabled = 1;

int attnc_cpu_has_avx2_fma(void)
{
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

void attnc_set_simd(int enabled) { atomic_store(&simd_enabled, enabled ? 1 : 0); }

int attnc_simd_active(void) { return atomic_load(&simd_enabled) && attnc_cpu_has_avx2_fma(); }
