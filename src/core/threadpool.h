/* Parallel loops with one kernel body for both builds.
 *
 * With OpenMP (-fopenmp defines _OPENMP) each call is an OpenMP parallel
 * region. Without it (CMake -DNEEDLE_OPENMP=OFF, e.g. Apple clang with no
 * libomp) the same calls run on a small persistent pthread pool
 * (threadpool.c): workers are created on first use, spin briefly after a
 * job and then sleep on a condition variable, so an idle pool costs nothing.
 *
 * Nesting and concurrency: a call made inside a parallel body runs serially
 * on the calling thread. The pool serves one call at a time: a call from
 * another thread while it is busy (the engine runs sessions on several
 * threads) runs serially on that thread instead of waiting. Results never
 * depend on which thread ran a share, only on the team size; reductions
 * that keep one partial per tid are deterministic for a given team. The
 * pool is not fork-safe: a child process must not use its parent's pool
 * (needle does not fork). */
#ifndef ND_THREADPOOL_H
#define ND_THREADPOOL_H

/* Body of a loop over [lo, hi), run by thread `tid` (0 = the caller;
 * tid < nd_get_threads() as read before the call, so per-thread scratch
 * sized by it can be indexed by tid). */
typedef void (*nd_range_fn)(void *ctx, long lo, long hi, int tid);

/* Body of a region: thread `tid` of a team of `team` threads. */
typedef void (*nd_region_fn)(void *ctx, int tid, int team);

/* fn over [0, n), split statically into one contiguous share per thread:
 * thread t of a team of T gets [n t / T, n (t + 1) / T). The team is at
 * most n / grain (rounded up) threads, so grain >= n runs serially. */
void nd_parallel_for(long n, long grain, nd_range_fn fn, void *ctx);

/* fn over [0, n) in chunks of `chunk` items handed out in order from a
 * shared counter (unbalanced work; OpenMP's schedule(dynamic, chunk)). */
void nd_parallel_for_dynamic(long n, long chunk, nd_range_fn fn, void *ctx);

/* fn over [0, n) in shrinking chunks from a shared counter: each claim is
 * half of what is left per thread, at least `grain` and n / (8 team)
 * (OpenMP's schedule(guided) with a floor). For items of about equal cost whose threads may
 * arrive late: a few claims per thread instead of one per item. */
void nd_parallel_for_guided(long n, long grain, nd_range_fn fn, void *ctx);

/* fn once on each thread of a team of min(team, nd_get_threads()) threads
 * (team <= 0: all of them). The team may be smaller (nested, busy pool):
 * bodies must use the `team` they are given. */
void nd_parallel_region(int team, nd_region_fn fn, void *ctx);

/* A crew: main(ctx) runs on the calling thread while up to team - 1 other
 * threads (team <= 0: nd_get_threads()) wait beside it for work, and each
 * parallel call that main makes on this thread (nd_parallel_for, _dynamic,
 * _guided, _region, when not serial) is handed to them instead of starting
 * a new team: one fork and join for all of main's calls (an engine step
 * makes ~80). The shares and tids are those of a fork with the same team,
 * so results are the same. A helper that has not picked up a call by the
 * time the caller has finished its own share is skipped (its share runs on
 * the caller, under the helper's tid), so a thread the OS parked before
 * the call delays nothing. Helpers spin briefly between calls, then sleep.
 * Calls from inside a call's body run serially, as always; main itself
 * runs inside a parallel region (nd_in_parallel() is true). Where no team
 * can be had (one thread, serial mode, nested, a busy pool) main just runs.
 * A helper that keeps the caller waiting over a millisecond (in a share it
 * took, or at the end) means its core is busy with other work: the crew's
 * later calls then run all their shares on the caller, and nd_crew_run
 * returns 1 (else 0), so the caller can stop asking for threads a while. */
int nd_crew_run(int team, void (*main_fn)(void *ctx), void *ctx);

/* One job beside the caller: inside a crew's main, nd_async_begin hands
 * fn(ctx) to the crew's last helper and returns at once (the helper takes
 * the crew's later calls when it is done; shares it has not taken by then
 * run on the caller, as always); nd_async_end waits for it, or runs it
 * here when the helper has not started it, also in serial mode (a decode
 * step keeps its small calls on the caller, not its job). Elsewhere (no
 * crew, a held crew, inside a call's body) fn runs at once in
 * nd_async_begin. One job at a time per crew: a begin while one is out
 * ends that one first, and the crew's main returning ends it too. For a
 * decode step's serial work whose result is needed only later (the
 * engine's lane-mix matrix: Sinkhorn). fn must not make parallel calls
 * (they would run serially). Returns 1 when the job was handed off. */
int nd_async_begin(void (*fn)(void *ctx), void *ctx);
void nd_async_end(void);

/* Seconds left of this thread's crew's hold (a late helper: its calls run
 * every share on the caller, jobs run at once), 0 when none. For tests:
 * what a call makes of the crew depends on it, and a loaded machine can
 * start one at any call. */
double nd_crew_hold_left(void);

/* This thread's parallel calls so far: forks (teams started: parallel
 * regions; a crew is one) and handoffs (calls run by a crew). Cheap
 * thread-local counters for tests and measurements. */
void nd_parallel_counts(long *forks, long *handoffs);

/* thread t's contiguous share [lo, hi) of n items in a team of `team` */
static inline void nd_share(long n, int tid, int team, long *lo, long *hi)
{
    *lo = n * tid / team;
    *hi = n * (tid + 1) / team;
}

/* Team size for parallel calls. Default: OMP_NUM_THREADS when set, else
 * the online cores. nd_set_threads is process-wide (the CLI's --threads). */
int nd_get_threads(void);
void nd_set_threads(int threads);

/* Non-zero inside a parallel body (where calls run serially). */
int nd_in_parallel(void);

/* Make this thread's parallel calls serial (on != 0) or not; returns the
 * previous setting. For work too small to be worth a fork/join. */
int nd_set_serial(int on);
/* This thread's setting (non-zero: serial). */
int nd_serial(void);

/* Fixed splits: while on (this thread), kernels whose results could depend
 * on how their work is cut among threads cut it by the work's shape alone,
 * the same at every team size, so one thread and a team give the same
 * bits. The CPU backend's GEMM is one: OpenBLAS may round a row of C
 * differently depending on the size of the call it is in (its Haswell
 * kernels do), so blocks sized by the team change results. Costs some
 * speed where a block's shared operand is big (it is packed per block, not
 * per thread). Returns the previous setting. */
int nd_set_fixed_split(int on);
/* This thread's setting (non-zero: fixed splits). */
int nd_fixed_split(void);

/* Without OpenMP: run fn on each thread that enters a parallel call (the
 * pool's workers, callers) once before its work, and again after another
 * nd_parallel_setup. For per-thread library settings, e.g. an OpenBLAS that
 * must stay single-threaded inside our threads. Ignored with OpenMP. */
void nd_parallel_setup(void (*fn)(void));

/* Wall-clock seconds since an arbitrary origin. */
double nd_wtime(void);

#endif
