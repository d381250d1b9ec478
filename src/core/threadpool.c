/* Parallel loops (threadpool.h): OpenMP regions when the compiler has
 * OpenMP, otherwise a persistent pthread pool of our own. */
#include "core/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#else
#include <stdint.h>
#include <unistd.h>
#endif

/* nd_set_serial: this thread's parallel calls run on itself */
static _Thread_local int tls_serial;

/* nd_set_fixed_split: this thread's kernels split work by its shape */
static _Thread_local int tls_fixed_split;

int nd_set_fixed_split(int on)
{
    int prev = tls_fixed_split;
    tls_fixed_split = on != 0;
    return prev;
}

int nd_fixed_split(void)
{
    return tls_fixed_split;
}

/* nd_parallel_counts */
static _Thread_local long tls_forks, tls_handoffs;

void nd_parallel_counts(long *forks, long *handoffs)
{
    if (forks)
        *forks = tls_forks;
    if (handoffs)
        *handoffs = tls_handoffs;
}

int nd_serial(void)
{
    return tls_serial;
}

double nd_wtime(void)
{
    /* C11 timespec_get: no POSIX feature macro needed */
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#ifdef _OPENMP

/* the thread's OpenMP team size before nd_set_serial(1) */
static _Thread_local int tls_saved_threads;

/* Also the thread's OpenMP team size: the OpenMP build of OpenBLAS sizes
 * its own threading by it, so serial work stays serial inside BLAS too. */
int nd_set_serial(int on)
{
    int prev = tls_serial;
    on = on != 0;
    if (on && !prev) {
        tls_saved_threads = omp_get_max_threads();
        omp_set_num_threads(1);
    } else if (!on && prev) {
        omp_set_num_threads(tls_saved_threads);
    }
    tls_serial = on;
    return prev;
}

int nd_get_threads(void)
{
    return omp_get_max_threads();
}

void nd_set_threads(int threads)
{
    if (threads > 0)
        omp_set_num_threads(threads);
}

int nd_in_parallel(void)
{
    return omp_in_parallel();
}

void nd_parallel_setup(void (*fn)(void))
{
    (void)fn;
}

static void fork_region(int team, nd_region_fn fn, void *ctx)
{
    if (team <= 1 || tls_serial || omp_in_parallel()) {
        fn(ctx, 0, 1);
        return;
    }
    tls_forks++;
#pragma omp parallel num_threads(team)
    fn(ctx, omp_get_thread_num(), omp_get_num_threads());
}

#else /* the pool */

/* A worker spins this many pause instructions (a few microseconds) for the
 * next job before sleeping: kernels come in quick succession, but a shared
 * machine must not lose cores to idle spinning. */
#define POOL_SPIN 4000
#define POOL_MAX 256

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

typedef struct {
    atomic_uint go; /* the job generation this worker is asked to run */
    pthread_cond_t wake;
} pool_worker;

static struct {
    pthread_mutex_t owner; /* held by the thread whose region the pool runs */
    pthread_mutex_t lock;  /* sleeping and waking */
    pthread_cond_t done;
    pool_worker w[POOL_MAX - 1];
    int workers;     /* started (owner only) */
    unsigned gen;    /* last job generation (owner only) */
    nd_region_fn fn; /* the job: written by the owner before `go` */
    void *ctx;
    int team;
    atomic_int remaining; /* workers still running the job */
    atomic_int threads;   /* team size; 0 = not chosen yet */
} pool = {
    .owner = PTHREAD_MUTEX_INITIALIZER,
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .done = PTHREAD_COND_INITIALIZER,
};

/* inside a parallel body (a worker always is) */
static _Thread_local int tls_in_region;

/* nd_parallel_setup: the function and how many times it was set; each
 * thread runs it when its own count is behind */
static void (*_Atomic setup_fn)(void);
static atomic_uint setup_count;
static _Thread_local unsigned tls_setup_seen;

void nd_parallel_setup(void (*fn)(void))
{
    atomic_store(&setup_fn, fn);
    atomic_fetch_add(&setup_count, 1);
}

static inline void thread_setup(void)
{
    unsigned n = atomic_load_explicit(&setup_count, memory_order_acquire);
    if (n != tls_setup_seen) {
        tls_setup_seen = n;
        void (*fn)(void) = atomic_load(&setup_fn);
        if (fn)
            fn();
    }
}

static int default_threads(void)
{
    const char *env = getenv("OMP_NUM_THREADS");
    long n = env ? strtol(env, NULL, 10) : 0;
    if (n <= 0)
        n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > POOL_MAX ? POOL_MAX : (int)n;
}

int nd_get_threads(void)
{
    int n = atomic_load_explicit(&pool.threads, memory_order_relaxed);
    if (n == 0) {
        int zero = 0;
        n = default_threads();
        if (!atomic_compare_exchange_strong(&pool.threads, &zero, n))
            n = zero;
    }
    return n;
}

void nd_set_threads(int threads)
{
    if (threads > 0)
        atomic_store(&pool.threads, threads > POOL_MAX ? POOL_MAX : threads);
}

int nd_in_parallel(void)
{
    return tls_in_region;
}

int nd_set_serial(int on)
{
    int prev = tls_serial;
    tls_serial = on != 0;
    return prev;
}

static void *worker_main(void *arg)
{
    int id = (int)(intptr_t)arg;
    pool_worker *w = &pool.w[id];
    unsigned seen = 0;
    tls_in_region = 1;
    for (;;) {
        unsigned g = atomic_load_explicit(&w->go, memory_order_acquire);
        for (int s = 0; g == seen && s < POOL_SPIN; s++) {
            cpu_relax();
            g = atomic_load_explicit(&w->go, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&pool.lock);
            while ((g = atomic_load_explicit(&w->go, memory_order_acquire)) == seen)
                pthread_cond_wait(&w->wake, &pool.lock);
            pthread_mutex_unlock(&pool.lock);
        }
        seen = g;
        thread_setup();
        pool.fn(pool.ctx, id + 1, pool.team);
        if (atomic_fetch_sub_explicit(&pool.remaining, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&pool.lock);
            pthread_cond_signal(&pool.done);
            pthread_mutex_unlock(&pool.lock);
        }
    }
    return NULL;
}

/* Start workers up to `want` (owner only); returns how many there are. */
static int grow_workers(int want)
{
    while (pool.workers < want) {
        pool_worker *w = &pool.w[pool.workers];
        atomic_init(&w->go, 0);
        if (pthread_cond_init(&w->wake, NULL))
            break;
        pthread_attr_t attr;
        pthread_t th;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&th, &attr, worker_main, (void *)(intptr_t)pool.workers);
        pthread_attr_destroy(&attr);
        if (rc) {
            pthread_cond_destroy(&w->wake);
            break;
        }
        pool.workers++;
    }
    return pool.workers;
}

static void fork_region(int team, nd_region_fn fn, void *ctx)
{
    thread_setup();
    if (team <= 1 || tls_serial || tls_in_region || pthread_mutex_trylock(&pool.owner)) {
        fn(ctx, 0, 1);
        return;
    }
    int have = grow_workers(team - 1);
    if (team > have + 1)
        team = have + 1;
    if (team <= 1) {
        pthread_mutex_unlock(&pool.owner);
        fn(ctx, 0, 1);
        return;
    }
    tls_forks++;
    pool.fn = fn;
    pool.ctx = ctx;
    pool.team = team;
    atomic_store_explicit(&pool.remaining, team - 1, memory_order_relaxed);
    unsigned g = ++pool.gen;
    pthread_mutex_lock(&pool.lock);
    for (int i = 0; i < team - 1; i++) {
        atomic_store_explicit(&pool.w[i].go, g, memory_order_release);
        pthread_cond_signal(&pool.w[i].wake);
    }
    pthread_mutex_unlock(&pool.lock);

    tls_in_region = 1;
    fn(ctx, 0, team);
    tls_in_region = 0;

    for (int s = 0; s < POOL_SPIN; s++) {
        if (!atomic_load_explicit(&pool.remaining, memory_order_acquire))
            break;
        cpu_relax();
    }
    if (atomic_load_explicit(&pool.remaining, memory_order_acquire)) {
        pthread_mutex_lock(&pool.lock);
        while (atomic_load_explicit(&pool.remaining, memory_order_acquire))
            pthread_cond_wait(&pool.done, &pool.lock);
        pthread_mutex_unlock(&pool.lock);
    }
    pthread_mutex_unlock(&pool.owner);
}

#endif

/* ---- the crew (nd_crew_run) ---- */

#define CREW_MAX 64
/* a helper spins this long for the next call, then sleeps: a decode step's
 * serial stretches between calls last a few to tens of microseconds */
#define CREW_SPIN_S 200e-6
/* a share that keeps the caller waiting this long means its helper lost
 * its core: the crew's calls then run all their shares on the caller, as a
 * fork that got no threads would, for a hold that starts at CREW_HOLD_S
 * and doubles while the helper stays late (a machine busy with other
 * jobs), up to CREW_HOLD_MAX_S; a call after the hold tries the helper
 * again. (A hold for the crew's whole life ran everything after the
 * first 1 ms hiccup of a shared virtual machine on one thread: a loop of
 * 20,000 calls of ~200 us was no faster at two threads in 3 runs of 4;
 * with these holds, 1.9x.) */
#define CREW_LATE_S 1e-3
#define CREW_HOLD_S 4e-3
#define CREW_HOLD_MAX_S 64e-3
#define CREW_CALM_S 0.25

static inline void crew_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* a helper's slot: the generation of the call it is offered (gen << 2)
 * and where that offer stands */
enum { CREW_SKIPPED = 0, CREW_POSTED = 1, CREW_TAKEN = 2, CREW_DONE = 3 };

typedef struct {
    _Alignas(64) atomic_uint state;
    atomic_uint job; /* nd_async_begin's job: 0 none, else a CREW_ state */
} crew_slot;

typedef struct {
    void (*main_fn)(void *);
    void *ctx;
    /* the current call: written by the caller before it posts the call,
     * read by a helper after it took it */
    nd_region_fn fn;
    void *fctx;
    int fteam;
    unsigned gen;
    int helpers;    /* team - 1 */
    int busy;       /* the caller is inside a call's body (nested calls: serial) */
    int job_helper; /* the helper an nd_async_begin job went to (0: none out) */
    void (*job_fn)(void *);
    void *job_ctx;
    double hold_until; /* a helper was late (CREW_LATE_S): no posts until then */
    double hold;       /* the last hold's length (0: none yet) */
    double last_late;  /* when a helper was last late */
    double t_end;      /* when main returned (0: it ran without helpers) */
    atomic_int quit;
    atomic_int sleepers;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    crew_slot slot[CREW_MAX];
} nd_crew;

/* the crew whose main this thread runs */
static _Thread_local nd_crew *tls_crew;

/* until slot h's state differs from `seen` or the crew quits: spin, then
 * sleep on the crew's condition variable */
static void crew_wait(nd_crew *c, crew_slot *sl, unsigned seen)
{
    double t0 = 0.0;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(&sl->state, memory_order_acquire) != seen ||
            atomic_load_explicit(&sl->job, memory_order_acquire) == CREW_POSTED ||
            atomic_load_explicit(&c->quit, memory_order_acquire))
            return;
        crew_relax();
        if (i % 64 == 0) {
            double t = nd_wtime();
            if (t0 == 0.0)
                t0 = t;
            else if (t - t0 > CREW_SPIN_S)
                break;
        }
    }
    atomic_fetch_add(&c->sleepers, 1);
    pthread_mutex_lock(&c->lock);
    while (atomic_load(&sl->state) == seen && atomic_load(&sl->job) != CREW_POSTED &&
           !atomic_load(&c->quit))
        pthread_cond_wait(&c->wake, &c->lock);
    pthread_mutex_unlock(&c->lock);
    atomic_fetch_sub(&c->sleepers, 1);
}

/* helper h: take each call offered to it until the crew quits */
static void crew_serve(nd_crew *c, int h)
{
    crew_slot *sl = &c->slot[h];
    for (;;) {
        unsigned job = CREW_POSTED; /* a job first: it was handed out before any call */
        if (atomic_compare_exchange_strong(&sl->job, &job, CREW_TAKEN)) {
            c->job_fn(c->job_ctx);
            atomic_store_explicit(&sl->job, CREW_DONE, memory_order_release);
        }
        unsigned st = atomic_load_explicit(&sl->state, memory_order_acquire);
        if ((st & 3u) == CREW_POSTED) {
            unsigned g = st & ~3u;
            if (atomic_compare_exchange_strong(&sl->state, &st, g | CREW_TAKEN)) {
                c->fn(c->fctx, h, c->fteam);
                atomic_store_explicit(&sl->state, g | CREW_DONE, memory_order_release);
            }
            continue;
        }
        if (atomic_load_explicit(&c->quit, memory_order_acquire))
            return;
        crew_wait(c, sl, st);
    }
}

static void crew_wake_all(nd_crew *c)
{
    pthread_mutex_lock(&c->lock);
    pthread_cond_broadcast(&c->wake);
    pthread_mutex_unlock(&c->lock);
}

/* after a call: a late helper starts a hold, twice the last one where
 * the last late call was less than CREW_CALM_S ago (a machine busy with
 * other jobs: the holds grow to CREW_HOLD_MAX_S and stay there) */
static void crew_note_call(nd_crew *c, int late)
{
    if (!late)
        return;
    double now = nd_wtime();
    int again = c->hold > 0.0 && now - c->last_late < CREW_CALM_S;
    c->hold = again ? 2.0 * c->hold : CREW_HOLD_S;
    if (c->hold > CREW_HOLD_MAX_S)
        c->hold = CREW_HOLD_MAX_S;
    c->last_late = now;
    c->hold_until = now + c->hold;
}

/* crew_post_note: a post is a release store and the sleepers count is
 * read without a fence after it. A sequentially consistent store (x86:
 * xchg) held the caller until the slot's cache line came back from the
 * helper's core, ~0.25 us on every one of a decode step's ~80 posts. The
 * price is a rare missed wake-up: a helper that went to sleep just as the
 * post was made sleeps on, its share still POSTED, and the caller runs
 * that share itself after its own (crew_call, nd_async_end), as it does
 * for any helper that has not taken its share; the next post that sees
 * the sleeper wakes it. */

/* a parallel call of the crew's main: offered to the helpers, share 0 on
 * this thread, then the shares of helpers that have not taken theirs */
static void crew_call(nd_crew *c, int team, nd_region_fn fn, void *ctx)
{
    int helpers = team - 1 < c->helpers ? team - 1 : c->helpers;
    team = helpers + 1;
    tls_handoffs++;
    if (c->hold_until > 0.0) { /* held: every share here, a fork's tids */
        if (nd_wtime() < c->hold_until) {
            c->busy = 1;
            for (int t = 0; t < team; t++)
                fn(ctx, t, team);
            c->busy = 0;
            return;
        }
        c->hold_until = 0.0; /* the hold is over: the helpers again */
    }
    c->fn = fn;
    c->fctx = ctx;
    c->fteam = team;
    unsigned g = ++c->gen << 2;
    for (int h = 1; h <= helpers; h++)
        atomic_store_explicit(&c->slot[h].state, g | CREW_POSTED, memory_order_release);
    if (atomic_load_explicit(&c->sleepers, memory_order_relaxed)) /* see crew_post_note */
        crew_wake_all(c);
    c->busy = 1;
    int late = 0;
    fn(ctx, 0, team);
    for (int h = 1; h <= helpers; h++) {
        unsigned st = g | CREW_POSTED;
        if (atomic_compare_exchange_strong(&c->slot[h].state, &st, g | CREW_SKIPPED)) {
            fn(ctx, h, team);
            continue;
        }
        if (atomic_load_explicit(&c->slot[h].state, memory_order_acquire) == (g | CREW_DONE))
            continue;
        double t0 = nd_wtime();
        for (unsigned i = 1;
             atomic_load_explicit(&c->slot[h].state, memory_order_acquire) != (g | CREW_DONE);
             i++) {
            crew_relax();
            if (i % 4096 == 0) { /* its thread may have been parked mid-share */
                if (nd_wtime() - t0 > CREW_LATE_S)
                    late = 1;
                sched_yield();
            }
        }
        if (nd_wtime() - t0 > CREW_LATE_S) /* this thread may have been the one parked */
            late = 1;
    }
    c->busy = 0;
    crew_note_call(c, late);
}

static void crew_body(void *p, int tid, int team)
{
    nd_crew *c = p;
    if (tid > 0) {
        crew_serve(c, tid);
        return;
    }
    if (team > 1) {
        c->helpers = team - 1;
        nd_crew *prev = tls_crew;
        tls_crew = c;
        c->main_fn(c->ctx);
        nd_async_end();
        tls_crew = prev;
        c->t_end = nd_wtime();
        atomic_store(&c->quit, 1);
        crew_wake_all(c);
    } else {
        c->main_fn(c->ctx);
    }
}

int nd_crew_run(int team, void (*main_fn)(void *ctx), void *ctx)
{
    int max = nd_get_threads();
    team = team <= 0 || team > max ? max : team;
    if (team > CREW_MAX)
        team = CREW_MAX;
    if (team < 2 || tls_serial || tls_crew || nd_in_parallel()) {
        main_fn(ctx);
        return 0;
    }
    /* the slots on their own cache lines: malloc's 16-byte alignment is
     * not enough */
    nd_crew *c = aligned_alloc(64, (sizeof(nd_crew) + 63) / 64 * 64);
    if (!c || pthread_mutex_init(&c->lock, NULL)) {
        free(c);
        main_fn(ctx);
        return 0;
    }
    if (pthread_cond_init(&c->wake, NULL)) {
        pthread_mutex_destroy(&c->lock);
        free(c);
        main_fn(ctx);
        return 0;
    }
    c->main_fn = main_fn;
    c->ctx = ctx;
    c->fn = NULL;
    c->fctx = NULL;
    c->fteam = 0;
    c->gen = 0;
    c->helpers = 0;
    c->busy = 0;
    c->job_helper = 0;
    c->job_fn = NULL;
    c->job_ctx = NULL;
    c->hold_until = 0.0;
    c->hold = 0.0;
    c->last_late = 0.0;
    c->t_end = 0.0;
    atomic_init(&c->quit, 0);
    atomic_init(&c->sleepers, 0);
    for (int h = 0; h < CREW_MAX; h++) {
        atomic_init(&c->slot[h].state, 0);
        atomic_init(&c->slot[h].job, 0);
    }
    fork_region(team, crew_body, c);
    /* the join waited for helpers that had lost their cores */
    int late = c->hold_until > c->t_end || (c->t_end > 0.0 && nd_wtime() - c->t_end > CREW_LATE_S);
    pthread_cond_destroy(&c->wake);
    pthread_mutex_destroy(&c->lock);
    free(c);
    return late;
}

int nd_async_begin(void (*fn)(void *ctx), void *ctx)
{
    nd_crew *c = tls_crew;
    nd_async_end();
    if (!c || c->busy || c->helpers < 1 || (c->hold_until > 0.0 && nd_wtime() < c->hold_until)) {
        fn(ctx);
        return 0;
    }
    int h = c->helpers;
    c->job_fn = fn;
    c->job_ctx = ctx;
    c->job_helper = h;
    atomic_store_explicit(&c->slot[h].job, CREW_POSTED, memory_order_release);
    if (atomic_load_explicit(&c->sleepers, memory_order_relaxed)) /* see crew_post_note */
        crew_wake_all(c);
    return 1;
}

void nd_async_end(void)
{
    nd_crew *c = tls_crew;
    if (!c || !c->job_helper)
        return;
    crew_slot *sl = &c->slot[c->job_helper];
    c->job_helper = 0;
    unsigned st = CREW_POSTED;
    if (atomic_compare_exchange_strong(&sl->job, &st, CREW_SKIPPED)) {
        c->job_fn(c->job_ctx); /* not started: it runs here */
        return;
    }
    for (unsigned i = 1; atomic_load_explicit(&sl->job, memory_order_acquire) != CREW_DONE; i++) {
        crew_relax();
        if (i % 4096 == 0)
            sched_yield();
    }
    atomic_store_explicit(&sl->job, CREW_SKIPPED, memory_order_relaxed);
}

double nd_crew_hold_left(void)
{
    nd_crew *c = tls_crew;
    if (!c || c->hold_until <= 0.0)
        return 0.0;
    double left = c->hold_until - nd_wtime();
    return left > 0.0 ? left : 0.0;
}

/* a parallel call: handed to this thread's crew, or a team of its own */
static void run_region(int team, nd_region_fn fn, void *ctx)
{
    nd_crew *c = tls_crew;
    if (c && team > 1 && !tls_serial && !c->busy) {
        crew_call(c, team, fn, ctx);
        return;
    }
    fork_region(team, fn, ctx);
}

void nd_parallel_region(int team, nd_region_fn fn, void *ctx)
{
    int max = nd_get_threads();
    run_region(team <= 0 || team > max ? max : team, fn, ctx);
}

typedef struct {
    long n, grain;
    nd_range_fn fn;
    void *ctx;
    atomic_long next; /* dynamic schedule: first unclaimed item */
} range_job;

static void static_share(void *p, int tid, int team)
{
    range_job *j = p;
    long lo, hi;
    nd_share(j->n, tid, team, &lo, &hi);
    if (lo < hi)
        j->fn(j->ctx, lo, hi, tid);
}

static void dynamic_chunks(void *p, int tid, int team)
{
    (void)team;
    range_job *j = p;
    for (;;) {
        long lo = atomic_fetch_add_explicit(&j->next, j->grain, memory_order_relaxed);
        if (lo >= j->n)
            break;
        j->fn(j->ctx, lo, lo + j->grain < j->n ? lo + j->grain : j->n, tid);
    }
}

/* guided: a thread's first claim takes its even share of what is left
 * (1 / team of it), later claims half of that; every claim at least grain
 * and at least n / (8 team). Each claim moves the counter's cache line
 * between cores. A crew's helper starts a call ~0.3 us (the post's cache
 * line) to a few us (an async job first) after the caller: with a quarter
 * of the rest as every claim, a two-thread decode step made ~5 claims per
 * thread per call and waited on the helper's tail; even first claims gave
 * decode +5-8% at 2 and 4 bits (alternated runs). Before the floor, a
 * tail of one-item claims and the wait after it took 17% of the caller's
 * perf samples (12% with it). */
static void guided_chunks(void *p, int tid, int team)
{
    range_job *j = p;
    long lo = atomic_load_explicit(&j->next, memory_order_relaxed), hi;
    long share = team; /* the first claim's divisor, then 2 team */
    for (;;) {
        do {
            if (lo >= j->n)
                return;
            long take = (j->n - lo) / share, least = j->n / (8L * team);
            take = take < least ? least : take;
            take = take < j->grain ? j->grain : take;
            hi = j->n - lo < take ? j->n : lo + take;
        } while (!atomic_compare_exchange_weak_explicit(&j->next, &lo, hi, memory_order_relaxed,
                                                        memory_order_relaxed));
        share = 2L * team;
        j->fn(j->ctx, lo, hi, tid);
        lo = atomic_load_explicit(&j->next, memory_order_relaxed);
    }
}

/* threads worth using for n items of at least `grain` each */
static int team_for(long n, long grain)
{
    long most = (n + grain - 1) / grain;
    int max = nd_get_threads();
    return most < max ? (int)most : max;
}

/* fn over [0, n) by a team sized for items of at least `grain`, each
 * thread running `schedule` over the shared job */
static void run_range(long n, long grain, nd_region_fn schedule, nd_range_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    range_job j = {.n = n, .grain = grain, .fn = fn, .ctx = ctx};
    atomic_init(&j.next, 0);
    run_region(team_for(n, grain), schedule, &j);
}

void nd_parallel_for(long n, long grain, nd_range_fn fn, void *ctx)
{
    run_range(n, grain, static_share, fn, ctx);
}

void nd_parallel_for_dynamic(long n, long chunk, nd_range_fn fn, void *ctx)
{
    run_range(n, chunk, dynamic_chunks, fn, ctx);
}

void nd_parallel_for_guided(long n, long grain, nd_range_fn fn, void *ctx)
{
    run_range(n, grain, guided_chunks, fn, ctx);
}
