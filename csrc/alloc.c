/* Checked size arithmetic and the one allocator every kernel uses.
 * The failure-injection counter lets tests prove that every allocation
 * failure becomes a clean MemoryError with nothing leaked. */
#include <stdatomic.h>
#include <stdlib.h>

#include "attnc.h"

#define ATTNC_ALIGNMENT 64 /* a cache line; also enough for any vector load */

static atomic_long allocs_until_failure = -1; /* < 0: never fail */

int attnc_mul_ok(idx_t a, idx_t b, idx_t *out)
{
    if (a < 0 || b < 0) return 0;
    if (a != 0 && b > PTRDIFF_MAX / a) return 0;
    *out = a * b;
    return 1;
}

void attnc_fail_alloc_after(long n) { atomic_store(&allocs_until_failure, n); }

void *attnc_malloc(size_t n_bytes)
{
    long left = atomic_load(&allocs_until_failure);
    while (left >= 0) {
        if (left == 0) return NULL;
        if (atomic_compare_exchange_weak(&allocs_until_failure, &left, left - 1)) break;
    }
    size_t rounded = (n_bytes + ATTNC_ALIGNMENT - 1) / ATTNC_ALIGNMENT * ATTNC_ALIGNMENT;
    if (rounded < n_bytes) return NULL;
    return aligned_alloc(ATTNC_ALIGNMENT, rounded ? rounded : ATTNC_ALIGNMENT);
}

void attnc_free(void *p) { free(p); }
