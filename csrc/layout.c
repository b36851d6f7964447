/* Broadcast batch layouts as offset tables: one offset per item, so the
 * kernels read any broadcast or strided batch with a single indirection. */
#include "attnc.h"

void attnc_broadcast_offsets(int ndim, const idx_t *shape, const idx_t *strides, idx_t *offsets)
{
    idx_t count = 1;
    for (int d = 0; d < ndim; d++) count *= shape[d];
    /* odometer over the multi-index, last dimension fastest */
    idx_t index[64] = {0};
    idx_t offset = 0;
    for (idx_t t = 0; t < count; t++) {
        offsets[t] = offset;
        for (int d = ndim - 1; d >= 0; d--) {
            if (++index[d] < shape[d]) {
                offset += strides[d];
                break;
            }
            offset -= (shape[d] - 1) * strides[d];
            index[d] = 0;
        }
    }
}
