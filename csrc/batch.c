/* Broadcast batches of matrices, walked without offset tables. */
#include "attnc.h"

void attnc_item_offsets(const attnc_batch *batch, idx_t item, int n_sets, const idx_t *const *batch_strides,
                        idx_t *offsets)
{
    for (int s = 0; s < n_sets; s++) offsets[s] = 0;
    for (int d = batch->ndim - 1; d >= 0; d--) { /* C order: the last dim fastest */
        idx_t index = item % batch->shape[d];
        for (int s = 0; s < n_sets; s++) offsets[s] += index * batch_strides[s][d];
        item /= batch->shape[d];
    }
}

idx_t attnc_item_offset(const attnc_batch *batch, const idx_t *batch_strides, idx_t item)
{
    idx_t offset;
    attnc_item_offsets(batch, item, 1, &batch_strides, &offset);
    return offset;
}
