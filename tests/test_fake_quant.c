/* Needle 3 training numerics (src/model/fake_quant.c): values worked out
 * by hand from 3.x's quantize.py formulas (ties, clipping, all-zero and
 * single-element groups, negatives, group and row boundaries, the kernel
 * axis), the straight-through backward, and the accepted widths. The
 * random-input comparison with numpy is tests/test_fake_quant_numpy.py. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "model/cq.h"
#include "model/fake_quant.h"
#include "testutil.h"

static int same(float a, float b)
{
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0;
}

static void expect_row(const char *what, const float *got, const float *want, int n)
{
    for (int i = 0; i < n; i++)
        CHECK_MSG(same(got[i], want[i]), "%s[%d]: got %.9g, want %.9g", what, i, got[i], want[i]);
}

/* absmax 127: scale 1, so y = round_half_even(x) */
static void test_ties(void)
{
    const float x[10] = {127, -0.5f, 0.5f, 1.5f, 2.5f, -1.5f, -127, 3.49f, -2.5f, 126.5f};
    const float want[10] = {127, 0, 0, 2, 2, -2, -127, 3, -2, 126};
    float y[10];
    CHECK(nd_fq3_fake_quant(x, y, 1, 10, 8) == ND_OK);
    expect_row("ties", y, want, 10);
    /* q = round(-0.5) * 1 = -0, but x + (q - x) = -0.5 + 0.5 = +0 */
    CHECK(!signbit(y[1]));
}

/* absmax 254: scale 2 */
static void test_scale_two(void)
{
    const float x[6] = {254, 1, 3, -5, 0.9f, -254};
    const float want[6] = {254, 0, 4, -4, 0, -254};
    float y[6];
    CHECK(nd_fq3_fake_quant(x, y, 1, 6, 8) == ND_OK);
    expect_row("scale 2", y, want, 6);
}

/* absmax 1: scale = 1/127; 0.3 * 127 = 38.1 -> 38 -> 38/127 */
static void test_inexact_scale(void)
{
    const float x[3] = {1, 0.3f, -0.3f};
    float y[3];
    CHECK(nd_fq3_fake_quant(x, y, 1, 3, 8) == ND_OK);
    CHECK(y[0] == 1.0f);
    CHECK_MSG(fabs(y[1] - 38.0 / 127.0) < 3e-8, "%.9g", y[1]);
    CHECK(y[2] == -y[1]);
}

/* rows are separate groups; a zero row stays zero */
static void test_rows(void)
{
    const float x[9] = {1, 2, 127, 0, 0, 0.5f, 0, 0, 0};
    /* row 1 has its own scale 0.5/127 (with row 0's scale 1 0.5 would be 0) */
    const float want[9] = {1, 2, 127, 0, 0, 0.5f, 0, 0, 0};
    float y[9];
    CHECK(nd_fq3_fake_quant(x, y, 3, 3, 8) == ND_OK);
    expect_row("rows", y, want, 9);
    for (int i = 6; i < 9; i++)
        CHECK(!signbit(y[i]));
}

/* the clip bound [-qmax-1, qmax] is reached when the scale underflows */
static void test_clip_subnormal(void)
{
    const float t = ldexpf(1.0f, -149), t2 = ldexpf(1.0f, -148);
    /* scale = 2^-148 / 127 rounds to 0: x/0 = +-inf clips to 127 / -128,
     * 0/0 stays NaN; q = clip * 0 */
    const float x[4] = {t, 0, -t, t2};
    const float want[4] = {0, NAN, 0, 0};
    float y[4];
    CHECK(nd_fq3_fake_quant(x, y, 1, 4, 8) == ND_OK);
    expect_row("subnormal", y, want, 4);
}

/* NaN absmax: NaN > 0 is false, scale 1, so values clip at 4 bits to
 * [-8, 7] */
static void test_clip_nan_row(void)
{
    const float x[6] = {NAN, 300, -500, 1.5f, 2.5f, -7.5f};
    const float want[6] = {NAN, 7, -8, 2, 2, -8};
    float y[6];
    CHECK(nd_fq3_fake_quant(x, y, 1, 6, 4) == ND_OK);
    expect_row("nan row", y, want, 6);
    /* an infinite absmax makes the whole row NaN (inf/inf, 0 * inf) */
    const float xi[3] = {INFINITY, 1, 0};
    CHECK(nd_fq3_fake_quant(xi, y, 1, 3, 8) == ND_OK);
    for (int i = 0; i < 3; i++)
        CHECK(isnan(y[i]));
}

/* other widths: qmax 7 (4 bits), 1 (2 bits) */
static void test_widths(void)
{
    const float x[4] = {7, 3.5f, -2.5f, -7};
    const float want4[4] = {7, 4, -2, -7};
    float y[4];
    CHECK(nd_fq3_fake_quant(x, y, 1, 4, 4) == ND_OK);
    expect_row("4 bits", y, want4, 4);
    /* 2 bits: scale 7, x/7 = 1, .5, -.357, -1 -> 1, 0, -0, -1 */
    const float want2[4] = {7, 0, 0, -7};
    CHECK(nd_fq3_fake_quant(x, y, 1, 4, 2) == ND_OK);
    expect_row("2 bits", y, want2, 4);
    /* in place */
    float z[4];
    memcpy(z, x, sizeof z);
    CHECK(nd_fq3_fake_quant(z, z, 1, 4, 4) == ND_OK);
    expect_row("in place", z, want4, 4);
}

/* query and KV: 8 bits per head whatever ACT_BITS is; kv_bits 0 and
 * act_bits 0 (query) are the identity */
static void test_query_kv(void)
{
    nd_fq3_numerics n;
    nd_fq3_defaults(&n);
    CHECK(n.act_bits == 8 && n.kv_bits == 8 && n.kv_group == 64 && n.weight_bits == 4);
    const float x[4] = {127, 3.5f, 0.5f, 127}; /* two heads of 2 */
    const float want[4] = {127, 4, 0, 127};
    float y[4];
    n.act_bits = 4; /* a 4-bit query would give 3.5 -> 0 */
    CHECK(nd_fq3_query(&n, x, y, 2, 2) == ND_OK);
    expect_row("query", y, want, 4);
    n.act_bits = 0;
    CHECK(nd_fq3_query(&n, x, y, 2, 2) == ND_OK);
    expect_row("query off", y, x, 4);
    n.act_bits = 4; /* but _aq follows ACT_BITS: 3.5 / (127/7) rounds to 0 */
    CHECK(nd_fq3_act(&n, x, y, 2, 2) == ND_OK);
    CHECK(y[0] == 127 && y[1] == 0 && y[3] == 127);
    n.kv_bits = 16;
    CHECK(nd_fq3_kv(&n, x, y, 2, 2) == ND_OK);
    expect_row("kv 16", y, want, 4);
    n.kv_bits = 0;
    CHECK(nd_fq3_kv(&n, x, y, 2, 2) == ND_OK);
    expect_row("kv off", y, x, 4);
}

/* The 4-bit Lloyd-Max levels nearest +1 and -1 (levels 11 and 4 of 16;
 * upstream's 200 iterations from sample quantiles stop short of Max's
 * symmetric 0.9424: about 0.961 and -0.922). */
static void levels_near_one(double *pos, double *neg)
{
    const double *lv;
    int nl;
    *pos = 1, *neg = -1;
    CHECK(cq_lloyd_max(4, &lv, &nl) == ND_OK && nl == 16);
    if (nl != 16)
        return;
    CHECK_MSG(lv[11] > 0.9 && lv[11] < 1 && lv[12] - 1 > 1 - lv[11], "level 11 %.6f", lv[11]);
    CHECK_MSG(lv[4] < -0.9 && lv[4] > -1 && -1 - lv[3] > lv[4] + 1, "level 4 %.6f", lv[4]);
    *pos = lv[11];
    *neg = lv[4];
}

/* CQ KV at kv_bits 4, group 64, head_dim 48 (one zero-padded group):
 * c e_0 rotates to c/8 (1, ..., 1) (H = +-1/8 exactly), norm |c|, unit
 * coordinates sign(c)/8 -> level P/8 (or N/8), and back:
 * (P/8 * |c|) @ H = P |c| e_0, all exact. */
static void test_kv_cq(void)
{
    double pos, neg;
    levels_near_one(&pos, &neg);
    float P = (float)(pos / 8.0) * 8.0f, N = (float)(neg / 8.0) * 8.0f;
    nd_fq3_numerics n;
    nd_fq3_defaults(&n);
    n.kv_bits = 4;
    CHECK(nd_fq3_validate(&n) == ND_OK);
    float x[3 * 48] = {0}, y[3 * 48];
    x[0] = 1;       /* head 0: e_0 */
    x[48] = -4;     /* head 1: -4 e_0 */
    x[48 + 47] = 0; /* head 2: all zero */
    CHECK(nd_fq3_kv(&n, x, y, 3, 48) == ND_OK);
    for (int i = 0; i < 3 * 48; i++) {
        float want = i == 0 ? P : i == 48 ? 4 * N : 0;
        CHECK_MSG(y[i] == want, "kv cq [%d]: %.9g, want %.9g", i, y[i], want);
    }
}

/* cq_ste_params on a q_proj kernel (L 2, in 130, out 3), W4 group 128:
 * groups run along the input axis (rows 0..127, then 128..129 padded);
 * column 0 all zero, column 1 holds 1 at in 0 and -2 at in 128, column 2
 * 0.5 at in 0 of layer 1 only. A group c e_0 comes back as P c e_0
 * (c > 0) or N |c| e_0 (c < 0). */
static void test_kernel_leaf(void)
{
    double pos, neg;
    levels_near_one(&pos, &neg);
    const int64_t shape[3] = {2, 130, 3};
    float w[2 * 130 * 3] = {0}, y[2 * 130 * 3];
    for (int l = 0; l < 2; l++) {
        w[(l * 130 + 0) * 3 + 1] = 1;
        w[(l * 130 + 128) * 3 + 1] = -2;
    }
    w[(130 + 0) * 3 + 2] = 0.5f;
    int rule =
        nd_fq3_cq_ste_leaf("stack/layers/block/self_attn/q_proj/kernel", shape, 3, w, y, 4, 128);
    CHECK(rule == ND_FQ3_LEAF_SECOND_LAST);
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < 130; i++)
            for (int o = 0; o < 3; o++) {
                double want = 0;
                if (o == 1 && i == 0)
                    want = pos;
                if (o == 1 && i == 128)
                    want = 2 * neg;
                if (o == 2 && i == 0 && l == 1)
                    want = 0.5 * pos;
                float got = y[(l * 130 + i) * 3 + o];
                /* the float32 codebook and H: a few ulp from the exact level */
                CHECK_MSG(fabs(got - want) <= 1e-6 * fabs(want) + 1e-7, "[%d,%d,%d] %.9g vs %.9g",
                          l, i, o, got, want);
            }
    /* in place gives the same */
    float z[2 * 130 * 3];
    memcpy(z, w, sizeof z);
    CHECK(nd_fq3_cq_ste_leaf("stack/layers/block/self_attn/q_proj/kernel", shape, 3, z, z, 4,
                             128) == ND_FQ3_LEAF_SECOND_LAST);
    CHECK(memcmp(z, y, sizeof z) == 0);
    /* the same numbers as an embedding (reduce the last axis, 3 wide) are
     * different groups and give different values */
    CHECK(nd_fq3_cq_ste_leaf("embedding/embedding", shape + 1, 2, w, z, 4, 128) ==
          ND_FQ3_LEAF_LAST);
    CHECK(memcmp(z, y, 130 * 3 * sizeof *z) != 0);
}

/* embedding rows (last axis) and the CQ STE add: equals cq.c's quantise ->
 * dequantise up to the x + (q - x) rounding, which is exact when q and x
 * are within a factor two */
static void test_embedding_leaf(void)
{
    const int64_t shape[2] = {4, 200};
    float w[800], y[800], q[800];
    for (int i = 0; i < 800; i++)
        w[i] = (float)sin(i * 0.37) * 0.05f;
    memset(w + 200, 0, 200 * sizeof *w); /* row 1 all zero */
    CHECK(nd_fq3_cq_ste_leaf("embedding/embedding", shape, 2, w, y, 4, 128) == ND_FQ3_LEAF_LAST);
    size_t nb = cq_blob_bytes(4, 200, 4, 128);
    unsigned char *blob = malloc(nb);
    CHECK(blob && cq_quantize(w, 4, 200, 4, 128, blob) == ND_OK);
    CHECK(blob && cq_dequantize(blob, nb, 4, 200, 4, 128, q) == ND_OK);
    free(blob);
    int differ = 0;
    for (int i = 0; i < 800; i++) {
        float want = w[i] + (q[i] - w[i]);
        CHECK_MSG(same(y[i], want), "[%d] %.9g vs %.9g", i, y[i], want);
        differ += y[i] != q[i];
        if (i >= 200 && i < 400)
            CHECK(y[i] == 0);
    }
    /* the STE form is visible in some elements */
    CHECK(differ > 0);
    /* a float leaf is copied; ndim < 2 is float whatever its name */
    const int64_t s1[1] = {800};
    CHECK(nd_fq3_cq_ste_leaf("stack/final_norm/scale", shape, 2, w, y, 4, 128) ==
          ND_FQ3_LEAF_FLOAT);
    CHECK(memcmp(y, w, sizeof y) == 0);
    CHECK(nd_fq3_cq_ste_leaf("odd/kernel", s1, 1, w, y, 4, 128) == ND_FQ3_LEAF_FLOAT);
    CHECK(nd_fq3_cq_ste_leaf("embedding/embedding", shape, 2, w, y, 5, 128) == ND_EARG);
    CHECK(strstr(nd_last_error(), "embedding/embedding") != NULL);
}

static void test_leaf_rule(void)
{
    CHECK(nd_fq3_leaf_rule("stack/mhc_phi_res", 3) == ND_FQ3_LEAF_SECOND_LAST);
    CHECK(nd_fq3_leaf_rule("engrams_0/embedding", 3) == ND_FQ3_LEAF_LAST);
    CHECK(nd_fq3_leaf_rule("engram_readers_2/value_proj/kernel", 2) == ND_FQ3_LEAF_SECOND_LAST);
    CHECK(nd_fq3_leaf_rule("stack/layers/block/hadamard_mlp/w1a", 3) == ND_FQ3_LEAF_FLOAT);
    CHECK(nd_fq3_leaf_rule("stack/layers/block/self_attn/q_taps", 3) == ND_FQ3_LEAF_FLOAT);
    CHECK(nd_fq3_leaf_rule("embedding_head/probes", 3) == ND_FQ3_LEAF_FLOAT);
    CHECK(nd_fq3_leaf_rule("stack/mhc_b_res", 3) == ND_FQ3_LEAF_FLOAT);
    CHECK(nd_fq3_leaf_rule("kernel", 2) == ND_FQ3_LEAF_SECOND_LAST);
}

/* straight through: dx = dy for every element, whatever the forward did
 * (clipped, NaN row, the absmax element that set the scale, zero group) */
static void test_backward(void)
{
    const float dy[6] = {0.25f, -1, 3, 1e-30f, -0.0f, 7};
    float dx[6] = {1, 1, 1, 1, 1, 1};
    nd_fq3_ste_backward(dy, dx, 6, 0);
    expect_row("dx", dx, dy, 6);
    nd_fq3_ste_backward(dy, dx, 6, 1);
    for (int i = 0; i < 6; i++)
        CHECK(dx[i] == 2 * dy[i]);
    float d[6];
    memcpy(d, dy, sizeof d);
    nd_fq3_ste_backward(d, d, 6, 0);
    expect_row("dx in place", d, dy, 6);
    /* the chain rule with the STE: for L = sum c_i y_i^2, y = fq(x), the
     * gradient is 2 c_i y_i at the quantised point (not 2 c_i x_i, and
     * not the true derivative, 0 almost everywhere) */
    const float x[4] = {127, 0.4f, -2.6f, 10.5f};
    const float c[4] = {1, 2, 3, 4};
    float y[4], g[4], gx[4];
    CHECK(nd_fq3_fake_quant(x, y, 1, 4, 8) == ND_OK);
    for (int i = 0; i < 4; i++)
        g[i] = 2 * c[i] * y[i];
    nd_fq3_ste_backward(g, gx, 4, 0);
    const float want[4] = {254, 0, -18, 80};
    expect_row("chain", gx, want, 4);
}

static void test_validate(void)
{
    nd_fq3_numerics n;
    nd_fq3_defaults(&n);
    CHECK(nd_fq3_validate(&n) == ND_OK);
    /* 3.x's maybe_quant_kv: 0 off, 1..7 CQ at that width, >= 8 int8 */
    const int ok_kv[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 16};
    for (size_t i = 0; i < sizeof ok_kv / sizeof *ok_kv; i++) {
        n.kv_bits = ok_kv[i];
        CHECK_MSG(nd_fq3_validate(&n) == ND_OK, "kv_bits %d", ok_kv[i]);
    }
    const int bad_kv[] = {-1, -8};
    for (size_t i = 0; i < sizeof bad_kv / sizeof *bad_kv; i++) {
        n.kv_bits = bad_kv[i];
        CHECK_MSG(nd_fq3_validate(&n) == ND_EARG && strstr(nd_last_error(), "kv_bits"),
                  "kv_bits %d", bad_kv[i]);
    }
    nd_fq3_defaults(&n);
    const int bad_act[] = {-1, 0, 1, 17};
    for (size_t i = 0; i < sizeof bad_act / sizeof *bad_act; i++) {
        n.act_bits = bad_act[i];
        CHECK_MSG(nd_fq3_validate(&n) == ND_EARG && strstr(nd_last_error(), "act_bits"),
                  "act_bits %d", bad_act[i]);
    }
    nd_fq3_defaults(&n);
    n.kv_group = 48;
    CHECK(nd_fq3_validate(&n) == ND_EARG);
    nd_fq3_defaults(&n);
    n.weight_bits = 8;
    CHECK(nd_fq3_validate(&n) == ND_EARG);
    float x[2] = {1, 2}, y[2];
    CHECK(nd_fq3_fake_quant(x, y, 1, 0, 8) == ND_EARG);
    CHECK(nd_fq3_fake_quant(x, y, 1, 2, 1) == ND_EARG);
    CHECK(nd_fq3_fake_quant(x, y, 0, 2, 8) == ND_OK);
    CHECK(nd_fq3_cq_ste_rows(x, y, 1, 2, 4, 48) == ND_EARG);
}

int main(void)
{
    test_ties();
    test_scale_two();
    test_inexact_scale();
    test_rows();
    test_clip_subnormal();
    test_clip_nan_row();
    test_widths();
    test_query_kv();
    test_kv_cq();
    test_kernel_leaf();
    test_embedding_leaf();
    test_leaf_rule();
    test_backward();
    test_validate();
    return tu_finish("test_fake_quant");
}
