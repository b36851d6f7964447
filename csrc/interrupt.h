/* Which call a thread works for (interrupt.c, threads.c only; the call's
 * state, attnc_call, is in attnc.h: the bindings keep it on their stack). */
#ifndef ATTNC_INTERRUPT_H
#define ATTNC_INTERRUPT_H

#include "attnc.h"

/* The call this thread works for (NULL outside one). */
attnc_call *attnc_current_call(void);
/* A worker takes part in `call` (NULL: leaves it). */
void attnc_join_call(attnc_call *call);
/* In a child forked by this thread mid-job: stop its calls, marked forked. */
void attnc_stop_calls_after_fork(void);
/* attnc_interrupted for a caller that has just waited (for its workers):
 * it reads the clock at once, where questions counted as cheap ones before
 * the wait would let up to MAX_QUESTIONS_PER_CLOCK waits pass unpolled. */
int attnc_interrupted_after_wait(void);

#endif
