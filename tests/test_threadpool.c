/* core/threadpool.h: coverage of every item exactly once (static and
 * dynamic schedules, n = 0, 1, fewer items than threads), tids, nested
 * calls, calls from several threads at once, thread count changes, the
 * serial switch and the sleep/wake path of the pool. The same test runs on
 * OpenMP builds (`make check`) and on our pool (`make noomp-check`, and
 * under ThreadSanitizer in `make tsan-check`). */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/threadpool.h"
#include "testutil.h"

#define MAXN 5000
#define MAXT 8

typedef struct {
    atomic_int hits[MAXN]; /* times each item was run */
    int owner[MAXN];       /* tid that ran it */
    atomic_int calls;      /* fn invocations */
    atomic_int tid_used[MAXT];
    atomic_int bad;        /* a check inside a body failed */
    atomic_long first_len; /* length of the range that starts at item 0 */
    pthread_t caller;
    long chunk;        /* dynamic: expected chunk size */
    int nested_serial; /* crew_range: the call has a team, so calls in its body are serial */
} record;

static void record_reset(record *r)
{
    memset(r, 0, sizeof *r);
    r->caller = pthread_self();
}

static void record_range(void *p, long lo, long hi, int tid)
{
    record *r = p;
    atomic_fetch_add(&r->calls, 1);
    if (tid < 0 || tid >= MAXT || lo >= hi ||
        (tid == 0) != !!pthread_equal(pthread_self(), r->caller))
        atomic_store(&r->bad, 1);
    if (tid >= 0 && tid < MAXT)
        atomic_store(&r->tid_used[tid], 1);
    if (r->chunk && (lo % r->chunk || (hi - lo > r->chunk)))
        atomic_store(&r->bad, 1);
    if (lo == 0)
        atomic_store(&r->first_len, hi - lo);
    for (long i = lo; i < hi; i++) {
        atomic_fetch_add(&r->hits[i], 1);
        r->owner[i] = tid;
    }
}

static int all_once(record *r, long n)
{
    for (long i = 0; i < n; i++)
        if (atomic_load(&r->hits[i]) != 1)
            return 0;
    return 1;
}

static int tids_used(record *r)
{
    int k = 0;
    for (int t = 0; t < MAXT; t++)
        k += atomic_load(&r->tid_used[t]);
    return k;
}

static record R;

static void test_static(void)
{
    nd_set_threads(4);
    CHECK(nd_get_threads() == 4);

    record_reset(&R);
    nd_parallel_for(0, 1, record_range, &R);
    CHECK(atomic_load(&R.calls) == 0);

    record_reset(&R);
    nd_parallel_for(1, 1, record_range, &R);
    CHECK(atomic_load(&R.calls) == 1 && all_once(&R, 1) && R.owner[0] == 0);

    /* fewer items than threads: one item per thread, nobody idle called */
    record_reset(&R);
    nd_parallel_for(3, 1, record_range, &R);
    CHECK(all_once(&R, 3) && atomic_load(&R.calls) == 3 && !atomic_load(&R.bad));

    /* many items: contiguous shares in tid order (deterministic split) */
    record_reset(&R);
    nd_parallel_for(MAXN, 1, record_range, &R);
    CHECK(all_once(&R, MAXN) && !atomic_load(&R.bad));
    int ok = 1;
    for (long i = 1; i < MAXN; i++)
        ok &= R.owner[i] >= R.owner[i - 1];
    CHECK_MSG(ok, "static shares are not in tid order");
    int team = tids_used(&R);
    CHECK(team >= 1 && team <= 4);
    for (long i = 0; i < MAXN; i++) {
        long lo, hi;
        nd_share(MAXN, R.owner[i], team, &lo, &hi);
        ok &= i >= lo && i < hi;
    }
    CHECK_MSG(ok, "static shares differ from nd_share");
    printf("  static: team of %d for 4 threads\n", team);

    /* grain: 10 items of grain 4 use at most 3 threads */
    record_reset(&R);
    nd_parallel_for(10, 4, record_range, &R);
    CHECK(all_once(&R, 10) && tids_used(&R) <= 3);
    /* grain >= n: serial on the caller */
    record_reset(&R);
    nd_parallel_for(10, 10, record_range, &R);
    CHECK(all_once(&R, 10) && atomic_load(&R.calls) == 1 && R.owner[9] == 0);
}

static void test_dynamic(void)
{
    nd_set_threads(4);
    long sizes[] = {0, 1, 3, 997, MAXN};
    long chunks[] = {1, 7, 64};
    for (int s = 0; s < 5; s++)
        for (int c = 0; c < 3; c++) {
            record_reset(&R);
            R.chunk = chunks[c];
            nd_parallel_for_dynamic(sizes[s], chunks[c], record_range, &R);
            CHECK_MSG(all_once(&R, sizes[s]) && !atomic_load(&R.bad), "dynamic n=%ld chunk=%ld",
                      sizes[s], chunks[c]);
            long want = (sizes[s] + chunks[c] - 1) / chunks[c];
            CHECK(atomic_load(&R.calls) == want);
        }
}

/* guided: every item once; ranges never below the grain (but the last),
 * and items of equal cost need a few claims per thread, not one each */
static void test_guided(void)
{
    nd_set_threads(4);
    long sizes[] = {0, 1, 3, 997, MAXN};
    long grains[] = {1, 7, 64};
    for (int s = 0; s < 5; s++)
        for (int c = 0; c < 3; c++) {
            record_reset(&R);
            nd_parallel_for_guided(sizes[s], grains[c], record_range, &R);
            CHECK_MSG(all_once(&R, sizes[s]) && !atomic_load(&R.bad), "guided n=%ld grain=%ld",
                      sizes[s], grains[c]);
            long most = (sizes[s] + grains[c] - 1) / grains[c];
            CHECK_MSG(atomic_load(&R.calls) <= most, "guided n=%ld grain=%ld: %d calls", sizes[s],
                      grains[c], atomic_load(&R.calls));
        }
    /* 997 items of grain 1 on 4 threads: halving per claim, ~log2 claims each */
    record_reset(&R);
    nd_parallel_for_guided(997, 1, record_range, &R);
    CHECK_MSG(atomic_load(&R.calls) < 100, "guided: %d claims for 997 items",
              atomic_load(&R.calls));
    /* a decode step's matrix-vector call (96 tasks, 2 threads): no tail of
     * one-item claims (each claim moves a cache line between cores) */
    nd_set_threads(2);
    record_reset(&R);
    nd_parallel_for_guided(96, 1, record_range, &R);
    CHECK_MSG(all_once(&R, 96) && atomic_load(&R.calls) <= 12, "guided: %d claims for 96 items",
              atomic_load(&R.calls));
    /* the first claim (the one at item 0) is a thread's even share: a
     * crew's helper starts late, and smaller first claims left a longer
     * tail and more claims (decode 5-8% slower) */
    CHECK_MSG(atomic_load(&R.first_len) >= 96 / 2, "guided: first claim %ld of 96 items, 2 threads",
              atomic_load(&R.first_len));
}

/* ---- nested ---- */

typedef struct {
    atomic_int bad, inner_calls;
    record *inner;
} nest_ctx;

static void inner_range(void *p, long lo, long hi, int tid)
{
    nest_ctx *c = p;
    atomic_fetch_add(&c->inner_calls, 1);
    /* serial on the calling thread: the whole range, tid 0 */
    if (tid != 0 || lo != 0 || hi != 100)
        atomic_store(&c->bad, 1);
}

static void outer_range(void *p, long lo, long hi, int tid)
{
    (void)lo;
    (void)hi;
    (void)tid;
    nest_ctx *c = p;
    if (!nd_in_parallel() && nd_get_threads() > 1)
        atomic_store(&c->bad, 1);
    nd_parallel_for(100, 1, inner_range, c);
    nd_parallel_for_dynamic(100, 100, inner_range, c);
}

static void test_nested(void)
{
    nd_set_threads(4);
    nest_ctx c = {0};
    CHECK(!nd_in_parallel());
    nd_parallel_for(8, 1, outer_range, &c);
    CHECK(!atomic_load(&c.bad));
    /* one inner call of each kind per outer share */
    CHECK(atomic_load(&c.inner_calls) >= 2 && atomic_load(&c.inner_calls) % 2 == 0);
    CHECK(!nd_in_parallel());
}

/* ---- regions ---- */

typedef struct {
    atomic_int seen[MAXT], bad, team;
} region_ctx;

static void region_body(void *p, int tid, int team)
{
    region_ctx *c = p;
    if (tid < 0 || tid >= team || team > MAXT)
        atomic_store(&c->bad, 1);
    else
        atomic_fetch_add(&c->seen[tid], 1);
    atomic_store(&c->team, team);
}

static void test_region(void)
{
    int asks[] = {0, 1, 2, 3, 99};
    nd_set_threads(3);
    for (int i = 0; i < 5; i++) {
        region_ctx c = {0};
        nd_parallel_region(asks[i], region_body, &c);
        int team = atomic_load(&c.team), want = asks[i] <= 0 || asks[i] > 3 ? 3 : asks[i];
        CHECK(!atomic_load(&c.bad) && team >= 1 && team <= want);
        for (int t = 0; t < team; t++)
            CHECK(atomic_load(&c.seen[t]) == 1);
    }
}

/* ---- thread count changes, serial switch ---- */

static void test_counts(void)
{
    int counts[] = {1, 3, 2, 4, 1, 4};
    for (int i = 0; i < 6; i++) {
        nd_set_threads(counts[i]);
        CHECK(nd_get_threads() == counts[i]);
        record_reset(&R);
        nd_parallel_for(MAXN, 1, record_range, &R);
        CHECK(all_once(&R, MAXN) && tids_used(&R) <= counts[i]);
        if (counts[i] == 1)
            CHECK(atomic_load(&R.calls) == 1);
    }
    nd_set_threads(4);
    int prev = nd_set_serial(1);
    CHECK(prev == 0);
    record_reset(&R);
    nd_parallel_for(MAXN, 1, record_range, &R);
    CHECK(all_once(&R, MAXN) && atomic_load(&R.calls) == 1);
    CHECK(nd_set_serial(prev) == 1);
}

/* ---- several callers at once ---- */

#define CALLERS 4
#define ROUNDS 300

typedef struct {
    long n;
    double *x;
    double *sum; /* per tid */
} sum_ctx;

static void sum_range(void *p, long lo, long hi, int tid)
{
    sum_ctx *c = p;
    double s = 0;
    for (long i = lo; i < hi; i++)
        s += c->x[i];
    c->sum[tid] = s;
}

static void *caller_main(void *arg)
{
    long id = (long)(size_t)arg, n = 1000 + 37 * id;
    double *x = malloc(sizeof *x * (size_t)n), part[64];
    long bad = 0;
    for (long i = 0; i < n; i++)
        x[i] = (double)(i % 10);
    double want = 0;
    for (long i = 0; i < n; i++)
        want += x[i];
    for (int r = 0; r < ROUNDS; r++) {
        for (int t = 0; t < 64; t++)
            part[t] = 0;
        sum_ctx c = {n, x, part};
        if (r & 1)
            nd_parallel_for_dynamic(n, 50, sum_range, &c);
        else
            nd_parallel_for(n, 1, sum_range, &c);
        double got = 0;
        for (int t = 0; t < 64; t++)
            got += part[t];
        /* dynamic: a tid may run several chunks; only the static sums add up */
        if (!(r & 1) && got != want)
            bad++;
    }
    free(x);
    return (void *)(size_t)bad;
}

static void test_concurrent(void)
{
    nd_set_threads(3);
    pthread_t th[CALLERS];
    for (long i = 0; i < CALLERS; i++)
        CHECK(pthread_create(&th[i], NULL, caller_main, (void *)(size_t)i) == 0);
    long bad = 0;
    for (int i = 0; i < CALLERS; i++) {
        void *rv;
        pthread_join(th[i], &rv);
        bad += (long)(size_t)rv;
    }
    CHECK_MSG(bad == 0, "%ld wrong sums from concurrent callers", bad);
}

/* ---- sleep and wake: pauses longer than the workers' spin ---- */

static void test_sleep_wake(void)
{
    nd_set_threads(3);
    struct timespec nap = {0, 2000000}; /* 2 ms */
    int ok = 1;
    for (int i = 0; i < 30; i++) {
        nanosleep(&nap, NULL);
        record_reset(&R);
        nd_parallel_for(MAXN, 1, record_range, &R);
        ok &= all_once(&R, MAXN) && !atomic_load(&R.bad);
    }
    CHECK(ok);
    /* and many back-to-back calls (the spinning path) */
    for (int i = 0; i < 2000 && ok; i++) {
        record_reset(&R);
        nd_parallel_for(64, 1, record_range, &R);
        ok &= all_once(&R, 64);
    }
    CHECK(ok);
}

/* ---- the crew: one team for all of a main's calls ---- */

typedef struct {
    int calls;     /* parallel calls main made */
    int bad;       /* a check in main failed */
    long forks0;   /* forks before main's calls */
    long forks_in; /* forks main's calls made */
    long hand_in;  /* handoffs main's calls made */
    int waited;    /* the rendezvous call saw a helper run its share */
    int serial_ok; /* serial mode inside main ran on the caller, no handoff */
    int nested_ok; /* nd_crew_run inside main ran its main directly */
    int naps;      /* main sleeps past the helpers' spin before each call */
} crew_ctx;

static void count_range(void *p, long lo, long hi, int tid)
{
    (void)tid;
    atomic_fetch_add((atomic_int *)p, (int)(hi - lo));
}

/* tid 0 on the caller (a skipped helper's share may run there too, under
 * the helper's tid) */
static void crew_range(void *p, long lo, long hi, int tid)
{
    record *r = p;
    atomic_fetch_add(&r->calls, 1);
    if (tid < 0 || tid >= MAXT || lo >= hi ||
        (tid == 0 && !pthread_equal(pthread_self(), r->caller)))
        atomic_store(&r->bad, 1);
    if (tid >= 0 && tid < MAXT)
        atomic_store(&r->tid_used[tid], 1);
    for (long i = lo; i < hi; i++) {
        atomic_fetch_add(&r->hits[i], 1);
        r->owner[i] = tid;
    }
    /* a call in the body of a call with a team: serial on this thread, no
     * fork or handoff (a call without one runs its body as the caller) */
    if (!r->nested_serial)
        return;
    long f0, h0, f1, h1;
    atomic_int inner = 0;
    nd_parallel_counts(&f0, &h0);
    nd_parallel_for(64, 1, count_range, &inner);
    nd_parallel_counts(&f1, &h1);
    if (f1 != f0 || h1 != h0 || atomic_load(&inner) != 64)
        atomic_store(&r->bad, 1);
}

typedef struct {
    atomic_int ran[MAXT];
    atomic_int bad;
    pthread_t caller;
} meet_ctx;

/* tid 0 waits (up to 5 s) until another thread has run a share: only a
 * crew whose helpers run beside the caller gets past it early */
static void meet_body(void *p, int tid, int team)
{
    meet_ctx *m = p;
    if (tid < 0 || tid >= team || team > MAXT)
        atomic_store(&m->bad, 1);
    else
        atomic_fetch_add(&m->ran[tid], 1);
    if (tid != 0)
        return;
    if (!pthread_equal(pthread_self(), m->caller))
        atomic_store(&m->bad, 1);
    double t0 = nd_wtime();
    while (nd_wtime() - t0 < 5.0) {
        int other = 0;
        for (int t = 1; t < team; t++)
            other += atomic_load(&m->ran[t]);
        if (other)
            return;
    }
    atomic_store(&m->bad, 2); /* nobody came */
}

static void inner_main(void *p)
{
    *(int *)p = 1;
}

static void crew_main(void *p)
{
    crew_ctx *c = p;
    struct timespec nap = {0, 2000000}; /* 2 ms: longer than a helper spins */
    long f0, h0;
    nd_parallel_counts(&f0, &h0);
    c->forks0 = f0;
    /* first (a helper that a loaded machine parks over 1 ms in a later
     * call ends the crew's posts): the helpers run beside the caller */
    meet_ctx m = {0};
    m.caller = pthread_self();
    if (c->naps)
        nanosleep(&nap, NULL);
    nd_parallel_region(0, meet_body, &m);
    c->calls++;
    c->waited = atomic_load(&m.bad) == 0;
    int ok = 1;
    long sizes[] = {1, 3, 997, MAXN};
    for (int kind = 0; kind < 3; kind++)
        for (int s = 0; s < 4; s++) {
            if (c->naps)
                nanosleep(&nap, NULL);
            long g = kind == 0 ? 1 : kind == 1 ? 7 : 3;
            int team = (sizes[s] + g - 1) / g > 1; /* else no team: no handoff */
            record_reset(&R);
            R.nested_serial = team;
            if (kind == 0)
                nd_parallel_for(sizes[s], g, crew_range, &R);
            else if (kind == 1)
                nd_parallel_for_dynamic(sizes[s], g, crew_range, &R);
            else
                nd_parallel_for_guided(sizes[s], g, crew_range, &R);
            c->calls += team;
            ok &= all_once(&R, sizes[s]) && !atomic_load(&R.bad);
            if (kind == 0 && sizes[s] == MAXN) { /* static: nd_share's split */
                int team = nd_get_threads();
                for (long i = 0; i < MAXN; i++) {
                    long lo, hi;
                    nd_share(MAXN, R.owner[i], team, &lo, &hi);
                    ok &= i >= lo && i < hi;
                }
            }
        }
    /* regions: each tid once */
    region_ctx rc = {0};
    nd_parallel_region(0, region_body, &rc);
    c->calls++;
    ok &= !atomic_load(&rc.bad) && atomic_load(&rc.team) == nd_get_threads();
    for (int t = 0; t < atomic_load(&rc.team); t++)
        ok &= atomic_load(&rc.seen[t]) == 1;
    /* serial mode: no handoff */
    long f1, h1;
    nd_parallel_counts(&f1, &h1);
    int prev = nd_set_serial(1);
    record_reset(&R);
    nd_parallel_for(MAXN, 1, crew_range, &R);
    nd_set_serial(prev);
    long f2, h2;
    nd_parallel_counts(&f2, &h2);
    c->serial_ok = all_once(&R, MAXN) && atomic_load(&R.calls) == 1 && f2 == f1 && h2 == h1;
    /* a crew inside a crew: main runs directly */
    int ran = 0;
    nd_crew_run(0, inner_main, &ran);
    nd_parallel_counts(&f2, &h2);
    c->nested_ok = ran && f2 == f1;
    c->forks_in = f2 - f0;
    c->hand_in = h2 - h0;
    c->bad = !ok;
}

static void test_crew(void)
{
    for (int naps = 0; naps < 2; naps++) {
        nd_set_threads(3);
        crew_ctx c = {0};
        c.naps = naps;
        long f0, h0, f1, h1;
        nd_parallel_counts(&f0, &h0);
        nd_crew_run(0, crew_main, &c);
        nd_parallel_counts(&f1, &h1);
        CHECK_MSG(!c.bad, "crew calls (naps %d): wrong coverage or shares", naps);
        CHECK_MSG(c.waited, "crew (naps %d): no helper ran beside the caller", naps);
        CHECK(c.serial_ok && c.nested_ok);
        /* every call of main a handoff, none a fork; the crew one fork */
        CHECK_MSG(c.forks_in == 0 && c.hand_in == c.calls,
                  "crew: %ld forks, %ld handoffs for %d calls", c.forks_in, c.hand_in, c.calls);
        CHECK_MSG(f1 - f0 == 1 && h1 - h0 == c.calls, "crew: %ld forks, %ld handoffs in all",
                  f1 - f0, h1 - h0);
    }
    /* one thread, or serial: main just runs, calls serial */
    nd_set_threads(1);
    crew_ctx c = {0};
    long f0, h0, f1, h1;
    nd_parallel_counts(&f0, &h0);
    int ran = 0;
    nd_crew_run(0, inner_main, &ran);
    CHECK(ran == 1);
    nd_set_threads(3);
    int prev = nd_set_serial(1);
    ran = 0;
    nd_crew_run(0, inner_main, &ran);
    CHECK(ran == 1);
    nd_set_serial(prev);
    nd_parallel_counts(&f1, &h1);
    CHECK(f1 == f0 && h1 == h0);
    (void)c;
    /* outside a crew each call is a fork of its own */
    nd_parallel_counts(&f0, &h0);
    record_reset(&R);
    nd_parallel_for(MAXN, 1, record_range, &R);
    nd_parallel_counts(&f1, &h1);
    CHECK(all_once(&R, MAXN) && f1 - f0 <= 1 && h1 == h0);
}

/* a helper that keeps the caller waiting (5 ms, past the crew's 1 ms):
 * the crew's next calls run every share on the caller; once the hold is
 * over (4 ms after a first late call), the helper takes its share again */
typedef struct {
    pthread_t caller;
    atomic_int started, shares, on_caller, bad;
    int slow, meet;
    int held_shares, held_on_caller; /* the call right after the late one */
    int held;                        /* that call ran within the hold */
} late_ctx;

static void late_body(void *p, int tid, int team)
{
    late_ctx *l = p;
    int mine = pthread_equal(pthread_self(), l->caller);
    atomic_fetch_add(&l->shares, 1);
    atomic_fetch_add(&l->on_caller, mine);
    if (tid < 0 || tid >= team)
        atomic_store(&l->bad, 1);
    if (l->meet && tid == 1 && !mine)
        atomic_store(&l->started, 1);
    if (l->meet && tid == 0) { /* until the helper runs its share (at most 5 s) */
        double t0 = nd_wtime();
        while (!atomic_load(&l->started) && nd_wtime() - t0 < 5.0)
            ;
    }
    if (!l->slow)
        return;
    if (tid == 1 && !mine) {
        atomic_store(&l->started, 1);
        struct timespec nap = {0, 5000000};
        nanosleep(&nap, NULL);
    } else if (tid == 0) { /* until the helper has its share (at most 5 s) */
        double t0 = nd_wtime();
        while (!atomic_load(&l->started) && nd_wtime() - t0 < 5.0)
            ;
    }
}

static void late_main(void *p)
{
    late_ctx *l = p;
    l->slow = 1;
    nd_parallel_region(0, late_body, l);
    if (!atomic_load(&l->started))
        atomic_store(&l->bad, 2); /* no helper took its share */
    l->slow = 0;
    atomic_store(&l->shares, 0);
    atomic_store(&l->on_caller, 0);
    double left = nd_crew_hold_left(), t0 = nd_wtime();
    nd_parallel_region(0, late_body, l);
    l->held = nd_wtime() - t0 < left; /* else the machine kept us past it */
    l->held_shares = atomic_load(&l->shares);
    l->held_on_caller = atomic_load(&l->on_caller);
    struct timespec nap = {0, 20000000}; /* 20 ms: past the 4 ms hold */
    nanosleep(&nap, NULL);
    atomic_store(&l->started, 0);
    atomic_store(&l->shares, 0);
    atomic_store(&l->on_caller, 0);
    l->meet = 1;
    nd_parallel_region(0, late_body, l);
}

static void test_crew_late(void)
{
    nd_set_threads(2);
    late_ctx l;
    /* the call after the late one must fall within the 4 ms hold to say
     * anything; a loaded machine can keep the caller off its core longer:
     * then the crew runs again (a few times at most, in practice) */
    int tries = 0;
    do {
        memset(&l, 0, sizeof l);
        l.caller = pthread_self();
        nd_crew_run(0, late_main, &l);
    } while (!l.held && ++tries < 50);
    CHECK_MSG(l.held, "late crew: no call of %d fell within the hold", tries);
    CHECK_MSG(atomic_load(&l.bad) == 0, "late crew: bad %d", atomic_load(&l.bad));
    CHECK_MSG(l.held_shares == 2 && l.held_on_caller == 2,
              "late crew: %d of %d shares on the caller right after a late helper",
              l.held_on_caller, l.held_shares);
    CHECK_MSG(atomic_load(&l.shares) == 2 && atomic_load(&l.on_caller) == 1,
              "late crew: %d of %d shares on the caller after the hold (want 1 of 2)",
              atomic_load(&l.on_caller), atomic_load(&l.shares));
}

/* ---- nd_async_begin / nd_async_end: one job beside the caller ---- */

typedef struct {
    pthread_t caller;
    atomic_int go;     /* the caller has passed nd_async_begin */
    atomic_int runs;   /* times the job ran */
    atomic_int off;    /* it ran on another thread */
    atomic_int waited; /* it saw `go` while running (it ran beside the caller) */
    atomic_int order;  /* jobs finished so far, when this one started */
    atomic_int *finished;
    int wait_for_go;
} job_ctx;

static void job_fn(void *p)
{
    job_ctx *j = p;
    atomic_store(&j->order, atomic_load(j->finished));
    atomic_fetch_add(&j->runs, 1);
    atomic_store(&j->off, !pthread_equal(pthread_self(), j->caller));
    if (j->wait_for_go) { /* until the caller is past nd_async_begin (5 s at most) */
        double t0 = nd_wtime();
        while (!atomic_load(&j->go) && nd_wtime() - t0 < 5.0)
            ;
        atomic_store(&j->waited, atomic_load(&j->go));
    }
    atomic_fetch_add(j->finished, 1);
}

typedef struct {
    atomic_int finished;
    job_ctx a, b, c, left; /* left: still out when main returns */
    int handed_a, handed_left, cover_ok, serial_handed;
    int held_left, serial_held; /* the crew held its helper then (a loaded machine) */
} async_ctx;

static void async_main(void *p)
{
    async_ctx *x = p;
    /* a: runs on a helper beside the caller, while a parallel call goes on */
    x->handed_a = nd_async_begin(job_fn, &x->a);
    double t0 = nd_wtime(); /* a helper takes it (a new pool thread may take a while) */
    while (!atomic_load(&x->a.runs) && nd_wtime() - t0 < 5.0)
        ;
    atomic_store(&x->a.go, 1);
    record_reset(&R);
    nd_parallel_for_guided(MAXN, 1, record_range, &R);
    x->cover_ok = all_once(&R, MAXN) && !atomic_load(&R.bad);
    nd_async_end();
    /* b then c: a second begin ends the first job before the second starts */
    int prev = nd_set_serial(1); /* serial mode keeps small calls here, not jobs */
    x->serial_held = nd_crew_hold_left() > 0.0;
    x->serial_handed = nd_async_begin(job_fn, &x->b);
    nd_set_serial(prev);
    atomic_store(&x->b.go, 1);
    nd_async_begin(job_fn, &x->c);
    atomic_store(&x->c.go, 1);
    nd_async_end();
    nd_async_end(); /* nothing out: returns at once */
    x->held_left = nd_crew_hold_left() > 0.0;
    x->handed_left = nd_async_begin(job_fn, &x->left);
    atomic_store(&x->left.go, 1);
}

static void test_async(void)
{
    /* outside a crew: the job runs at once, on the caller */
    atomic_int finished = 0;
    job_ctx j = {.caller = pthread_self(), .finished = &finished};
    CHECK(nd_async_begin(job_fn, &j) == 0);
    CHECK(atomic_load(&j.runs) == 1 && !atomic_load(&j.off));
    nd_async_end();
    CHECK(atomic_load(&j.runs) == 1);
    for (int threads = 2; threads <= 3; threads++) {
        nd_set_threads(threads);
        async_ctx x = {0};
        job_ctx *jobs[4] = {&x.a, &x.b, &x.c, &x.left};
        for (int i = 0; i < 4; i++) {
            jobs[i]->caller = pthread_self();
            jobs[i]->finished = &x.finished;
            jobs[i]->wait_for_go = 1;
        }
        nd_crew_run(0, async_main, &x);
        CHECK_MSG(x.handed_a && atomic_load(&x.a.off) && atomic_load(&x.a.waited),
                  "async (%d threads): handed %d, off the caller %d, beside it %d", threads,
                  x.handed_a, atomic_load(&x.a.off), atomic_load(&x.a.waited));
        CHECK_MSG(x.cover_ok, "async (%d threads): a parallel call beside a job", threads);
        /* handed to the helper, unless a late helper (a loaded machine,
         * in the guided call above) started a hold: then it ran here */
        CHECK_MSG((x.serial_handed || x.serial_held) && (x.handed_left || x.held_left),
                  "async (%d threads): serial mode handed %d (held %d), last handed %d (held %d)",
                  threads, x.serial_handed, x.serial_held, x.handed_left, x.held_left);
        for (int i = 0; i < 4; i++)
            CHECK_MSG(atomic_load(&jobs[i]->runs) == 1, "async job %d ran %d times", i,
                      atomic_load(&jobs[i]->runs));
        /* in order: b was ended (by c's begin) before c started */
        CHECK_MSG(atomic_load(&x.c.order) > atomic_load(&x.b.order),
                  "async: job c started before job b finished");
        CHECK(atomic_load(&x.finished) == 4); /* the crew's end ended `left` */
    }
}

int main(void)
{
    double t0 = nd_wtime();
    test_static();
    test_dynamic();
    test_guided();
    test_nested();
    test_region();
    test_counts();
    test_concurrent();
    test_sleep_wake();
    test_crew();
    test_crew_late();
    test_async();
    CHECK(nd_wtime() >= t0);
    return tu_finish("test_threadpool");
}
