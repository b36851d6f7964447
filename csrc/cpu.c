/* Run-time choice of kernels: the best ISA level the CPU has (AVX-512,
 * else AVX2+FMA, else portable C), capped by attnc_set_simd_level (tests
 * run every level this CPU has; a cap above the CPU's best is harmless). */
#include <stdatomic.h>

#include "attnc.h"

static atomic_int level_cap = ATTNC_SIMD_AVX512;

int attnc_cpu_has_avx2_fma(void)
{
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

int attnc_cpu_has_avx512(void)
{
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    return attnc_cpu_has_avx2_fma() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
    return 0;
#endif
}

void attnc_set_simd_level(int max_level)
{
    if (max_level < ATTNC_SIMD_PORTABLE) max_level = ATTNC_SIMD_PORTABLE;
    if (max_level > ATTNC_SIMD_AVX512) max_level = ATTNC_SIMD_AVX512;
    atomic_store(&level_cap, max_level);
}

void attnc_set_simd(int enabled) { attnc_set_simd_level(enabled ? ATTNC_SIMD_AVX512 : ATTNC_SIMD_PORTABLE); }

int attnc_simd_level(void)
{
    int cap = atomic_load(&level_cap);
    if (cap >= ATTNC_SIMD_AVX512 && attnc_cpu_has_avx512()) return ATTNC_SIMD_AVX512;
    if (cap >= ATTNC_SIMD_AVX2 && attnc_cpu_has_avx2_fma()) return ATTNC_SIMD_AVX2;
    return ATTNC_SIMD_PORTABLE;
}

int attnc_simd_active(void) { return attnc_simd_level() != ATTNC_SIMD_PORTABLE; }
