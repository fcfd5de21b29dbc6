/* smelt runtime: the thread pool and helpers every generated model embeds.
 *
 * Design (see docs/architecture.md, "Runtime"):
 *  - one worker per physical core but the first; the calling thread is worker 0 and works too;
 *  - workers are pinned to the CPUs the caller passes (one per physical core);
 *  - a job is one function run as fn(ctx, tid, nt) by the caller and by every worker that
 *    enters it in time (the entry gate: a worker the OS has not run by the time the caller is
 *    done is not waited for, and never touches the job); a whole native block is one job, so an
 *    inference is a single fork/join (one persistent parallel region);
 *  - inside a job, a step (an operator, or part of one) is nt shares: share k is the work the
 *    kernel's smelt_range() split gives thread k. Threads claim shares (own first, then any left)
 *    and wait for the step's shares to be done before the next step (smelt_work_*): a late or
 *    descheduled thread's untouched shares are run by the others. Steps whose shares synchronize
 *    among themselves run one share per thread, as with a barrier (SMELT_POOL_SHARE=0: every
 *    step does, with smelt_barrier() between steps: the pool before work sharing);
 *  - between jobs workers spin for SMELT_SPIN_US microseconds (default 2000), then sleep on a
 *    futex, so an idle model costs no CPU;
 *  - a pool runs one job at a time: smelt_pool_run() takes the pool's mutex, which is what makes
 *    concurrent callers of one compiled model safe (they are served one after the other);
 *  - fork(): the child has none of the workers, so a pool created before the fork must never post
 *    a job there (the caller would wait for them forever). A pthread_atfork child handler bumps
 *    the library's fork epoch; a pool whose epoch is older runs every job on the caller alone
 *    (the generated code runs with any thread count) and is freed without joining. smelt's
 *    loader (smelt/runtime/module.py) replaces such a pool with a fresh one on the next call.
 * Everything mutable a model needs per instance lives in memory the loader passes in (arena,
 * scratch, the per-instance state buffer), never in library globals: instances loaded from one
 * .so share the library's data. The only exceptions are process-wide by nature: the fork epoch
 * and the per-thread error flag (smelt_tls_error).
 * No OpenMP: it would fight this pool for the same cores.
 */
#ifndef SMELT_RT_H
#define SMELT_RT_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SMELT_PAUSE() _mm_pause()
#else
#define SMELT_PAUSE() ((void)0)
#endif

#define SMELT_MAX_THREADS 256
#define SMELT_CACHELINE 64

typedef void (*smelt_job_fn)(void *ctx, int tid, int nt);

/* Shares of a step tracked in one word (work-sharing protocol below); more threads than this run
 * every step as one share per thread with a barrier between steps. */
#define SMELT_SHARE_MAX 32
#define SMELT_GATE_OPEN (1ull << 31)
#define SMELT_WORK_STEP_SHIFT 38
#define SMELT_WORK_DONE_SHIFT 32

typedef struct {
    _Alignas(SMELT_CACHELINE) atomic_uint generation; /* bumped once per job (the futex word) */
    /* the job's entry gate: (generation << 32) | SMELT_GATE_OPEN while open | workers entered.
     * A worker runs a job only after counting itself in while the gate is open; the caller
     * closes it when its own part is done and waits only for the workers that entered, so a
     * worker the OS has not run yet neither delays the join nor ever touches that job's ctx */
    _Alignas(SMELT_CACHELINE) atomic_ullong gate;
    _Alignas(SMELT_CACHELINE) atomic_int n_done;      /* entered workers finished with the job */
    _Alignas(SMELT_CACHELINE) atomic_int n_sleeping;  /* workers blocked on the futex */
    _Alignas(SMELT_CACHELINE) atomic_uint bar_count;  /* spin barrier inside a job */
    _Alignas(SMELT_CACHELINE) atomic_uint bar_gen;
    /* the running job's progress (smelt_work_*): (step << 38) | (shares done << 32) | claimed */
    _Alignas(SMELT_CACHELINE) atomic_ullong work;
    _Alignas(SMELT_CACHELINE) smelt_job_fn fn;
    void *ctx;
    int n_threads;
    int share; /* 1: jobs use the work-sharing protocol (n_threads <= SMELT_SHARE_MAX) */
    unsigned fork_epoch; /* smelt_fork_epoch when created; older = created before a fork() */
    atomic_int stop;
    long spin_ns;
    long delay_ns[2]; /* test hook (SMELT_TEST_DELAY_WORKER=tid:us): that worker sleeps before each job */
    atomic_ullong test_counts[3]; /* with the hook set: shares run, of them by another thread, steps run solo */
    long post_ns;  /* when the running job was posted */
    long grace_ns; /* how long the caller waits for a worker before running a synchronizing node alone */
    long last_job_ns; /* how long the previous job took, post to join (0: none yet) */
    pthread_mutex_t run_lock;
    pthread_t threads[SMELT_MAX_THREADS];
    int cpus[SMELT_MAX_THREADS];
} smelt_pool_t;

typedef struct {
    smelt_pool_t *pool;
    int tid;
} smelt_worker_arg_t;

/* Forks of this process seen by this library (bumped in the child only, while it has one thread). */
static atomic_uint smelt_fork_epoch;
static void smelt_after_fork_child(void) { atomic_fetch_add(&smelt_fork_epoch, 1); }
/* Unregistered by glibc when the library is dlclosed (the handler is tied to this DSO). */
__attribute__((constructor)) static void smelt_rt_register_fork_handler(void) {
    pthread_atfork(NULL, NULL, smelt_after_fork_child);
}

/* Whether the pool's workers exist in this process (false in a child forked after its creation). */
static inline int smelt_pool_live(const smelt_pool_t *pool) {
    return pool->fork_epoch == atomic_load_explicit(&smelt_fork_epoch, memory_order_relaxed);
}

static inline long smelt_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static inline void smelt_futex_wait(atomic_uint *addr, unsigned expected) {
#if defined(__linux__)
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
#else
    if (atomic_load(addr) == expected) sched_yield();
#endif
}

static inline void smelt_futex_wake_all(atomic_uint *addr) {
#if defined(__linux__)
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    (void)addr;
#endif
}

/* Even split of [0, total) over nt threads: the first total % nt threads take one more. */
static inline void smelt_range(long total, int tid, int nt, long *begin, long *end) {
    long base = total / nt, rem = total % nt;
    long b = tid * base + (tid < rem ? tid : rem);
    *begin = b;
    *end = b + base + (tid < rem ? 1 : 0);
}

/* Spin barrier among the nt threads of the running job (sense by generation count). */
static inline void smelt_barrier(smelt_pool_t *pool, int nt) {
    if (nt <= 1) return;
    unsigned gen = atomic_load_explicit(&pool->bar_gen, memory_order_acquire);
    if (atomic_fetch_add_explicit(&pool->bar_count, 1, memory_order_acq_rel) == (unsigned)nt - 1) {
        atomic_store_explicit(&pool->bar_count, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&pool->bar_gen, 1, memory_order_release);
        return;
    }
    unsigned spins = 0;
    while (atomic_load_explicit(&pool->bar_gen, memory_order_acquire) == gen) {
        SMELT_PAUSE();
        /* a peer was descheduled (shared machine): give the core away now and then */
        if (++spins > 20000u) { sched_yield(); spins = 0; }
    }
}

/* ---- work sharing inside a job ----------------------------------------------------------
 * A step's work is nt shares: share k is what the template's own split gives thread k, run as
 * fn(c, k, nt, args). Every share is claimed once (a bit in pool->work): a thread claims its own
 * share first (its cache affinity), then any share still unclaimed; then it waits until all nt
 * shares of the step are done (the done count in the same word) and goes on with the next step.
 * A thread the OS descheduled finds its shares taken when it comes back and only catches up, so
 * a busy core costs a step its running shares, not a barrier wait per operator. A step whose
 * shares synchronize with each other (the RNN recurrence's group barriers) is run with stealing
 * off: each thread runs exactly its own share, as with a barrier.
 * One word holds the step (bits 38..63), the shares done (32..37) and the claimed shares (0..31);
 * the thread finishing the last share moves the word to the next step. */
static inline unsigned smelt_work_step(unsigned long long w) { return (unsigned)(w >> SMELT_WORK_STEP_SHIFT); }

/* The step a thread entering the job starts at (steps before it are done). */
static inline unsigned smelt_work_enter(smelt_pool_t *pool) {
    return smelt_work_step(atomic_load_explicit(&pool->work, memory_order_acquire));
}

/* Claim a share of step i: own first, then (steal) any unclaimed one; -1 when none is left. */
static inline int smelt_work_claim(smelt_pool_t *pool, unsigned i, int own, int nt, int steal) {
    unsigned long long w = atomic_load_explicit(&pool->work, memory_order_acquire);
    const unsigned all = nt >= 32 ? 0xffffffffu : (1u << nt) - 1u;
    for (;;) {
        if (smelt_work_step(w) != i) return -1;
        const unsigned claimed = (unsigned)w;
        int k;
        if (!(claimed & (1u << own))) k = own;
        else if (!steal || (claimed & all) == all) return -1;
        else k = 31 - __builtin_clz(~claimed & all); /* the highest: farthest from the caller's */
        if (atomic_compare_exchange_weak_explicit(&pool->work, &w, w | (1ull << k), memory_order_acq_rel,
                                                  memory_order_acquire))
            return k;
    }
}

/* A share of step i is done (stolen: by a thread other than its own); the last one opens step i + 1. */
static inline void smelt_work_done(smelt_pool_t *pool, unsigned i, int nt, int stolen) {
    if (pool->delay_ns[0] >= 0) { /* test hook set: count shares (tests check each runs once) */
        atomic_fetch_add_explicit(&pool->test_counts[0], 1, memory_order_relaxed);
        if (stolen) atomic_fetch_add_explicit(&pool->test_counts[1], 1, memory_order_relaxed);
    }
    unsigned long long w = atomic_fetch_add_explicit(&pool->work, 1ull << SMELT_WORK_DONE_SHIFT, memory_order_acq_rel);
    if ((int)((w >> SMELT_WORK_DONE_SHIFT) & 63u) == nt - 1)
        atomic_store_explicit(&pool->work, (unsigned long long)(i + 1) << SMELT_WORK_STEP_SHIFT, memory_order_release);
}

/* Wait until step i is done; returns the step now open (later steps may be done too). */
static inline unsigned smelt_work_wait(smelt_pool_t *pool, unsigned i) {
    unsigned spins = 0, s;
    while ((s = smelt_work_step(atomic_load_explicit(&pool->work, memory_order_acquire))) == i) {
        SMELT_PAUSE();
        /* the share we wait for runs on a descheduled thread (shared machine): give the core away */
        if (++spins > 20000u) { sched_yield(); spins = 0; }
    }
    return s;
}

/* The caller's wait for a worker at a synchronizing node (smelt_work_solo): 20 us for a spinning
 * worker; for a sleeping one a quarter of the previous job's time, between 20 and 300 us. */
#define SMELT_GRACE_SPINNING_NS 20000L
#define SMELT_GRACE_SLEEPING_NS 300000L

/* Called by the caller (tid 0) where a node whose shares synchronize (all nt threads at once)
 * begins: if no worker has entered the job by the grace period after it was posted, the caller
 * closes the gate and returns 1, and runs the rest of the job alone (nt = 1: the generated code
 * runs with any thread count; the nodes before were finished by the shares). Otherwise 0: the
 * node waits for every thread, as a barrier does. */
static inline int smelt_work_solo(smelt_pool_t *pool) {
    unsigned long long gt = atomic_load_explicit(&pool->gate, memory_order_acquire);
    for (;;) {
        if ((gt & 0x7fffffffu) != 0 || !(gt & SMELT_GATE_OPEN)) return 0; /* a worker is in: wait for all */
        if (smelt_now_ns() - pool->post_ns > pool->grace_ns) {
            if (atomic_compare_exchange_strong_explicit(&pool->gate, &gt, gt & ~SMELT_GATE_OPEN,
                                                        memory_order_acq_rel, memory_order_acquire))
                return 1;
            continue; /* a worker entered meanwhile */
        }
        SMELT_PAUSE();
        gt = atomic_load_explicit(&pool->gate, memory_order_acquire);
    }
}

/* Test hook: count a step the caller ran alone. */
static inline void smelt_work_solo_step(smelt_pool_t *pool) {
    if (pool->delay_ns[0] >= 0) atomic_fetch_add_explicit(&pool->test_counts[2], 1, memory_order_relaxed);
}

/* Whether a job of nt threads uses the work-sharing protocol (else: a barrier between steps). */
static inline int smelt_sharing(const smelt_pool_t *pool, int nt) { return nt > 1 && pool && pool->share; }

static void *smelt_worker_main(void *p) {
    smelt_worker_arg_t *arg = (smelt_worker_arg_t *)p;
    smelt_pool_t *pool = arg->pool;
    int tid = arg->tid;
    free(arg);
    /* generation is 0 when the pool is created; a job may be posted before this thread first
     * runs, so starting from the current value could miss it and deadlock the caller */
    unsigned seen = 0;
    for (;;) {
        unsigned g = atomic_load_explicit(&pool->generation, memory_order_acquire);
        if (g == seen) {
            long start = smelt_now_ns();
            unsigned spins = 0;
            while ((g = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen) {
                SMELT_PAUSE();
                if ((++spins & 63u) == 0 && smelt_now_ns() - start > pool->spin_ns) {
                    atomic_fetch_add(&pool->n_sleeping, 1);
                    if (atomic_load(&pool->generation) == seen) smelt_futex_wait(&pool->generation, seen);
                    atomic_fetch_sub(&pool->n_sleeping, 1);
                    start = smelt_now_ns();
                }
            }
        }
        if (atomic_load(&pool->stop)) break;
        if (pool->delay_ns[0] == tid) { /* test hook: a worker the OS runs late */
            struct timespec ts = {0, pool->delay_ns[1]};
            nanosleep(&ts, NULL);
        }
        /* enter the newest job if its gate is still open; the gate's generation is the truth (a
         * late worker may see a later job than the one that woke it, and must enter each once) */
        unsigned long long gt = atomic_load_explicit(&pool->gate, memory_order_acquire);
        int entered = 0;
        while ((gt & SMELT_GATE_OPEN) && (unsigned)(gt >> 32) != seen) {
            if (atomic_compare_exchange_weak_explicit(&pool->gate, &gt, gt + 1, memory_order_acq_rel,
                                                      memory_order_acquire)) {
                entered = 1;
                break;
            }
        }
        seen = (unsigned)(gt >> 32);
        if (!entered) continue; /* closed: the job was done without this thread */
        pool->fn(pool->ctx, tid, pool->n_threads);
        atomic_fetch_add_explicit(&pool->n_done, 1, memory_order_acq_rel);
    }
    return NULL;
}

/* Create a pool of n_threads (caller included). cpus[i] pins thread i (i >= 1); -1 = no pin.
 * Environment: SMELT_SPIN_US (idle spin before sleeping), SMELT_POOL_SHARE=0 (the barrier pool:
 * no work sharing, the join waits for every worker; for comparisons), SMELT_TEST_DELAY_WORKER
 * (tests: "tid:us", that worker sleeps us microseconds before entering each job). */
smelt_pool_t *smelt_pool_create(int n_threads, const int *cpus) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > SMELT_MAX_THREADS) n_threads = SMELT_MAX_THREADS;
    smelt_pool_t *pool = (smelt_pool_t *)aligned_alloc(SMELT_CACHELINE, sizeof(smelt_pool_t));
    if (!pool) return NULL;
    memset(pool, 0, sizeof(*pool));
    pool->n_threads = n_threads;
    pool->fork_epoch = atomic_load(&smelt_fork_epoch);
    const char *spin = getenv("SMELT_SPIN_US");
    pool->spin_ns = (spin ? atol(spin) : 2000) * 1000L;
    const char *share = getenv("SMELT_POOL_SHARE");
    pool->share = !(share && share[0] == '0');
    pool->delay_ns[0] = -1;
    const char *delay = getenv("SMELT_TEST_DELAY_WORKER");
    if (delay && strchr(delay, ':')) {
        pool->delay_ns[0] = atol(delay);
        long us = atol(strchr(delay, ':') + 1);
        pool->delay_ns[1] = (us < 0 ? 0 : us > 999999 ? 999999 : us) * 1000L;
    }
    pthread_mutex_init(&pool->run_lock, NULL);
    for (int i = 0; i < n_threads; ++i) pool->cpus[i] = cpus ? cpus[i] : -1;
    for (int i = 1; i < n_threads; ++i) {
        smelt_worker_arg_t *arg = (smelt_worker_arg_t *)malloc(sizeof(*arg));
        if (arg) {
            arg->pool = pool;
            arg->tid = i;
        }
        if (!arg || pthread_create(&pool->threads[i], NULL, smelt_worker_main, arg) != 0) {
            /* out of threads or memory: run with the workers that exist (n_threads becomes their
             * count plus the caller; the generated code runs with any thread count) */
            free(arg);
            pool->n_threads = i;
            break;
        }
#if defined(__linux__)
        if (pool->cpus[i] >= 0) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(pool->cpus[i], &set);
            pthread_setaffinity_np(pool->threads[i], sizeof(set), &set);
        }
#endif
    }
    if (pool->n_threads > SMELT_SHARE_MAX) pool->share = 0;
    return pool;
}

void smelt_pool_destroy(smelt_pool_t *pool) {
    if (!pool) return;
    if (!smelt_pool_live(pool)) { /* a forked child's copy: no workers to join, the mutex may be held */
        free(pool);
        return;
    }
    pthread_mutex_lock(&pool->run_lock);
    atomic_store(&pool->stop, 1);
    atomic_fetch_add(&pool->generation, 1);
    smelt_futex_wake_all(&pool->generation);
    for (int i = 1; i < pool->n_threads; ++i) pthread_join(pool->threads[i], NULL);
    pthread_mutex_unlock(&pool->run_lock);
    pthread_mutex_destroy(&pool->run_lock);
    free(pool);
}

/* Test hook: shares run, shares stolen and steps the caller ran alone since the pool was
 * created (counted only while SMELT_TEST_DELAY_WORKER is set). */
void smelt_pool_test_counts(smelt_pool_t *pool, unsigned long long *out) {
    out[0] = atomic_load(&pool->test_counts[0]);
    out[1] = atomic_load(&pool->test_counts[1]);
    out[2] = atomic_load(&pool->test_counts[2]);
}

int smelt_pool_threads(const smelt_pool_t *pool) { return pool ? pool->n_threads : 1; }

/* Run fn(ctx, tid, nt) as one job: the caller runs it as thread 0, every worker that enters
 * before the caller is done runs it too, and this returns when all that entered are done.
 * With work sharing (pool->share), fn must finish the job whoever enters (the generated bodies
 * do: smelt_work_*); without it, every worker enters and the join waits for all of them. */
static void smelt_pool_run(smelt_pool_t *pool, smelt_job_fn fn, void *ctx) {
    if (!pool || pool->n_threads == 1 || !smelt_pool_live(pool)) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool->run_lock);
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->n_done, 0, memory_order_relaxed);
    atomic_store_explicit(&pool->work, 0, memory_order_relaxed);
    const unsigned g = atomic_load_explicit(&pool->generation, memory_order_relaxed) + 1;
    /* open the gate (publishing fn, ctx and the reset counters), then wake: a worker reads the
     * gate only after seeing the new generation */
    atomic_store_explicit(&pool->gate, ((unsigned long long)g << 32) | SMELT_GATE_OPEN, memory_order_release);
    atomic_store(&pool->generation, g); /* seq_cst: pairs with the sleepers' check */
    pool->post_ns = smelt_now_ns();
    /* a spinning worker enters within a microsecond; a sleeping one needs the futex wake-up
     * (tens of microseconds, more on a busy core). Waiting for it only pays when the job is long:
     * a model called every few tens of milliseconds (a voice-activity detector on audio chunks)
     * finds its worker asleep at every call, and a 60 us job must not wait 300 us for it */
    pool->grace_ns = SMELT_GRACE_SPINNING_NS;
    if (atomic_load(&pool->n_sleeping) > 0) {
        smelt_futex_wake_all(&pool->generation);
        const long quarter = pool->last_job_ns / 4;
        pool->grace_ns = quarter < SMELT_GRACE_SPINNING_NS ? SMELT_GRACE_SPINNING_NS
                       : quarter > SMELT_GRACE_SLEEPING_NS ? SMELT_GRACE_SLEEPING_NS : quarter;
    }
    fn(ctx, 0, pool->n_threads);
    int entered;
    if (pool->share) { /* the job is done: whoever has not entered yet never will */
        entered = (int)(atomic_fetch_and(&pool->gate, ~SMELT_GATE_OPEN) & 0x7fffffffu);
    } else {
        entered = pool->n_threads - 1;
    }
    unsigned spins = 0;
    while (atomic_load_explicit(&pool->n_done, memory_order_acquire) != entered) {
        SMELT_PAUSE();
        if (++spins > 20000u) { sched_yield(); spins = 0; }
    }
    if (!pool->share) atomic_fetch_and(&pool->gate, ~SMELT_GATE_OPEN);
    pool->last_job_ns = smelt_now_ns() - pool->post_ns;
    pthread_mutex_unlock(&pool->run_lock);
}

#ifdef SMELT_PROFILE
/* Instrumented build (`smelt.compile(..., profile=True)`, `smelt profile`); the generated source
 * defines SMELT_PROFILE only then, so an ordinary build contains none of this.
 *
 * What is measured, per native block (one exported entry):
 *  - wall time per step on thread 0, from the end of the previous step's barrier to the end of
 *    this step's barrier (the last step: to the return of the join in the entry). The barrier is
 *    where the wait for the slowest thread shows up, so it belongs to the step; and the steps of
 *    a block tile its wall time, leaving only the pool's dispatch outside them;
 *  - busy time per step and thread: from the same start to the moment that thread finished the
 *    step, barrier wait excluded (the spread between threads is the step's load imbalance);
 *  - the entry's wall time and call count.
 * Timestamps are TSC ticks on x86 (rdtsc, a few ns; no system call whatever the clock source)
 * and CLOCK_MONOTONIC_RAW ns elsewhere. The entry also reads CLOCK_MONOTONIC_RAW on entry and
 * exit, so ns per tick is the ratio of the two totals: calibrated on the run itself.
 *
 * Counters of a block: one uint64_t array, 64-byte aligned, so each thread writes only its own
 * cache lines:
 *   [0, SMELT_PROF_HEADER)       header: calls, ticks, ns, steps, threads, stride
 *   [HEADER, HEADER + stride)    per step: thread 0's wall ticks
 *   then threads rows of stride  per thread and step: busy ticks
 * Counters live in the instance's state buffer (the generated smelt_profile_counters(state, k)
 * finds block k's), so two models loaded from one .so keep their own. */
static inline uint64_t smelt_prof_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
static inline uint64_t smelt_prof_ticks(void) { return __rdtsc(); }
#else
static inline uint64_t smelt_prof_ticks(void) { return smelt_prof_ns(); }
#endif

enum {
    SMELT_PROF_CALLS, SMELT_PROF_TICKS, SMELT_PROF_NS, /* cumulative */
    SMELT_PROF_STEPS, SMELT_PROF_THREADS, SMELT_PROF_STRIDE, /* geometry, set at compile time */
    SMELT_PROF_HEADER = 8
};
#define SMELT_PROF_STRIDE_OF(steps) ((((steps) + 7) / 8) * 8)
#define SMELT_PROF_WORDS(steps, threads) (SMELT_PROF_HEADER + SMELT_PROF_STRIDE_OF(steps) * (1 + (threads)))

/* This thread finished step i, which started at t. */
static inline void smelt_prof_busy(uint64_t *p, int i, int tid, uint64_t t) {
    if (tid < (int)p[SMELT_PROF_THREADS])
        p[SMELT_PROF_HEADER + p[SMELT_PROF_STRIDE] * (uint64_t)(1 + tid) + (uint64_t)i] += smelt_prof_ticks() - t;
}

/* Every thread left step i's barrier: thread 0 adds the step's wall time. Returns the start of
 * the next step. */
static inline uint64_t smelt_prof_step(uint64_t *p, int i, int tid, uint64_t t) {
    const uint64_t now = smelt_prof_ticks();
    if (tid == 0) p[SMELT_PROF_HEADER + i] += now - t;
    return now;
}

/* In the entry, after the join: the last step (started at last_t on thread 0) ends here. */
static inline void smelt_prof_block_done(uint64_t *p, int last, uint64_t last_t, uint64_t t0, uint64_t ns0) {
    const uint64_t t1 = smelt_prof_ticks(), ns1 = smelt_prof_ns();
    if (last >= 0) p[SMELT_PROF_HEADER + last] += t1 - last_t;
    p[SMELT_PROF_CALLS] += 1;
    p[SMELT_PROF_TICKS] += t1 - t0;
    p[SMELT_PROF_NS] += ns1 - ns0;
}

static inline void smelt_prof_reset(uint64_t *p) {
    const uint64_t words = SMELT_PROF_WORDS(p[SMELT_PROF_STEPS], p[SMELT_PROF_THREADS]);
    p[SMELT_PROF_CALLS] = p[SMELT_PROF_TICKS] = p[SMELT_PROF_NS] = 0;
    memset(p + SMELT_PROF_HEADER, 0, (words - SMELT_PROF_HEADER) * sizeof(uint64_t));
}
#endif /* SMELT_PROFILE */

#endif /* SMELT_RT_H */
