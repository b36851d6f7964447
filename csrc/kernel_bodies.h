/* Every kernel body, for the dtype the includer has just named
 * (ATTNC_REAL_F32, ...): included once per dtype by kernel_bundle.h. */
#include "dtype.h"
#include "simd.h"
#include "storage.h"
#include "vexp.h"
#include "gemm_impl.h"
#include "attention_tiles.h"
#include "attention_rows.h"
#include "attention_impl.h"
#include "attention_backward_impl.h"
#include "softmax_impl.h"
#include "dropout_impl.h"
#include "dtype_end.h"
