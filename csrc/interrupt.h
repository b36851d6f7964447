/* The state of one call, shared by its calling thread and the pool
 * workers that help it (interrupt.c, threads.c only). */
#ifndef ATTNC_INTERRUPT_H
#define ATTNC_INTERRUPT_H

#include <stdatomic.h>

#include "attnc.h"

typedef struct {
    attnc_interrupt_hook hook;
    atomic_int stop;
    long long next_poll_ns;
} attnc_call;

/* The call this thread works for (NULL outside one). */
attnc_call *attnc_current_call(void);
/* A worker takes part in `call` (NULL: leaves it). */
void attnc_join_call(attnc_call *call);

#endif
