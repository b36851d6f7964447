/* A small persistent pthread pool (not OpenMP: PyTorch wheels bundle their
 * own libgomp, and libgomp hangs in a child after fork).
 *
 * One job at a time owns the pool; the caller works on its own job too. The
 * job's tasks are cut into one share a thread, in order (the caller's first,
 * then worker 0's, 1's, ...); a thread takes the tasks of its share one by
 * one from an atomic counter, then helps with the others' in turn. A call
 * repeated (a model's layers, a benchmark's loop) so gives each core the same
 * tasks, whose operands are still in its cache, however late a thread joins:
 * with one counter for all, the threads raced for them, and `linear` (32,
 * 256) x (768, 256)^T took 1.14x the time on 2 threads (benchmarks/NOTES.md).
 * Which thread runs a task still varies, but every task's result is fixed:
 * that keeps results independent of the thread count. A forked child starts
 * with no workers and builds its own pool on first use. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "attnc.h"
#include "interrupt.h"

/* Below this much work, waking a sleeping thread (~10-50 us) costs more
 * than it saves; the documents' (3, 2, 4) examples stay on one thread. */
#define MIN_PARALLEL_FLOPS 2.0e5
/* A thread about to sleep on a condition variable polls it this long
 * first: a module's forward is several parallel steps back to back (the
 * projections, the attention, the output projection), calls follow each
 * other within tens of microseconds, and a sleeping thread takes 5-50 us
 * to wake for each. Worse, waking it may put it on its waker's CPU: in a
 * virtual machine the scheduler takes an idle vCPU the host has
 * descheduled for a busy one, and the two threads then take turns on one
 * CPU. With 50 us, 50 back-to-back 0.45 ms attention calls on 2 threads
 * ran at the one-thread time in most blocks, each thread ~20 ms in the run
 * queue (/proc/<tid>/schedstat); with 500 us the workers stay awake and
 * apart (benchmarks/NOTES.md), and one woken after a longer pause steps
 * off its caller's CPU (leave_caller_cpu). Still short next to the pause
 * a benchmark leaves before the next library runs on these cores. */
#define SPIN_SECONDS 500e-6
/* The caller, its tasks done, waits for the workers' last ones no longer
 * than this between two asks for Ctrl-C (the call's poll, interrupt.c):
 * no one else polls, and a worker's task may be long (a few rows of x
 * times a weight of millions of rows: 0.5-0.7 s, during which Ctrl-C had
 * waited). */
#define CALLER_WAIT_NS 10000000L
/* attnc_lock_briefly_held's polls before it sleeps: 1-14 thousand cycles
 * (a pause takes 10-140, by CPU), where the lock is held for hundreds and
 * a sleep and its wake-up cost 5-10 us. */
#define LOCK_POLLS 100

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t work_ready, work_done;
    pthread_t *threads;
    int n_workers;
    atomic_int shutting_down;
    atomic_ulong generation; /* bumped for each job */
    atomic_int job_open;        /* workers may still join the current job */
    atomic_int workers_in_job;  /* workers that joined it and are not done */
    attnc_task_fn fn;
    void *ctx;
    idx_t n_tasks;
    int n_shares;              /* the job's tasks cut in this many shares */
    atomic_llong *share_next;  /* the next task of each share (n_workers + 1 of them) */
    unsigned long start_generation; /* the generation when the workers were created */
    attnc_call *call;  /* the call the job belongs to (interrupt.c) */
    atomic_int caller_cpu; /* the CPU the job's caller was on when it opened the job */
    int wanted_workers; /* what resize_pool was last asked for */
} pool_state;

static pool_state pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .work_ready = PTHREAD_COND_INITIALIZER,
                          .work_done = PTHREAD_COND_INITIALIZER, .caller_cpu = -1};
static pthread_mutex_t job_lock = PTHREAD_MUTEX_INITIALIZER; /* who owns the pool */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static atomic_int requested_threads = 0; /* 0: not set, use the affinity count */
static _Thread_local int inside_task = 0;
static _Thread_local int thread_index = 0; /* attnc_thread_index */
static _Thread_local int holds_job_lock = 0; /* this thread is a pool job's caller */

/* The CPUs this process may run on, asked of the system (a syscall) once,
 * and again at each set_num_threads and after fork; 0: not asked yet. */
static atomic_int cpu_count = 0;

static int count_cpus(void)
{
    cpu_set_t set;
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    atomic_store(&cpu_count, n > 0 ? n : 1);
    return n > 0 ? n : 1;
}

static atomic_int cpus_for_tests = 0; /* attnc_set_cpus_for_tests; 0: none */

static int available_cpus(void)
{
    int n = atomic_load(&cpu_count);
    return n > 0 ? n : count_cpus();
}

void attnc_set_cpus_for_tests(int n) { atomic_store(&cpus_for_tests, n > 0 ? n : 0); }

int attnc_get_num_threads(void)
{
    int n = atomic_load(&requested_threads);
    return n > 0 ? n : available_cpus();
}

void attnc_set_num_threads(int n)
{
    count_cpus();
    atomic_store(&requested_threads, n > 0 ? n : 1);
}

/* Threads that compute at once: more than the CPUs only take turns. */
int attnc_running_threads(void)
{
    int requested = attnc_get_num_threads(), for_tests = atomic_load(&cpus_for_tests);
    int cpus = for_tests > 0 ? for_tests : available_cpus();
    return requested < cpus ? requested : cpus;
}

/* Share s of the job's tasks: runs as even as whole tasks allow. */
static idx_t share_begin(int s)
{
    idx_t per = pool.n_tasks / pool.n_shares, extra = pool.n_tasks % pool.n_shares;
    return per * s + (s < extra ? s : extra);
}

/* The current job's tasks, taken one by one until none is left or the call
 * is interrupted: those of share `share` first, then of the shares after it. */
static void run_tasks(int share)
{
    int was_inside = inside_task;
    inside_task = 1;
    for (int k = 0; k < pool.n_shares && !attnc_interrupted(); k++) {
        int s = (share + k) % pool.n_shares;
        idx_t end = s + 1 == pool.n_shares ? pool.n_tasks : share_begin(s + 1);
        for (;;) {
            idx_t t = (idx_t)atomic_fetch_add(&pool.share_next[s], 1);
            if (t >= end || attnc_interrupted()) break;
            pool.fn(pool.ctx, t);
        }
    }
    inside_task = was_inside;
}

static double seconds_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void pause_briefly(void)
{
#ifdef ATTNC_X86
    __builtin_ia32_pause();
#endif
}

/* Polls until idle() is false or SPIN_SECONDS pass; the caller then
 * sleeps on the condition variable if it must. */
static void spin_while(int (*idle)(unsigned long), unsigned long arg)
{
    double until = seconds_now() + SPIN_SECONDS;
    while (idle(arg) && seconds_now() < until) pause_briefly();
}

void attnc_lock_briefly_held(pthread_mutex_t *mutex)
{
    for (int i = 0; i < LOCK_POLLS; i++) {
        if (pthread_mutex_trylock(mutex) == 0) return;
        pause_briefly();
    }
    pthread_mutex_lock(mutex);
}

/* Nothing for a worker that last joined job `seen` to do. */
static int no_new_job(unsigned long seen)
{
    return (atomic_load(&pool.generation) == seen || !atomic_load(&pool.job_open)) &&
           !atomic_load(&pool.shutting_down);
}

static int workers_busy(unsigned long unused)
{
    (void)unused;
    return atomic_load(&pool.workers_in_job) > 0;
}

/* The caller's wait for the workers of its job: it spins, then sleeps,
 * and every CALLER_WAIT_NS asks whether the call is interrupted (a yes
 * stops the workers at their next question). */
static void wait_for_workers(void)
{
    spin_while(workers_busy, 0);
    attnc_lock_briefly_held(&pool.lock);
    while (pool.workers_in_job > 0) {
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_nsec += CALLER_WAIT_NS;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
        if (pthread_cond_timedwait(&pool.work_done, &pool.lock, &deadline) != 0 && pool.workers_in_job > 0) {
            pthread_mutex_unlock(&pool.lock); /* (the poll may run Python code) */
            (void)attnc_interrupted_after_wait();
            attnc_lock_briefly_held(&pool.lock);
        }
    }
    pthread_mutex_unlock(&pool.lock);
}

/* A worker that finds itself on the CPU its caller was on steps off it.
 * Woken after a pause, a worker may be put on its waker's CPU (in a
 * virtual machine the scheduler takes an idle vCPU the host has
 * descheduled for a busy one), and the two threads then take turns on one
 * CPU until the load balancer parts them, milliseconds later: the first
 * calls after a 0.25 s pause spent 1.3-1.6 ms (median) of every 6 module
 * calls in the run queue. Leaving that CPU out of the worker's mask moves
 * it at once (median 0-0.2 ms; benchmarks/NOTES.md); the mask is then
 * given back, so the worker is never pinned. */
static void leave_caller_cpu(void)
{
    int caller = atomic_load(&pool.caller_cpu);
    if (caller < 0 || sched_getcpu() != caller) return;
    cpu_set_t allowed, elsewhere;
    if (pthread_getaffinity_np(pthread_self(), sizeof allowed, &allowed) != 0) return;
    elsewhere = allowed;
    CPU_CLR(caller, &elsewhere);
    if (CPU_COUNT(&elsewhere) == 0) return;
    if (pthread_setaffinity_np(pthread_self(), sizeof elsewhere, &elsewhere) == 0)
        pthread_setaffinity_np(pthread_self(), sizeof allowed, &allowed);
}

/* A worker joins each job it finds open. One that wakes after the caller
 * closed the job (all its tasks taken) leaves it alone: the caller waits
 * only for the workers that joined, never for a thread the system has not
 * scheduled yet (on a busy machine that wait was milliseconds).
 * Worker `index` (from 0) runs share index + 1 of each job first. */
static void *worker_main(void *index)
{
    unsigned long seen = pool.start_generation;
    int share = (int)(uintptr_t)index + 1;
    thread_index = share;
    for (;;) {
        spin_while(no_new_job, seen);
        attnc_lock_briefly_held(&pool.lock);
        while (no_new_job(seen)) pthread_cond_wait(&pool.work_ready, &pool.lock);
        if (pool.shutting_down) {
            pthread_mutex_unlock(&pool.lock);
            return NULL;
        }
        seen = pool.generation;
        pool.workers_in_job++;
        pthread_mutex_unlock(&pool.lock);
        leave_caller_cpu();
        attnc_join_call(pool.call);
        run_tasks(share);
        attnc_join_call(NULL);
        attnc_lock_briefly_held(&pool.lock);
        if (--pool.workers_in_job == 0 && !pool.job_open) pthread_cond_signal(&pool.work_done);
        pthread_mutex_unlock(&pool.lock);
    }
}

static void stop_workers(void)
{
    attnc_lock_briefly_held(&pool.lock);
    pool.shutting_down = 1;
    pthread_cond_broadcast(&pool.work_ready);
    pthread_mutex_unlock(&pool.lock);
    for (int i = 0; i < pool.n_workers; i++) pthread_join(pool.threads[i], NULL);
    /* Cleared before they are freed: a fork from another thread in between
     * would leave the child pointers its next resize frees a second time. */
    pthread_t *threads = pool.threads;
    atomic_llong *share_next = pool.share_next;
    pool.threads = NULL;
    pool.share_next = NULL;
    free(threads);
    free(share_next);
    pool.n_workers = 0;
    pool.shutting_down = 0;
}

/* The child of a fork has only the forking thread: forget the parent's
 * workers (they do not exist here) and start from unlocked state. A child
 * forked by a job's caller (os.fork() in a Python signal handler, which the
 * call's Ctrl-C poll runs mid-task) returns into that job: it keeps the
 * job's lock and task counters (the arrays are the child's copies, freed by
 * the next resize), and its calls stop, marked forked (the bindings raise),
 * since the tasks the parent's workers held are not done here. The
 * counters had been cleared, and the child's caller read them: a segfault. */
static void reset_after_fork(void)
{
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.work_ready, NULL);
    pthread_cond_init(&pool.work_done, NULL);
    pthread_mutex_init(&job_lock, NULL);
    if (holds_job_lock) {
        pthread_mutex_lock(&job_lock);
        attnc_stop_calls_after_fork();
    }
    pool.n_workers = 0;
    pool.shutting_down = 0;
    pool.job_open = 0;
    pool.workers_in_job = 0;
    pool.wanted_workers = 0;
    atomic_store(&cpu_count, 0);
}

static void register_atfork(void) { pthread_atfork(NULL, NULL, reset_after_fork); }

/* Called with job_lock held: make the pool have n_workers threads.
 * Returns the number it has (0 if threads are unavailable). When the
 * system starts fewer (a thread or memory limit), the pool keeps those and
 * does not try again until a different count is wanted. */
static int resize_pool(int n_workers)
{
    if (pool.wanted_workers == n_workers) return pool.n_workers;
    stop_workers();
    pool.wanted_workers = n_workers;
    pool.threads = malloc(sizeof(pthread_t) * (size_t)n_workers);
    pool.share_next = malloc(sizeof(atomic_llong) * ((size_t)n_workers + 1));
    if (!pool.threads || !pool.share_next) return 0;
    pool.start_generation = pool.generation;
    for (int i = 0; i < n_workers; i++) {
        if (pthread_create(&pool.threads[i], NULL, worker_main, (void *)(uintptr_t)i) != 0) break;
        /* named here, before any job can end, as top -H and /proc/<pid>/task/<tid>/comm show it */
        pthread_setname_np(pool.threads[i], "attnc-worker");
        pool.n_workers++;
    }
    return pool.n_workers;
}

/* (as thread 0 of the job, whichever thread runs it) */
static void run_inline(idx_t n_tasks, attnc_task_fn fn, void *ctx)
{
    int was_inside = inside_task, was_index = thread_index;
    inside_task = 1;
    thread_index = 0;
    for (idx_t t = 0; t < n_tasks && !attnc_interrupted(); t++) fn(ctx, t);
    inside_task = was_inside;
    thread_index = was_index;
}

int attnc_threads_for(double work_flops)
{
    return inside_task || work_flops < MIN_PARALLEL_FLOPS ? 1 : attnc_running_threads();
}

int attnc_thread_index(void) { return thread_index; }

void attnc_parallel_for(idx_t n_tasks, double work_flops, attnc_task_fn fn, void *ctx)
{
    attnc_parallel_for_on(n_tasks, attnc_threads_for(work_flops), fn, ctx);
}

void attnc_parallel_for_on(idx_t n_tasks, int max_threads, attnc_task_fn fn, void *ctx)
{
    if (n_tasks <= 0) return;
    int running = attnc_running_threads(), n_threads = max_threads < running ? max_threads : running;
    if (n_tasks == 1 || n_threads <= 1 || inside_task) {
        run_inline(n_tasks, fn, ctx);
        return;
    }
    pthread_once(&atfork_once, register_atfork);
    if (pthread_mutex_trylock(&job_lock) != 0) { /* another Python thread has the pool */
        run_inline(n_tasks, fn, ctx);
        return;
    }
    if (resize_pool(n_threads - 1) == 0) {
        pthread_mutex_unlock(&job_lock);
        run_inline(n_tasks, fn, ctx);
        return;
    }
    attnc_lock_briefly_held(&pool.lock);
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n_tasks = n_tasks;
    pool.n_shares = pool.n_workers + 1;
    for (int s = 0; s < pool.n_shares; s++) atomic_store(&pool.share_next[s], share_begin(s));
    pool.call = attnc_current_call();
    atomic_store(&pool.caller_cpu, sched_getcpu());
    pool.job_open = 1;
    pool.generation++;
    pthread_cond_broadcast(&pool.work_ready);
    pthread_mutex_unlock(&pool.lock);

    holds_job_lock = 1;
    run_tasks(0); /* returns when every task is taken */

    attnc_lock_briefly_held(&pool.lock);
    pool.job_open = 0;
    pthread_mutex_unlock(&pool.lock);
    wait_for_workers();
    holds_job_lock = 0;
    pthread_mutex_unlock(&job_lock);
}
