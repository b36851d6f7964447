/* attnc kernel API: the few types shared by the bindings and the kernels.
 *
 * Kernels see plain pointers, sizes and strides, never Python objects.
 * Sizes and strides are counted in elements (idx_t), not bytes.
 * Every entry point returns an attnc_status; ATTNC_ENOMEM means a workspace
 * allocation failed and everything allocated so far has been freed.
 */
#ifndef ATTNC_H
#define ATTNC_H

#include <stddef.h>
#include <stdint.h>

typedef ptrdiff_t idx_t;

typedef enum { ATTNC_OK = 0, ATTNC_ENOMEM = 1, ATTNC_EOVERFLOW = 2 } attnc_status;
typedef enum { ATTNC_F32 = 0, ATTNC_F64 = 1 } attnc_dtype;

/* ------------------------------------------------------------------------ */
/* checked size arithmetic (alloc.c)                                         */

/* *out = a * b; returns 0 on overflow of idx_t (a, b >= 0). */
int attnc_mul_ok(idx_t a, idx_t b, idx_t *out);
/* malloc wrapper with an allocation-failure injection hook for tests:
 * after attnc_fail_alloc_after(n), the (n+1)-th allocation fails (n < 0: never). */
void *attnc_malloc(size_t n_bytes);
void attnc_free(void *p);
void attnc_fail_alloc_after(long n);

/* ------------------------------------------------------------------------ */
/* threads.c: a persistent pthread pool, rebuilt after fork                  */

typedef void (*attnc_task_fn)(void *ctx, idx_t task);
/* Runs fn(ctx, t) for every t in [0, n_tasks), each exactly once, on the
 * pool (the caller takes part). Runs inline when the pool is busy (another
 * Python thread), when called from inside a task, or when work_flops is too
 * small to pay for waking threads. Task results must not depend on which
 * thread runs them: that is what keeps results thread-count independent. */
void attnc_parallel_for(idx_t n_tasks, double work_flops, attnc_task_fn fn, void *ctx);
void attnc_set_num_threads(int n);
int attnc_get_num_threads(void);

/* ------------------------------------------------------------------------ */
/* cpu.c: run-time choice of the kernels' ISA level                          */

/* The ISA levels, each implying the ones below it. */
enum { ATTNC_SIMD_PORTABLE = 0, ATTNC_SIMD_AVX2 = 1, ATTNC_SIMD_AVX512 = 2 };

int attnc_cpu_has_avx2_fma(void);
/* AVX-512 F, VL and DQ (and AVX2+FMA): what the AVX-512 kernels are compiled for. */
int attnc_cpu_has_avx512(void);
/* Use at most max_level (clamped to the known levels); the default is the best. */
void attnc_set_simd_level(int max_level);
/* The level in use: min(the cap, the best this CPU has). */
int attnc_simd_level(void);
/* 0: force the portable path; nonzero: the best level the CPU has. */
void attnc_set_simd(int enabled);
/* 1 when a SIMD (AVX2 or AVX-512) path is in use. */
int attnc_simd_active(void);

/* ------------------------------------------------------------------------ */
/* gemm.c: the one GEMM entry point ("NT": C = A . B^T, as linear needs)     */
/*
 * C (M, N) = A (M, K) . B (N, K)^T  [+ bias (N)]
 *   A(i, p) = a[i * a_rs + p * a_cs]
 *   B(j, p) = b[j * b_rs + p * b_cs]
 *   C(i, j) = c[i * c_rs + j]           (rows of C contiguous)
 * bias may be NULL. C is overwritten (K == 0 gives bias or zeros).
 * Parallel over fixed-size blocks of C; each element is computed by one
 * task in a fixed order, so results never depend on the thread count.
 */
attnc_status attnc_gemm(attnc_dtype dt, idx_t M, idx_t N, idx_t K,
                        const void *a, idx_t a_rs, idx_t a_cs,
                        const void *b, idx_t b_rs, idx_t b_cs,
                        const void *bias, void *c, idx_t c_rs);

/* ------------------------------------------------------------------------ */
/* attention.c: the one attention entry point                                */
/*
 * For every item b in [0, n_items) (an item is one batch element and head):
 *   scores (L, S) = scale * Q_b (L, E) . K_b (S, E)^T
 *   scores[i, j]  = -1e20   where mask_b[i, j] == 0            (documents' masked_fill)
 *   scores[i, j] += -inf    where is_causal and j > i          (weight exactly 0
 *                                      for a finite score; NaN, +inf and NaN
 *                                      values propagate as in PyTorch's math path)
 *   weights = softmax(scores, axis=-1)            -> written to `weights` if not NULL
 *   out_b (L, Ev) = dropout(weights) . V_b (S, Ev)
 * Row i of Q_b is q + q_off[b] + i * q_rs, its E elements contiguous; same for
 * K (k_off, k_rs), V (v_off, v_rs, Ev contiguous) and out (out_off, out_rs).
 * mask (uint8, 0 = masked) element (i, j) of item b is
 *   mask[mask_off[b] + i * mask_rs + j * mask_cs]   (zero strides broadcast).
 * weights, when not NULL, is (n_items, L, S) contiguous.
 * Dropout keeps weight (b, i, j) when attnc_uniform(seed, (b*L + i)*S + j) >= p
 * and scales kept weights by 1/(1-p); p == 1 gives zeros.
 */
typedef struct {
    attnc_dtype dtype;
    idx_t n_items, L, S, E, Ev;
    const void *q; const idx_t *q_off; idx_t q_rs;
    const void *k; const idx_t *k_off; idx_t k_rs;
    const void *v; const idx_t *v_off; idx_t v_rs;
    const uint8_t *mask; const idx_t *mask_off; idx_t mask_rs, mask_cs;
    int is_causal;
    double scale;
    double dropout_p;
    uint64_t seed;
    void *out; const idx_t *out_off; idx_t out_rs;
    void *weights;
} attnc_attention_args;

attnc_status attnc_attention(const attnc_attention_args *args);

/* ------------------------------------------------------------------------ */
/* dispatch.c: softmax and dropout                                           */

/* out (outer, n, inner) <- softmax(in) along n, stable (row max subtracted);
 * both C-contiguous, outer * n * inner checked by the caller. */
attnc_status attnc_softmax(attnc_dtype dt, void *out, const void *in, idx_t outer, idx_t n,
                           idx_t inner);

/* out (n) <- in (n) * (attnc_uniform(seed, i) < p ? 0 : 1/(1-p)); p == 1 gives
 * in * 0 (zeros, NaN stays NaN as in PyTorch). */
void attnc_dropout(attnc_dtype dt, void *out, const void *in, idx_t n, double p, uint64_t seed);

/* ------------------------------------------------------------------------ */
/* layout.c                                                                  */

/* offsets[t] = sum_d index_d(t) * strides[d] for every multi-index t of
 * shape (ndim), in C order. A broadcast dimension has stride 0. */
void attnc_broadcast_offsets(int ndim, const idx_t *shape, const idx_t *strides, idx_t *offsets);

/* ------------------------------------------------------------------------ */
/* self_attention.c: a whole module forward in one call                      */
/*
 * x (B, T, C) contiguous (B = all leading dims flattened).
 * Q = x . Wq^T + bq (B, T, Dq), K likewise (Dk == Dq), V (B, T, Dv): one
 * buffer (B*T, Dq+Dk+Dv) written by three GEMMs; heads are strides into it:
 * head h of Q is columns [h*Dq/H, (h+1)*Dq/H). Each weight (D, C) and Wo
 * (n_out, Dv) is C-contiguous (row slices of a fused (3D, C) projection are).
 * attention per (b, h) as in attnc_attention, merged back as (B, T, H*Dv/H);
 * then, if w_out is not NULL, out = merged . Wo^T + bo (B, T, n_out).
 * mask_off has B*H entries (mask given), weights is (B, H, T, T) or NULL.
 */
typedef struct {
    attnc_dtype dtype;
    idx_t B, T, C, H;
    const void *x;
    const void *w[3]; const void *bias[3]; idx_t dim[3]; /* Q, K, V */
    const void *w_out; const void *bias_out; idx_t n_out;
    double scale, dropout_p;
    uint64_t seed;
    const uint8_t *mask; const idx_t *mask_off; idx_t mask_rs, mask_cs;
    void *out, *weights;
} attnc_self_attention_args;

attnc_status attnc_self_attention(const attnc_self_attention_args *args);

/* ------------------------------------------------------------------------ */
/* rng: counter-based uniform in [0, 1): the same bits for any tiling       */

static inline uint64_t attnc_hash64(uint64_t seed, uint64_t index)
{
    /* splitmix64's output function at position `index` of stream `seed` */
    uint64_t z = seed + (index + 1) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline double attnc_uniform(uint64_t seed, uint64_t index)
{
    return (double)(attnc_hash64(seed, index) >> 11) * 0x1.0p-53;
}

#endif
