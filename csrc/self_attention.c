/* A whole attention module, forward and backward: the Q, K, V projections
 * as one product, attention over heads (as strides into the projection
 * buffer), output projection; every step through the kernel table. Short
 * items of an inference forward on several threads instead project and
 * attend an item (or a group of its heads) per task (but a frozen module's,
 * whose packs serve whole products), or a thread's share of whole items all
 * three steps per task, with the same bits. */
#include <stdatomic.h>
#include <string.h>

#include "attnc.h"

/* The module's sizes, derived once from its arguments. */
typedef struct {
    const attnc_kernels *kernels;
    size_t elem;
    idx_t rows, width, Dv; /* x's rows (B * T), Dq + Dk + Dv, Dv */
} module_sizes;

/* The packs of s's weights, if it has them for these kernels (else NULL:
 * the products pack the weights themselves). */
static const attnc_packed_module *packs_of(const attnc_self_attention_args *s, const module_sizes *m)
{
    return s->packed && s->packed->kernels == m->kernels ? s->packed : NULL;
}

/* The sizes of s; 0 if a buffer of rows x width elements overflows. */
static int sizes_of(const attnc_self_attention_args *s, module_sizes *m)
{
    m->kernels = attnc_kernels_for(s->dtype);
    m->elem = attnc_dtype_size(s->dtype);
    idx_t B = 1;
    for (int d = 0; d < s->batch.ndim - 1; d++) B *= s->batch.shape[d]; /* x holds them: no overflow */
    m->rows = B * s->T;
    m->width = s->dim[ATTNC_Q] + s->dim[ATTNC_K] + s->dim[ATTNC_V];
    m->Dv = s->dim[ATTNC_V];
    idx_t size;
    return attnc_mul_ok(m->rows, m->width, &size) && (size_t)size <= SIZE_MAX / m->elem;
}

/* a <- attention over the heads of the (rows, width) projection buffer
 * qkv, out (and its gradient) the (rows, Dv) buffer merged: per item
 * (leading dims..., head), the heads are column blocks, and the leading
 * dims walk the flattened rows in C order. */
static void head_view(const attnc_self_attention_args *s, const module_sizes *m, const char *qkv, char *merged,
                      attnc_attention_args *a)
{
    int nd = s->batch.ndim;
    idx_t H = s->batch.shape[nd - 1], head_qk = s->dim[ATTNC_Q] / H, head_v = m->Dv / H;
    *a = (attnc_attention_args){
        .batch = s->batch, .L = s->T, .S = s->T, .E = head_qk, .Ev = head_v,
        .q = {qkv, {0}, m->width},
        .k = {qkv + (size_t)s->dim[ATTNC_Q] * m->elem, {0}, m->width},
        .v = {qkv + (size_t)(s->dim[ATTNC_Q] + s->dim[ATTNC_K]) * m->elem, {0}, m->width},
        .mask = s->mask, .mask_rs = s->mask_rs, .mask_cs = s->mask_cs,
        .scale = s->scale, .dropout_p = s->dropout_p, .seed = s->seed,
        .out = {merged, {0}, m->Dv}, .nan_rows = s->nan_rows,
    };
    idx_t inner_rows = s->T;
    for (int d = nd - 2; d >= 0; d--) {
        a->q.batch_strides[d] = a->k.batch_strides[d] = a->v.batch_strides[d] = inner_rows * m->width;
        a->out.batch_strides[d] = inner_rows * m->Dv;
        inner_rows *= s->batch.shape[d];
    }
    a->q.batch_strides[nd - 1] = a->k.batch_strides[nd - 1] = head_qk;
    a->v.batch_strides[nd - 1] = a->out.batch_strides[nd - 1] = head_v;
    for (int d = 0; d < nd; d++) a->mask_batch_strides[d] = s->mask_batch_strides[d];
}

/* Up to this many bytes of x per item (its T rows), an inference forward
 * on more than one thread projects and attends each item, or each group
 * of an item's heads, in one task (attend_by_items): the task's GEMM writes
 * its heads' Q, K and V into a buffer of its own, and its attention reads
 * them there, on the core that wrote them. Through one projection buffer,
 * about a third of each head's Q, K and V had been written by the other
 * core's share of the QKV GEMM; by items, a (1, 32, 256) module took
 * 0.92-0.99x the time (five runs, median 0.955x) on 2 threads of a Zen 3
 * host. Beyond 32 KB, each task's product is the slower one: a (2, 128,
 * 256) module took 1.03x on 2 threads, 1.12x on one, where a (128, 256)
 * x_b is multiplied in the transposed order and the whole (256, 256) x
 * in the packed one (benchmarks/NOTES.md). */
#define ITEM_TASK_MAX_X_BYTES (32 * 1024)
/* When the items split evenly among the threads and a thread's share of x
 * is at most this much, each thread's one task takes whole items through
 * all three steps (projections, attention, output projection): nothing a
 * core writes is read by the other. On a 2-vCPU Zen 4 host whose two vCPUs
 * are at times placed on different core complexes (a cache line's round
 * trip between them 300-500 ns instead of 60-110), a (2, 128, 256) module
 * took 0.99 ms there against 0.83 near (ONNX Runtime 0.88 and 0.82); with
 * a task per thread of whole items 0.85-0.86 there and 0.83 near. A share
 * of 1 MB, module (8, 128, 512), took 1.01-1.02x the time, of 2 MB ((4,
 * 256, 1024)) 1.06x: single-threaded products of a longer x lose what
 * the other core's data cost (benchmarks/NOTES.md). */
#define ITEM_GROUP_MAX_X_BYTES (256 * 1024)
/* Whole items a task (a task per thread of them, or one per item) only when
 * a task has at least this many rows: each such task multiplies all of the
 * weights, so each turns or packs all of them for its own rows, where one
 * product of every row (split by columns) prepares each weight once. With
 * fewer rows that preparation outweighs the products: on 2 threads of a
 * Xeon family 6 model 167, split by columns against whole items (best /
 * median), decoding steps (4, 1, 768) 0.60 / 0.61x the time, (16, 1, 768)
 * 0.77 / 0.78x, (3, 1, 768) (a task per item) 0.41 / 0.42x, 16 rows a task
 * (2, 16, 768) 0.80 / 0.79x, (8, 4, 768) 0.81 / 0.79x, (2, 16, 256) 1.00 /
 * 0.98x, 24 rows (2, 24, 768) 0.71 / 0.74x, (2, 24, 256) 0.89 / 0.87x; 32
 * rows and more, whole items as fast or faster: (2, 32, 768) 1.01x, (4, 16,
 * 512) 1.07 / 1.04x, (4, 16, 256) 1.19 / 1.18x, (2, 64, 512) 1.01 / 1.02x,
 * (2, 128, 256) 1.03 / 1.02x (benchmarks/NOTES.md). A group of one item's
 * heads multiplies only their weights, so it needs no such rows. */
#define ITEM_TASK_MIN_ROWS 32

/* Tasks of attend_by_items: items_per_task whole items and heads_per_task
 * of their heads each (items_per_task 1 when an item's heads are split,
 * heads_per_task H when whole items are), head_groups tasks per group of
 * items. With project_out (whole items), a task also projects its rows'
 * output, so nothing it computes is read by another core. */
typedef struct {
    const attnc_self_attention_args *s;
    const module_sizes *m;
    char *merged;
    idx_t H, head_qk, head_v, items, items_per_task, heads_per_task, head_groups;
    int project_out;
    atomic_int status;
} heads_job;

/* Task = items [b0, b0 + nb) and their heads [h0, h0 + nh): merged's
 * columns of those heads in those items' rows <- attention over their
 * projections of the items' rows of x (one product), and with project_out
 * out's rows of those items <- merged's . Wo^T + bo. */
static void heads_task(void *ctx, idx_t task)
{
    heads_job *job = ctx;
    const attnc_self_attention_args *s = job->s;
    const module_sizes *m = job->m;
    idx_t b0 = task / job->head_groups * job->items_per_task, nb = attnc_min(job->items_per_task, job->items - b0);
    idx_t h0 = task % job->head_groups * job->heads_per_task;
    idx_t nh = attnc_min(job->heads_per_task, job->H - h0), qk = nh * job->head_qk, v = nh * job->head_v;
    idx_t width = 2 * qk + v, rows = nb * s->T, r0 = b0 * s->T;
    char *qkv = attnc_malloc((size_t)(rows * width) * m->elem); /* within the sizes' check */
    if (!qkv) {
        atomic_store(&job->status, ATTNC_ENOMEM);
        return;
    }
    const char *w[3] = {s->w[ATTNC_Q], s->w[ATTNC_K], s->w[ATTNC_V]};
    const char *bias[3] = {s->bias[ATTNC_Q], s->bias[ATTNC_K], s->bias[ATTNC_V]};
    idx_t first[3] = {h0 * job->head_qk, h0 * job->head_qk, h0 * job->head_v}, heads_rows[3] = {qk, qk, v};
    attnc_gemm_args project = {
        .M = rows, .K = s->C, .a = (const char *)s->x + (size_t)(r0 * s->C) * m->elem, .a_rs = s->C, .a_cs = 1,
        .n_parts = 3, .b_rs = s->C, .b_cs = 1, .c = qkv, .c_rs = width,
    };
    for (int part = 0; part < 3; part++)
        project.parts[part] = (attnc_gemm_part){w[part] + (size_t)(first[part] * s->C) * m->elem,
                                                bias[part] ? bias[part] + (size_t)first[part] * m->elem : NULL,
                                                heads_rows[part]};
    const attnc_packed_module *packs = packs_of(s, m);
    if (packs && nh == job->H) project.packed_b = packs->qkv; /* all the weights' rows */
    attnc_status status = m->kernels->gemm(&project);
    int head_dim = s->batch.ndim - 1;
    for (idx_t b = b0; status == ATTNC_OK && b < b0 + nb; b++) {
        idx_t item = b * job->H + h0; /* the first head's item of the module's batch */
        const char *item_qkv = qkv + (size_t)((b - b0) * s->T * width) * m->elem;
        attnc_attention_args a = {
            .batch = {1, {nh}}, .L = s->T, .S = s->T, .E = job->head_qk, .Ev = job->head_v,
            .q = {item_qkv, {job->head_qk}, width},
            .k = {item_qkv + (size_t)qk * m->elem, {job->head_qk}, width},
            .v = {item_qkv + (size_t)(2 * qk) * m->elem, {job->head_v}, width},
            .mask = s->mask ? s->mask + attnc_item_offset(&s->batch, s->mask_batch_strides, item) : NULL,
            .mask_batch_strides = {s->mask_batch_strides[head_dim]}, .mask_rs = s->mask_rs, .mask_cs = s->mask_cs,
            .scale = s->scale,
            .out = {job->merged + (size_t)(b * s->T * m->Dv + h0 * job->head_v) * m->elem, {job->head_v}, m->Dv},
            .weights = s->weights ? (char *)s->weights + (size_t)(item * s->T * s->T) * m->elem : NULL,
            .nan_rows = s->nan_rows,
        };
        status = m->kernels->attention(&a);
    }
    attnc_free(qkv);
    if (status == ATTNC_OK && job->project_out) {
        attnc_gemm_args out = {
            .M = rows, .K = m->Dv, .a = job->merged + (size_t)(r0 * m->Dv) * m->elem, .a_rs = m->Dv, .a_cs = 1,
            .n_parts = 1, .parts = {{s->w_out, s->bias_out, s->n_out}}, .b_rs = m->Dv, .b_cs = 1,
            .c = (char *)s->out + (size_t)(r0 * s->n_out) * m->elem, .c_rs = s->n_out,
            .packed_b = packs ? packs->out : NULL,
        };
        status = m->kernels->gemm(&out);
    }
    if (status != ATTNC_OK) atomic_store(&job->status, status);
}

/* merged <- attention over every item's heads, in as few tasks as keep
 * the threads busy (heads_task): with by_groups, a task per thread of
 * whole items, which also projects its rows' output (*projected_out set);
 * else a task per item, or per group of its heads when the items are
 * fewer than the threads. */
static attnc_status attend_by_items(const attnc_self_attention_args *s, const module_sizes *m, char *merged,
                                    double flops, idx_t threads, int by_groups, int *projected_out)
{
    idx_t H = s->batch.shape[s->batch.ndim - 1], items = m->rows / s->T;
    heads_job job = {s, m, merged, H, s->dim[ATTNC_Q] / H, m->Dv / H, items, 1, H, 1, 0, ATTNC_OK};
    if (by_groups) {
        job.items_per_task = items / threads;
        job.project_out = s->w_out != NULL;
    } else if (items < threads) {
        job.head_groups = attnc_min(H, attnc_ceil_div(threads, items));
        job.heads_per_task = attnc_ceil_div(H, job.head_groups);
        job.head_groups = attnc_ceil_div(H, job.heads_per_task);
    }
    attnc_parallel_for(attnc_ceil_div(items, job.items_per_task) * job.head_groups, flops, heads_task, &job);
    *projected_out = job.project_out;
    attnc_status status = atomic_load(&job.status);
    return status == ATTNC_OK && attnc_interrupted() ? ATTNC_EINTR : status;
}

/* The product qkv (rows, width) <- x . [Wq; Wk; Wv]^T + [bq bk bv]. */
static attnc_gemm_args qkv_product(const attnc_self_attention_args *s, const module_sizes *m, char *qkv)
{
    const attnc_packed_module *packs = packs_of(s, m);
    return (attnc_gemm_args){
        .M = m->rows, .K = s->C, .a = s->x, .a_rs = s->C, .a_cs = 1, .n_parts = 3,
        .parts = {{s->w[ATTNC_Q], s->bias[ATTNC_Q], s->dim[ATTNC_Q]},
                  {s->w[ATTNC_K], s->bias[ATTNC_K], s->dim[ATTNC_K]},
                  {s->w[ATTNC_V], s->bias[ATTNC_V], s->dim[ATTNC_V]}},
        .b_rs = s->C, .b_cs = 1, .c = qkv, .c_rs = m->width, .packed_b = packs ? packs->qkv : NULL,
    };
}

/* The product out (rows, n_out) <- merged . Wo^T + bo. */
static attnc_gemm_args out_product(const attnc_self_attention_args *s, const module_sizes *m, const char *merged)
{
    const attnc_packed_module *packs = packs_of(s, m);
    return (attnc_gemm_args){
        .M = m->rows, .K = m->Dv, .a = merged, .a_rs = m->Dv, .a_cs = 1,
        .n_parts = 1, .parts = {{s->w_out, s->bias_out, s->n_out}}, .b_rs = m->Dv, .b_cs = 1,
        .c = s->out, .c_rs = s->n_out, .packed_b = packs ? packs->out : NULL,
    };
}

/* Passes 1 and 2 through one projection buffer: qkv <- the Q, K, V
 * projections side by side (rows, width), one product of x with the three
 * weights stacked; merged <- attention per item over its heads' columns. */
static attnc_status project_then_attend(const attnc_self_attention_args *s, const module_sizes *m, char *qkv,
                                        char *merged)
{
    attnc_gemm_args qkv_args = qkv_product(s, m, qkv);
    attnc_status status = m->kernels->gemm(&qkv_args);
    if (status != ATTNC_OK) return status;
    attnc_attention_args a;
    head_view(s, m, qkv, merged, &a);
    a.weights = s->weights;
    a.lse = s->lse;
    return m->kernels->attention(&a);
}

/* Up to this many bytes of projections and merged heads, a forward that
 * keeps nothing computes all its items at once; beyond, it goes through
 * them in chunks of its first batch dim that each fit (forward_by_chunks),
 * so that its buffers stay among the blocks alloc.c keeps (64 MiB in all)
 * instead of being faulted in again, zeroed, on every call. A float64
 * MultiHeadAttention(768, 12) on x (8, 512, 768) (75 MB of projections,
 * 25 MB merged) spent 10 % of its time in the kernel's page clearing. On
 * 2 threads of a Xeon family 6 model 167, by chunks (medians of 5-7 runs
 * against one buffer): that module 0.91x the time, float32 (4, 1024, 1024)
 * 0.84x, (16, 512, 768) 0.93x, (8, 512, 768) (50 MB, which the kept blocks
 * held) 1.00x, float64 (4, 256, 1024) (34 MB) 1.00x; chunks of 16 MiB and
 * 40 MiB no better (benchmarks/NOTES.md). Each row's products and each
 * item's attention are the same operations in either case: the same bits. */
#define WHOLE_FORWARD_MAX_BYTES ((size_t)32 << 20)

/* The forward of s by chunks of its first batch dim (items along the
 * others whole), each at most WHOLE_FORWARD_MAX_BYTES of buffers (or one
 * index of that dim), as even as whole indices go, the first of the
 * largest: each later chunk's buffers are then blocks the one before freed
 * (alloc.c hands a kept block only to a request it holds; smallest first,
 * 385 items in 96, 96, 96, 97 had two sets of buffers live: a (385, 64,
 * 256) SelfAttentionV1 peaked at 37 MiB past its output, 21 now, as 388
 * items in four chunks of 97); 0 (not run) if s has no such dim to cut or
 * fits whole. */
static int forward_by_chunks(const attnc_self_attention_args *s, const module_sizes *m, attnc_status *status)
{
    int nd = s->batch.ndim;
    if (s->keep_qkv || s->keep_merged || s->lse || s->dropout_p != 0 || nd < 2 || s->batch.shape[0] < 2) return 0;
    double bytes = (double)m->rows * (double)(m->width + m->Dv) * (double)m->elem;
    if (bytes <= (double)WHOLE_FORWARD_MAX_BYTES) return 0;
    idx_t first = s->batch.shape[0], items_per_index = 1;
    for (int d = 1; d < nd - 1; d++) items_per_index *= s->batch.shape[d];
    idx_t per_chunk = (idx_t)((double)WHOLE_FORWARD_MAX_BYTES / (bytes / (double)first));
    if (per_chunk < 1) per_chunk = 1;
    idx_t chunks = attnc_ceil_div(first, per_chunk), rows_per_index = items_per_index * s->T;
    idx_t heads = s->batch.shape[nd - 1];
    *status = ATTNC_OK;
    for (idx_t c = 0, b0 = 0; c < chunks && *status == ATTNC_OK; c++) {
        idx_t b1 = attnc_ceil_div(first * (c + 1), chunks), r0 = b0 * rows_per_index;
        attnc_self_attention_args chunk = *s;
        chunk.batch.shape[0] = b1 - b0;
        chunk.x = (const char *)s->x + (size_t)(r0 * s->C) * m->elem;
        chunk.out = (char *)s->out + (size_t)(r0 * (s->w_out ? s->n_out : m->Dv)) * m->elem;
        if (s->mask) chunk.mask = s->mask + b0 * s->mask_batch_strides[0];
        if (s->weights)
            chunk.weights = (char *)s->weights + (size_t)(b0 * items_per_index * heads * s->T * s->T) * m->elem;
        *status = attnc_self_attention(&chunk);
        b0 = b1;
    }
    return 1;
}

attnc_status attnc_self_attention(const attnc_self_attention_args *s)
{
    module_sizes m;
    idx_t merged_size = 0;
    if (!sizes_of(s, &m) || !attnc_mul_ok(m.rows, m.Dv, &merged_size)) return ATTNC_EOVERFLOW;
    attnc_status chunked;
    if (forward_by_chunks(s, &m, &chunked)) return chunked;

    /* an inference forward (nothing kept, no dropout) of short items on
     * more than one thread: a task per item or group of its heads, no
     * projection buffer */
    double qkv_flops = 2.0 * (double)m.rows * (double)s->C * (double)m.width;
    double attention_flops = 2.0 * (double)m.rows * (double)s->T * (double)(s->dim[ATTNC_Q] + m.Dv);
    int threads = attnc_threads_for(qkv_flops + attention_flops);
    idx_t items = m.rows > 0 ? m.rows / s->T : 0;
    double item_bytes = (double)s->T * (double)s->C * (double)m.elem;
    int inference = threads > 1 && !s->keep_qkv && !s->keep_merged && !s->lse && s->dropout_p == 0 && m.rows > 0;
    int by_groups = inference && items >= threads && items % threads == 0 &&
                    items / threads * s->T >= ITEM_TASK_MIN_ROWS &&
                    item_bytes * (double)(items / threads) <= ITEM_GROUP_MAX_X_BYTES;
    /* (a frozen module's products read its packs: all rows in one product, split by columns,
     * took 0.73-0.79x the time of a task per item or head group at (1, 8, 768) on 2 threads) */
    int by_items = by_groups || (inference && item_bytes <= ITEM_TASK_MAX_X_BYTES && !packs_of(s, &m) &&
                                 (items < threads || s->T >= ITEM_TASK_MIN_ROWS));
    int projected_out = 0;
    attnc_status status = ATTNC_ENOMEM;
    char *qkv = s->keep_qkv ? s->keep_qkv : by_items ? NULL : attnc_malloc((size_t)(m.rows * m.width) * m.elem);
    char *merged = s->keep_merged ? s->keep_merged : s->w_out ? attnc_malloc((size_t)merged_size * m.elem) : s->out;
    if ((!qkv && !by_items) || !merged) goto done;
    status = by_items ? attend_by_items(s, &m, merged, qkv_flops + attention_flops, threads, by_groups, &projected_out)
                      : project_then_attend(s, &m, qkv, merged);
    if (status != ATTNC_OK || projected_out) goto done;
    if (!s->w_out) {
        if (merged != s->out) memcpy(s->out, merged, (size_t)merged_size * m.elem);
        goto done;
    }

    /* pass 3: output projection */
    attnc_gemm_args out_args = out_product(s, &m, merged);
    status = m.kernels->gemm(&out_args);
done:
    if (qkv != s->keep_qkv) attnc_free(qkv);
    if (merged != s->keep_merged && merged != s->out) attnc_free(merged);
    return status;
}

attnc_status attnc_pack_module(const attnc_self_attention_args *s, attnc_packed_module *p)
{
    module_sizes m;
    *p = (attnc_packed_module){NULL, NULL, NULL};
    if (!sizes_of(s, &m)) return ATTNC_EOVERFLOW;
    p->kernels = m.kernels;
    attnc_gemm_args qkv_args = qkv_product(s, &m, NULL), out_args = out_product(s, &m, NULL);
    attnc_status status = m.kernels->pack_weights(&qkv_args, &p->qkv);
    if (status == ATTNC_OK && s->w_out) status = m.kernels->pack_weights(&out_args, &p->out);
    if (status != ATTNC_OK) attnc_packed_module_free(p);
    return status;
}

void attnc_packed_module_free(attnc_packed_module *p)
{
    attnc_free(p->qkv);
    attnc_free(p->out);
    p->qkv = p->out = NULL;
}

/* The backward's stacked copy of separate Q, K, V weights, by tasks of
 * STACK_TASK_BYTES on the pool's threads: one thread copying the 7 MB of a
 * MultiHeadAttention(768)'s weights was 1.0 % of a training step's samples,
 * the other core waiting (benchmarks/NOTES.md). */
#define STACK_TASK_BYTES ((size_t)256 * 1024)

typedef struct {
    const char *parts[3];
    size_t part_bytes[3];
    char *stack;
} stack_job;

/* Task = bytes [t STACK_TASK_BYTES, (t + 1) STACK_TASK_BYTES) of the stack,
 * from the parts they fall in. */
static void stack_task(void *ctx, idx_t t)
{
    const stack_job *job = ctx;
    size_t start = (size_t)t * STACK_TASK_BYTES, end = start + STACK_TASK_BYTES, part_start = 0;
    for (int p = 0; p < 3; p++) {
        size_t part_end = part_start + job->part_bytes[p];
        size_t from = start > part_start ? start : part_start, to = end < part_end ? end : part_end;
        if (from < to) memcpy(job->stack + from, job->parts[p] + (from - part_start), to - from);
        part_start = part_end;
    }
}

attnc_status attnc_self_attention_backward(const attnc_self_attention_backward_args *g)
{
    const attnc_self_attention_args *s = &g->forward;
    module_sizes m;
    idx_t merged_size = 0, weights_size = 0;
    if (!sizes_of(s, &m) || !attnc_mul_ok(m.rows, m.Dv, &merged_size) || !attnc_mul_ok(m.width, s->C, &weights_size))
        return ATTNC_EOVERFLOW;
    /* the Q, K, V weights as one (width, C) matrix: in place when they are
     * the row blocks of one fused weight, else stacked into a copy */
    const char *w0 = s->w[ATTNC_Q];
    size_t q_bytes = (size_t)(s->dim[ATTNC_Q] * s->C) * m.elem, k_bytes = (size_t)(s->dim[ATTNC_K] * s->C) * m.elem;
    int stacked = (const char *)s->w[ATTNC_K] == w0 + q_bytes && (const char *)s->w[ATTNC_V] == w0 + q_bytes + k_bytes;

    attnc_status status = ATTNC_ENOMEM;
    char *dqkv = attnc_malloc((size_t)(m.rows * m.width) * m.elem);
    char *d_merged = s->w_out ? attnc_malloc((size_t)merged_size * m.elem) : (char *)g->grad_out;
    char *w_stack = stacked ? (char *)w0 : attnc_malloc((size_t)weights_size * m.elem);
    if (!dqkv || !d_merged || !w_stack) goto done;
    if (!stacked) {
        size_t v_bytes = (size_t)(s->dim[ATTNC_V] * s->C) * m.elem, total = q_bytes + k_bytes + v_bytes;
        stack_job job = {{s->w[ATTNC_Q], s->w[ATTNC_K], s->w[ATTNC_V]}, {q_bytes, k_bytes, v_bytes}, w_stack};
        attnc_parallel_for((idx_t)((total + STACK_TASK_BYTES - 1) / STACK_TASK_BYTES), (double)total, stack_task,
                           &job);
        if (attnc_interrupted()) {
            status = ATTNC_EINTR;
            goto done;
        }
    }

    if (s->w_out) { /* the output projection's gradients */
        attnc_gemm_args d_merged_args = {
            .M = m.rows, .K = s->n_out, .a = g->grad_out, .a_rs = s->n_out, .a_cs = 1,
            .n_parts = 1, .parts = {{s->w_out, NULL, m.Dv}}, .b_rs = 1, .b_cs = m.Dv, .c = d_merged, .c_rs = m.Dv,
        };
        attnc_gemm_args d_w_out_args = {
            .M = s->n_out, .K = m.rows, .a = g->grad_out, .a_rs = 1, .a_cs = s->n_out,
            .n_parts = 1, .parts = {{g->merged, NULL, m.Dv}}, .b_rs = 1, .b_cs = m.Dv, .c = g->grad_w_out,
            .c_rs = m.Dv,
        };
        if ((status = m.kernels->gemm(&d_merged_args)) != ATTNC_OK ||
            (status = m.kernels->gemm(&d_w_out_args)) != ATTNC_OK ||
            (g->grad_bias_out && (status = m.kernels->column_sums(&(attnc_column_sums_args){
                                      .g = g->grad_out, .rows = m.rows, .n = s->n_out, .g_rs = s->n_out,
                                      .sums = g->grad_bias_out})) != ATTNC_OK))
            goto done;
    }

    /* attention backward over the heads, into dqkv laid out as qkv */
    attnc_attention_args grads; /* the same strides over the gradient buffers */
    head_view(s, &m, dqkv, d_merged, &grads);
    attnc_attention_backward_args b = {
        .grad_out = grads.out, .lse = g->lse, .grad_q = grads.q, .grad_k = grads.k, .grad_v = grads.v,
    };
    head_view(s, &m, g->qkv, (char *)g->merged, &b.forward);
    if ((status = m.kernels->attention_backward(&b)) != ATTNC_OK) goto done;

    /* the projections' gradients */
    attnc_gemm_args d_x_args = {
        .M = m.rows, .K = m.width, .a = dqkv, .a_rs = m.width, .a_cs = 1,
        .n_parts = 1, .parts = {{w_stack, NULL, s->C}}, .b_rs = 1, .b_cs = s->C, .c = g->grad_x, .c_rs = s->C,
    };
    attnc_gemm_args d_w_args = {
        .M = m.width, .K = m.rows, .a = dqkv, .a_rs = 1, .a_cs = m.width,
        .n_parts = 1, .parts = {{s->x, NULL, s->C}}, .b_rs = 1, .b_cs = s->C, .c = g->grad_w, .c_rs = s->C,
    };
    if ((status = m.kernels->gemm(&d_x_args)) != ATTNC_OK || (status = m.kernels->gemm(&d_w_args)) != ATTNC_OK)
        goto done;
    if (g->grad_bias)
        status = m.kernels->column_sums(&(attnc_column_sums_args){
            .g = dqkv, .rows = m.rows, .n = m.width, .g_rs = m.width, .sums = g->grad_bias});
done:
    attnc_free(dqkv);
    if (s->w_out) attnc_free(d_merged);
    if (!stacked) attnc_free(w_stack);
    return status;
}
