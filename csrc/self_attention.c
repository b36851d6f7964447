/* A whole attention module forward: projections, attention over heads
 * (as strides into the projection buffer), output projection. */
#include "attnc.h"

typedef struct {
    idx_t *q, *k, *v, *out; /* (B*H) offsets each */
} item_offsets;

/* Offsets of head h of batch element b in the (B*T, width) projection
 * buffer and in the merged (B*T, Dv) output. */
static void fill_offsets(item_offsets o, const attnc_self_attention_args *s, idx_t width)
{
    idx_t head_qk = s->dim[0] / s->H, head_v = s->dim[2] / s->H;
    for (idx_t b = 0; b < s->B; b++)
        for (idx_t h = 0; h < s->H; h++) {
            idx_t item = b * s->H + h, row0 = b * s->T * width;
            o.q[item] = row0 + h * head_qk;
            o.k[item] = row0 + s->dim[0] + h * head_qk;
            o.v[item] = row0 + s->dim[0] + s->dim[1] + h * head_v;
            o.out[item] = b * s->T * s->dim[2] + h * head_v;
        }
}

attnc_status attnc_self_attention(const attnc_self_attention_args *s)
{
    size_t elem = s->dtype == ATTNC_F32 ? sizeof(float) : sizeof(double);
    idx_t rows, width = s->dim[0] + s->dim[1] + s->dim[2], n_items, qkv_size, merged_size;
    if (!attnc_mul_ok(s->B, s->T, &rows) || !attnc_mul_ok(rows, width, &qkv_size) ||
        !attnc_mul_ok(rows, s->dim[2], &merged_size) || !attnc_mul_ok(s->B, s->H, &n_items) ||
        (size_t)qkv_size > SIZE_MAX / elem || (size_t)merged_size > SIZE_MAX / elem ||
        (size_t)n_items > SIZE_MAX / (4 * sizeof(idx_t)))
        return ATTNC_EOVERFLOW;

    attnc_status status = ATTNC_ENOMEM;
    char *qkv = attnc_malloc((size_t)qkv_size * elem);
    idx_t *offsets = attnc_malloc((size_t)n_items * 4 * sizeof(idx_t));
    char *merged = s->w_out ? attnc_malloc((size_t)merged_size * elem) : s->out;
    if (!qkv || !offsets || !merged) goto done;

    /* pass 1: Q, K, V projections side by side in one buffer */
    for (int p = 0; p < 3; p++) {
        idx_t first_column = p == 0 ? 0 : (p == 1 ? s->dim[0] : s->dim[0] + s->dim[1]);
        status = attnc_gemm(s->dtype, rows, s->dim[p], s->C, s->x, s->C, 1, s->w[p], s->C, 1,
                            s->bias[p], qkv + (size_t)first_column * elem, width);
        if (status != ATTNC_OK) goto done;
    }

    /* pass 2: attention per (batch element, head), merged heads written in place */
    item_offsets o = {offsets, offsets + n_items, offsets + 2 * n_items, offsets + 3 * n_items};
    fill_offsets(o, s, width);
    attnc_attention_args a = {
        .dtype = s->dtype, .n_items = n_items, .L = s->T, .S = s->T,
        .E = s->dim[0] / s->H, .Ev = s->dim[2] / s->H,
        .q = qkv, .q_off = o.q, .q_rs = width,
        .k = qkv, .k_off = o.k, .k_rs = width,
        .v = qkv, .v_off = o.v, .v_rs = width,
        .mask = s->mask, .mask_off = s->mask_off, .mask_rs = s->mask_rs, .mask_cs = s->mask_cs,
        .is_causal = 0, .scale = s->scale, .dropout_p = s->dropout_p, .seed = s->seed,
        .out = merged, .out_off = o.out, .out_rs = s->dim[2], .weights = s->weights,
    };
    status = attnc_attention(&a);
    if (status != ATTNC_OK || !s->w_out) goto done;

    /* pass 3: output projection */
    status = attnc_gemm(s->dtype, rows, s->n_out, s->dim[2], merged, s->dim[2], 1, s->w_out,
                        s->dim[2], 1, s->bias_out, s->out, s->n_out);
done:
    attnc_free(qkv);
    attnc_free(offsets);
    if (s->w_out) attnc_free(merged);
    return status;
}
