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
 * Sequences run well past the sliding windows.
 *
 * The quantised path: a v3 archive (4 bits) run from its CQ matrices
 * (nd_cact3_to_qmodel's view, the v2 kernels) against the float forward of
 * the same archive dequantised: equal within the int8 activations' error,
 * and the same whether fed token by token or in chunks.
 *
 * Long conversations: with the session's sliding window (pinned rows plus
 * kv_window), a v3 state's memory stays within nd_kv_bytes_bound over a
 * stream 30x its max_seq_len, and the logits stay finite. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/status.h"
#include "engine/engine.h"
#include "engine/model_internal.h"
#include "io/cact.h"
#include "io/checkpoint.h"
#include "model/cq.h"
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
            nd_kv_release_scratch(&s); /* pages back between steps: state kept */
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
    /* int8 K/V rows (an archive's kv_bits 8): within the rows' rounding
     * of the float forward, the same in chunks as token by token, and
     * smaller */
    {
        nd_kv_state s8, sf;
        float *lg8 = malloc((size_t)T_SEQ * V * sizeof *lg8);
        CHECK(nd_kv_init(&s8, &m, be, 8, 0) == 0);
        nd_kv_set_bits(&s8, 8);
        CHECK(s8.kv_int8 == 1);
        for (int t = 0; t < T_SEQ; t++)
            CHECK(nd_kv_forward(&s8, tok + t, 1, lg8 + (size_t)t * V, 0) == 0);
        double e = rows_err(lg8, V, ref, Vo, T_SEQ, Vo);
        printf("  %s: int8 K/V rows vs the float forward: rel err %.5f\n", name, e);
        CHECK_MSG(e < 0.02 && e > 0, "%s: int8 K/V rel err %g", name, e);
        CHECK(nd_kv_init(&sf, &m, be, 8, 0) == 0);
        CHECK(nd_kv_forward(&sf, tok, T_SEQ, NULL, 0) == 0);
        CHECK_MSG(nd_kv_bytes(&s8) < nd_kv_bytes(&sf), "%s: int8 rows %zu bytes, float %zu", name,
                  nd_kv_bytes(&s8), nd_kv_bytes(&sf));
        nd_kv_free(&sf);
        nd_kv_free(&s8);
        CHECK(nd_kv_init(&s8, &m, be, 16, 0) == 0);
        nd_kv_set_bits(&s8, 8);
        CHECK(nd_kv_forward(&s8, tok, 13, lg, 1) == 0);
        CHECK(nd_kv_forward(&s8, tok + 13, T_SEQ - 13, lg + (size_t)13 * V, 1) == 0);
        /* The K/V rows come from products of 13 rows here and of one row
         * above; BLAS kernels may round the two shapes differently (the
         * Haswell kernels agree to 1e-5, the AVX-512 ones do not), and a
         * float difference at a rounding boundary flips an int8 step. A
         * few flipped steps stay far below the effect of all the int8
         * roundings together (e_int8 above); a chunk that reads a wrong or
         * missing row does not. */
        double e_int8 = e;
        e = rows_err(lg, V, lg8, V, T_SEQ, Vo);
        CHECK_MSG(e < 0.1 * e_int8, "%s: int8 K/V, chunks vs token by token rel err %g (int8 %g)",
                  name, e, e_int8);
        nd_kv_free(&s8);
        free(lg8);
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

/* the n tokens of tok through a fresh state fed in the given pieces (0:
 * one at a time), every row's logits into lg [n, V] */
static int feed(nd_kv_state *s, const int32_t *tok, int n, int piece, float *lg, int V)
{
    for (int t = 0; t < n;) {
        int k = piece ? (piece < n - t ? piece : n - t) : 1;
        if (nd_kv_forward(s, tok + t, k, lg + (size_t)t * V, 1))
            return -1;
        t += k;
    }
    return 0;
}

static void check_quant(const char *preset)
{
    const nd_backend *be = nd_backend_cpu(0);
    san_model src, mf, mq;
    random_model(&src, preset, -1, -1);
    pv *root = ckpt_fresh_tree(&src, 3);
    CHECK(root != NULL);
    cact_write_opts o = {0};
    o.bits = 4;
    o.group = CQ_GROUP;
    o.kv_window = cact3_effective_kv_window(&src.cfg);
    unsigned char *buf = NULL;
    size_t len = 0;
    cact_file f;
    nd_qweights3 q3;
    int rc = root ? cact_write_mem(&src, root, &o, &buf, &len, NULL) : -1;
    CHECK_MSG(rc == 0, "%s: archive: %s", preset, nd_last_error());
    CHECK_MSG(!rc && (rc = cact_parse(buf, len, &f)) == 0, "%s", nd_last_error());
    if (rc) {
        free(buf);
        pv_decref(root);
        san_model_free(&src);
        return;
    }
    CHECK_MSG(nd_cact3_to_model(&f, &mf) == 0, "%s", nd_last_error());
    CHECK_MSG(nd_cact3_to_qmodel(&f, &mq, &q3) == 0, "%s", nd_last_error());
    const san_dims *D = &mf.dims;
    int V = D->V, Vo = D->V_out;
    int32_t tok[T_SEQ];
    nd_rng r;
    nd_rng_seed(&r, 5);
    for (int i = 0; i < T_SEQ; i++)
        tok[i] = 5 + (int)(nd_rng_next(&r) % 23);
    san_acts a;
    CHECK(san_acts_create(&a, be, &mf, 1, T_SEQ, 0, 0) == 0);
    CHECK(san_forward(&mf, &mf.w, &a, tok) == 0);
    float *lg = malloc(sizeof *lg * T_SEQ * V), *lg1 = malloc(sizeof *lg1 * T_SEQ * V);
    nd_kv_state s;
    /* the dequantised archive through the float path */
    CHECK(nd_kv_init(&s, &mf, be, 16, 0) == 0);
    CHECK(feed(&s, tok, T_SEQ, 7, lg, V) == 0);
    double e = rows_err(lg, V, a.logits, Vo, T_SEQ, Vo);
    CHECK_MSG(e < TOL, "%s: archive, float path rel err %g", preset, e);
    nd_kv_free(&s);
    /* the CQ matrices in place */
    CHECK(nd_kv_init(&s, &mq, be, 16, 0) == 0);
    nd_kv_use_quant(&s, &q3.q);
    CHECK(feed(&s, tok, T_SEQ, 0, lg1, V) == 0);
    nd_kv_free(&s);
    e = rows_err(lg1, V, a.logits, Vo, T_SEQ, Vo);
    printf("  %s: 4-bit archive, quantised path vs its float weights: rel err %.4f\n", preset, e);
    CHECK_MSG(e < 0.03, "%s: quantised path vs float rel err %g", preset, e);
    CHECK(nd_kv_init(&s, &mq, be, 16, 0) == 0);
    nd_kv_use_quant(&s, &q3.q);
    CHECK(feed(&s, tok, T_SEQ, 11, lg, V) == 0);
    nd_kv_free(&s);
    e = rows_err(lg, V, lg1, V, T_SEQ, Vo);
    CHECK_MSG(e < 1e-4, "%s: quantised path, chunks vs token by token rel err %g", preset, e);
    for (int t = Vo; t < V; t++)
        CHECK(lg[(size_t)(T_SEQ - 1) * V + t] < -1e29f);
    free(lg);
    free(lg1);
    san_acts_free(&a);
    nd_qweights3_free(&q3);
    san_model_free(&mq);
    san_model_free(&mf);
    cact_free(&f);
    free(buf);
    pv_decref(root);
    san_model_free(&src);
}

static void check_slide(int bits)
{
    const nd_backend *be = nd_backend_cpu(0);
    san_model m;
    random_model(&m, "tiny3", -1, -1);
    nd_kv_state s;
    CHECK(nd_kv_init(&s, &m, be, 16, 24) == 0);
    nd_kv_set_bits(&s, bits);
    nd_kv_slide(&s, 6);
    size_t bound = nd_kv_bytes_bound(&s), worst = 0;
    int V = m.dims.V, bad = 0, total = 30 * m.cfg.max_seq_len, fed = 0;
    float *lg = malloc(sizeof *lg * 9 * (size_t)V);
    int32_t tok[9];
    nd_rng r;
    nd_rng_seed(&r, 9);
    for (int k = 0; fed < total && !bad; k++) {
        int n = 1 + k % 9;
        for (int i = 0; i < n; i++)
            tok[i] = 5 + (int)(nd_rng_next(&r) % 500);
        if (nd_kv_forward(&s, tok, n, lg, 1)) {
            CHECK_MSG(0, "slide: forward at %d: %s", fed, nd_last_error());
            break;
        }
        fed += n;
        for (long i = 0; i < (long)n * V; i++)
            bad |= !isfinite(lg[i]);
        size_t b = nd_kv_bytes(&s);
        worst = b > worst ? b : worst;
        CHECK(s.len <= m.cfg.max_seq_len);
    }
    CHECK_MSG(!bad, "slide (%d-bit rows): non-finite logits", bits);
    CHECK(s.evicted > total / 2);
    CHECK_MSG(worst <= bound, "slide (%d-bit rows): %zu bytes held, bound %zu", bits, worst, bound);
    free(lg);
    nd_kv_free(&s);
    san_model_free(&m);
}

int main(void)
{
    check_model("tiny3", "tiny3", -1, -1);
    check_model("tiny3b", "tiny3b", -1, -1);
    check_model("tiny3 window 2 < taps", "tiny3", 2, -1);
    check_model("tiny3 no taps", "tiny3", -1, 0);
    check_quant("tiny3");
    check_quant("tiny3b");
    check_slide(32);
    check_slide(8);
    return tu_finish("test_kv3");
}
