/* The trainer's memory savers change nothing but memory: the loss taken a
 * slice of logit rows at a time (NEEDLE_LOGIT_ROWS) and the lane states
 * saved at every k-th layer only, the rest recomputed a segment at a time in
 * the backward (NEEDLE_LANE_EVERY; the activation budget picks k), give the
 * loss and the LoRA and full gradients of the plain path (one slice, every
 * layer's lanes saved) to rounding, padded and packed, float and 3.x
 * training numerics, Needle 2 and 3. Also how the budget sizes them. */
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

static nd_rng rng;

enum { NB = 3, NT = 23 };

typedef struct {
    int32_t ids[NB * NT];
    float mask[NB * NT];
    int len[NB];
} batch;

typedef struct {
    double loss;
    float *lg, *fg;
    long logit_rows;
    int lane_every, kept;
} result;

static void set_env(const char *rows, const char *every, const char *budget)
{
#define SET(name, v)                                                                               \
    do {                                                                                           \
        if (v)                                                                                     \
            setenv(name, v, 1);                                                                    \
        else                                                                                       \
            unsetenv(name);                                                                        \
    } while (0)
    SET("NEEDLE_LOGIT_ROWS", rows);
    SET("NEEDLE_LANE_EVERY", every);
    SET("NEEDLE_ACT_BUDGET_MB", budget);
#undef SET
    nd_tuning_refresh(); /* the switches from the environment (core/tuning.h) */
}

/* one step (padded or packed) under the current environment */
static int run_step(san_model *m, san_lora *lo, const batch *bt, int packed, int quant, result *r)
{
    const nd_backend *be = nd_backend_cpu(0);
    nd_trainer tr;
    int rc;
    if (packed) {
        long cap = 0, items = 0;
        for (int b = 0; b < NB; b++) {
            cap += bt->len[b];
            for (int t = 1; t < bt->len[b]; t++)
                items += bt->mask[b * NT + t] != 0.0f;
        }
        rc = nd_trainer_create_packed(&tr, m, be, lo, NB, cap, NT, items, items, 1, -1);
    } else {
        rc = nd_trainer_create(&tr, m, be, lo, NB, NT, 1, -1);
    }
    if (rc)
        return rc;
    if (quant && (rc = nd_trainer_set_quant3(&tr))) {
        nd_trainer_free(&tr);
        return rc;
    }
    if (packed) {
        nd_seq_example ex[NB];
        for (int b = 0; b < NB; b++)
            ex[b] = (nd_seq_example){bt->ids + b * NT, bt->mask + b * NT, bt->len[b]};
        rc = nd_trainer_step_examples(&tr, ex, NB, 1, &r->loss, NULL);
    } else {
        rc = nd_trainer_step(&tr, bt->ids, bt->mask, NB, 1, &r->loss, NULL);
    }
    if (!rc) {
        r->lg = malloc(sizeof(float) * lo->numel);
        r->fg = malloc(sizeof(float) * m->numel);
        memcpy(r->lg, tr.lora_g, sizeof(float) * lo->numel);
        memcpy(r->fg, tr.full_g, sizeof(float) * m->numel);
        r->logit_rows = tr.logit_rows;
        r->lane_every = tr.acts.lane_every;
        r->kept = tr.kept_layers;
    }
    nd_trainer_free(&tr);
    return rc;
}

static void check_variants(const san_config *cfgp, const char *label, int quant)
{
    san_config cfg = *cfgp;
    san_model m;
    CHECK(san_model_create(&m, &cfg) == 0);
    san_model_init_random(&m, 5);
    for (size_t i = 0; i < m.numel; i++)
        m.mem[i] += (float)(0.1 * nd_rng_normal(&rng));
    san_lora lo;
    CHECK(san_lora_create(&lo, &m, 4, 8.0f) == 0);
    san_lora_init(&lo, 3);
    for (int t = 0; t < LORA_NTARGETS; t++)
        if (lo.t[t].present) {
            float *B = san_lora_B(&lo, lo.mem, t);
            for (size_t i = 0; i < (size_t)lo.L * lo.rank * lo.t[t].out; i++)
                B[i] = (float)(0.05 * nd_rng_normal(&rng));
        }
    batch bt;
    int vmax = m.dims.V_out < 200 ? m.dims.V_out : 200;
    for (int b = 0; b < NB; b++) {
        bt.len[b] = NT - 4 * b; /* packed: examples of their own lengths */
        for (int t = 0; t < NT; t++) {
            /* a shared 6-token prefix so packing shares rows */
            int32_t id = t < 6 ? (int32_t)(t * 7 + 1) : (int32_t)nd_rng_below(&rng, (uint64_t)vmax);
            bt.ids[b * NT + t] = id;
            bt.mask[b * NT + t] = t > 4 && t < bt.len[b] && (t + b) % 5 ? 1.0f : 0.0f;
        }
    }
    for (int packed = 0; packed < 2; packed++) {
        set_env(NULL, NULL, NULL);
        result ref = {0};
        CHECK(run_step(&m, &lo, &bt, packed, quant, &ref) == 0);
        CHECK_MSG(ref.lane_every == 1 && ref.kept == m.dims.L &&
                      (packed || ref.logit_rows == NB * NT),
                  "%s: the reference is the plain path (lanes every %d, %d kept, %ld logit rows)",
                  label, ref.lane_every, ref.kept, ref.logit_rows);
        /* logit slices (not dividing the rows), lane segments of every
         * length, with layers kept and recomputed */
        static const char *const vars[][3] = {
            {"5", NULL, NULL}, /* slices not dividing the rows */
            {NULL, "3", "0"},  /* segments of 2 and 1 layers, every layer recomputed */
            {"7", "2", NULL},  /* both, with every layer's activations kept */
            {"4", NULL, "0"},  /* the budget's pick (the fewest slots) */
        };
        for (size_t v = 0; v < sizeof vars / sizeof vars[0]; v++) {
            set_env(vars[v][0], vars[v][1], vars[v][2]);
            result r = {0};
            CHECK(run_step(&m, &lo, &bt, packed, quant, &r) == 0);
            if (!r.lg)
                continue;
            if (vars[v][0])
                CHECK_MSG(r.logit_rows == atol(vars[v][0]), "logit rows %ld", r.logit_rows);
            if (vars[v][1])
                CHECK_MSG(r.lane_every == atoi(vars[v][1]) && r.lane_every > 1, "lanes every %d",
                          r.lane_every);
            double el = fabs(r.loss - ref.loss) / fmax(fabs(ref.loss), 1e-6);
            double eg = tu_rel_err(r.lg, ref.lg, (long)lo.numel, 1e-6);
            double ef = tu_rel_err(r.fg, ref.fg, (long)m.numel, 1e-6);
            printf("  %-8s %-7s rows %-4s lanes every %-4s budget %-4s (%d kept): loss %.9f "
                   "rel %.1e, lora grads %.1e, full grads %.1e\n",
                   label, packed ? "packed" : "padded", vars[v][0] ? vars[v][0] : "-",
                   vars[v][1] ? vars[v][1] : "-", vars[v][2] ? vars[v][2] : "-", r.kept, r.loss, el,
                   eg, ef);
            CHECK_MSG(el < 1e-6 && eg < 1e-5 && ef < 1e-5,
                      "%s %s variant %zu: loss %.2e lora %.2e full %.2e", label,
                      packed ? "packed" : "padded", v, el, eg, ef);
            free(r.lg);
            free(r.fg);
        }
        free(ref.lg);
        free(ref.fg);
    }
    set_env(NULL, NULL, NULL);
    san_lora_free(&lo);
    san_model_free(&m);
}

/* How the budget sizes the savers, without running a step. */
static void check_sizing(void)
{
    san_config cfg;
    san_config_preset(&cfg, "tiny3");
    san_model m;
    CHECK(san_model_create(&m, &cfg) == 0);
    san_lora lo;
    CHECK(san_lora_create(&lo, &m, 4, 8.0f) == 0);
    const nd_backend *be = nd_backend_cpu(0);
    int B = 16, T = 256;
    long N = (long)B * T;
    /* one lane state: N x lanes x d floats */
    double lane_mb = (double)N * m.dims.n * m.dims.d * 4 / 1048576.0;
    nd_trainer tr;
    set_env(NULL, NULL, NULL);
    CHECK(nd_trainer_create(&tr, &m, be, &lo, B, T, 0, 1e6) == 0);
    /* logits ND_LOGIT_SLICE_MB at a time, never [N, V] */
    long want = (long)(ND_LOGIT_SLICE_MB * 1048576.0 / (m.dims.V_out * 4.0));
    CHECK_MSG(want < N && tr.logit_rows == want && tr.acts.cap_logits == want,
              "logit rows %ld (want %ld of %ld)", tr.logit_rows, want, N);
    CHECK(tr.acts.lane_every == 1 && tr.kept_layers == m.dims.L);
    size_t big = tr.acts.bytes;
    nd_trainer_free(&tr);
    /* lanes of every layer do not fit, every second layer's do: k = 2 (two
     * saved + one segment slot), nothing kept */
    CHECK(san_lane_slots(m.dims.L, 1) == 4 && san_lane_slots(m.dims.L, 2) == 3 &&
          san_lane_slots(m.dims.L, 3) == 4 && san_lane_slots(20, 4) == 8 &&
          san_lane_slots(20, 5) == 8 && san_lane_slots(20, 2) == 11);
    CHECK(nd_trainer_create(&tr, &m, be, &lo, B, T, 0, 3.5 * lane_mb) == 0);
    CHECK_MSG(tr.acts.lane_every == 2 && tr.kept_layers == 0, "lanes every %d, %d kept",
              tr.acts.lane_every, tr.kept_layers);
    size_t small = tr.acts.bytes;
    nd_trainer_free(&tr);
    /* nothing fits: the fewest slots */
    CHECK(nd_trainer_create(&tr, &m, be, &lo, B, T, 0, 0) == 0);
    CHECK(tr.acts.lane_every == 2 && tr.kept_layers == 0);
    nd_trainer_free(&tr);
    printf("  sizing: %ld rows: logits %ld rows at a time; activations %.1f MB (all kept) -> "
           "%.1f MB (lanes every 2nd layer, none kept)\n",
           N, want, big / 1e6, small / 1e6);
    CHECK(small < big);
    san_lora_free(&lo);
    san_model_free(&m);
}

int main(void)
{
    nd_rng_seed(&rng, 31);
    check_sizing();
    san_config cfg;
    tu_small_config(&cfg);
    check_variants(&cfg, "needle2", 0);
    san_config_preset(&cfg, "tiny3");
    check_variants(&cfg, "tiny3", 0);
    check_variants(&cfg, "tiny3 q", 1);
    san_config_preset(&cfg, "tiny3b");
    check_variants(&cfg, "tiny3b", 0);
    return tu_finish("test_train_chunked");
}
