/* The engine's incremental (KV-cache) forward on Needle 3 models, float
 * weights: feeding a sequence token by token, in uneven chunks, after a
 * rewind or from a restored snapshot gives the trainer's full-sequence
 * float forward's logits (san_forward) to ~1e-5, for the presets that
 * together cover every 3.x piece:
 *   tiny3:  conv taps 3, local layers (window 4) + a global one, a CLA pair
 *           (1 -> 2), elementwise gate, engram seed heads and a shared bank,
 *           shared Hadamard factors;
 *   tiny3b: conv taps 2, window 3 with a global layer 0, CLA (2 -> 3),
 *           headwise gate, untied Hadamard factors, out_vocab < vocab;
 *   tiny3 with window 2 (< taps: the local layers' conv is cut to 2 taps)
 *           and one without conv taps.
 * Sequences run well past the sliding windows. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/status.h"
#include "engine/engine.h"
#include "model/san.h"
#include "testutil.h"

#define T_SEQ 48

static void random_model(san_model *m, const char *preset, int window, int taps)
{
    san_config c;
    CHECK(san_config_preset(&c, preset) == 0);
    c.max_seq_len = 64;
    if (window >= 0)
        c.sliding_window = window;
    if (taps >= 0)
        c.qkv_conv_taps = taps;
    CHECK_MSG(san_model_create(m, &c) == 0, "%s", nd_last_error());
    san_model_init_random(m, 7);
    nd_rng r;
    nd_rng_seed(&r, 11);
    /* every weight away from its init (zero taps, unit diagonals, ...) */
    for (size_t i = 0; i < m->numel; i++)
        m->mem[i] += (float)(0.05 * nd_rng_normal(&r));
}

/* max |a - b| over the first Vo logits of each row / max |b| */
static double rows_err(const float *a, int lda, const float *b, int ldb, int rows, int Vo)
{
    double mx = 0, ref = 1e-6;
    for (int r = 0; r < rows; r++)
        for (int t = 0; t < Vo; t++) {
            double d = fabs((double)a[(size_t)r * lda + t] - b[(size_t)r * ldb + t]);
            mx = d > mx ? d : mx;
            double v = fabs((double)b[(size_t)r * ldb + t]);
            ref = v > ref ? v : ref;
        }
    return mx / ref;
}

#define TOL 2e-5

static void check_model(const char *name, const char *preset, int window, int taps)
{
    const nd_backend *be = nd_backend_cpu(0);
    san_model m;
    random_model(&m, preset, window, taps);
    const san_dims *D = &m.dims;
    int V = D->V, Vo = D->V_out;
    int32_t tok[T_SEQ], tok2[T_SEQ];
    nd_rng r;
    nd_rng_seed(&r, 3);
    for (int i = 0; i < T_SEQ; i++) {
        /* a small alphabet so that n-grams repeat (the engram hash sees hits) */
        tok[i] = 5 + (int)(nd_rng_next(&r) % 23);
        tok2[i] = i < 20 ? tok[i] : 100 + (int)(nd_rng_next(&r) % 1000);
    }
    /* the trainer's float forward of the whole sequences */
    san_acts a;
    CHECK_MSG(san_acts_create(&a, be, &m, 1, T_SEQ, 0, 0) == 0, "%s", nd_last_error());
    float *ref = malloc((size_t)T_SEQ * Vo * sizeof *ref),
          *ref2 = malloc(sizeof *ref2 * T_SEQ * Vo);
    CHECK(san_forward(&m, &m.w, &a, tok) == 0);
    memcpy(ref, a.logits, (size_t)T_SEQ * Vo * sizeof *ref);
    CHECK(san_forward(&m, &m.w, &a, tok2) == 0);
    memcpy(ref2, a.logits, (size_t)T_SEQ * Vo * sizeof *ref2);
    san_acts_free(&a);

    float *lg = malloc((size_t)T_SEQ * V * sizeof *lg);
    /* token by token */
    {
        nd_kv_state s;
        CHECK_MSG(nd_kv_init(&s, &m, be, 8, 0) == 0, "%s", nd_last_error());
        double worst = 0;
        for (int t = 0; t < T_SEQ; t++) {
            CHECK(nd_kv_forward(&s, tok + t, 1, lg, 0) == 0);
            double e = rows_err(lg, V, ref + (size_t)t * Vo, Vo, 1, Vo);
            worst = e > worst ? e : worst;
        }
        CHECK_MSG(worst < TOL, "%s: token by token vs full forward rel err %g", name, worst);
        /* out_vocab: the tokens past it are never produced */
        for (int t = Vo; t < V; t++)
            CHECK(lg[t] < -1e29f);
        /* rewind into the middle and go on with other tokens: the rows and
         * conv history before the rewind point are still those of tok */
        nd_kv_rewind(&s, 20);
        CHECK(nd_kv_forward(&s, tok2 + 20, T_SEQ - 20, lg, 1) == 0);
        double e = rows_err(lg, V, ref2 + (size_t)20 * Vo, Vo, T_SEQ - 20, Vo);
        CHECK_MSG(e < TOL, "%s: rewound to 20, new suffix rel err %g", name, e);
        /* a snapshot of the first 20 rows restored into a fresh state */
        nd_kv_snap snap;
        CHECK(nd_kv_snapshot(&s, 20, &snap) == 0);
        nd_kv_state s2;
        CHECK(nd_kv_init(&s2, &m, be, 5, 0) == 0);
        CHECK(nd_kv_restore(&s2, &snap) == 0);
        CHECK(nd_kv_forward(&s2, tok2 + 20, T_SEQ - 20, lg, 1) == 0);
        e = rows_err(lg, V, ref2 + (size_t)20 * Vo, Vo, T_SEQ - 20, Vo);
        CHECK_MSG(e < TOL, "%s: restored snapshot rel err %g", name, e);
        nd_kv_snap_free(&snap);
        nd_kv_free(&s2);
        nd_kv_free(&s);
    }
    /* uneven chunks, all logits; chunk capacities that split them again */
    static const int pieces[] = {3, 1, 7, 2, 11, 5, 19};
    for (int cap = 4; cap <= 64; cap *= 4) {
        nd_kv_state s;
        CHECK(nd_kv_init(&s, &m, be, cap, 0) == 0);
        int t = 0;
        for (int k = 0; t < T_SEQ; k++) {
            int n = pieces[k % 7] < T_SEQ - t ? pieces[k % 7] : T_SEQ - t;
            CHECK(nd_kv_forward(&s, tok + t, n, lg + (size_t)t * V, 1) == 0);
            t += n;
        }
        double e = rows_err(lg, V, ref, Vo, T_SEQ, Vo);
        CHECK_MSG(e < TOL, "%s: uneven chunks (capacity %d) rel err %g", name, cap, e);
        /* the whole sequence in one call */
        nd_kv_rewind(&s, 0);
        CHECK(nd_kv_forward(&s, tok, T_SEQ, lg, 1) == 0);
        e = rows_err(lg, V, ref, Vo, T_SEQ, Vo);
        CHECK_MSG(e < TOL, "%s: one call (capacity %d) rel err %g", name, cap, e);
        nd_kv_free(&s);
    }
    free(lg);
    free(ref);
    free(ref2);
    san_model_free(&m);
}

int main(void)
{
    check_model("tiny3", "tiny3", -1, -1);
    check_model("tiny3b", "tiny3b", -1, -1);
    check_model("tiny3 window 2 < taps", "tiny3", 2, -1);
    check_model("tiny3 no taps", "tiny3", -1, 0);
    return tu_finish("test_kv3");
}
