/* Stopping a long call from its caller (Ctrl-C).
 *
 * The calling thread brackets a call with attnc_call_begin/end; the pool
 * hands the call's state to the workers of each job (threads.c). Kernels
 * ask attnc_interrupted() between tiles or rows; on the calling thread that
 * also polls the hook (the bindings: take the GIL, run Python's signal
 * handlers) at most every POLL_INTERVAL, and a nonzero answer stops every
 * thread of the call at its next question. */
#include <stdatomic.h>
#include <time.h>

#include "attnc.h"
#include "interrupt.h"

/* Ctrl-C should stop a call within a fraction of the 0.2 s users notice. */
#define POLL_INTERVAL_NS 20000000LL
/* A question may come after as little work as a short row or after
 * milliseconds of it (a key tile for a thousand queries; many times that
 * under a sanitizer or on a loaded CPU). The caller reads the clock (Linux's
 * coarse one: about 10 ns, in ticks of a few ms) every questions_per_clock
 * questions: doubled, up to MAX_QUESTIONS_PER_CLOCK, while readings come
 * less than CLOCK_GAP_NS apart (with the coarse clock: in the same tick),
 * and back to 1 as soon as two come further apart. Cheap questions then pay
 * a reading every 4, and slow ones are polled about one question after
 * the interval (at most 4 where a call turns from cheap questions to slow
 * ones). The cap was 16: a softmax row's chunks can turn from 0.3 ms to a
 * few ms when the host is slow to give fresh pages, and 16 of them would run
 * past the interval (the likely cause, not reproduced, of Ctrl-C 0.11 s late
 * in two CI runs, 2026-12-07). A reading costs about 10 ns; the cheapest
 * questions, a product's slivers of x, about 2.5 us ((4096, 256) by
 * (256, 256)^T: 1376 questions in 3.4 ms on one thread). */
#define CLOCK_GAP_NS 1000000LL
#define MAX_QUESTIONS_PER_CLOCK 4
#ifdef CLOCK_MONOTONIC_COARSE
#define POLL_CLOCK CLOCK_MONOTONIC_COARSE
#else
#define POLL_CLOCK CLOCK_MONOTONIC
#endif

static _Thread_local attnc_call *current;
static _Thread_local int is_caller;

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(POLL_CLOCK, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void attnc_call_begin(attnc_call *call, const attnc_interrupt_hook *hook)
{
    call->hook = hook && hook->poll ? *hook : (attnc_interrupt_hook){NULL, NULL};
    atomic_store(&call->stop, 0);
    call->forked = 0;
    call->last_clock_ns = now_ns();
    call->next_poll_ns = call->last_clock_ns + POLL_INTERVAL_NS;
    call->questions = 0;
    call->questions_per_clock = 1;
    call->outer = current;
    call->outer_is_caller = is_caller;
    current = call;
    is_caller = 1;
}

void attnc_call_end(attnc_call *call)
{
    current = call->outer;
    is_caller = call->outer_is_caller;
}

attnc_call *attnc_current_call(void) { return current; }

void attnc_join_call(attnc_call *call) { current = call; }

void attnc_stop_calls_after_fork(void)
{
    for (attnc_call *call = current; call; call = call->outer) {
        call->forked = 1;
        atomic_store(&call->stop, 1);
    }
}

int attnc_interrupted_after_wait(void)
{
    attnc_call *call = current;
    if (call && is_caller) {
        call->questions = 0;
        call->questions_per_clock = 1;
    }
    return attnc_interrupted();
}

int attnc_interrupted(void)
{
    attnc_call *call = current;
    if (!call) return 0;
    if (atomic_load_explicit(&call->stop, memory_order_relaxed)) return 1;
    if (!is_caller || !call->hook.poll || ++call->questions < call->questions_per_clock) return 0;
    call->questions = 0;
    long long t = now_ns();
    if (t - call->last_clock_ns >= CLOCK_GAP_NS)
        call->questions_per_clock = 1;
    else if (call->questions_per_clock < MAX_QUESTIONS_PER_CLOCK)
        call->questions_per_clock *= 2;
    call->last_clock_ns = t;
    if (t < call->next_poll_ns) return 0;
    if (call->hook.poll(call->hook.ctx)) atomic_store(&call->stop, 1);
    call->next_poll_ns = now_ns() + POLL_INTERVAL_NS;
    return atomic_load(&call->stop);
}
