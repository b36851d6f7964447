/* A whole attention module forward: the Q, K, V projections as one
 * product, attention over heads (as strides into the projection buffer),
 * output projection; every step through the kernel table. */
#include "attnc.h"

attnc_status attnc_self_attention(const attnc_self_attention_args *s)
{
    const attnc_kernels *kernels = attnc_kernels_for(s->dtype);
    size_t elem = s->dtype == ATTNC_F32 ? sizeof(float) : sizeof(double);
    int nd = s->batch.ndim; /* leading dims of x, then heads */
    idx_t H = s->batch.shape[nd - 1], B = 1;
    for (int d = 0; d < nd - 1; d++) B *= s->batch.shape[d]; /* x holds them: no overflow */
    idx_t rows = B * s->T, width = s->dim[ATTNC_Q] + s->dim[ATTNC_K] + s->dim[ATTNC_V], qkv_size, merged_size;
    if (!attnc_mul_ok(rows, width, &qkv_size) || !attnc_mul_ok(rows, s->dim[ATTNC_V], &merged_size) ||
        (size_t)qkv_size > SIZE_MAX / elem || (size_t)merged_size > SIZE_MAX / elem)
        return ATTNC_EOVERFLOW;

    attnc_status status = ATTNC_ENOMEM;
    char *qkv = attnc_malloc((size_t)qkv_size * elem);
    char *merged = s->w_out ? attnc_malloc((size_t)merged_size * elem) : s->out;
    if (!qkv || !merged) goto done;

    /* pass 1: Q, K, V projections side by side in one (rows, width) buffer,
     * one product of x with the three weights stacked */
    attnc_gemm_args qkv_args = {
        .M = rows, .K = s->C, .a = s->x, .a_rs = s->C, .a_cs = 1, .n_parts = 3,
        .parts = {{s->w[ATTNC_Q], s->bias[ATTNC_Q], s->dim[ATTNC_Q]},
                  {s->w[ATTNC_K], s->bias[ATTNC_K], s->dim[ATTNC_K]},
                  {s->w[ATTNC_V], s->bias[ATTNC_V], s->dim[ATTNC_V]}},
        .b_rs = s->C, .b_cs = 1, .c = qkv, .c_rs = width,
    };
    if ((status = kernels->gemm(&qkv_args)) != ATTNC_OK) goto done;

    /* pass 2: attention per item (leading dims..., head); the heads are
     * column blocks of the buffer, merged in place in the output rows */
    idx_t head_qk = s->dim[ATTNC_Q] / H, head_v = s->dim[ATTNC_V] / H;
    attnc_attention_args a = {
        .batch = s->batch, .L = s->T, .S = s->T, .E = head_qk, .Ev = head_v,
        .q = {qkv, {0}, width},
        .k = {qkv + (size_t)s->dim[ATTNC_Q] * elem, {0}, width},
        .v = {qkv + (size_t)(s->dim[ATTNC_Q] + s->dim[ATTNC_K]) * elem, {0}, width},
        .mask = s->mask, .mask_rs = s->mask_rs, .mask_cs = s->mask_cs,
        .scale = s->scale, .dropout_p = s->dropout_p, .seed = s->seed,
        .out = {merged, {0}, s->dim[ATTNC_V]}, .weights = s->weights,
    };
    /* strides of the leading dims (C order over the flattened rows) and heads */
    idx_t inner_rows = s->T;
    for (int d = nd - 2; d >= 0; d--) {
        a.q.batch_strides[d] = a.k.batch_strides[d] = a.v.batch_strides[d] = inner_rows * width;
        a.out.batch_strides[d] = inner_rows * s->dim[ATTNC_V];
        inner_rows *= s->batch.shape[d];
    }
    a.q.batch_strides[nd - 1] = a.k.batch_strides[nd - 1] = head_qk;
    a.v.batch_strides[nd - 1] = a.out.batch_strides[nd - 1] = head_v;
    for (int d = 0; d < nd; d++) a.mask_batch_strides[d] = s->mask_batch_strides[d];
    if ((status = kernels->attention(&a)) != ATTNC_OK || !s->w_out) goto done;

    /* pass 3: output projection */
    attnc_gemm_args out_args = {
        .M = rows, .K = s->dim[ATTNC_V], .a = merged, .a_rs = s->dim[ATTNC_V], .a_cs = 1,
        .n_parts = 1, .parts = {{s->w_out, s->bias_out, s->n_out}}, .b_rs = s->dim[ATTNC_V], .b_cs = 1,
        .c = s->out, .c_rs = s->n_out,
    };
    status = kernels->gemm(&out_args);
done:
    attnc_free(qkv);
    if (s->w_out) attnc_free(merged);
    return status;
}
