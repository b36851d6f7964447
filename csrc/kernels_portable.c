/* The kernels for any CPU: portable C with 16-byte vectors (SSE2 on x86-64). */
#define ATTNC_ISA portable
#include "kernel_bundle.h"
