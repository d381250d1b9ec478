/* Packed batches against padded ones: the same examples as a padded
 * [B, T] batch (upstream's way), packed at their own lengths, and packed
 * with shared prefixes run once must give the same loss (<= 1e-5
 * relative) and the same gradients (<= 1e-4 relative, every LoRA tensor
 * and every base tensor). Batches: several prefix groups, no shared prefix,
 * one example, examples cut at T (one with no target left), an example
 * that is a prefix of another, and duplicates. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/status.h"
#include "core/tuning.h"
#include "train/trainer.h"
#include "testutil.h"

#define T 48
#define MAXB 10

static nd_rng rng;
static san_model m;
static san_lora lora;
static const nd_backend *be;

typedef struct {
    int32_t ids[MAXB][T];
    float mask[MAXB][T];
    int len[MAXB];
    int count;
} batch;

/* example b = prefix[0..plen) + random suffix, total len (<= T); the loss
 * mask is 1 from position `tgt` on */
static void add_example(batch *bt, const int32_t *prefix, int plen, int len, int tgt)
{
    int b = bt->count++;
    for (int t = 0; t < len; t++) {
        bt->ids[b][t] = t < plen ? prefix[t] : 4 + (int32_t)nd_rng_below(&rng, 60);
        bt->mask[b][t] = t >= tgt ? 1.0f : 0.0f;
    }
    bt->len[b] = len;
}

typedef struct {
    double loss, masked;
    float *gl, *gf;
    long rows;
} result;

static result run_dense(const batch *bt)
{
    result r = {0};
    nd_trainer tr;
    CHECK(nd_trainer_create(&tr, &m, be, &lora, bt->count, T, 1, -1) == 0);
    int32_t *ids = calloc((size_t)bt->count * T, sizeof *ids);
    float *mask = calloc((size_t)bt->count * T, sizeof *mask);
    for (int b = 0; b < bt->count; b++) {
        memcpy(ids + b * T, bt->ids[b], sizeof(int32_t) * bt->len[b]);
        memcpy(mask + b * T, bt->mask[b], sizeof(float) * bt->len[b]);
    }
    CHECK(nd_trainer_step(&tr, ids, mask, bt->count, 1, &r.loss, &r.masked) == 0);
    r.gl = malloc(sizeof(float) * lora.numel);
    r.gf = malloc(sizeof(float) * m.numel);
    memcpy(r.gl, tr.lora_g, sizeof(float) * lora.numel);
    memcpy(r.gf, tr.full_g, sizeof(float) * m.numel);
    r.rows = (long)bt->count * T;
    free(ids);
    free(mask);
    nd_trainer_free(&tr);
    return r;
}

/* micro: run the batch as micro-batches of one prefix group each */
static result run_packed(const batch *bt, int share, int micro)
{
    result r = {0};
    nd_trainer tr;
    nd_seq_example ex[MAXB];
    for (int b = 0; b < bt->count; b++)
        ex[b] = (nd_seq_example){bt->ids[b], bt->mask[b], bt->len[b]};
    long cap = 0, items = 0;
    for (int b = 0; b < bt->count; b++) {
        cap += bt->len[b];
        for (int t = 1; t < bt->len[b]; t++)
            items += bt->mask[b][t] != 0.0f;
    }
    long cap_rows = cap;
    if (micro) {
        nd_pack_plan p;
        CHECK(nd_pack_plan_init(&p, bt->count) == 0);
        nd_pack_plan_make(&p, ex, bt->count, share);
        cap_rows = 1;
        for (int g = 0; g < p.n_groups; g++) {
            long gr = nd_pack_group_rows(&p, ex, g, g + 1);
            cap_rows = gr > cap_rows ? gr : cap_rows;
        }
        nd_pack_plan_free(&p);
    }
    CHECK(nd_trainer_create_packed(&tr, &m, be, &lora, bt->count, cap_rows, T, items, items, 1,
                                   -1) == 0);
    tr.share = share;
    CHECK(nd_trainer_step_examples(&tr, ex, bt->count, 1, &r.loss, &r.masked) == 0);
    r.gl = malloc(sizeof(float) * lora.numel);
    r.gf = malloc(sizeof(float) * m.numel);
    memcpy(r.gl, tr.lora_g, sizeof(float) * lora.numel);
    memcpy(r.gf, tr.full_g, sizeof(float) * m.numel);
    r.rows = tr.plan.rows;
    if (micro && tr.plan.n_groups > 1)
        CHECK_MSG(tr.n_micro > 1, "micro-batches: %d", tr.n_micro);
    /* per-position losses sum to the batch loss */
    double s = 0;
    for (long i = 0; i < tr.n_items; i++)
        s += tr.item_loss[i];
    CHECK(fabs(s / (r.masked > 1 ? r.masked : 1) - r.loss) <= 1e-6 * fmax(1, fabs(r.loss)));
    nd_trainer_free(&tr);
    return r;
}

/* max |a - b| / max |a| over one tensor */
static double tensor_err(const float *a, const float *b, size_t n)
{
    double md = 0, ma = 1e-12;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double)a[i] - b[i]));
        ma = fmax(ma, fabs((double)a[i]));
    }
    return md / ma;
}

static void compare(const char *what, const result *ref, const result *got)
{
    double le = fabs(got->loss - ref->loss) / fmax(fabs(ref->loss), 1e-12);
    CHECK_MSG(le <= 1e-5, "%s: loss %.9f vs %.9f (rel %.2e)", what, got->loss, ref->loss, le);
    CHECK(got->masked == ref->masked);
    double worst = 0;
    for (int t = 0; t < LORA_NTARGETS; t++) {
        if (!lora.t[t].present)
            continue;
        size_t na = (size_t)lora.L * lora.t[t].in * lora.rank;
        size_t nb = (size_t)lora.L * lora.rank * lora.t[t].out;
        double ea = tensor_err(ref->gl + lora.t[t].a_off, got->gl + lora.t[t].a_off, na);
        double eb = tensor_err(ref->gl + lora.t[t].b_off, got->gl + lora.t[t].b_off, nb);
        CHECK_MSG(ea <= 1e-4 && eb <= 1e-4, "%s: lora %s grads differ (A %.2e, B %.2e)", what,
                  san_lora_target_name(t), ea, eb);
        worst = fmax(worst, fmax(ea, eb));
    }
    for (int i = 0; i < m.n_tensors; i++) {
        const san_tensor *t = &m.tensors[i];
        double e = tensor_err(ref->gf + t->offset, got->gf + t->offset, t->numel);
        CHECK_MSG(e <= 1e-4, "%s: %s grad differs (%.2e)", what, t->name, e);
        worst = fmax(worst, e);
    }
    printf("  %-34s loss %.6f  rows %4ld  worst grad rel err %.2e\n", what, got->loss, got->rows,
           worst);
}

static void free_result(result *r)
{
    free(r->gl);
    free(r->gf);
}

static void check_batch(const char *name, const batch *bt, int expect_saving)
{
    printf("%s (%d examples)\n", name, bt->count);
    result d = run_dense(bt), p0 = run_packed(bt, 0, 0), p1 = run_packed(bt, 1, 0);
    result p2 = run_packed(bt, 1, 1);
    printf("  %-34s loss %.6f  rows %4ld\n", "padded [B, T]", d.loss, d.rows);
    compare("packed, own lengths", &d, &p0);
    compare("packed, shared prefixes", &d, &p1);
    compare("shared, one group per micro-batch", &d, &p2);
    if (expect_saving)
        CHECK_MSG(p1.rows < p0.rows, "%s: sharing saved nothing (%ld vs %ld rows)", name, p1.rows,
                  p0.rows);
    free_result(&d);
    free_result(&p0);
    free_result(&p1);
    free_result(&p2);
}

static void setup_model(void)
{
    san_config cfg;
    tu_small_config(&cfg);
    CHECK(san_model_create(&m, &cfg) == 0);
    san_model_init_random(&m, 5);
    for (size_t i = 0; i < m.numel; i++)
        m.mem[i] += (float)(0.1 * nd_rng_normal(&rng));
    CHECK(san_lora_create(&lora, &m, 4, 8.0f) == 0);
    san_lora_init(&lora, 3);
    for (int t = 0; t < LORA_NTARGETS; t++)
        if (lora.t[t].present) {
            float *B = san_lora_B(&lora, lora.mem, t);
            for (size_t i = 0; i < (size_t)lora.L * lora.rank * lora.t[t].out; i++)
                B[i] = (float)(0.05 * nd_rng_normal(&rng));
        }
}

static void run_all(void)
{
    int32_t pa[T], pb[T];
    for (int i = 0; i < T; i++) {
        pa[i] = 4 + (int32_t)nd_rng_below(&rng, 60);
        pb[i] = 4 + (int32_t)nd_rng_below(&rng, 60);
    }
    pa[0] = pb[0] = 2; /* BOS, as real data */
    batch bt;

    /* two tool sets interleaved (upstream's shuffled order) and a loner */
    memset(&bt, 0, sizeof bt);
    add_example(&bt, pa, 30, 36, 33);
    add_example(&bt, pb, 25, 40, 28);
    add_example(&bt, pa, 30, 31, 30);
    add_example(&bt, pa, 30, 45, 32);
    add_example(&bt, pb, 25, 27, 26);
    add_example(&bt, pa, 1, 20, 12);
    add_example(&bt, pa, 30, 42, 31);
    check_batch("two prefix groups and a loner", &bt, 1);

    memset(&bt, 0, sizeof bt);
    add_example(&bt, pa, 0, 17, 9);
    add_example(&bt, pa, 0, 23, 12);
    add_example(&bt, pa, 0, 9, 4);
    check_batch("no shared prefix", &bt, 0);

    memset(&bt, 0, sizeof bt);
    add_example(&bt, pa, 30, 37, 31);
    check_batch("a batch of one", &bt, 0);

    /* cut at T: one keeps part of its target, one keeps none of it (an
     * example whose prompt fills max_len contributes nothing) */
    memset(&bt, 0, sizeof bt);
    add_example(&bt, pa, 40, T, 44);
    add_example(&bt, pa, 40, T, T);
    add_example(&bt, pa, 40, 43, 41);
    check_batch("examples cut at T", &bt, 1);

    /* one example a prefix of another, and two identical ones */
    memset(&bt, 0, sizeof bt);
    add_example(&bt, pb, 33, 33, 29);
    add_example(&bt, pb, 33, 38, 29);
    memcpy(bt.ids[2], bt.ids[1], sizeof bt.ids[1]);
    memcpy(bt.mask[2], bt.mask[1], sizeof bt.mask[1]);
    bt.len[2] = bt.len[1];
    bt.count = 3;
    check_batch("a prefix of another, duplicates", &bt, 1);
}

/* the plan on its own: groups, prefix lengths, row counts */
static void test_plan(void)
{
    int32_t a[8] = {2, 5, 6, 7, 8, 9, 10, 11}, b[8] = {2, 5, 6, 1, 1, 1, 1, 1};
    float z[8] = {0};
    nd_seq_example ex[4] = {{a, z, 8}, {b, z, 8}, {a, z, 7}, {b, z, 5}};
    nd_pack_plan p;
    CHECK(nd_pack_plan_init(&p, 4) == 0);
    CHECK(nd_pack_plan_make(&p, ex, 4, 0) == 0);
    CHECK(p.n_groups == 4 && p.rows == 28 && p.real == 28);
    CHECK(nd_pack_plan_make(&p, ex, 4, 1) == 0);
    /* best: {a8, a7} sharing 6 and {b8, b5} sharing 4 -> 28 - 10 rows
     * (one group of all four would share only 3: 28 - 9 rows) */
    CHECK_MSG(p.n_groups == 2 && p.rows == 18, "groups %d rows %ld", p.n_groups, p.rows);
    CHECK(nd_pack_plan_make(&p, ex, 5, 1) == -1); /* over capacity */
    nd_pack_plan_free(&p);
}

int main(void)
{
    nd_rng_seed(&rng, 4242);
    setup_model();
    be = nd_backend_cpu(0);
    test_plan();
    printf("every layer's activations kept:\n");
    run_all();
    /* the same with layers recomputed in the backward (remat) */
    setenv("NEEDLE_ACT_BUDGET_MB", "0", 1);
    nd_tuning_refresh();
    printf("layers recomputed in the backward:\n");
    run_all();
    san_lora_free(&lora);
    san_model_free(&m);
    return tu_finish("test_pack");
}
