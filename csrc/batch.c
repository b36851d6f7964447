/* Broadcast batches of matrices, walked without offset tables. */
#include "attnc.h"

idx_t attnc_item_offset(const attnc_batch *batch, const idx_t *batch_strides, idx_t item)
{
    idx_t offset = 0;
    for (int d = batch->ndim - 1; d >= 0; d--) { /* C order: the last dim fastest */
        offset += item % batch->shape[d] * batch_strides[d];
        item /= batch->shape[d];
    }
    return offset;
}
