/* CQ quantisation: numpy-identical random stream and codebooks, round-trip
 * error per width against Lloyd-Max theory, packing, ties, bits maps. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/np_random.h"
#include "core/rng.h"
#include "core/status.h"
#include "model/cq.h"
#include "testutil.h"

static const char *python(void)
{
    const char *p = getenv("PYTHON");
    return p && *p ? p : NULL;
}

/* numpy's RandomState(0).randn(400000), bit for bit */
static void test_randn_vs_numpy(void)
{
    if (!python()) {
        fprintf(stderr, "test_cq: PYTHON not set, skipping the numpy comparison\n");
        return;
    }
    const size_t n = 400000;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s tests/ref/cact_ref.py randn %zu", python(), n);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    if (!p)
        return;
    double *ref = malloc(n * sizeof *ref);
    size_t got = fread(ref, sizeof *ref, n, p);
    CHECK(pclose(p) == 0);
    CHECK_MSG(got == n, "read %zu of %zu numpy samples", got, n);
    nd_np_random r;
    nd_np_random_seed(&r, 0);
    size_t bad = 0, first = n;
    for (size_t i = 0; i < got; i++) {
        double g = nd_np_random_gauss(&r);
        if (memcmp(&g, &ref[i], sizeof g)) {
            if (first == n)
                first = i;
            bad++;
        }
    }
    CHECK_MSG(bad == 0, "%zu of %zu samples differ from numpy (first at %zu)", bad, got, first);
    free(ref);
}

/* Lloyd-Max levels (float64) equal to the numpy port of upstream's
 * _lloyd_max_gaussian */
static void test_levels_vs_numpy(void)
{
    if (!python())
        return;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s tests/ref/cact_ref.py levels", python());
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    if (!p)
        return;
    for (int b = 2; b <= 4; b++) {
        const double *lv;
        int n;
        CHECK(cq_lloyd_max(b, &lv, &n) == 0 && n == 1 << b);
        for (int i = 0; i < n; i++) {
            double ref;
            CHECK(fscanf(p, "%lf", &ref) == 1);
            CHECK_MSG(ref == lv[i], "bits %d level %d: C %.17g numpy %.17g", b, i, lv[i], ref);
        }
    }
    CHECK(pclose(p) == 0);
    float cb[CQ_HEADER_CODEBOOK_LEN];
    CHECK(cq_header_codebooks(CQ_GROUP, cb) == 0);
    snprintf(cmd, sizeof cmd, "%s tests/ref/cact_ref.py codebooks", python());
    p = popen(cmd, "r");
    for (int i = 0; p && i < CQ_HEADER_CODEBOOK_LEN; i++) {
        unsigned ref;
        uint32_t u;
        memcpy(&u, &cb[i], 4);
        CHECK(fscanf(p, "%x", &ref) == 1);
        CHECK_MSG(ref == u, "codebook float %d: C %08x numpy %08x", i, u, ref);
    }
    if (p)
        CHECK(pclose(p) == 0);
}

static void test_codebook_shape(void)
{
    for (int b = 2; b <= 4; b++) {
        float cb[CQ_MAX_LEVELS];
        int n = cq_codebook(b, CQ_GROUP, cb);
        CHECK(n == 1 << b);
        for (int i = 1; i < n; i++)
            CHECK(cb[i - 1] < cb[i]);
        /* symmetric to within sampling noise */
        CHECK(fabsf(cb[0] + cb[n - 1]) < 5e-3f);
    }
    float t[CQ_MAX_LEVELS];
    CHECK(cq_codebook(CQ_TERNARY, CQ_GROUP, t) == 3);
    CHECK(t[1] == 0.0f && t[2] == (float)(1.2240064 / sqrt(128.0)) && t[0] == -t[2]);
    /* 2-bit Lloyd-Max of N(0,1) is +-0.4528, +-1.5104 */
    const double *lv;
    int n;
    CHECK(cq_lloyd_max(2, &lv, &n) == 0);
    CHECK(fabs(lv[3] - 1.5104) < 2e-3 && fabs(lv[2] - 0.4528) < 2e-3);
    CHECK(cq_codebook(7, CQ_GROUP, t) < 0);
    CHECK(cq_codebook(4, 100, t) < 0);
}

static double round_trip_mse(int bits, int64_t rows, int64_t cols, uint64_t seed)
{
    size_t n = (size_t)(rows * cols);
    float *w = malloc(n * sizeof *w), *back = malloc(n * sizeof *back);
    nd_rng r;
    nd_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        w[i] = (float)nd_rng_normal(&r) * 0.02f;
    size_t nb = cq_blob_bytes(rows, cols, bits, CQ_GROUP);
    unsigned char *blob = malloc(nb);
    CHECK(cq_quantize(w, rows, cols, bits, CQ_GROUP, blob) == 0);
    CHECK(cq_dequantize(blob, nb, rows, cols, bits, CQ_GROUP, back) == 0);
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)back[i] - w[i]) * ((double)back[i] - w[i]);
        den += (double)w[i] * w[i];
    }
    /* re-quantising the reconstruction mostly keeps the indices (the norms move) */
    unsigned char *blob2 = malloc(nb);
    CHECK(cq_quantize(back, rows, cols, bits, CQ_GROUP, blob2) == 0);
    size_t rb = cq_row_bytes(cols, bits, CQ_GROUP) * (size_t)rows, same = 0;
    for (size_t i = 0; i < rb; i++)
        same += blob[i] == blob2[i];
    CHECK_MSG(same > rb * 95 / 100, "bits %d: re-quantised indices agree on %zu of %zu bytes", bits,
              same, rb);
    free(w);
    free(back);
    free(blob);
    free(blob2);
    return num / den;
}

static void test_round_trip_error(void)
{
    /* Lloyd-Max distortion of N(0,1): 4 bits 0.009497, 3 bits 0.03454,
     * 2 bits 0.1175, 3 levels 0.1902. The rotated, normalised group
     * coordinates are close to N(0, 1/128), so CQ's relative MSE matches. */
    static const struct {
        int bits;
        double theory;
    } w[] = {{4, 0.009497}, {3, 0.03454}, {2, 0.1175}, {CQ_TERNARY, 0.1902}};
    for (size_t k = 0; k < 4; k++) {
        double mse = round_trip_mse(w[k].bits, 256, 512, 11 + k);
        fprintf(stderr, "  CQ bits %d: relative MSE %.5f (Lloyd-Max theory %.5f)\n", w[k].bits, mse,
                w[k].theory);
        CHECK_MSG(fabs(mse - w[k].theory) < 0.12 * w[k].theory, "bits %d: MSE %.5f vs %.5f",
                  w[k].bits, mse, w[k].theory);
        /* padded input axis (200 -> 256) round-trips the same way */
        double mp = round_trip_mse(w[k].bits, 64, 200, 99 + k);
        CHECK_MSG(mp < 1.3 * w[k].theory, "bits %d padded: MSE %.5f", w[k].bits, mp);
    }
}

static void test_zero_and_sizes(void)
{
    float z[3 * 130] = {0}, back[3 * 130];
    size_t nb = cq_blob_bytes(3, 130, 4, CQ_GROUP);
    CHECK(nb == 3 * (256 * 4 / 8) + 3 * 2 * 2);
    CHECK(cq_blob_bytes(3, 130, 3, CQ_GROUP) == 3 * 96 + 12);
    CHECK(cq_blob_bytes(3, 130, CQ_TERNARY, CQ_GROUP) == 3 * 64 + 12);
    CHECK(cq_blob_bytes(1LL << 50, 1LL << 50, 4, CQ_GROUP) == 0);
    unsigned char blob[1024];
    CHECK(cq_quantize(z, 3, 130, 4, CQ_GROUP, blob) == 0);
    CHECK(cq_dequantize(blob, nb, 3, 130, 4, CQ_GROUP, back) == 0);
    for (int i = 0; i < 3 * 130; i++)
        CHECK(back[i] == 0.0f);
    CHECK(cq_dequantize(blob, nb - 1, 3, 130, 4, CQ_GROUP, back) == ND_EFORMAT);
    CHECK(cq_dequantize(blob, nb, 3, 130, 6, CQ_GROUP, back) < 0);
}

static void test_packing(void)
{
    uint8_t idx[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0}, back[16];
    unsigned char p[16];
    cq_pack_indices(idx, 16, 4, p);
    CHECK(p[0] == 0x21 && p[1] == 0x43 && p[7] == 0x0f); /* low nibble = even column */
    uint8_t i3[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    cq_pack_indices(i3, 8, 3, p);
    CHECK(p[0] == 0x88 && p[1] == 0xC6 && p[2] == 0xFA); /* sum i << 3i = 0xFAC688 */
    uint8_t i2[8] = {3, 0, 1, 2, 2, 2, 2, 2};
    cq_pack_indices(i2, 8, 2, p);
    CHECK(p[0] == (3 | 0 << 2 | 1 << 4 | 2 << 6) && p[1] == 0xAA);
    uint8_t it[8] = {0, 1, 2, 0, 1, 1, 1, 1};
    cq_pack_indices(it, 8, CQ_TERNARY, p); /* crumbs 3, 0, 1 */
    CHECK(p[0] == (3 | 0 << 2 | 1 << 4 | 3 << 6) && p[1] == 0);
    cq_unpack_indices(p, 8, CQ_TERNARY, back);
    CHECK(!memcmp(back, it, 8));
    nd_rng r;
    nd_rng_seed(&r, 5);
    for (int bits = 2; bits <= 5; bits++) {
        uint8_t a[256], b[256];
        unsigned char pk[256];
        int lv = bits == CQ_TERNARY ? 3 : 1 << bits;
        for (int i = 0; i < 256; i++)
            a[i] = (uint8_t)nd_rng_below(&r, (uint64_t)lv);
        cq_pack_indices(a, 256, bits, pk);
        cq_unpack_indices(pk, 256, bits, b);
        CHECK_MSG(!memcmp(a, b, 256), "bits %d pack round trip", bits);
    }
}

static void test_nearest(void)
{
    const float cb2[2] = {0.0f, 1.0f}, sym[2] = {-1.0f, 1.0f};
    CHECK(cq_nearest_index(0.5f, cb2, 2) == 0); /* tie -> lower */
    CHECK(cq_nearest_index(0.0f, sym, 2) == 0);
    CHECK(cq_nearest_index(0.50001f, cb2, 2) == 1);
    CHECK(cq_nearest_index(-5.0f, cb2, 2) == 0);
    CHECK(cq_nearest_index(5.0f, cb2, 2) == 1);
    CHECK(cq_nearest_index(NAN, cb2, 2) == 1);
    float cb[CQ_MAX_LEVELS];
    int n = cq_codebook(4, CQ_GROUP, cb);
    for (int k = 0; k + 1 < n; k++) {
        CHECK(cq_nearest_index(cb[k], cb, n) == k);
        /* a float32 exactly half-way (when representable) goes low */
        float mid = cb[k] + (cb[k + 1] - cb[k]) / 2;
        if (mid - cb[k] == cb[k + 1] - mid)
            CHECK(cq_nearest_index(mid, cb, n) == k);
        CHECK(cq_nearest_index(nextafterf(mid, 1.0f), cb, n) >= k);
    }
}

static void test_bits_map(void)
{
    char c[128];
    static const char *names[][2] = {
        {"layer03.q_proj", "attn.q_proj"},
        {"stack/layers/block/self_attn/q_proj/kernel", "attn.q_proj"},
        {"engrams_0/embedding", "engram0.tables"},
        {"engram1.tables", "engram1.tables"},
        {"engram0.key_proj", "engram0.key_proj"},
        {"embedding/embedding", "embedding"},
        {"mtp_block/self_attn/k_proj/kernel", "mtp.k_proj"},
        {"stack/mhc_phi_pre", "mhc_phi_pre"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        cq_canonical_name(names[i][0], c, sizeof c);
        CHECK_MSG(!strcmp(c, names[i][1]), "%s -> %s, expected %s", names[i][0], c, names[i][1]);
    }
    cq_bits_map m;
    CHECK(cq_bits_map_parse("attn=3, attn.q_proj=2,engrams_0/embedding=1.58,default=4", &m) == 0);
    CHECK(cq_bits_for(&m, "layer00.q_proj") == 2);
    CHECK(cq_bits_for(&m, "layer07.k_proj") == 3);
    CHECK(cq_bits_for(&m, "engram0.tables") == CQ_TERNARY);
    CHECK(cq_bits_for(&m, "engram0.key_proj") == 4);
    CHECK(cq_bits_for(&m, "embedding") == 4);
    cq_bits_map_free(&m);
    CHECK(cq_bits_map_parse("attn=3", &m) == ND_EARG);           /* no default */
    CHECK(cq_bits_map_parse("attn=5,default=4", &m) == ND_EARG); /* bad width */
    CHECK(cq_bits_map_parse("attn,default=4", &m) == ND_EARG);
    CHECK(cq_bits_map_parse("default=x", &m) == ND_EARG);
    CHECK(cq_bits_map_parse(",default=2,", &m) == 0 && m.default_bits == 2);
    cq_bits_map_free(&m);
}

int main(void)
{
    test_codebook_shape();
    test_randn_vs_numpy();
    test_levels_vs_numpy();
    test_round_trip_error();
    test_zero_and_sizes();
    test_packing();
    test_nearest();
    test_bits_map();
    return tu_finish("test_cq");
}
