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
/* Reading the clock costs about as much as a short row: look at it only
 * every this many questions. */
#define QUESTIONS_PER_CLOCK 16

static _Thread_local attnc_call *current;
static _Thread_local int is_caller, questions;

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void attnc_call_begin(attnc_call *call, const attnc_interrupt_hook *hook)
{
    call->hook = hook && hook->poll ? *hook : (attnc_interrupt_hook){NULL, NULL};
    atomic_store(&call->stop, 0);
    call->forked = 0;
    call->next_poll_ns = now_ns() + POLL_INTERVAL_NS;
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

int attnc_interrupted(void)
{
    attnc_call *call = current;
    if (!call) return 0;
    if (atomic_load_explicit(&call->stop, memory_order_relaxed)) return 1;
    if (!is_caller || !call->hook.poll || ++questions % QUESTIONS_PER_CLOCK) return 0;
    long long t = now_ns();
    if (t < call->next_poll_ns) return 0;
    if (call->hook.poll(call->hook.ctx)) atomic_store(&call->stop, 1);
    call->next_poll_ns = now_ns() + POLL_INTERVAL_NS;
    return atomic_load(&call->stop);
}
