/* attnc kernel API: the few types shared by the bindings and the kernels.
 *
 * Kernels see plain pointers, sizes and strides, never Python objects, and
 * trust them: the bindings validate every argument once, at the boundary.
 * Sizes and strides are counted in elements (idx_t), not bytes.
 * Every entry point returns an attnc_status; on any status but ATTNC_OK,
 * everything the call allocated has been freed and its output is garbage.
 */
#ifndef ATTNC_H
#define ATTNC_H

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef ptrdiff_t idx_t;

typedef enum {
    ATTNC_OK = 0,
    ATTNC_ENOMEM = 1,    /* a workspace allocation failed */
    ATTNC_EOVERFLOW = 2, /* a workspace size overflows */
    ATTNC_EINTR = 3,     /* the caller's interrupt hook asked to stop (interrupt.c) */
} attnc_status;

/* The dtypes of the arrays a kernel is given (its storage). float16 and
 * bfloat16 are stored as their 16 bits (a struct, so that they never mix
 * with numbers by accident) and computed in float: each element is
 * widened when read and rounded to nearest even when written. A kernel's
 * "reals" are its storage type; its lse, and anything else it documents
 * as compute precision, are float for the 16-bit dtypes. */
typedef enum { ATTNC_F32 = 0, ATTNC_F64 = 1, ATTNC_F16 = 2, ATTNC_BF16 = 3, ATTNC_N_DTYPES } attnc_dtype;
typedef struct { uint16_t bits; } attnc_f16;  /* IEEE 754 binary16 */
typedef struct { uint16_t bits; } attnc_bf16; /* the top half of a float */

/* Bytes of one stored element, and of one element computed in (lse). */
static inline size_t attnc_dtype_size(attnc_dtype dt) { return dt == ATTNC_F64 ? 8 : dt == ATTNC_F32 ? 4 : 2; }
static inline size_t attnc_compute_size(attnc_dtype dt) { return dt == ATTNC_F64 ? 8 : 4; }

/* x86-64 (or x86) with GCC or Clang: the AVX2 and AVX-512 kernels are
 * compiled; elsewhere only the portable ones. The one place this is asked. */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define ATTNC_X86 1
#endif

/* ------------------------------------------------------------------------ */
/* alloc.c: checked size arithmetic and the one allocator                    */

/* *out = a * b; returns 0 on overflow of idx_t (a, b >= 0). */
int attnc_mul_ok(idx_t a, idx_t b, idx_t *out);
static inline idx_t attnc_min(idx_t x, idx_t y) { return x < y ? x : y; }
/* ceil(x / y) without the overflow of (x + y - 1) / y */
static inline idx_t attnc_ceil_div(idx_t x, idx_t y) { return x / y + (x % y != 0); }
/* 64-byte aligned malloc whose large freed blocks are kept for reuse (at
 * most 64 MiB in all), with an allocation-failure injection hook for tests:
 * after attnc_fail_alloc_after(n, once), the (n+1)-th allocation fails, and
 * every later one too unless once (n < 0: none fails); it returns the
 * allocations that were left before a failure (-1 once a `once` failure
 * has been made). Memory only from attnc_malloc goes to attnc_free. */
void *attnc_malloc(size_t n_bytes);
void attnc_free(void *p);
/* realloc's contract over attnc_malloc's blocks (p NULL: attnc_malloc) */
void *attnc_realloc(void *p, size_t n_bytes);
long attnc_fail_alloc_after(long n, int once);
/* Advice, where the system takes it (Linux's MADV_HUGEPAGE), for a block of
 * 4 MB or more not yet faulted in: its whole pages in huge pages. */
void attnc_ask_for_huge_pages(void *block, size_t bytes);
/* Freed blocks of this many bytes or more are kept */
#define ATTNC_KEPT_MIN_BYTES ((size_t)64 << 10)

/* ------------------------------------------------------------------------ */
/* threads.c: a persistent pthread pool, rebuilt after fork                  */

typedef void (*attnc_task_fn)(void *ctx, idx_t task);
/* Runs fn(ctx, t) for every t in [0, n_tasks), each at most once, on the
 * pool (the caller takes part). Runs inline when the pool is busy (another
 * Python thread), when called from inside a task, or when work_flops is too
 * small to pay for waking threads. Once the call is interrupted
 * (attnc_interrupted), tasks not yet started are skipped. Task results must
 * not depend on which thread runs them: that keeps results thread-count
 * independent. */
void attnc_parallel_for(idx_t n_tasks, double work_flops, attnc_task_fn fn, void *ctx);
/* The same on at most max_threads threads (attnc_threads_for(work_flops) in
 * attnc_parallel_for), so that a task may keep something per thread in
 * max_threads slots indexed by attnc_thread_index(). */
void attnc_parallel_for_on(idx_t n_tasks, int max_threads, attnc_task_fn fn, void *ctx);
/* In a task: which thread runs it, 0 to max_threads - 1 (0: the thread
 * that called parallel_for, which also runs the tasks a pool busy with
 * another Python thread, or a nested call, leaves inline). Never part of a
 * result: tasks may only use it to pick a per-thread slot. */
int attnc_thread_index(void);
/* The thread count asked for (n >= 1); the pool never runs more threads
 * than the CPUs this process may use. */
void attnc_set_num_threads(int n);
int attnc_get_num_threads(void);
/* The threads a parallel_for would compute on: the count asked for, at most
 * the CPUs (or the count attnc_set_cpus_for_tests gave); for kernels sizing
 * their tasks (never their results) by it. */
int attnc_running_threads(void);
/* A test hook: cap the threads that run at n (n >= 1) instead of the CPUs
 * this process may use, so that a test's thread counts split the work as
 * they would on a machine that wide; 0 caps at the real CPUs again. The
 * default thread count stays the real CPUs'. */
void attnc_set_cpus_for_tests(int n);
/* The threads a parallel_for of work_flops would compute on: 1 below the
 * work that pays for waking a thread, or inside a task (which runs nested
 * work inline), else attnc_running_threads(). */
int attnc_threads_for(double work_flops);
/* Locks a mutex held only for moments (a few hundred instructions): polls
 * it LOCK_POLLS times (threads.c) before sleeping in it. The pool's threads
 * reach such locks together (each task's buffer from the allocator's cache,
 * at the start and end of its task), and a plain pthread mutex put the loser
 * to sleep at once: a futex wait and a wake-up syscall at nearly every small
 * call, a (1, 4, 64, 64) SDPA 18-26 us instead of 18 (benchmarks/NOTES.md). */
void attnc_lock_briefly_held(pthread_mutex_t *mutex);

/* ------------------------------------------------------------------------ */
/* interrupt.c: stopping a long call from its caller (Ctrl-C)                */

/* poll(ctx) is called now and then, only on the thread that began the call
 * (never on a pool worker); nonzero asks every thread of the call to stop.
 * The bindings' hook takes the GIL and runs Python's signal handlers. */
typedef struct {
    int (*poll)(void *ctx);
    void *ctx;
} attnc_interrupt_hook;

/* The state of one call, shared by its calling thread and the pool
 * workers that help it; the caller's (on its stack), opaque to it. */
typedef struct attnc_call {
    attnc_interrupt_hook hook;
    atomic_int stop;          /* read by every thread of the call at each question */
    struct attnc_call *outer; /* the call this one runs inside (a Python signal */
    int outer_is_caller;      /* handler's, run by the outer call's hook), or NULL */
    int forked;               /* 1 in a child forked mid-job (stopped: the parent's */
                              /* workers' tasks are not done there) */
    /* the caller's alone, written at its questions: on a cache line of their
     * own, so that the workers' reads of `stop` do not miss */
    _Alignas(64) long long next_poll_ns; /* the caller's clock: when to poll the hook next, */
    long long last_clock_ns;             /* when it last read the clock, */
    int questions;                       /* questions since, */
    int questions_per_clock;             /* and how many to let pass between readings */
} attnc_call;

/* Bracket one call on the calling thread, with its state in *call; hook
 * may be NULL (never stops). A call begun inside another (from the other's
 * hook) has its own state and gives the other back its own at its end. */
void attnc_call_begin(attnc_call *call, const attnc_interrupt_hook *hook);
void attnc_call_end(attnc_call *call);
/* Kernels ask at safe points (between tiles); 1 once the call must stop. */
int attnc_interrupted(void);

/* ------------------------------------------------------------------------ */
/* batches of matrices: a broadcast batch walked without offset tables      */

#define ATTNC_MAX_BATCH_DIMS 64

/* The batch shape; item b is its C-order multi-index. */
typedef struct {
    int ndim;
    idx_t shape[ATTNC_MAX_BATCH_DIMS];
} attnc_batch;

/* A batch of matrices: matrix b starts at data + offset(b), where offset is
 * the dot product of b's multi-index with batch_strides (0 broadcasts);
 * its rows are row_stride apart and each row is contiguous. */
typedef struct {
    const void *data;
    idx_t batch_strides[ATTNC_MAX_BATCH_DIMS];
    idx_t row_stride;
} attnc_matrices;

/* The element offset of matrix `item` over batch: the dot product of its
 * multi-index with batch_strides (batch.c). */
idx_t attnc_item_offset(const attnc_batch *batch, const idx_t *batch_strides, idx_t item);
/* offsets[s] <- attnc_item_offset over batch_strides[s], s < n_sets: the
 * multi-index found once for all of them (a division a dim). */
void attnc_item_offsets(const attnc_batch *batch, idx_t item, int n_sets, const idx_t *const *batch_strides,
                        idx_t *offsets);

/* ------------------------------------------------------------------------ */
/* the kernels: GEMM, attention, softmax, dropout                           */

/*
 * gemm: C (M, N) = A (M, K) . B (N, K)^T  [+ bias (N)]      ("NT", as linear)
 *   B and its bias are stacked from 1..ATTNC_GEMM_MAX_PARTS blocks of rows
 *   (a module's Q, K and V weights: one product, A packed once): B's rows
 *   [0, parts[0].rows) are parts[0]'s, the next parts[1].rows parts[1]'s...
 *   A(i, p) = a[i * a_rs + p * a_cs],  part row (j, p) = b[j * b_rs + p * b_cs],
 *   C(i, j) = c[i * c_rs + j]; a part's bias may be NULL (zeros); C is
 *   overwritten.
 * Each element of C is summed in one fixed order whatever M, N, the parts,
 * the tiling or the thread count: a row's result never depends on the
 * other rows.
 */
#define ATTNC_GEMM_MAX_PARTS 3
/* KC: the steps of K summed per block. An element of C is the sum of its
 * K blocks, each summed from zero, in order; so the block size is part of
 * every result's bits, the same at every SIMD level (attnc._C.GEMM_KC for
 * the tests). Every K block reads and writes all of C once more, and a C
 * larger than the caches (a (4096, 2304) float C is 36 MB) travels from
 * memory each time: with KC = 256, a K of 768 took three such passes and
 * reached 0.88x NumPy's throughput on Zen 4; with 768 it took one and
 * reached 1.0x, for the AVX2 and AVX-512 kernels alike. 1024 takes the
 * hidden size of 1024 in one block as well: on a Zen 3 core, module (1,
 * 50, 1024) 0.94x the time on 1 thread, `linear` (50, 1024) -> 3072
 * 0.94-0.96x, unchanged within the noise on 2 threads and at K = 768 and
 * 3072 (benchmarks/NOTES.md). A B sliver (KC, NR) streams from L2, which
 * keeps up with the kernel. */
#define ATTNC_GEMM_KC 1024
typedef struct {
    const void *b, *bias;
    idx_t rows;
} attnc_gemm_part;

typedef struct {
    idx_t M, K;
    const void *a; idx_t a_rs, a_cs;
    int n_parts; attnc_gemm_part parts[ATTNC_GEMM_MAX_PARTS]; idx_t b_rs, b_cs;
    void *c; idx_t c_rs;
    /* NULL, or B (these parts, all of K) as this kernel's pack_weights
     * packed it: the orders that pack B read it there instead */
    const void *packed_b;
} attnc_gemm_args;

/* The keys query i may see: j in [i + offset - left, i + offset + right],
 * a band around its aligned diagonal i + offset (ATTNC_UNBOUNDED: that
 * side is open). Causal is right = 0: offset 0 aligns it top-left (as
 * torch's is_causal), S - L bottom-right (decode, chunked prefill). */
#define ATTNC_UNBOUNDED (PTRDIFF_MAX / 4)
typedef struct {
    int on;
    idx_t offset, left, right;
} attnc_band;

/* The keys query i sees are [attnc_band_begin, attnc_band_end), within [0, S). */
static inline idx_t attnc_band_begin(const attnc_band *band, idx_t i, idx_t S)
{
    idx_t j = band->on ? i + band->offset - band->left : 0;
    return j < 0 ? 0 : j > S ? S : j;
}

static inline idx_t attnc_band_end(const attnc_band *band, idx_t i, idx_t S)
{
    idx_t j = band->on ? i + band->offset + band->right + 1 : S;
    return j < 0 ? 0 : j > S ? S : j;
}

/*
 * attention: for every item b of the batch (a batch element and head):
 *   scores (L, S) = scale * Q_b (L, E) . K_b (S, E)^T
 *   scores[i, j] += bias_b[i, j]       where bias is given (torch's float attn_mask)
 *   scores[i, j]  = -1e20   where mask_b[i, j] == 0            (documents' masked_fill)
 *   scores[i, j] += -inf    where key j is outside query i's band (weight exactly 0
 *                                      for a finite score; NaN, +inf and NaN values
 *                                      propagate as in PyTorch's math path)
 *   weights = softmax(scores, axis=-1); a row whose scores are all -inf gets
 *             weights 0 (PyTorch's SDPA math path), or NaN with
 *             nan_rows (torch.softmax's, as the documents' modules
 *             compute)                           -> written to `weights` if not NULL
 *   out_b (L, Ev) = dropout(weights) . V_b (S, Ev)
 * The output's bits do not depend on whether the weights are written, on
 * the thread count, or on the other items of the batch.
 * mask (uint8, 0 = masked) element (i, j) of item b is
 *   mask[offset(b) + i * mask_rs + j * mask_cs]   (zero strides broadcast);
 * bias (the dtype's reals) likewise with its own strides.
 * weights, when not NULL, is (n_items, L, S) contiguous; lse, when not
 * NULL, (n_items, L) contiguous: each row's log-sum-exp of its scores
 * (-inf for a row of -inf, NaN with nan_rows: its backward's gradients are
 * then NaN, as torch's), what the backward recomputes weights from.
 * Dropout keeps weight (b, i, j) when draw (b*L + i)*S + j of stream seed is
 * kept (attnc_keep_threshold), and scales kept weights by 1/(1-p); p == 1
 * gives zeros.
 */
typedef struct {
    attnc_batch batch;
    idx_t L, S, E, Ev;
    attnc_matrices q, k, v;  /* (L, E), (S, E), (S, Ev) per item */
    const uint8_t *mask;     /* NULL: no mask */
    idx_t mask_batch_strides[ATTNC_MAX_BATCH_DIMS], mask_rs, mask_cs;
    const void *bias;        /* NULL: no bias */
    idx_t bias_batch_strides[ATTNC_MAX_BATCH_DIMS], bias_rs, bias_cs;
    attnc_band band;         /* band.on == 0: every key */
    double scale;
    double dropout_p;
    uint64_t seed;
    attnc_matrices out;      /* (L, Ev) per item; data written */
    void *weights, *lse;
    int nan_rows;            /* a row of -inf scores: NaN weights, output and lse (else 0, 0, -inf) */
} attnc_attention_args;

/*
 * attention backward: for every item b, with the forward's scores, bias,
 * mask, band and dropout factors m (0 or 1/(1-p), the same counter-based
 * mask) as above, and P recomputed from the forward's lse:
 *   P (L, S)  = exp(scores - lse)       (a row of -inf: 0; a row whose |lse| is
 *               too large for that, e.g. the mask's -1e20 fill or a large
 *               bias: exp(scores - max) / sum from its scores recomputed)
 *   D (L)     = rowsum(dO * O)
 *   dV        = (P * m)^T dO            (S, Ev)
 *   dS        = P * ((dO V^T) * m - D)  (L, S), 0 where the mask is 0 (a constant)
 *   dQ        = scale dS K              (L, E)
 *   dK        = scale dS^T Q            (S, E)
 * forward: the forward's arguments (out = O; weights and lse unused);
 * grad_q/k/v are written, one matrix per item; one with a batch stride of
 * 0 on an axis of more than one item (its input broadcast there) gets the
 * sum of those items' gradients, added in item order into the caller's
 * zeros, in the dtype of the call (float or double: 16-bit callers widen).
 * (Query tile, key block) pairs outside every band are skipped. Extra
 * memory per task: the item's packed queries and dO (about 2 L (E + Ev)),
 * a row of S and fixed tiles, never (L, S); with a shared gradient, a
 * scratch the size of the shared gradients (at least 2^20 elements, and
 * one item a thread);
 * bits independent of the thread count and of the pass plan.
 */
typedef struct {
    attnc_attention_args forward;
    attnc_matrices grad_out; /* dO (L, Ev) per item */
    const void *lse;         /* (n_items, L) contiguous, the forward's */
    attnc_matrices grad_q, grad_k, grad_v; /* written */
} attnc_attention_backward_args;

/* An optimizer's step on one parameter (optimizer_impl.h): param (n
 * elems) updated in place from grad (n elems), with the rule's state (n
 * reals each: the update's real type, float for the 16-bit dtypes):
 *   ATTNC_SGD    state[0]: the momentum buffer, NULL without momentum;
 *                start: it is new (b = d)
 *   ATTNC_ADAMW  state[0], state[1]: the moments m and v
 * The settings are attnc/optim.py's, those derived from the step count
 * (step_size, bias2_sqrt) computed there, as Python computes them. */
typedef enum { ATTNC_SGD, ATTNC_ADAMW } attnc_update_rule;

typedef struct {
    attnc_update_rule rule;
    void *param;
    const void *grad;
    void *state[2];
    idx_t n;
    int start;                         /* SGD */
    double lr, momentum, weight_decay; /* SGD */
    /* AdamW: decay = 1 - lr weight_decay, lerp_weight = 1 - beta1,
     * step_size = lr / (1 - beta1^t), bias2_sqrt = (1 - beta2^t)^0.5 */
    double decay, lerp_weight, beta2, step_size, bias2_sqrt, eps;
} attnc_update_args;

/* sums (n) <- the column sums of g (rows, n; rows g_rs elements apart,
 * columns adjacent): a bias's gradient (column_sums_impl.h). */
typedef struct {
    const void *g;
    idx_t rows, n, g_rs;
    void *sums;
} attnc_column_sums_args;

/* One dtype's kernels at one ISA level: a row of the kernel table. */
typedef struct {
    attnc_status (*gemm)(const attnc_gemm_args *args);
    /* *packed <- B of args (its parts, all of K; M, A and C unused) packed
     * as gemm packs it, in memory from attnc_malloc (the caller frees it),
     * for gemm's args->packed_b: weights packed once for many products. */
    attnc_status (*pack_weights)(const attnc_gemm_args *args, void **packed);
    attnc_status (*attention)(const attnc_attention_args *args);
    attnc_status (*attention_backward)(const attnc_attention_backward_args *args);
    /* out (outer, n, inner) <- softmax(in) along n, stable (row max
     * subtracted); both C-contiguous, outer * n * inner fits idx_t. */
    attnc_status (*softmax)(void *out, const void *in, idx_t outer, idx_t n, idx_t inner);
    /* out (n) <- in (n) * (draw i of stream seed kept ? 1/(1-p) : 0); p == 1
     * gives in * 0 (zeros; NaN stays NaN as in PyTorch). */
    attnc_status (*dropout)(void *out, const void *in, idx_t n, double p, uint64_t seed);
    attnc_status (*update)(const attnc_update_args *args);
    attnc_status (*column_sums)(const attnc_column_sums_args *args);
    int vector_bytes; /* the level's SIMD width (the GEMM's orders depend on it; tests ask) */
} attnc_kernels;

/* ------------------------------------------------------------------------ */
/* cpu.c: the kernel table (one row per ISA level) and the CPU's caches     */

/* The kernels of dtype dt at the active ISA level. */
const attnc_kernels *attnc_kernels_for(attnc_dtype dt);
/* Chooses the best level this CPU has (called once, at import). */
void attnc_select_kernels(void);
/* The levels this CPU can run, best last: n_levels names. */
int attnc_n_levels(void);
const char *attnc_level_name(int level);
/* Use at most level `name` (tests): 0 if this CPU has no such level. */
int attnc_set_level(const char *name);
const char *attnc_active_level(void);
/* The ways of a set of this CPU's L1 data cache, 0 if unknown (read at
 * import); tests may set it to take the GEMM's other orders. */
#define ATTNC_MAX_L1D_WAYS 64
int attnc_l1d_ways(void);
void attnc_set_l1d_ways(int ways);
/* Whether this CPU is Intel's (read at import): its L3 is farther than Zen's. */
int attnc_cpu_is_intel(void);
/* The order the last GEMM called on this thread took (a test hook: the tests
 * assert that their sizes reach the order they are written for). A far-x
 * job whose tasks hold one weight sliver each runs as the streamed order
 * does, and is noted as it. */
typedef enum {
    ATTNC_GEMM_DIRECT,     /* direct loops, no packing (the tiniest products) */
    ATTNC_GEMM_FEW_ROWS,   /* weights read in place and turned in registers */
    ATTNC_GEMM_TRANSPOSED, /* C^T = B . A^T: weights broadcast in place, x packed */
    ATTNC_GEMM_STREAMED,   /* x packed (or read) whole, weights a sliver at a time */
    ATTNC_GEMM_FAR_X,      /* streamed by blocks of weight slivers (an x far beyond L2) */
    ATTNC_GEMM_BLOCKED,    /* blocks of x by blocks of the packed weights */
    ATTNC_GEMM_N_ORDERS
} attnc_gemm_order;
void attnc_note_gemm_order(attnc_gemm_order order);
attnc_gemm_order attnc_last_gemm_order(void);
extern const char *const attnc_gemm_order_names[ATTNC_GEMM_N_ORDERS];

/* ------------------------------------------------------------------------ */
/* self_attention.c: a whole module forward in one call                      */
/*
 * x (B, T, C) contiguous, B = the product of the batch dims but the last;
 * the batch is (leading dims of x..., H).
 * Q = x . Wq^T + bq (B, T, Dq), K likewise (Dk == Dq), V (B, T, Dv): one
 * buffer (B*T, Dq+Dk+Dv); heads are strides into it: head h of Q is columns
 * [h*Dq/H, (h+1)*Dq/H). Each weight (D, C) and Wo (n_out, Dv) is
 * C-contiguous (row slices of a fused (3D, C) projection are).
 * attention per item as attnc_attention, merged back as (B, T, Dv); then,
 * if w_out is not NULL, out = merged . Wo^T + bo (B, T, n_out).
 * weights is (batch..., T, T) or NULL.
 * To keep what the backward needs (a training-mode forward), keep_qkv
 * (rows, Dq+Dk+Dv), keep_merged (rows, Dv) and lse (n_items, T) receive
 * the projections, the merged heads (before the output projection) and
 * the rows' log-sum-exp; NULL keeps nothing.
 */
enum { ATTNC_Q = 0, ATTNC_K = 1, ATTNC_V = 2 };
typedef struct {
    attnc_dtype dtype;
    attnc_batch batch; /* leading dims of x, then heads (H = shape[ndim - 1]) */
    idx_t T, C;
    const void *x;
    const void *w[3]; const void *bias[3]; idx_t dim[3]; /* by ATTNC_Q, _K, _V */
    const void *w_out; const void *bias_out; idx_t n_out;
    double scale, dropout_p;
    uint64_t seed;
    const uint8_t *mask; idx_t mask_batch_strides[ATTNC_MAX_BATCH_DIMS], mask_rs, mask_cs;
    void *out, *weights;
    void *keep_qkv, *keep_merged, *lse;
    const struct attnc_packed_module *packed; /* NULL, or these weights' packs */
    int nan_rows; /* attnc_attention_args' */
} attnc_self_attention_args;

attnc_status attnc_self_attention(const attnc_self_attention_args *args);

/* A module's projection weights packed once (a frozen module's): the
 * stacked Q, K, V weights and Wo, each as the kernels that packed them
 * pack a product's B (pack_weights; out NULL without Wo). A forward given
 * them reads them instead of packing its weights, while those kernels are
 * the active ones (else it packs as ever: the same bits either way). */
typedef struct attnc_packed_module {
    const attnc_kernels *kernels;
    void *qkv, *out;
} attnc_packed_module;

/* *p <- the packs of s's weights (s's dtype, weights and dims; the rest
 * unused); attnc_packed_module_free releases them. */
attnc_status attnc_pack_module(const attnc_self_attention_args *s, attnc_packed_module *p);
void attnc_packed_module_free(attnc_packed_module *p);

/*
 * The module backward from what its forward kept: with G = grad_out
 * (rows, n_out), or (rows, Dv) when there is no output projection,
 *   dMerged = G . Wo,  dWo = G^T . merged,  dbo = column sums of G
 *   dQ, dK, dV (heads as in the forward) = attention backward(dMerged)
 *   grad_x = [dQ dK dV] . [Wq; Wk; Wv]       (rows, C)
 *   grad_w = [dQ dK dV]^T . x                (Dq+Dk+Dv, C): Q, K, V stacked
 *   grad_bias = column sums of [dQ dK dV]    (Dq+Dk+Dv), if not NULL
 * forward: the forward's arguments (out, weights, keep_* and lse unused).
 */
typedef struct {
    attnc_self_attention_args forward;
    const void *qkv, *merged, *lse; /* what the forward kept */
    const void *grad_out;
    void *grad_x, *grad_w, *grad_bias, *grad_w_out, *grad_bias_out; /* written; biases may be NULL */
} attnc_self_attention_backward_args;

attnc_status attnc_self_attention_backward(const attnc_self_attention_backward_args *args);

/* ------------------------------------------------------------------------ */
/* rng: a counter-based draw per element: the same bits for any tiling     */

/* Draw `index` of stream `seed` is splitmix64's output there: the state
 * seed + (index + 1) * ATTNC_SPLITMIX64_GAMMA (mod 2^64), mixed. The mix
 * takes a uint64_t state or a vector of them (z: a scratch of the state's
 * type), and dropout_impl.h steps a vector's states by additions. */
#define ATTNC_SPLITMIX64_GAMMA 0x9E3779B97F4A7C15ULL
#define ATTNC_SPLITMIX64_MIX(z, state)                         \
    ((z) = (state), (z) = ((z) ^ ((z) >> 30)) * 0xBF58476D1CE4E5B9ULL, \
     (z) = ((z) ^ ((z) >> 27)) * 0x94D049BB133111EBULL, (z) ^ ((z) >> 31))

/* A draw's uniform is u = (draw >> 11) * 2^-53 in [0, 1), and dropout
 * keeps an element whose u >= p: the same test in integers is draw >> 11
 * >= attnc_keep_threshold(p), since u's 53 bits are an integer n and
 * n * 2^-53 >= p exactly when n >= ceil(p * 2^53). */
static inline uint64_t attnc_keep_threshold(double p) { return (uint64_t)ceil(p * 0x1.0p53); }

#endif
