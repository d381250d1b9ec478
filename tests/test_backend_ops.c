/* Backend conformance test, in the style of ggml's test-backend-ops.
 *
 * Usage: test_backend_ops <backend>   (cpu, vulkan, vulkan:N, cuda, cuda:N)
 *
 * Every op of the backend interface (backend/backend.h) runs on random
 * inputs of awkward shapes on the target backend and on the CPU backend
 * with one thread (the reference), and the outputs are compared with a
 * tolerance per op. The target gets its inputs in its own alloc memory or,
 * for token/index/target arrays, row lists and some float inputs, in plain
 * host memory (the copy-at-issue path); outputs always lie in alloc memory,
 * pre-filled with the same random values on both sides (ops that
 * accumulate start from them). All ops of a case are issued before one
 * nd_backend_sync; chains of dependent ops check the backend's ordering.
 * Host inputs are overwritten (NaN, index 0) right after the ops are
 * issued: a device backend must have copied them at issue. Inputs are also
 * checked to be left unchanged. Each case runs twice on the target. A NULL
 * table entry (a partial table) makes its rows read MISSING instead of
 * crashing. An op the target declines (supports(), or
 * NEEDLE_BACKEND_DECLINE=op,...; the registry runs it on the CPU) is not
 * compared: its rows read DECLINED and fail unless
 * NEEDLE_TEST_ALLOW_DECLINED=1 (chains and the model still run, through
 * the CPU fallback). An op of backend/ops.def without cases fails the
 * run. At the end the small
 * all-parts model trains one padded and one packed (shared-prefix) batch
 * on both backends: losses and every LoRA and full gradient must agree.
 *
 * The "cpu" target is the CPU backend with 3 threads against 1: a check
 * that results do not depend on the thread count beyond rounding.
 *
 * One table line per op: op, cases, max abs error, max relative error
 * (|a - b| / max(|b|, 1% of the buffer's max |b|, 1e-2)), tolerance,
 * ok/FAIL/MISSING (a NULL entry in the target's table)/DECLINED,
 * and det: whether a second run of each case on the target gave the same
 * bits (the interface promises deterministic reductions; reported, not
 * failed).
 * Exit 0 when all pass, 1 on any failure, 77 when the backend is not
 * available ("skipped: <why>"; CTest shows the test as skipped), or 1
 * then too when NEEDLE_TEST_REQUIRE_BACKEND=1 (machines that have the
 * device: a plugin that fails to open must not pass as a skip).
 *
 * Self-test: NEEDLE_TEST_BREAK=<op> (e.g. matmul, attention_backward)
 * runs the target through a copy of its table whose <op> perturbs its
 * first output by ~1e-3 relative; the test must then fail on that op's
 * line (and on the chains and model lines that use it). defer:<op> runs
 * the op only at the next sync instead (backend_ops_break.c): its rows
 * with host inputs, and the chains, must fail. CTest runs a few of these
 * (test_backend_ops_break_*). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_ops.h"
#include "core/status.h"
#include "core/tuning.h"

nd_rng bo_rng;
const nd_backend *bo_ref;
static const nd_backend *tgt;
static int tgt_is_cpu;
enum { REF_THREADS = 1, CPU_TARGET_THREADS = 3 };

/* ---- result table ---- */

typedef struct {
    char op[48];
    int cases, fail;
    int nondet;   /* a second run on the target gave other bits */
    int model;    /* a model row (run once) */
    int missing;  /* the target's table has NULL for the op (or one the row needs) */
    int declined; /* the target declines the op (runs it on the CPU) */
    double tol, max_abs, max_rel;
} bo_row;

static bo_row rows[96];
static int n_rows, failures;

static int has_row(const char *op)
{
    for (int i = 0; i < n_rows; i++)
        if (!strcmp(rows[i].op, op))
            return 1;
    return 0;
}

static int n_rows_of(const char *op)
{
    for (int i = 0; i < n_rows; i++)
        if (!strcmp(rows[i].op, op))
            return i;
    return 0;
}

int bo_record(const char *op, double tol, double max_abs, double max_rel, int fail)
{
    bo_row *r = NULL;
    for (int i = 0; i < n_rows && !r; i++)
        if (!strcmp(rows[i].op, op))
            r = &rows[i];
    if (!r) {
        if (n_rows == (int)(sizeof rows / sizeof *rows)) {
            fprintf(stderr, "test_backend_ops: too many table rows\n");
            exit(2);
        }
        r = &rows[n_rows++];
        snprintf(r->op, sizeof r->op, "%s", op);
        r->model = !strncmp(op, "model:", 6) || !strncmp(op, "copies:", 7); /* no det */
    }
    r->cases++;
    r->tol = fmax(r->tol, tol);
    if (max_abs != max_abs) /* NaN: worse than anything */
        max_abs = INFINITY;
    if (max_rel != max_rel)
        max_rel = INFINITY;
    if (!(max_abs <= r->max_abs))
        r->max_abs = max_abs;
    if (!(max_rel <= r->max_rel))
        r->max_rel = max_rel;
    r->fail |= fail;
    failures += fail;
    return r->cases;
}

void bo_use(int target)
{
    if (tgt_is_cpu || !target)
        nd_backend_cpu(target ? CPU_TARGET_THREADS : REF_THREADS);
}

void bo_mark_missing(const char *op)
{
    bo_record(op, 0, 0, 0, 1);
    rows[n_rows_of(op)].missing = 1;
}

int bo_missing(const char *op)
{
    int any = strncmp(op, "chain:", 6) && strncmp(op, "model:", 6) ? 0 : 1;
    for (int i = 0; i < (int)ND_OP_COUNT; i++)
        if ((any || !strcmp(nd_op_name((enum nd_op)i), op)) && !nd_backend_has(tgt, (enum nd_op)i))
            return 1;
    return 0;
}

/* Whether the target declines op (it runs on the CPU): its row is not
 * compared (that would compare the CPU with itself) but reads DECLINED. */
static int declined(const char *op)
{
    enum nd_op k = nd_op_from_name(op);
    return k != ND_OP_COUNT && !nd_backend_supports(tgt, k);
}

/* ---- layouts ---- */

static nd_layout_buf lay[16];

const nd_layout *bo_layout(int slot, const int *pairs, int n)
{
    nd_layout_buf *b = &lay[slot];
    if (!b->seg && nd_layout_buf_init(b, 4096, 64)) {
        fprintf(stderr, "test_backend_ops: out of memory\n");
        exit(2);
    }
    nd_layout_reset(b);
    for (int i = 0; i < n; i++)
        if (nd_layout_add(b, pairs[2 * i], pairs[2 * i + 1]) < 0) {
            fprintf(stderr, "test_backend_ops: bad layout\n");
            exit(2);
        }
    return &b->L;
}

/* ---- cases ---- */

static bo_case cur;

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "test_backend_ops: out of memory\n");
        exit(2);
    }
    return p;
}

static void case_free(void)
{
    for (int i = 0; i < cur.nb; i++)
        free(cur.b[i].data);
    memset(&cur, 0, sizeof cur);
}

bo_case *bo_new(const char *op, double tol, bo_issue issue)
{
    case_free();
    cur.op = op;
    cur.tol = tol;
    cur.issue = issue;
    return &cur;
}

static int add_buf(bo_case *c, int kind, long n)
{
    if (c->nb == BO_MAXBUF) {
        fprintf(stderr, "test_backend_ops: too many buffers in a %s case\n", c->op);
        exit(2);
    }
    bo_buf *b = &c->b[c->nb];
    b->kind = kind;
    b->n = n;
    b->data = xmalloc(sizeof(float) * (size_t)n);
    memset(b->data, 0, sizeof(float) * (size_t)n);
    b->host = kind == BO_IIN;
    return c->nb++;
}

static void fill(float *x, long n, double scale)
{
    for (long i = 0; i < n; i++)
        x[i] = (float)(scale * nd_rng_normal(&bo_rng));
}

int bo_fin(bo_case *c, long n, double scale)
{
    int i = add_buf(c, BO_FIN, n);
    fill(c->b[i].data, n, scale);
    c->b[i].host = nd_rng_below(&bo_rng, 4) == 0;
    return i;
}

int bo_fout(bo_case *c, long n, double scale)
{
    int i = add_buf(c, BO_FOUT, n);
    fill(c->b[i].data, n, scale);
    return i;
}

int bo_iin(bo_case *c, long n, const int32_t *vals)
{
    int i = add_buf(c, BO_IIN, n);
    if (vals)
        memcpy(c->b[i].data, vals, sizeof(int32_t) * (size_t)n);
    return i;
}

int bo_iout(bo_case *c, long n)
{
    int i = add_buf(c, BO_IOUT, n);
    int32_t *x = c->b[i].data;
    for (long j = 0; j < n; j++)
        x[j] = -7; /* never a valid index */
    return i;
}

float *bo_f(bo_case *c, int i)
{
    return c->b[i].data;
}

int32_t *bo_i(bo_case *c, int i)
{
    return c->b[i].data;
}

/* Buffers of one side: the reference gets host copies; the target gets
 * alloc memory except for inputs marked host. */
static void side_setup(const nd_backend *be, int target, const bo_case *c, void **p, int *on_dev)
{
    for (int i = 0; i < c->nb; i++) {
        const bo_buf *b = &c->b[i];
        size_t bytes = sizeof(float) * (size_t)b->n;
        int dev = target && !(b->host && (b->kind == BO_FIN || b->kind == BO_IIN));
        p[i] = dev ? be->alloc(be, bytes ? bytes : 4) : xmalloc(bytes);
        if (!p[i]) {
            fprintf(stderr, "test_backend_ops: %s: alloc of %zu bytes failed\n", be->name, bytes);
            exit(2);
        }
        if (dev)
            nd_backend_upload(be, p[i], b->data, bytes);
        else
            memcpy(p[i], b->data, bytes);
        on_dev[i] = dev;
    }
}

/* The buffers of one side where the host reads them: alloc memory through
 * the backend's copies (its memory may be device memory), host memory as
 * it is. side_release ends it. */
static void side_fetch(const nd_backend *be, const bo_case *c, void **p, const int *on_dev,
                       void **h)
{
    for (int i = 0; i < c->nb; i++) {
        h[i] = on_dev[i] ? nd_backend_map(be, p[i], sizeof(float) * (size_t)c->b[i].n, 1) : p[i];
        if (!h[i]) {
            fprintf(stderr, "test_backend_ops: out of memory\n");
            exit(2);
        }
    }
}

static void side_release(const nd_backend *be, const bo_case *c, void **p, const int *on_dev,
                         void **h)
{
    for (int i = 0; i < c->nb; i++)
        if (on_dev[i])
            nd_backend_unmap(be, p[i], h[i], sizeof(float) * (size_t)c->b[i].n, 0);
}

static void side_free(const nd_backend *be, const bo_case *c, void **p, const int *on_dev)
{
    for (int i = 0; i < c->nb; i++) {
        if (on_dev[i])
            be->free(be, p[i]);
        else
            free(p[i]);
    }
}

/* Max abs error and relative error of a against the reference b:
 * |a - b| / max(|b|, floor), floor = 1% of the buffer's max |b| (at least
 * 1e-2), so elements near zero by cancellation do not dominate. */
static void compare(const float *a, const float *b, long n, double *mabs, double *mrel)
{
    double mb = 0;
    for (long i = 0; i < n; i++)
        mb = fmax(mb, fabs((double)b[i]));
    /* inputs are O(1): an output that is ~0 in exact arithmetic (dq of a
     * row that sees one key) is rounding noise of that size, so the floor
     * is never below 1e-2 */
    double floor = fmax(1e-2 * mb, 1e-2);
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d != d)
            d = INFINITY; /* NaN on either side */
        if (!(d <= *mabs))
            *mabs = d;
        double r = d / fmax(fabs((double)b[i]), floor);
        if (!(r <= *mrel))
            *mrel = r;
    }
}

/* One run on the target; returns 1 when a const host input changed. */
static int target_run(const bo_case *c, void **pt, int *dt)
{
    side_setup(tgt, 1, c, pt, dt);
    c->issue(tgt, c, pt);
    /* host inputs are copied when an op is issued: the host may reuse them
     * at once (a backend that reads them later sees NaN and index 0) */
    int fail = 0;
    for (int i = 0; i < c->nb; i++) {
        const bo_buf *b = &c->b[i];
        if (dt[i] || (b->kind != BO_FIN && b->kind != BO_IIN))
            continue;
        if (memcmp(pt[i], b->data, sizeof(float) * (size_t)b->n)) {
            fprintf(stderr, "%s: the target changed const host input %d\n", c->op, i);
            fail = 1;
        }
        if (b->kind == BO_FIN)
            for (long j = 0; j < b->n; j++)
                ((float *)pt[i])[j] = NAN;
        else
            memset(pt[i], 0, sizeof(int32_t) * (size_t)b->n);
    }
    nd_backend_sync(tgt);
    return fail;
}

void bo_run(bo_case *c)
{
    if (bo_missing(c->op)) { /* a partial backend: the row says so */
        bo_mark_missing(c->op);
        return;
    }
    if (declined(c->op)) {
        if (!has_row(c->op)) {
            bo_record(c->op, c->tol, 0, 0, 0);
            rows[n_rows - 1].declined = 1;
        }
        return;
    }
    void *pr[BO_MAXBUF], *pt[BO_MAXBUF], *p2[BO_MAXBUF];
    int dr[BO_MAXBUF], dt[BO_MAXBUF], d2[BO_MAXBUF];
    const nd_backend *ref = bo_ref;
    bo_use(0);
    side_setup(ref, 0, c, pr, dr);
    c->issue(ref, c, pr);
    nd_backend_sync(ref);
    bo_use(1);
    int fail = target_run(c, pt, dt);
    /* a second run must give the same bits ("reductions over rows are
     * deterministic"): reported in the table's det column, not a failure */
    fail |= target_run(c, p2, d2);
    void *h1[BO_MAXBUF], *h2[BO_MAXBUF];
    side_fetch(tgt, c, pt, dt, h1);
    side_fetch(tgt, c, p2, d2, h2);

    double mabs = 0, mrel = 0;
    int same = 1;
    for (int i = 0; i < c->nb; i++) {
        const bo_buf *b = &c->b[i];
        size_t bytes = sizeof(float) * (size_t)b->n;
        if (b->kind == BO_FOUT || b->kind == BO_IOUT)
            same &= !memcmp(h1[i], h2[i], bytes);
        if (b->kind == BO_FOUT) {
            compare(h1[i], pr[i], b->n, &mabs, &mrel);
        } else if (b->kind == BO_IOUT) {
            if (memcmp(h1[i], pr[i], bytes)) {
                fprintf(stderr, "%s: int32 output %d differs\n", c->op, i);
                mrel = INFINITY;
            }
        } else if (dt[i] && memcmp(h1[i], b->data, bytes)) {
            fprintf(stderr, "%s: the target changed const input %d\n", c->op, i);
            fail = 1;
        }
    }
    fail |= !(mrel <= c->tol);
    int k = bo_record(c->op, c->tol, mabs, mrel, fail);
    if (!same)
        rows[n_rows_of(c->op)].nondet = 1;
    if (fail)
        fprintf(stderr, "FAIL %s, case %d: max abs %.3g, max rel %.3g (tol %.1g)\n", c->op, k, mabs,
                mrel, c->tol);
    side_release(tgt, c, pt, dt, h1);
    side_release(tgt, c, p2, d2, h2);
    side_free(ref, c, pr, dr);
    side_free(tgt, c, pt, dt);
    side_free(tgt, c, p2, d2);
    bo_use(0);
}

static void print_table(void)
{
    printf("%-38s %5s %10s %10s %8s  %-6s %s\n", "op", "cases", "max_abs", "max_rel", "tol",
           "result", "det");
    for (int i = 0; i < n_rows; i++) {
        const bo_row *r = &rows[i];
        printf("%-38s %5d %10.2e %10.2e %8.0e  %-6s %s\n", r->op, r->cases, r->max_abs, r->max_rel,
               r->tol,
               r->missing    ? "MISSING"
               : r->declined ? "DECLINED"
               : r->fail     ? "FAIL"
                             : "ok",
               r->nondet  ? "NO"
               : r->model ? "-"
                          : "yes");
    }
}

/* The host's way into alloc memory (backend.h): upload, zero and download
 * keep issue order with the ops. x is uploaded, an op adds it to y, x is
 * overwritten by a second upload and partly zeroed, another op adds it
 * again; then y and x come back by download. A backend whose copies run
 * out of order with its ops (or lose the source buffer's contents before
 * the copy ran) gives other sums. */
static void copies_check(void)
{
    enum { N = 3000, Z0 = 1000, ZN = 700 }; /* beyond one 4 KB page; zero an inner span */
    static float x1[N], x2[N], y0[N], want_y[N], want_x[N], got_y[N], got_x[N];
    for (int i = 0; i < N; i++) {
        x1[i] = (float)nd_rng_normal(&bo_rng);
        x2[i] = (float)nd_rng_normal(&bo_rng);
        y0[i] = (float)nd_rng_normal(&bo_rng);
    }
    for (int i = 0; i < N; i++) {
        want_x[i] = i >= Z0 && i < Z0 + ZN ? 0.0f : x2[i];
        want_y[i] = (y0[i] + x1[i]) + 2.0f * want_x[i];
    }
    bo_use(1);
    float *x = tgt->alloc(tgt, sizeof x1), *y = tgt->alloc(tgt, sizeof y0);
    if (!x || !y) {
        fprintf(stderr, "test_backend_ops: copies: alloc failed\n");
        exit(2);
    }
    float buf[N];
    memcpy(buf, y0, sizeof buf);
    nd_backend_upload(tgt, y, buf, sizeof buf);
    memcpy(buf, x1, sizeof buf);
    nd_backend_upload(tgt, x, buf, sizeof buf);
    memset(buf, 0xff, sizeof buf); /* the source may be reused at once */
    tgt->add(tgt, y, x, 1.0f, N);
    memcpy(buf, x2, sizeof buf);
    nd_backend_upload(tgt, x, buf, sizeof buf);
    memset(buf, 0xff, sizeof buf);
    nd_backend_zero(tgt, x + Z0, sizeof(float) * ZN);
    tgt->add(tgt, y, x, 2.0f, N);
    nd_backend_download(tgt, got_y, y, sizeof got_y);
    nd_backend_download(tgt, got_x, x, sizeof got_x);
    double mabs = 0, mrel = 0;
    compare(got_y, want_y, N, &mabs, &mrel);
    compare(got_x, want_x, N, &mabs, &mrel);
    tgt->free(tgt, x);
    tgt->free(tgt, y);
    bo_use(0);
    int fail = !(mrel <= 1e-6);
    if (fail)
        fprintf(stderr, "copies: upload / zero / download out of order (max rel %.3g)\n", mrel);
    bo_record("copies: upload, zero, download", 1e-6, mabs, mrel, fail);
    /* CUDA: an allocation beyond the card's free memory is a clean NULL
     * (the caller's "out of cuda memory"), not an abort or a hang */
    if (!strcmp(tgt->name, "cuda")) {
        bo_use(1);
        void *huge = tgt->alloc(tgt, (size_t)1 << 50);
        if (huge)
            tgt->free(tgt, huge);
        bo_use(0);
        if (huge)
            fprintf(stderr, "copies: a 1 PB alloc did not return NULL\n");
        bo_record("copies: alloc beyond free memory", 0, 0, 0, huge != NULL);
    }
}

/* cpu, auto, cuda, cuda:N, vulkan, vulkan:N (a typo must not read as a skip) */
static int valid_name(const char *name)
{
    if (!strcmp(name, "cpu") || !strcmp(name, "auto"))
        return 1;
    const char *kinds[2] = {"cuda", "vulkan"};
    for (int k = 0; k < 2; k++) {
        size_t n = strlen(kinds[k]);
        if (strncmp(name, kinds[k], n))
            continue;
        if (!name[n])
            return 1;
        if (name[n] != ':' || !name[n + 1])
            return 0;
        for (const char *c = name + n + 1; *c; c++)
            if (*c < '0' || *c > '9')
                return 0;
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    nd_tuning_refresh(); /* NEEDLE_PLUGIN_DIR ... (core/tuning.h) */
    if (argc != 2) {
        fprintf(stderr, "usage: test_backend_ops <backend: cpu, vulkan[:N], cuda[:N]>\n");
        return 2;
    }
    const char *name = argv[1];
    tgt_is_cpu = !strcmp(name, "cpu");
    bo_ref = nd_backend_cpu(REF_THREADS);
    if (!valid_name(name)) {
        fprintf(stderr,
                "test_backend_ops: unknown backend '%s' (cpu, auto, cuda[:N], vulkan[:N])\n", name);
        return 2;
    }
    tgt = nd_backend_get(name, tgt_is_cpu ? CPU_TARGET_THREADS : 0);
    if (!tgt && strstr(nd_last_error(), "NEEDLE_BACKEND_DECLINE")) {
        fprintf(stderr, "test_backend_ops: %s\n", nd_last_error()); /* a typo, not a skip */
        return 2;
    }
    if (!tgt) {
        /* nd_backend_get does not say whether the backend is absent (no
         * plugin, runtime or device) or present but broken: a machine that
         * has the device sets NEEDLE_TEST_REQUIRE_BACKEND=1 to fail here */
        const char *req = getenv("NEEDLE_TEST_REQUIRE_BACKEND");
        if (req && *req && strcmp(req, "0")) {
            printf("FAIL: backend %s required but unavailable: %s\n", name, nd_last_error());
            return 1;
        }
        printf("skipped: %s\n", nd_last_error());
        return 77;
    }
    const char *brk = getenv("NEEDLE_TEST_BREAK");
    if (brk && *brk) {
        const nd_backend *b = bo_break(tgt, brk);
        if (!b) {
            fprintf(stderr, "NEEDLE_TEST_BREAK=%s: no such op\n", brk);
            return 2;
        }
        printf("NEEDLE_TEST_BREAK=%s: %s perturbs its first output (this run must FAIL)\n", brk,
               brk);
        tgt = b;
    }
    bo_ref = nd_backend_cpu(REF_THREADS);
    printf("target %s (%s%s%s), reference cpu with %d thread%s\n", name, tgt->name,
           tgt->detail && *tgt->detail ? ", " : "", tgt->detail ? tgt->detail : "", REF_THREADS,
           REF_THREADS == 1 ? "" : "s");
    nd_rng_seed(&bo_rng, 20261203);
    bo_cases_forward();
    bo_cases_backward();
    bo_cases_hada3();
    bo_cases_chains();
    bo_cases_v3();
    case_free();
    copies_check();
    bo_model_check(tgt);
    bo_use(0);
    print_table();
    /* every op of backend/ops.def has cases: a new op needs its own */
    for (int i = 0; i < (int)ND_OP_COUNT; i++)
        if (!has_row(nd_op_name((enum nd_op)i))) {
            printf("FAIL: op %s has no conformance cases (tests/backend_ops_cases.c, "
                   "backend_ops_backward.c)\n",
                   nd_op_name((enum nd_op)i));
            failures++;
        }
    /* declined ops ran on the CPU: named, and a failure unless accepted */
    int n_declined = 0;
    for (int i = 0; i < n_rows; i++)
        if (rows[i].declined)
            printf("%s %s",
                   n_declined++ ? "," : "declined by the target (run on the CPU):", rows[i].op);
    if (n_declined) {
        const char *allow = getenv("NEEDLE_TEST_ALLOW_DECLINED");
        int ok = allow && *allow && strcmp(allow, "0");
        printf("\n%d op%s declined: %s\n", n_declined, n_declined == 1 ? "" : "s",
               ok ? "accepted (NEEDLE_TEST_ALLOW_DECLINED=1)"
                  : "FAIL (NEEDLE_TEST_ALLOW_DECLINED=1 accepts a backend that declines ops)");
        if (!ok)
            failures += n_declined;
    }
    for (int i = 0; i < 16; i++)
        nd_layout_buf_free(&lay[i]);
    printf("test_backend_ops %s: %d table rows, %s\n", name, n_rows,
           failures ? "FAILED" : "all ok");
    return failures ? 1 : 0;
}
