/* The kernel table: one row per ISA level (each row is one translation
 * unit's kernels, kernel_bundle.h), and the run-time choice among them:
 * the best level the CPU has, chosen once at import; tests may cap it
 * (attnc_set_level) to run every level this CPU has. Beside it, the two
 * other facts of the CPU the kernels choose by: the ways of its L1 data
 * cache, and whether it is Intel's; and, for the tests, the order the last
 * GEMM on a thread took. */
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "attnc.h"

extern const attnc_kernels attnc_kernels_portable[ATTNC_N_DTYPES];
#ifdef ATTNC_X86
extern const attnc_kernels attnc_kernels_avx2[ATTNC_N_DTYPES];
#endif
#if defined(ATTNC_X86) && !defined(ATTNC_WITHOUT_AVX512) /* setup.py: ATTNC_SKIP_UNRUNNABLE_KERNELS */
extern const attnc_kernels attnc_kernels_avx512[ATTNC_N_DTYPES];
extern const attnc_kernels attnc_kernels_avx512bf16_bf16;
#endif

/* 1 if this CPU (and OS) can run a level's kernels */
static int always(void) { return 1; }
#ifdef ATTNC_X86
/* AVX2, FMA and F16C (the float16 conversions): what kernels_avx2.c is compiled for */
static int has_avx2_fma(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
#endif
#if defined(ATTNC_X86) && !defined(ATTNC_WITHOUT_AVX512)
/* AVX-512 F, VL and DQ: what kernels_avx512.c is compiled for */
static int has_avx512(void)
{
    return has_avx2_fma() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
}
/* AVX512_BF16 (and BW, which every CPU with it has): kernels_avx512bf16.c;
 * any AVX-512 CPU in the test build that emulates it */
static int has_avx512bf16(void)
{
#ifdef ATTNC_EMULATE_BF16_DOT
    return has_avx512();
#else
    return has_avx512() && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16");
#endif
}
#endif

/* The levels, each implying the ones before it. Import chooses the last this
 * CPU runs, but on an Intel CPU the last it runs that is chosen_on_intel:
 * not avx512bf16, whose bfloat16 products (vdpbf16ps, two products a lane)
 * are slower there than the AVX-512 level's (widened, one FMA a product).
 * On a Xeon family 6 model 167 (Sapphire Rapids' features), vdpbf16ps ran
 * 0.47 a cycle against vfmadd231ps's 1.84, and bfloat16 took at avx512bf16,
 * against avx512 (2 threads): SDPA (8, 12, 1024, 64) 1.59x the time, (2, 4,
 * 256, 64) 1.42x, `linear` (4096, 768) -> 2304 1.56x, (64, 768) -> 2304
 * 1.43x, (8, 768) -> 2304 1.18x, (1, 768) -> 2304 1.42x, modules (8, 512,
 * 768) 1.52x, (1, 77, 512) 1.43x, a decoding step's SDPA (memory-bound)
 * 1.00x (1 thread: 1.14-1.63x, decoding 0.99x); on a Zen 4 core the
 * pairs' SDPA takes 0.57x float32's time (benchmarks/NOTES.md). The level
 * stays available to set_simd_level. */
static const struct {
    const char *name;
    int (*cpu_has)(void);
    const attnc_kernels *kernels; /* by dtype */
    const attnc_kernels *bf16;    /* bfloat16's in place of kernels[ATTNC_BF16], or NULL */
    int chosen_on_intel;
} levels[] = {
    {"portable", always, attnc_kernels_portable, NULL, 1},
#ifdef ATTNC_X86
    {"avx2", has_avx2_fma, attnc_kernels_avx2, NULL, 1},
#endif
#if defined(ATTNC_X86) && !defined(ATTNC_WITHOUT_AVX512)
    {"avx512", has_avx512, attnc_kernels_avx512, NULL, 1},
    {"avx512bf16", has_avx512bf16, attnc_kernels_avx512, &attnc_kernels_avx512bf16_bf16, 0},
#endif
};
#define N_LEVELS ((int)(sizeof levels / sizeof levels[0]))

static int n_runnable = 1;         /* levels [0, n_runnable) run on this CPU */
static atomic_int active_level = 0;
static atomic_int l1d_ways = 0;    /* 0: unknown */
static int is_intel = 0;

void attnc_select_kernels(void)
{
#ifdef ATTNC_X86
    __builtin_cpu_init();
    is_intel = __builtin_cpu_is("intel");
#endif
    n_runnable = 1;
    while (n_runnable < N_LEVELS && levels[n_runnable].cpu_has()) n_runnable++;
    int chosen = n_runnable - 1;
    while (is_intel && !levels[chosen].chosen_on_intel) chosen--;
    atomic_store(&active_level, chosen);
#ifdef _SC_LEVEL1_DCACHE_ASSOC /* glibc: from CPUID; 0 when it cannot tell */
    long ways = sysconf(_SC_LEVEL1_DCACHE_ASSOC);
    atomic_store(&l1d_ways, ways > 0 && ways <= ATTNC_MAX_L1D_WAYS ? (int)ways : 0);
#endif
}

int attnc_cpu_is_intel(void) { return is_intel; }

static _Thread_local attnc_gemm_order last_gemm_order = ATTNC_GEMM_DIRECT;
const char *const attnc_gemm_order_names[ATTNC_GEMM_N_ORDERS] = {"direct",   "few_rows", "transposed",
                                                                 "streamed", "far_x",    "blocked"};
void attnc_note_gemm_order(attnc_gemm_order order) { last_gemm_order = order; }
attnc_gemm_order attnc_last_gemm_order(void) { return last_gemm_order; }

int attnc_l1d_ways(void) { return atomic_load_explicit(&l1d_ways, memory_order_relaxed); }

void attnc_set_l1d_ways(int ways) { atomic_store(&l1d_ways, ways); }

const attnc_kernels *attnc_kernels_for(attnc_dtype dt)
{
    int level = atomic_load(&active_level);
    return dt == ATTNC_BF16 && levels[level].bf16 ? levels[level].bf16 : &levels[level].kernels[dt];
}

int attnc_n_levels(void) { return n_runnable; }

const char *attnc_level_name(int level) { return levels[level].name; }

int attnc_set_level(const char *name)
{
    for (int level = 0; level < n_runnable; level++)
        if (strcmp(name, levels[level].name) == 0) {
            atomic_store(&active_level, level);
            return 1;
        }
    return 0;
}

const char *attnc_active_level(void) { return levels[atomic_load(&active_level)].name; }
