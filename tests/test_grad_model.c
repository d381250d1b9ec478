/* Whole-model gradient check: the analytic gradient of the masked training
 * loss (docs/model.md §4.1) with respect to every base tensor and to the LoRA A and B
 * matrices, against central finite differences of the loss, along a
 * direction mixing the gradient with random noise (so the directional
 * derivative is large enough to measure in float32). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/status.h"
#include "train/trainer.h"
#include "testutil.h"

static nd_rng rng;

static double loss_at(nd_trainer *tr, const int32_t *ids, const float *mask, int rows)
{
    double loss;
    nd_trainer_merge(tr);
    if (nd_trainer_step(tr, ids, mask, rows, 0, &loss, NULL))
        return NAN;
    return loss;
}

/* g.v vs (f(p + h v) - f(p - h v)) / 2h over n floats of p */
static double check_dir(nd_trainer *tr, float *p, const float *g, size_t n, const int32_t *ids,
                        const float *mask, int rows, double h, const char *name)
{
    double gn = 0;
    for (size_t i = 0; i < n; i++)
        gn += (double)g[i] * g[i];
    gn = sqrt(gn);
    float *v = malloc(sizeof *v * n), *p0 = malloc(sizeof *p0 * n);
    double rn = 0;
    for (size_t i = 0; i < n; i++) {
        v[i] = (float)nd_rng_normal(&rng);
        rn += (double)v[i] * v[i];
    }
    rn = sqrt(rn);
    double dot = 0;
    for (size_t i = 0; i < n; i++) {
        v[i] = (float)(0.5 * v[i] / rn + (gn > 0 ? 0.5 * g[i] / gn : 0));
        dot += (double)g[i] * v[i];
    }
    memcpy(p0, p, sizeof *p * n);
    for (size_t i = 0; i < n; i++)
        p[i] = p0[i] + (float)h * v[i];
    double fp = loss_at(tr, ids, mask, rows);
    for (size_t i = 0; i < n; i++)
        p[i] = p0[i] - (float)h * v[i];
    double fm = loss_at(tr, ids, mask, rows);
    memcpy(p, p0, sizeof *p * n);
    double fd = (fp - fm) / (2 * h);
    /* The losses come from a float32 forward: their rounding (~1e-7 of a
     * loss near 4, varying with the BLAS kernels) puts ~2e-5 of noise on
     * fd at h = 1e-2, so a directional derivative below 1e-3 is judged
     * against 1e-3 (a 10% error in g.v = 1e-3 still fails the 2e-2 bound). */
    double err = fabs(fd - dot) / fmax(fabs(dot), 1e-3);
    printf("  %-48s |g| %.3e  g.v %+.6e  fd %+.6e  rel %.2e\n", name, gn, dot, fd, err);
    free(v);
    free(p0);
    return err;
}

/* the check on one config; returns the worst relative error */
static double check_model(const san_config *cfgp, const char *label)
{
    san_config cfg = *cfgp;
    printf("== %s\n", label);
    san_model m;
    CHECK(san_model_create(&m, &cfg) == 0);
    san_model_init_random(&m, 5);
    /* perturb every parameter so no term hides behind a zero or identity */
    for (size_t i = 0; i < m.numel; i++)
        m.mem[i] += (float)(0.1 * nd_rng_normal(&rng));
    const nd_backend *be = nd_backend_cpu(0);
    san_lora lora;
    CHECK(san_lora_create(&lora, &m, 4, 8.0f) == 0);
    san_lora_init(&lora, 3);
    for (int t = 0; t < LORA_NTARGETS; t++) /* B != 0 so dA is not trivially zero */
        if (lora.t[t].present) {
            float *B = san_lora_B(&lora, lora.mem, t);
            for (size_t i = 0; i < (size_t)lora.L * lora.rank * lora.t[t].out; i++)
                B[i] = (float)(0.05 * nd_rng_normal(&rng));
        }
    int Bn = 2, T = 21, rows = 2; /* T crosses nothing special but has padding-like zeros */
    int32_t ids[2 * 21];
    float mask[2 * 21];
    for (int i = 0; i < Bn * T; i++) {
        ids[i] = (int32_t)nd_rng_below(&rng, 64);
        mask[i] = (i % T) > 5 && (i % 7) ? 1.0f : 0.0f;
    }
    nd_trainer tr;
    CHECK(nd_trainer_create(&tr, &m, be, &lora, Bn, T, 1, -1) == 0);
    double loss, masked;
    CHECK(nd_trainer_step(&tr, ids, mask, rows, 1, &loss, &masked) == 0);
    printf("loss %.6f over %.0f masked positions\n", loss, masked);
    /* keep the analytic gradients: later forwards reuse the buffers */
    float *gl = malloc(sizeof(float) * lora.numel), *gf = malloc(sizeof(float) * m.numel);
    memcpy(gl, tr.lora_g, sizeof(float) * lora.numel);
    memcpy(gf, tr.full_g, sizeof(float) * m.numel);
    double worst = 0;
    for (int t = 0; t < LORA_NTARGETS; t++) {
        if (!lora.t[t].present)
            continue;
        char name[128];
        size_t na = (size_t)lora.L * lora.t[t].in * lora.rank;
        size_t nb = (size_t)lora.L * lora.rank * lora.t[t].out;
        snprintf(name, sizeof name, "lora %s A", san_lora_target_name(t) + 25);
        double e = check_dir(&tr, lora.mem + lora.t[t].a_off, gl + lora.t[t].a_off, na, ids, mask,
                             rows, 1e-2, name);
        CHECK_MSG(e < 2e-2, "%s rel err %g", name, e);
        worst = fmax(worst, e);
        snprintf(name, sizeof name, "lora %s B", san_lora_target_name(t) + 25);
        e = check_dir(&tr, lora.mem + lora.t[t].b_off, gl + lora.t[t].b_off, nb, ids, mask, rows,
                      1e-2, name);
        CHECK_MSG(e < 2e-2, "%s rel err %g", name, e);
        worst = fmax(worst, e);
    }
    for (int i = 0; i < m.n_tensors; i++) {
        const san_tensor *t = &m.tensors[i];
        double e = check_dir(&tr, m.mem + t->offset, gf + t->offset, t->numel, ids, mask, rows,
                             1e-2, t->name);
        CHECK_MSG(e < 2e-2, "%s rel err %g", t->name, e);
        worst = fmax(worst, e);
    }
    printf("%s: worst relative error %.2e\n", label, worst);
    free(gl);
    free(gf);
    nd_trainer_free(&tr);
    san_lora_free(&lora);
    san_model_free(&m);
    return worst;
}

int main(void)
{
    nd_rng_seed(&rng, 99);
    san_config cfg;
    tu_small_config(&cfg);
    check_model(&cfg, "Needle 2 (small config)");
    /* Needle 3: every new piece (conv taps masked by the window, local and
     * global layers, separate head dims, CLA, engram banks with seed heads,
     * elementwise gate, shared factors), then headwise gate, block_untied
     * factors and out_vocab; sequences longer than the windows */
    san_config_preset(&cfg, "tiny3");
    check_model(&cfg, "Needle 3 tiny3");
    san_config_preset(&cfg, "tiny3b");
    check_model(&cfg, "Needle 3 tiny3b");
    return tu_finish("test_grad_model");
}
