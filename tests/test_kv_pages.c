/* Which pages of a KV state a forward maps (nd_kv_map_rows,
 * nd_kv_map_scratch), by mincore(2) on its arrays:
 *   - a prompt's new K/V rows and a decode step's 64 rows ahead are mapped
 *     before the layers write them, and no row past that;
 *   - a full chunk maps the whole scratch at once; a call shorter than a
 *     chunk after the scratch was handed back maps only what it writes
 *     (a session's peak memory depends on it: docs/engine.md).
 * A needle2-layout model at a test's size (d 256, 2 layers), 2 bits, int8
 * KV rows. Where the kernel lacks MADV_POPULATE_WRITE (before Linux 5.14)
 * the mapping is advice that does nothing: the test says so and skips. */
#define _DEFAULT_SOURCE /* mincore, madvise */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/status.h"
#include "core/threadpool.h"
#include "engine/engine.h"
#include "engine/model_internal.h"
#include "io/cact.h"
#include "model/params.h"
#include "testutil.h"

/* resident pages of those wholly inside [p, p + bytes), and how many */
static long resident(const void *p, size_t bytes, long *pages)
{
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
    uintptr_t e = ((uintptr_t)p + bytes) & ~((uintptr_t)pg - 1);
    *pages = e > a ? (long)((e - a) / (uintptr_t)pg) : 0;
    if (*pages == 0)
        return 0;
    unsigned char *v = calloc((size_t)*pages, 1);
    long n = 0;
    if (v && !mincore((void *)a, e - a, v))
        for (long i = 0; i < *pages; i++)
            n += v[i] & 1;
    else
        n = -1;
    free(v);
    return n;
}

/* can this kernel populate pages on request? */
static int populate_works(void)
{
    long pg = sysconf(_SC_PAGESIZE);
    void *p = mmap(NULL, (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return 0;
#ifdef MADV_POPULATE_WRITE
    int ok = madvise(p, (size_t)pg, MADV_POPULATE_WRITE) == 0;
#else
    int ok = 0;
#endif
    munmap(p, (size_t)pg);
    return ok;
}

/* engram site 0's v' rows [r0, r1) (d bytes a row as int8, 4d as float:
 * whole pages for 64 rows): pages resident / pages */
static double vp_rows_resident(const nd_kv_state *s, int r0, int r1)
{
    size_t row = (size_t)s->m->dims.d * (s->vp_int8 ? 1 : sizeof(float));
    const char *base = s->vp_int8 ? (const char *)s->vp8[0] : (const char *)s->vp[0];
    long pages, n = resident(base + (size_t)r0 * row, (size_t)(r1 - r0) * row, &pages);
    return pages ? (double)n / (double)pages : -1.0;
}

static double scratch_resident(const nd_kv_state *s)
{
    long pages, n = resident((const char *)s->scratch + s->scratch_keep,
                             s->scratch_bytes - s->scratch_keep, &pages);
    return pages ? (double)n / (double)pages : -1.0;
}

static void check_pages(const san_model *mq, const nd_qweights *qw)
{
    const nd_backend *be = nd_backend_cpu(0);
    nd_kv_state s;
    CHECK(nd_kv_init(&s, mq, be, 64, 0) == 0);
    nd_kv_use_quant(&s, qw);
    nd_kv_set_bits(&s, 8);
    int V = mq->dims.V;
    int32_t toks[200];
    for (int i = 0; i < 200; i++)
        toks[i] = 4 + (i * 7919) % (V - 4);
    float *lg = malloc(sizeof *lg * (size_t)V);

    /* a 64-token prompt (one full chunk): its rows and the whole scratch */
    CHECK(nd_kv_forward(&s, toks, 64, lg, 0) == 0);
    CHECK_MSG(s.faulted == 64, "faulted %d after a 64-row prompt", s.faulted);
    double sc = scratch_resident(&s);
    CHECK_MSG(sc == 1.0, "a full chunk left %.0f%% of the scratch unmapped", 100.0 * (1.0 - sc));
    /* a decode step maps 64 rows ahead of the rows held, no more */
    CHECK(nd_kv_forward(&s, toks + 64, 1, lg, 0) == 0);
    CHECK_MSG(s.faulted == 128, "faulted %d after a decode step at 64 rows (want 128)", s.faulted);
    double ahead = vp_rows_resident(&s, 66, s.faulted);
    CHECK_MSG(ahead == 1.0, "rows ahead of the step %.0f%% mapped", 100.0 * ahead);
    if (s.cap > s.faulted + 128) {
        double past = vp_rows_resident(&s, s.faulted + 64, s.cap);
        CHECK_MSG(past == 0.0, "rows past the mapped ones %.0f%% resident", 100.0 * past);
    }
    /* the scratch handed back (as between a session's turns), then a call
     * shorter than a chunk (a 12-word turn): only what it writes comes back */
    nd_kv_release_scratch(&s);
    CHECK_MSG(scratch_resident(&s) < 0.05, "released scratch %.0f%% resident",
              100.0 * scratch_resident(&s));
    CHECK(nd_kv_forward(&s, toks + 65, 20, lg, 0) == 0);
    sc = scratch_resident(&s);
    CHECK_MSG(sc < 0.6, "a 20-token call mapped %.0f%% of the scratch", 100.0 * sc);
    printf(
        "test_kv_pages: cap %d rows, faulted %d; scratch %.0f%% resident after a 20-token call\n",
        s.cap, s.faulted, 100.0 * sc);
    free(lg);
    nd_kv_free(&s);
}

int main(void)
{
    if (!populate_works()) {
        printf("test_kv_pages: this kernel has no MADV_POPULATE_WRITE: nothing to check\n");
        return 77;
    }
    nd_set_threads(1);
    nd_tokenizer *tok = NULL;
    if (nd_tokenizer_load("models/tokenizer.model", &tok)) {
        fprintf(stderr, "test_kv_pages: %s\n", nd_last_error());
        return 1;
    }
    san_model src;
    tu_small_needle2(&src, 7);
    size_t len = 0;
    unsigned char *arch = tu_archive(&src, tok, 2, 0, &len);
    CHECK(arch != NULL);
    if (arch) {
        cact_file f;
        CHECK(cact_parse(arch, len, &f) == 0);
        san_model mq;
        nd_qweights qw;
        CHECK_MSG(nd_cact_to_qmodel(&f, &mq, &qw) == 0, "%s", nd_last_error());
        check_pages(&mq, &qw);
        san_model_free(&mq);
        nd_qweights_free(&qw);
        cact_free(&f);
        free(arch);
    }
    san_model_free(&src);
    nd_tokenizer_free(tok);
    return tu_finish("test_kv_pages");
}
