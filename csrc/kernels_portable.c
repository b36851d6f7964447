/* The attention and softmax kernels for any CPU (plain C; the compiler
 * vectorises with the baseline ISA, SSE2 on x86-64). */
#include "kernels.h"

#define ATTNC_REAL_F32
#include "dtype.h"
#include "ukernel_shape.h"
#include "vexp.h"
#include "attention_tiles.h"
#include "attention_impl.h"
#include "softmax_impl.h"
#include "dtype_end.h"

#define ATTNC_REAL_F64
#include "dtype.h"
#include "ukernel_shape.h"
#include "vexp.h"
#include "attention_tiles.h"
#include "attention_impl.h"
#include "softmax_impl.h"
#include "dtype_end.h"
