/* Whole-model part of test_backend_ops: the small all-parts model
 * (tu_small_config) with a LoRA, weights and adapter moved into the
 * target's memory, trains one padded [B, T] batch and one packed batch
 * with shared prefixes on an nd_trainer of each backend; the losses and
 * every LoRA and full gradient tensor must agree (relative to the
 * tensor's largest element). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_ops.h"
#include "core/status.h"
#include "core/tuning.h"
#include "testutil.h"
#include "train/trainer.h"

#define T 48
#define NEX 7
#define LOSS_TOL 1e-5
#define GRAD_TOL 1e-4

typedef struct {
    san_model m;
    san_lora lora;
} model_pair;

static model_pair ref, tg;

static void fail_setup(const char *what)
{
    fprintf(stderr, "test_backend_ops: model check: %s: %s\n", what, nd_last_error());
    exit(2);
}

static void setup(const nd_backend *tgt)
{
    san_config cfg;
    tu_small_config(&cfg);
    model_pair *mp[2] = {&ref, &tg};
    for (int s = 0; s < 2; s++) {
        if (san_model_create(&mp[s]->m, &cfg))
            fail_setup("model");
        san_model_init_random(&mp[s]->m, 5);
    }
    for (size_t i = 0; i < ref.m.numel; i++)
        ref.m.mem[i] += (float)(0.1 * nd_rng_normal(&bo_rng));
    memcpy(tg.m.mem, ref.m.mem, sizeof(float) * ref.m.numel);
    for (int s = 0; s < 2; s++)
        if (san_lora_create(&mp[s]->lora, &mp[s]->m, 4, 8.0f))
            fail_setup("lora");
    san_lora_init(&ref.lora, 3);
    for (int t = 0; t < LORA_NTARGETS; t++)
        if (ref.lora.t[t].present) {
            float *B = san_lora_B(&ref.lora, ref.lora.mem, t);
            for (size_t i = 0; i < (size_t)ref.lora.L * ref.lora.rank * ref.lora.t[t].out; i++)
                B[i] = (float)(0.05 * nd_rng_normal(&bo_rng));
        }
    memcpy(tg.lora.mem, ref.lora.mem, sizeof(float) * ref.lora.numel);
    if (san_model_to_backend(&tg.m, tgt) || san_lora_to_backend(&tg.lora, tgt))
        fail_setup("moving the model to the target");
}

/* max |a - b| / max |b| over one tensor; the largest |a - b| too */
static double tensor_err(const float *a, const float *b, size_t n, double *mabs)
{
    double md = 0, mb = 1e-12;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d != d)
            d = INFINITY;
        if (!(d <= md))
            md = d;
        mb = fmax(mb, fabs((double)b[i]));
    }
    if (!(md <= *mabs))
        *mabs = md;
    return md / mb;
}

typedef struct {
    int32_t ids[NEX][T];
    float mask[NEX][T];
    int len[NEX];
} batch;

/* Run the step on a trainer of each side (created by mk), compare. */
typedef int (*make_fn)(nd_trainer *tr, model_pair *mp, const nd_backend *be, const batch *bt);
typedef int (*step_fn)(nd_trainer *tr, const batch *bt, double *loss, double *masked);

static void run_pair(const char *label, const nd_backend *tgt, const batch *bt, make_fn mk,
                     step_fn st)
{
    nd_trainer tr[2];
    double loss[2], masked[2];
    model_pair *mp[2] = {&ref, &tg};
    const nd_backend *bes[2] = {bo_ref, tgt};
    for (int s = 0; s < 2; s++) {
        bo_use(s);
        if (mk(&tr[s], mp[s], bes[s], bt))
            fail_setup(label);
        if (st(&tr[s], bt, &loss[s], &masked[s]))
            fail_setup(label);
    }
    bo_use(0);
    double mabs = fabs(loss[1] - loss[0]), lrel = mabs / fmax(fabs(loss[0]), 1e-12);
    int fail = !(lrel <= LOSS_TOL) || masked[0] != masked[1];
    if (fail)
        fprintf(stderr, "%s: loss %.9f vs %.9f (rel %.2e), masked %g vs %g\n", label, loss[1],
                loss[0], lrel, masked[1], masked[0]);
    double worst = 0;
    const san_lora *lo = &ref.lora;
    /* the target's gradients where the host reads them (the backend's copy
     * calls; the reference is the CPU) */
    size_t lb = sizeof(float) * lo->numel, fb = sizeof(float) * ref.m.numel;
    float *tlg = nd_backend_map(tgt, tr[1].lora_g, lb, 1);
    float *tfg = nd_backend_map(tgt, tr[1].full_g, fb, 1);
    if (!tlg || !tfg)
        fail_setup("out of memory");
    for (int t = 0; t < LORA_NTARGETS; t++) {
        if (!lo->t[t].present)
            continue;
        size_t na = (size_t)lo->L * lo->t[t].in * lo->rank;
        size_t nb = (size_t)lo->L * lo->rank * lo->t[t].out;
        size_t offs[2] = {lo->t[t].a_off, lo->t[t].b_off}, ns[2] = {na, nb};
        for (int j = 0; j < 2; j++) {
            double e = tensor_err(tlg + offs[j], tr[0].lora_g + offs[j], ns[j], &mabs);
            if (!(e <= GRAD_TOL)) {
                fprintf(stderr, "%s: lora %s %s gradient differs (%.2e)\n", label,
                        san_lora_target_name(t), j ? "B" : "A", e);
                fail = 1;
            }
            if (!(e <= worst))
                worst = e;
        }
    }
    for (int i = 0; i < ref.m.n_tensors; i++) {
        const san_tensor *ten = &ref.m.tensors[i];
        double e = tensor_err(tfg + ten->offset, tr[0].full_g + ten->offset, ten->numel, &mabs);
        if (!(e <= GRAD_TOL)) {
            fprintf(stderr, "%s: %s gradient differs (%.2e)\n", label, ten->name, e);
            fail = 1;
        }
        if (!(e <= worst))
            worst = e;
    }
    printf("  %-30s loss %.6f vs %.6f (rel %.1e), worst grad rel err %.2e\n", label, loss[1],
           loss[0], lrel, worst);
    bo_record(label, GRAD_TOL, mabs, fmax(worst, lrel), fail);
    nd_backend_unmap(tgt, tr[1].lora_g, tlg, lb, 0);
    nd_backend_unmap(tgt, tr[1].full_g, tfg, fb, 0);
    for (int s = 0; s < 2; s++) {
        bo_use(s);
        nd_trainer_free(&tr[s]);
    }
    bo_use(0);
}

/* ---- padded batch ---- */

static int mk_dense(nd_trainer *tr, model_pair *mp, const nd_backend *be, const batch *bt)
{
    (void)bt;
    return nd_trainer_create(tr, &mp->m, be, &mp->lora, 4, T, 1, -1);
}

static int st_dense(nd_trainer *tr, const batch *bt, double *loss, double *masked)
{
    int32_t ids[4 * T] = {0};
    float mask[4 * T] = {0};
    for (int b = 0; b < 3; b++) { /* row 3 is beyond `rows`: ignored */
        memcpy(ids + b * T, bt->ids[b], sizeof(int32_t) * (size_t)bt->len[b]);
        memcpy(mask + b * T, bt->mask[b], sizeof(float) * (size_t)bt->len[b]);
    }
    return nd_trainer_step(tr, ids, mask, 3, 1, loss, masked);
}

/* ---- packed batch, shared prefixes ---- */

static int mk_packed(nd_trainer *tr, model_pair *mp, const nd_backend *be, const batch *bt)
{
    long cap = 0, items = 0;
    for (int b = 0; b < NEX; b++) {
        cap += bt->len[b];
        for (int t = 1; t < bt->len[b]; t++)
            items += bt->mask[b][t] != 0.0f;
    }
    int rc = nd_trainer_create_packed(tr, &mp->m, be, &mp->lora, NEX, cap, T, items, items, 1, -1);
    tr->share = 1;
    return rc;
}

static int st_packed(nd_trainer *tr, const batch *bt, double *loss, double *masked)
{
    nd_seq_example ex[NEX];
    for (int b = 0; b < NEX; b++)
        ex[b] = (nd_seq_example){bt->ids[b], bt->mask[b], bt->len[b]};
    return nd_trainer_step_examples(tr, ex, NEX, 1, loss, masked);
}

/* example b: prefix[0..plen) + random tokens up to len; loss from tgt on */
static void add_example(batch *bt, int b, const int32_t *prefix, int plen, int len, int tgt)
{
    for (int t = 0; t < len; t++) {
        bt->ids[b][t] = t < plen ? prefix[t] : 4 + (int32_t)nd_rng_below(&bo_rng, 60);
        bt->mask[b][t] = t >= tgt ? 1.0f : 0.0f;
    }
    bt->len[b] = len;
}

void bo_model_check(const nd_backend *tgt)
{
    if (bo_missing("model:")) {
        bo_mark_missing("model: padded batch");
        bo_mark_missing("model: packed, shared prefixes");
        bo_mark_missing("model: packed, recomputed");
        return;
    }
    printf("model check (tu_small_config + LoRA rank 4, full gradients):\n");
    setup(tgt);
    int32_t pa[T], pb[T];
    for (int i = 0; i < T; i++) {
        pa[i] = 4 + (int32_t)nd_rng_below(&bo_rng, 60);
        pb[i] = 4 + (int32_t)nd_rng_below(&bo_rng, 60);
    }
    pa[0] = pb[0] = 2;
    batch bt;
    memset(&bt, 0, sizeof bt);
    /* two prefix groups, a loner, one example cut at T, one of one row
     * beyond its prefix */
    add_example(&bt, 0, pa, 30, 36, 33);
    add_example(&bt, 1, pb, 25, 40, 28);
    add_example(&bt, 2, pa, 30, 31, 30);
    add_example(&bt, 3, pa, 30, T, 32);
    add_example(&bt, 4, pb, 25, 27, 26);
    add_example(&bt, 5, pa, 1, 20, 12);
    add_example(&bt, 6, pa, 30, 42, 31);
    run_pair("model: padded batch", tgt, &bt, mk_dense, st_dense);
    run_pair("model: packed, shared prefixes", tgt, &bt, mk_packed, st_packed);
    /* the same with every layer recomputed in the backward */
    const char *old = getenv("NEEDLE_ACT_BUDGET_MB");
    char keep[64] = "";
    if (old)
        snprintf(keep, sizeof keep, "%s", old);
    setenv("NEEDLE_ACT_BUDGET_MB", "0", 1);
    nd_tuning_refresh();
    run_pair("model: packed, recomputed", tgt, &bt, mk_packed, st_packed);
    if (old)
        setenv("NEEDLE_ACT_BUDGET_MB", keep, 1);
    else
        unsetenv("NEEDLE_ACT_BUDGET_MB");
    nd_tuning_refresh();
    for (int s = 0; s < 2; s++) {
        model_pair *mp = s ? &tg : &ref;
        san_lora_free(&mp->lora);
        san_model_free(&mp->m);
    }
}
