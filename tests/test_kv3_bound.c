/* Needle 3's decoder history bounded (issue 32): the q/k/v conv taps keep
 * a ring of their last rows (plus the rows at the pinned prefix's end), the
 * local (sliding-window) layers a ring of window + ND_KV_TAIL rows past the
 * pinned prefix, instead of every retained position.
 *
 * A bounded state and an unbounded one (nd_kv_set_unbounded: every row
 * kept, the engine before the bound) run the same multi-turn conversation
 * of a tiny3 model (conv taps 3, local window 4, a CLA pair), 100 turns
 * (int8 K/V rows, a session's) and 40 (float rows), through the session's
 * sliding window (pinned prefix + kv_window, rows dropped):
 * prompts in chunks, decoded tokens one at a time (the reference's argmax),
 * resets to the prefix, failed turns rewound to their start. Every logits
 * row is bit-for-bit the same; the bounded state's bytes are flat from
 * turn 20 to the last and below the unbounded
 * one's by at least the conv rows and local rows it no longer keeps.
 *
 * A rewind past what the rings hold (a long turn rewound to its start, a
 * rewind into the middle of the prefix) runs the rows again from the
 * pinned prefix's end (or row 0) at the next forward: the logits after it
 * equal the reference's within float rounding (the rows are the same
 * computation, run in other chunks). A copy of the pinned prefix taken
 * after the rings wrapped (the prefix cache's) restores exactly. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/status.h"
#include "core/threadpool.h"
#include "engine/engine.h"
#include "engine/kv_internal.h"
#include "model/san.h"
#include "testutil.h"

#define PREFIX 24

static void random_model(san_model *m)
{
    san_config c;
    CHECK(san_config_preset(&c, "tiny3") == 0);
    c.max_seq_len = 256;
    CHECK_MSG(san_model_create(m, &c) == 0, "%s", nd_last_error());
    san_model_init_random(m, 7);
    nd_rng r;
    nd_rng_seed(&r, 11);
    for (size_t i = 0; i < m->numel; i++)
        m->mem[i] += (float)(0.05 * nd_rng_normal(&r));
}

typedef struct {
    nd_kv_state b, r; /* bounded, reference */
    float *lb, *lr;
    int V, Vo;
    long rows, mismatches; /* logits rows compared, rows that differ */
    double worst;          /* largest relative difference */
} pair;

static void pair_init(pair *p, const san_model *m, int kv_window, int bits)
{
    const nd_backend *be = nd_backend_cpu(0);
    memset(p, 0, sizeof *p);
    CHECK_MSG(nd_kv_init(&p->b, m, be, ND_SESSION_CHUNK, kv_window) == 0, "%s", nd_last_error());
    CHECK(nd_kv_init(&p->r, m, be, ND_SESSION_CHUNK, kv_window) == 0);
    CHECK(nd_kv_set_unbounded(&p->r) == 0);
    nd_kv_set_bits(&p->b, bits);
    nd_kv_set_bits(&p->r, bits);
    p->V = m->dims.V;
    p->Vo = m->dims.V_out;
    p->lb = malloc(sizeof(float) * (size_t)p->V);
    p->lr = malloc(sizeof(float) * (size_t)p->V);
}

static void pair_free(pair *p)
{
    nd_kv_free(&p->b);
    nd_kv_free(&p->r);
    free(p->lb);
    free(p->lr);
}

/* n tokens through both; the last row's logits compared */
static int pair_run(pair *p, const int32_t *tok, int n)
{
    int rb = nd_kv_forward(&p->b, tok, n, p->lb, 0), rr = nd_kv_forward(&p->r, tok, n, p->lr, 0);
    CHECK_MSG(rb == 0 && rr == 0, "forward: %s", nd_last_error());
    if (rb || rr)
        return -1;
    CHECK(p->b.len == p->r.len && p->b.evicted == p->r.evicted);
    p->rows++;
    if (memcmp(p->lb, p->lr, sizeof(float) * (size_t)p->V)) {
        p->mismatches++;
        double mx = 0, ref = 1e-6;
        for (int t = 0; t < p->Vo; t++) {
            double d = fabs((double)p->lb[t] - p->lr[t]), v = fabs((double)p->lr[t]);
            mx = d > mx ? d : mx;
            ref = v > ref ? v : ref;
        }
        p->worst = mx / ref > p->worst ? mx / ref : p->worst;
    }
    return 0;
}

static int32_t argmax(const float *lg, int Vo)
{
    int best = 0;
    for (int t = 1; t < Vo; t++)
        if (lg[t] > lg[best])
            best = t;
    return best;
}

/* g tokens decoded one at a time (the reference's pick) */
static int pair_decode(pair *p, int g)
{
    for (int i = 0; i < g; i++) {
        int32_t t = argmax(p->lr, p->Vo);
        if (pair_run(p, &t, 1))
            return -1;
    }
    return 0;
}

static void pair_rewind(pair *p, int len)
{
    nd_kv_rewind(&p->b, len);
    nd_kv_rewind(&p->r, len);
}

static void pair_slide(pair *p, int n)
{
    nd_kv_slide(&p->b, n);
    nd_kv_slide(&p->r, n);
}

static void random_tokens(nd_rng *r, int32_t *t, int n)
{
    for (int i = 0; i < n; i++)
        t[i] = 5 + (int)(nd_rng_next(r) % 400);
}

/* turns through the sliding window: resets, short failed turns */
static void check_conversation(const san_model *m, int bits, int turns)
{
    pair p;
    pair_init(&p, m, 100, bits);
    nd_rng r;
    nd_rng_seed(&r, 21 + (unsigned)bits);
    int32_t tok[64];
    random_tokens(&r, tok, PREFIX);
    if (pair_run(&p, tok, PREFIX)) { /* the prefix, before it is pinned */
        pair_free(&p);
        return;
    }
    pair_slide(&p, PREFIX);
    CHECK_MSG(p.b.lr_ring > 0 && p.b.lr_ring < p.r.cap - PREFIX,
              "local ring %d rows (cache %d rows, prefix %d)", p.b.lr_ring, p.r.cap, PREFIX);
    size_t at20 = 0, worst_after = 0;
    int resets = 0, failed = 0;
    long dropped = 0;
    for (int turn = 1; turn <= turns; turn++) {
        int start = p.r.len;
        long start_ev = p.r.evicted;
        int n_in = 3 + (turn * 7) % 20;
        random_tokens(&r, tok, n_in);
        if (pair_run(&p, tok, n_in) || pair_decode(&p, 5 + (turn * 13) % 30))
            break;
        if (turn % 10 == 4) { /* a failed turn: back to where it started (session.c) */
            long back = start - (p.r.evicted - start_ev);
            pair_rewind(&p, back > PREFIX ? (int)back : PREFIX);
            failed++;
        } else if (turn % 10 == 9) { /* needle_session_reset */
            pair_rewind(&p, PREFIX);
            pair_slide(&p, PREFIX);
            resets++;
        }
        dropped = p.r.evicted > dropped ? p.r.evicted : dropped;
        size_t bytes = nd_kv_bytes(&p.b);
        if (turn == 20)
            at20 = bytes;
        if (turn >= 20)
            worst_after = bytes > worst_after ? bytes : worst_after;
    }
    CHECK_MSG(dropped > 0 && resets == turns / 10 && failed == turns / 10, "%ld rows dropped",
              dropped);
    CHECK_MSG(p.mismatches == 0,
              "%d-bit rows: %ld of %ld logits rows differ from the unbounded state (worst rel "
              "%g)",
              bits, p.mismatches, p.rows, p.worst);
    /* memory: flat from turn 20 on, within the bound, and without the
     * conv rows and local rows the unbounded state keeps */
    size_t bb = nd_kv_bytes(&p.b), br = nd_kv_bytes(&p.r);
    const san_dims *D = &m->dims;
    size_t cw = sizeof(float) * ((size_t)D->q_dim + D->k_dim + D->v_dim) * (size_t)D->L;
    int nloc = 0;
    for (int i = 0; i < p.b.kv_layers; i++)
        nloc += p.b.kv_local[i];
    size_t kvrow = bits == 8 ? (size_t)D->k_dim + D->v_dim + 2 * sizeof(float) * D->G
                             : sizeof(float) * ((size_t)D->k_dim + D->v_dim);
    long rows = p.r.rows_hw, conv_kept = p.b.cv_ring + m->cfg.qkv_conv_taps - 1,
         local_kept = PREFIX + p.b.lr_ring;
    long more_conv = rows > conv_kept ? rows - conv_kept : 0,
         more_local = rows > local_kept ? rows - local_kept : 0;
    size_t saved = (size_t)more_conv * cw + (size_t)more_local * nloc * kvrow;
    printf("  %d-bit rows: %ld logits rows equal; %d resets, %d failed turns, up to %ld rows "
           "dropped; %zu bytes (turn 20: %zu), unbounded %zu\n",
           bits, p.rows, resets, failed, dropped, bb, at20, br);
    CHECK_MSG(worst_after == at20, "%d-bit rows: %zu bytes at turn 20, up to %zu later", bits, at20,
              worst_after);
    CHECK_MSG(bb <= nd_kv_bytes_bound(&p.b), "%zu bytes, bound %zu", bb, nd_kv_bytes_bound(&p.b));
    CHECK_MSG(rows > conv_kept && rows > local_kept && br >= bb + saved,
              "%d-bit rows: bounded %zu bytes, unbounded %zu: expected at least %zu less (%ld "
              "rows held, conv keeps %ld, local layers %ld)",
              bits, bb, br, saved, rows, conv_kept, local_kept);
    pair_free(&p);
}

/* rewinds past the rings: the rows run again */
static void check_recovery(const san_model *m)
{
    pair p;
    pair_init(&p, m, 0, 8);
    nd_rng r;
    nd_rng_seed(&r, 5);
    int32_t tok[64];
    random_tokens(&r, tok, PREFIX);
    if (pair_run(&p, tok, PREFIX)) {
        pair_free(&p);
        return;
    }
    pair_slide(&p, PREFIX);
    /* a long turn, then back to 6 rows past the prefix (> ND_KV_TAIL back) */
    random_tokens(&r, tok, 40);
    pair_run(&p, tok, 40);
    pair_decode(&p, 100);
    long exact = p.mismatches;
    pair_rewind(&p, PREFIX + 6);
    CHECK(p.b.len == PREFIX + 6);
    random_tokens(&r, tok, 10);
    pair_run(&p, tok, 10);
    pair_decode(&p, 20);
    /* into the prefix (a first turn whose tokens part from it) */
    pair_rewind(&p, PREFIX - 5);
    pair_slide(&p, PREFIX);
    random_tokens(&r, tok, 30);
    pair_run(&p, tok, 30);
    pair_decode(&p, 80);
    /* back to the prefix's end */
    pair_rewind(&p, PREFIX);
    pair_run(&p, tok, 12);
    pair_decode(&p, 10);
    printf("  recovery: %ld logits rows, %ld differ after rows ran again (worst rel %.2g)\n",
           p.rows, p.mismatches, p.worst);
    CHECK_MSG(exact == 0, "%ld rows differ before any rewind", exact);
    CHECK_MSG(p.worst < 1e-5, "after rows ran again: rel err %g", p.worst);
    pair_free(&p);
}

/* The prefix cache's copy of a session's pinned prefix, taken after the
 * session went on well past its rings (nd_kv_snapshot_rows: the rows in
 * place and the conv rows kept at the prefix's end), restored into a
 * fresh state: the same logits as the session had after its prefix. */
static void check_lent_prefix(const san_model *m)
{
    const nd_backend *be = nd_backend_cpu(0);
    nd_kv_state s, t;
    CHECK(nd_kv_init(&s, m, be, ND_SESSION_CHUNK, 0) == 0);
    CHECK(nd_kv_init(&t, m, be, ND_SESSION_CHUNK, 0) == 0);
    nd_kv_set_bits(&s, 8);
    nd_kv_set_bits(&t, 8);
    int V = m->dims.V;
    float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)V);
    int32_t tok[PREFIX + 150];
    nd_rng r;
    nd_rng_seed(&r, 77);
    random_tokens(&r, tok, PREFIX + 150);
    CHECK(nd_kv_forward(&s, tok, PREFIX, NULL, 0) == 0);
    nd_kv_slide(&s, PREFIX);
    CHECK(nd_kv_forward(&s, tok + PREFIX, 10, a, 0) == 0);
    CHECK(nd_kv_forward(&s, tok + PREFIX + 10, 140, NULL, 0) == 0);
    CHECK(s.lr_ring > 0 && s.len - PREFIX > s.lr_ring && s.len - PREFIX > s.cv_ring);
    nd_kv_snap snap;
    CHECK_MSG(nd_kv_snapshot_rows(&s, PREFIX, &snap) == 0, "%s", nd_last_error());
    CHECK(nd_kv_restore(&t, &snap) == 0);
    nd_kv_slide(&t, PREFIX);
    CHECK(nd_kv_forward(&t, tok + PREFIX, 10, b, 0) == 0);
    CHECK_MSG(!memcmp(a, b, sizeof(float) * (size_t)V), "restored prefix: other logits");
    nd_kv_snap_free(&snap);
    nd_kv_free(&s);
    nd_kv_free(&t);
    free(a);
    free(b);
}

int main(void)
{
    san_model m;
    random_model(&m);
    /* one thread: a tiny model's decode step costs less than a fork on a
     * busy machine, and the rows do not depend on it */
    nd_set_threads(1);
    check_conversation(&m, 8, 100);
    check_conversation(&m, 32, 40);
    check_recovery(&m);
    check_lent_prefix(&m);
    san_model_free(&m);
    return tu_finish("test_kv3_bound");
}
