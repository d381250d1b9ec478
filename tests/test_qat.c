/* Quantisation-aware training (train/qat.h, needle finetune --qat):
 *
 * 1. Q(W) as training computes it equals, bit for bit, the dequantised
 *    weights of the archive `needle build` writes for the same merged
 *    weights (read back through cact_dequant, the engine's float path),
 *    at 2, 3, 4 bits and for a config weight_bits map; the trainer's own
 *    merged-then-quantised weights match it up to the float rounding of
 *    the merge (reported).
 * 2. The step-0 --qat training loss equals the float forward on the
 *    archive's dequantised weights.
 * 3. Straight-through gradients: the --qat LoRA (and full) gradients equal
 *    the plain gradients at the dequantised point, and differ from the
 *    float-point gradients (so the check can tell them apart). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/status.h"
#include "core/threadpool.h"
#include "io/cact.h"
#include "model/lora_merge.h"
#include "train/trainer.h"
#include "testutil.h"

static nd_rng rng;

/* element k of the model layout <-> element of the archive's [out, in] */
static size_t archive_index(const cact_model_tensor *t, size_t k)
{
    if (t->src == CACT_SRC_FP16 || t->src == CACT_SRC_DIRECT)
        return k;
    if (t->src == CACT_SRC_KERNEL) { /* kernel [in, out] */
        size_t i = k / (size_t)t->out, o = k % (size_t)t->out;
        return o * (size_t)t->in + i;
    }
    /* phi (L, nC, lanes) -> (L*lanes, nC) */
    size_t lanes = (size_t)t->c, nC = (size_t)t->b;
    size_t l = k / (nC * lanes), c = k / lanes % nC, j = k % lanes;
    return (l * lanes + j) * nC + c;
}

static int model_copy(san_model *dst, const san_model *src)
{
    if (san_model_create(dst, &src->cfg))
        return -1;
    memcpy(dst->mem, src->mem, src->numel * sizeof(float));
    return 0;
}

/* the archive build writes for `m` at `bits` (0: config map) -> its
 * dequantised weights scattered back into the model layout (others: NaN) */
static float *archive_weights(const san_model *m, int bits, const nd_qat *q)
{
    cact_write_opts o = {0};
    o.bits = bits ? bits : 4;
    o.bits_map = !bits && m->cfg.weight_bits[0] ? m->cfg.weight_bits : NULL;
    o.group = 128;
    unsigned char *buf = NULL;
    size_t len = 0;
    cact_write_info info;
    cact_file f;
    float *w = malloc(m->numel * sizeof *w);
    if (!w || cact_write_mem(m, NULL, &o, &buf, &len, &info) || cact_parse(buf, len, &f)) {
        fprintf(stderr, "archive: %s\n", nd_last_error());
        free(w);
        free(buf);
        return NULL;
    }
    for (size_t i = 0; i < m->numel; i++)
        w[i] = NAN;
    for (int i = 0; i < q->n; i++) {
        const cact_model_tensor *t = &q->t[i];
        int idx = cact_find(&f, t->name);
        float *d = NULL;
        size_t n = 0;
        CHECK_MSG(idx >= 0 && !cact_dequant(&f, idx, &d, &n) && n == t->numel, "%s", t->name);
        if (idx < 0 || !d)
            continue;
        CHECK_MSG(t->src == CACT_SRC_FP16 ? f.t[idx].dtype == CACT_FP16
                                          : (int)f.t[idx].bits == t->bits,
                  "%s stored as build stores it", t->name);
        for (size_t k = 0; k < t->numel && n == t->numel; k++)
            w[t->offset + k] = d[archive_index(t, k)];
        free(d);
    }
    cact_free(&f);
    free(buf);
    return w;
}

/* differing elements (bitwise) and max |a - b| over the listed tensors */
static long compare(const nd_qat *q, const float *a, const float *b, double *maxd, long *total)
{
    long diff = 0;
    *maxd = 0;
    *total = 0;
    for (int i = 0; i < q->n; i++)
        for (size_t k = q->t[i].offset; k < q->t[i].offset + q->t[i].numel; k++) {
            ++*total;
            if (memcmp(&a[k], &b[k], sizeof(float))) {
                diff++;
                double d = fabs((double)a[k] - b[k]);
                *maxd = d > *maxd || isnan(d) ? d : *maxd;
            }
        }
    return diff;
}

static double rel_diff(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-30));
}

int main(void)
{
    nd_rng_seed(&rng, 7);
    san_config cfg;
    tu_small_config(&cfg);
    cfg.d_model = 136; /* > one CQ group of 128: two groups, the last padded */
    cfg.vocab_size = 96;
    san_model m;
    CHECK(san_model_create(&m, &cfg) == 0);
    san_model_init_random(&m, 5);
    for (size_t i = 0; i < m.numel; i++)
        m.mem[i] += (float)(0.05 * nd_rng_normal(&rng));
    const nd_backend *be = nd_backend_cpu(0);
    san_lora lora;
    CHECK(san_lora_create(&lora, &m, 4, 8.0f) == 0);
    san_lora_init(&lora, 3);
    for (int t = 0; t < LORA_NTARGETS; t++) /* B != 0: the merge changes W */
        if (lora.t[t].present) {
            float *B = san_lora_B(&lora, lora.mem, t);
            for (size_t i = 0; i < (size_t)lora.L * lora.rank * lora.t[t].out; i++)
                B[i] = (float)(0.05 * nd_rng_normal(&rng));
        }
    /* the merged model exactly as `needle build --lora` forms it */
    san_model merged;
    CHECK(model_copy(&merged, &m) == 0);
    pv *ad = san_lora_to_pv(&lora);
    lora_merge_info li;
    CHECK(ad && lora_merge(&merged, NULL, ad, "test adapter", &li) == 0);
    pv_decref(ad);

    int Bn = 2, T = 19, rows = 2;
    int32_t ids[2 * 19];
    float mask[2 * 19];
    for (int i = 0; i < Bn * T; i++) {
        ids[i] = (int32_t)nd_rng_below(&rng, (uint64_t)cfg.vocab_size);
        mask[i] = (i % T) > 4 && (i % 5) ? 1.0f : 0.0f;
    }

    /* ---- 1. Q(W) == build's dequantised weights ---- */
    static const struct {
        int bits;
        const char *map;
    } cases[] = {{2, ""}, {3, ""}, {4, ""}, {0, "embedding=3,attn.q_proj=2,default=4"}, {0, ""}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int bits = cases[c].bits;
        snprintf(merged.cfg.weight_bits, sizeof merged.cfg.weight_bits, "%s", cases[c].map);
        nd_qat q;
        CHECK(nd_qat_init(&q, &merged, bits) == 0);
        float *qw = malloc(merged.numel * sizeof *qw);
        CHECK(nd_qat_apply(&q, merged.mem, qw, 0, merged.numel) == 0);
        float *aw = archive_weights(&merged, bits, &q);
        CHECK(aw != NULL);
        double maxd;
        long total = 0, diff = aw ? compare(&q, qw, aw, &maxd, &total) : -1;
        printf("1. %-44s Q(W) vs archive: %ld of %ld floats differ\n", q.scheme, diff, total);
        CHECK_MSG(diff == 0, "%s: Q(W) differs from build's archive in %ld floats", q.scheme, diff);
        nd_qat_free(&q);
        free(qw);
        free(aw);
    }
    merged.cfg.weight_bits[0] = 0;
    m.cfg.weight_bits[0] = 0;

    for (int bits = 2; bits <= 4; bits += 2) {
        /* the trainer's own merge (float32 GEMM) then Q, against the archive */
        nd_trainer tq;
        CHECK(nd_trainer_create(&tq, &m, be, &lora, Bn, T, 0, -1) == 0);
        CHECK(nd_trainer_set_qat(&tq, bits) == 0);
        float *aw = archive_weights(&merged, bits, tq.qat);
        double maxd;
        long total, diff = compare(tq.qat, tq.qmem, aw, &maxd, &total);
        printf("1. W%d trainer merge+Q vs archive: %ld of %ld floats differ (max %.3g; float "
               "rounding of the merge)\n",
               bits, diff, total, maxd);
        CHECK_MSG(diff * 1000 <= total, "W%d: %ld of %ld floats differ", bits, diff, total);

        /* ---- 2. step-0 loss == float forward on the archive's weights ---- */
        double lq, lf, lfloat;
        CHECK(nd_trainer_step(&tq, ids, mask, rows, 1, &lq, NULL) == 0);
        san_model deq;
        CHECK(model_copy(&deq, &merged) == 0);
        for (int i = 0; i < tq.qat->n; i++) /* every exported tensor: the archive's */
            for (size_t k = 0; k < tq.qat->t[i].numel; k++)
                deq.mem[tq.qat->t[i].offset + k] = aw[tq.qat->t[i].offset + k];
        nd_trainer tf;
        CHECK(nd_trainer_create(&tf, &deq, be, NULL, Bn, T, 0, -1) == 0);
        CHECK(nd_trainer_step(&tf, ids, mask, rows, 0, &lf, NULL) == 0);
        nd_trainer_free(&tf);
        nd_trainer tplain;
        CHECK(nd_trainer_create(&tplain, &m, be, &lora, Bn, T, 0, -1) == 0);
        CHECK(nd_trainer_step(&tplain, ids, mask, rows, 1, &lfloat, NULL) == 0);
        printf("2. W%d step-0 loss: qat %.7f  float forward on the archive %.7f  (float "
               "weights %.7f)\n",
               bits, lq, lf, lfloat);
        CHECK_MSG(fabs(lq - lf) <= 1e-5 * fabs(lf), "W%d: qat loss %.9g vs archive %.9g", bits, lq,
                  lf);
        CHECK_MSG(fabs(lq - lfloat) > 1e-4, "W%d: quantisation should change the loss", bits);

        /* ---- 3. STE: LoRA gradients == plain gradients at base' + sAB = Q(merged) ---- */
        san_model shifted;
        CHECK(model_copy(&shifted, &m) == 0);
        memcpy(shifted.mem, tq.qmem, m.numel * sizeof(float));
        for (int t = 0; t < LORA_NTARGETS; t++) {
            if (!lora.t[t].present)
                continue;
            /* base' = Q(W + sAB) - sAB, so the plain merge lands on Q(W + sAB) */
            float *W = san_lora_weight_slot(&shifted.w, t);
            int in = lora.t[t].in, out = lora.t[t].out, r = lora.rank;
            for (int l = 0; l < lora.L; l++)
                be->matmul(be, 0, 0, in, out, r, -lora.scale,
                           san_lora_A(&lora, lora.mem, t) + (size_t)l * in * r, r,
                           san_lora_B(&lora, lora.mem, t) + (size_t)l * r * out, out, 1.0f,
                           W + (size_t)l * in * out, out);
        }
        nd_trainer tref;
        double lref;
        CHECK(nd_trainer_create(&tref, &shifted, be, &lora, Bn, T, 0, -1) == 0);
        CHECK(nd_trainer_step(&tref, ids, mask, rows, 1, &lref, NULL) == 0);
        double e = rel_diff(tq.lora_g, tref.lora_g, lora.numel);
        double e_float = rel_diff(tplain.lora_g, tref.lora_g, lora.numel);
        printf("3. W%d LoRA grads: qat vs plain at the dequantised point rel %.2e (float-point "
               "grads: rel %.2e)\n",
               bits, e, e_float);
        CHECK_MSG(e < 1e-3, "W%d: STE LoRA gradient rel err %g", bits, e);
        CHECK_MSG(e_float > 10 * e, "W%d: qat gradients indistinguishable from float ones", bits);
        nd_trainer_free(&tref);
        nd_trainer_free(&tplain);
        san_model_free(&shifted);

        /* full gradients: --qat on m vs plain on Q(m) */
        nd_trainer fq, fr;
        double a, b;
        CHECK(nd_trainer_create(&fq, &m, be, NULL, Bn, T, 1, -1) == 0);
        CHECK(nd_trainer_set_qat(&fq, bits) == 0);
        san_model qm;
        CHECK(model_copy(&qm, &m) == 0);
        memcpy(qm.mem, fq.qmem, m.numel * sizeof(float));
        CHECK(nd_trainer_create(&fr, &qm, be, NULL, Bn, T, 1, -1) == 0);
        CHECK(nd_trainer_step(&fq, ids, mask, rows, 1, &a, NULL) == 0);
        CHECK(nd_trainer_step(&fr, ids, mask, rows, 1, &b, NULL) == 0);
        e = rel_diff(fq.full_g, fr.full_g, m.numel);
        printf("3. W%d full grads: qat vs plain on Q(W) rel %.2e, loss %.7f vs %.7f\n", bits, e, a,
               b);
        CHECK_MSG(e == 0 && a == b, "W%d: full STE gradient rel err %g", bits, e);
        /* a changed base weight is requantised by nd_trainer_merge */
        float *keep = malloc(m.numel * sizeof *keep);
        memcpy(keep, m.mem, m.numel * sizeof *keep);
        for (size_t i = 0; i < m.numel; i++)
            m.mem[i] *= 1.5f;
        CHECK(nd_trainer_merge(&fq) == 0);
        CHECK(nd_trainer_step(&fq, ids, mask, rows, 0, &a, NULL) == 0);
        CHECK_MSG(a != b, "W%d: --full --qat requantises after an update", bits);
        memcpy(m.mem, keep, m.numel * sizeof *keep);
        free(keep);
        nd_trainer_free(&fq);
        nd_trainer_free(&fr);
        san_model_free(&qm);

        /* the per-step cost: LoRA requantise (targets only) */
        double t0 = nd_wtime();
        for (int i = 0; i < 5; i++)
            CHECK(nd_trainer_merge(&tq) == 0);
        printf("   W%d merge+requantise %.2f ms per step (this shape)\n", bits,
               (nd_wtime() - t0) / 5 * 1e3);
        nd_trainer_free(&tq);
        san_model_free(&deq);
        free(aw);
    }
    nd_qat q;
    CHECK(nd_qat_init(&q, &m, 6) != 0); /* a bad width is refused */
    CHECK(nd_qat_init(&q, &m, 1) != 0);
    san_lora_free(&lora);
    san_model_free(&merged);
    san_model_free(&m);
    return tu_finish("test_qat");
}
