/* Checked size arithmetic and the one allocator every kernel uses: 64-byte
 * aligned blocks, the large ones kept for the next call.
 *
 * A call's work buffers (the Q, K, V projections, packed GEMM operands,
 * attention workspaces) are 64 KB to tens of MB, allocated and freed on
 * every call. The C library hands blocks that large back to the system
 * (munmap, or a trimmed heap), so the next call faulted every page in again:
 * 2.5 MB per (2, 128, 256) module call, which then took 1.5x as long as its
 * parts (benchmarks/NOTES.md). So a freed block of at least ATTNC_KEPT_MIN_BYTES
 * is kept instead (up to CACHE_SLOTS blocks and CACHE_MAX_BYTES in all, the
 * oldest let go first) and given to the next request it fits with no more
 * than half of it to spare: the smallest such block, and of blocks of one
 * size the one this thread (attnc_thread_index) freed, so that a task's
 * buffer is the one its core wrote in the call before, not the other
 * core's (the lines then come from that core's cache: on a host whose two
 * vCPUs sat on different core complexes, the tasks of a (2, 128, 256)
 * module by item groups took 0.85 ms with this choice against 0.95 with
 * the oldest block). Memory kept between calls is thus bounded by
 * CACHE_MAX_BYTES whatever the calls. A kept block is unaddressable to ASan
 * and valgrind until it is handed out again, and then uninitialised, as a
 * new block would be.
 *
 * The output arrays attnc returns of ATTNC_KEPT_MIN_BYTES or more are
 * allocated here too (NumPy's memory handler in bindings.c), so that an
 * output freed by the caller serves the next call in the same way.
 *
 * New blocks of several MB are asked for in transparent huge pages.
 *
 * The failure-injection counter lets tests prove that every allocation
 * failure becomes a clean MemoryError with nothing leaked. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "attnc.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define MARK_KEPT(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define MARK_REUSED(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#elif defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#define MARK_KEPT(p, n) VALGRIND_MAKE_MEM_NOACCESS(p, n)
#define MARK_REUSED(p, n) VALGRIND_MAKE_MEM_UNDEFINED(p, n)
#endif
#endif
#ifndef MARK_KEPT
#define MARK_KEPT(p, n) ((void)(p), (void)(n))
#define MARK_REUSED(p, n) ((void)(p), (void)(n))
#endif

#define ATTNC_ALIGNMENT 64 /* a cache line; also enough for any vector load */
/* Each block starts with a header of one alignment unit: its size, which
 * attnc_free keeps it by, and the bytes handed out of it (a kept block serves
 * requests down to half its size), which attnc_realloc copies: only those
 * are addressable to ASan and valgrind. */
typedef struct {
    size_t bytes;
    size_t handed_out;
} block_header;
#define HEADER_BYTES ATTNC_ALIGNMENT
_Static_assert(sizeof(block_header) <= HEADER_BYTES, "a block's header fits before its aligned start");
#define CACHE_MAX_BYTES ((size_t)64 << 20)
#define CACHE_SLOTS 16

/* A new block of at least this much is asked to be backed by transparent huge pages (as
 * NumPy asks for its own arrays of 4 MB or more, attnc's outputs among them): a
 * block too large for the cache (a float64 module's (4096, 2304) projections, 75 MB) was
 * faulted in again on every call, 4 KB at a time. In 2 MB pages: MultiHeadAttention(768, 12)
 * in float64 on x (8, 512, 768) 0.91x the time, in float32 0.986x, `linear` (4096, 768,
 * 2304) 0.986x (its packed weights, 7 MB, in fewer TLB entries); the same peak RSS
 * (benchmarks/NOTES.md). */
#define HUGE_PAGES_MIN_BYTES ((size_t)4 << 20)

static atomic_long allocs_until_failure = -1; /* < 0: never fail */
static atomic_int fail_once;                  /* the failing allocation's successors succeed */

/* The kept blocks, oldest first, and their total size; under cache_lock. */
static struct {
    char *block;
    size_t bytes;
    int thread; /* attnc_thread_index() of the thread that freed it */
} kept[CACHE_SLOTS];
static int n_kept;
static size_t kept_bytes;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t fork_handlers_once = PTHREAD_ONCE_INIT;

/* A fork while another thread holds the lock would leave it locked in the
 * child: the forking thread takes it first, and both sides release it. */
static void lock_cache(void) { attnc_lock_briefly_held(&cache_lock); }
static void unlock_cache(void) { pthread_mutex_unlock(&cache_lock); }
static void register_fork_handlers(void) { pthread_atfork(lock_cache, unlock_cache, unlock_cache); }

int attnc_mul_ok(idx_t a, idx_t b, idx_t *out)
{
    if (a < 0 || b < 0) return 0;
    if (a != 0 && b > PTRDIFF_MAX / a) return 0;
    *out = a * b;
    return 1;
}

long attnc_fail_alloc_after(long n, int once)
{
    long left = atomic_exchange(&allocs_until_failure, -1);
    atomic_store(&fail_once, once);
    atomic_store(&allocs_until_failure, n);
    return left;
}

static block_header *header_of(char *block) { return (block_header *)(block - HEADER_BYTES); }

/* Drop kept[i], keeping the order of the rest. */
static void forget_kept(int i)
{
    kept_bytes -= kept[i].bytes;
    for (n_kept--; i < n_kept; i++) kept[i] = kept[i + 1];
}

/* The smallest kept block of `bytes` to 2 * bytes, this thread's among
 * those of that size, taken out; NULL if none. */
static char *take_kept(size_t bytes)
{
    pthread_once(&fork_handlers_once, register_fork_handlers);
    lock_cache();
    int best = -1, me = attnc_thread_index();
    for (int i = 0; i < n_kept; i++)
        if (kept[i].bytes >= bytes && kept[i].bytes / 2 <= bytes &&
            (best < 0 || kept[i].bytes < kept[best].bytes ||
             (kept[i].bytes == kept[best].bytes && kept[i].thread == me && kept[best].thread != me)))
            best = i;
    char *block = best < 0 ? NULL : kept[best].block;
    if (best >= 0) forget_kept(best);
    unlock_cache();
    if (block) {
        header_of(block)->handed_out = bytes;
        MARK_REUSED(block, bytes);
    }
    return block;
}

void attnc_ask_for_huge_pages(void *block, size_t bytes)
{
#ifdef MADV_HUGEPAGE
    char *start = block;
    if (bytes < HUGE_PAGES_MIN_BYTES) return;
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) return;
    uintptr_t first = ((uintptr_t)start + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
    uintptr_t end = ((uintptr_t)start + bytes) / (uintptr_t)page * (uintptr_t)page;
    int saved_errno = errno; /* the allocation succeeded: a refusal leaves no trace */
    if (end > first) (void)madvise((void *)first, end - first, MADV_HUGEPAGE); /* refused: 4 KB pages, as before */
    errno = saved_errno;
#else
    (void)block, (void)bytes;
#endif
}

void *attnc_malloc(size_t n_bytes)
{
    long left = atomic_load(&allocs_until_failure);
    while (left >= 0) {
        if (left == 0 && !atomic_load(&fail_once)) return NULL;
        /* (once: of the threads that find 0, the one that ends the countdown fails) */
        if (atomic_compare_exchange_weak(&allocs_until_failure, &left, left == 0 ? -1 : left - 1)) {
            if (left == 0) return NULL;
            break;
        }
    }
    size_t rounded = (n_bytes + ATTNC_ALIGNMENT - 1) / ATTNC_ALIGNMENT * ATTNC_ALIGNMENT;
    if (rounded < n_bytes || rounded > SIZE_MAX - HEADER_BYTES) return NULL;
    if (rounded == 0) rounded = ATTNC_ALIGNMENT;
    char *block = rounded >= ATTNC_KEPT_MIN_BYTES ? take_kept(rounded) : NULL;
    if (block) return block;
    char *start = aligned_alloc(ATTNC_ALIGNMENT, HEADER_BYTES + rounded);
    if (!start) return NULL;
    attnc_ask_for_huge_pages(start, HEADER_BYTES + rounded);
    *(block_header *)start = (block_header){.bytes = rounded, .handed_out = rounded};
    return start + HEADER_BYTES;
}

void *attnc_realloc(void *p, size_t n_bytes)
{
    void *moved = attnc_malloc(n_bytes);
    if (p && moved) {
        size_t old = header_of(p)->handed_out;
        memcpy(moved, p, old < n_bytes ? old : n_bytes);
        attnc_free(p);
    }
    return moved; /* NULL: p untouched */
}

void attnc_free(void *p)
{
    if (!p) return;
    char *block = p, *let_go[CACHE_SLOTS + 1];
    size_t bytes = header_of(block)->bytes;
    int n_let_go = 0;
    if (bytes < ATTNC_KEPT_MIN_BYTES || bytes > CACHE_MAX_BYTES) {
        let_go[n_let_go++] = block;
    } else {
        MARK_KEPT(block, bytes);
        pthread_once(&fork_handlers_once, register_fork_handlers);
        lock_cache();
        while (n_kept == CACHE_SLOTS || kept_bytes + bytes > CACHE_MAX_BYTES) {
            let_go[n_let_go++] = kept[0].block;
            forget_kept(0);
        }
        kept[n_kept].block = block, kept[n_kept].bytes = bytes, kept[n_kept].thread = attnc_thread_index();
        kept_bytes += bytes, n_kept++;
        unlock_cache();
    }
    for (int i = 0; i < n_let_go; i++) free(let_go[i] - HEADER_BYTES);
}
