/* Quantised kernels (engine/qmat.h): every SIMD variant against the plain C
 * reference on random codes and activations, all widths, odd row and token
 * counts, padded inputs; the reference against the dequantise-to-float
 * product; row dequantisation against cq_dequantize. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp16.h"
#include "core/rng.h"
#include "engine/qmat.h"
#include "model/cq.h"
#include "testutil.h"

static uint64_t state = 0x9e3779b97f4a7c15ull;

static uint32_t next_u32(void)
{
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (uint32_t)(state >> 16);
}

static float uniform(void)
{
    return (float)(next_u32() & 0xffffff) / (float)0x1000000;
}

/* a random CQ blob: random code bytes, norms in [0.5, 2) */
static unsigned char *random_blob(int rows, int in, int bits, size_t *len)
{
    *len = cq_blob_bytes(rows, in, bits, ND_QGROUP);
    unsigned char *b = malloc(*len);
    size_t codes = cq_row_bytes(in, bits, ND_QGROUP) * (size_t)rows;
    for (size_t i = 0; i < codes; i++)
        b[i] = (unsigned char)next_u32();
    for (size_t i = codes; i + 1 < *len; i += 2) {
        uint16_t h = nd_float_to_half(0.5f + 1.5f * uniform());
        b[i] = (unsigned char)(h & 0xff);
        b[i + 1] = (unsigned char)(h >> 8);
    }
    return b;
}

/* max |a - b| over max |b|; infinite where a holds a NaN or infinity (an
 * output a kernel never wrote stays NaN, which fmax would skip) */
static double rel(const float *a, const float *b, size_t n)
{
    double num = 0, den = 1e-30;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            return INFINITY;
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return num / den;
}

/* a tile kernel over two tile views of the batch (the first tile alone,
 * then the rest: a partial last tile stays in its view) gives every token
 * the very values of the whole batch's call (`whole`) */
static void tile_split_case(const nd_qkernel *kern, const nd_qmat *w, const nd_qact *a, int rows,
                            const float *whole)
{
    size_t ny = (size_t)a->n * (size_t)rows;
    float *got = malloc(sizeof *got * ny);
    for (size_t i = 0; i < ny; i++)
        got[i] = NAN;
    nd_qact v0 = nd_qact_tile_view(a, 0, 1), v1 = nd_qact_tile_view(a, 1, a->tiles - 1);
    kern->gemm(w, &v0, 0, rows, got, rows);
    kern->gemm(w, &v1, 0, rows, got + (size_t)ND_QTILE * rows, rows);
    CHECK_MSG(!memcmp(got, whole, sizeof *got * ny), "%s n %d: tile views differ from the batch",
              kern->name, a->n);
    free(got);
}

static void one_case(int bits, int rows, int in, int n)
{
    size_t len;
    unsigned char *blob = random_blob(rows, in, bits, &len);
    nd_qmat w;
    CHECK(nd_qmat_init(&w, blob, len, rows, in, bits) == 0);
    float *x = malloc(sizeof *x * (size_t)n * (size_t)in);
    for (long i = 0; i < (long)n * in; i++)
        x[i] = 2.0f * uniform() - 1.0f + (i % 17 == 0 ? 4.0f : 0.0f); /* some outliers */
    nd_qact a = {0};
    CHECK(nd_qact_prepare(&a, x, n, in, nd_qmat_layout(&w)) == 0);
    size_t ny = (size_t)n * (size_t)rows;
    float *ref = malloc(sizeof *ref * ny), *got = malloc(sizeof *got * ny);
    nd_qgemm_ref(&w, &a, 0, rows, ref, rows);

    /* each variant matches the reference: integer sums are exact, only the
     * float order of the per-group scaling differs */
    for (int k = 1; k < nd_qkernel_count(); k++) {
        const nd_qkernel *kern = nd_qkernel_get(k);
        for (size_t i = 0; i < ny; i++)
            got[i] = NAN;
        /* two calls over split row ranges, as the threaded driver does */
        kern->gemm(&w, &a, 0, rows / 2, got, rows);
        kern->gemm(&w, &a, rows / 2, rows, got, rows);
        double e = rel(got, ref, ny);
        CHECK_MSG(e < 1e-5, "%s bits %d rows %d in %d n %d: rel err %.3g", kern->name, bits, rows,
                  in, n, e);
        if (kern->tiles && a.tiles >= 2) /* split by tokens, as the threaded driver may */
            tile_split_case(kern, &w, &a, rows, got);
    }
    nd_qgemm(&w, &a, got, rows);
    CHECK_MSG(rel(got, ref, ny) < 1e-5, "nd_qgemm bits %d", bits);

    /* against the float product with the dequantised weights: the int8
     * activations and int8 codebook cost well under 2% */
    float *wf = malloc(sizeof *wf * (size_t)rows * (size_t)in);
    CHECK(cq_dequantize(blob, len, rows, in, bits, ND_QGROUP, wf) == 0);
    float *fl = malloc(sizeof *fl * ny);
    for (int t = 0; t < n; t++)
        for (int r = 0; r < rows; r++) {
            double s = 0;
            for (int c = 0; c < in; c++)
                s += (double)wf[(size_t)r * in + c] * x[(size_t)t * in + c];
            fl[(size_t)t * rows + r] = (float)s;
        }
    double ef = rel(ref, fl, ny);
    /* (a lone output can sit near zero: judge the error over many) */
    CHECK_MSG(ny < 16 || ef < 0.02, "bits %d rows %d in %d: quantised vs float rel err %.3g", bits,
              rows, in, ef);
    /* one dequantised row equals cq_dequantize's */
    float *row = malloc(sizeof *row * (size_t)in);
    nd_qmat_row(&w, rows - 1, row);
    CHECK(rel(row, wf + (size_t)(rows - 1) * in, (size_t)in) < 1e-5);
    free(row);
    free(fl);
    free(wf);
    free(ref);
    free(got);
    nd_qact_free(&a);
    free(x);
    free(blob);
}

/* the SIMD activation group against the scalar one: the transforms round
 * in a different order, so a value may land one int8 step apart */
static void test_act_group(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl"))
        return;
    for (int rep = 0; rep < 50; rep++) {
        float v[ND_QGROUP], m1, m2;
        int8_t q1[ND_QGROUP], q2[ND_QGROUP];
        int32_t s1, s2;
        for (int j = 0; j < ND_QGROUP; j++)
            v[j] = rep == 0 ? 0.0f : 4.0f * uniform() - 2.0f;
        nd_qact_group_ref(v, q1, &m1, &s1);
        nd_qact_group_avx512(v, q2, &m2, &s2);
        CHECK(fabsf(m1 - m2) <= 1e-5f * m1);
        int worst = 0, total = 0;
        for (int j = 0; j < ND_QGROUP; j++) {
            int dq = abs(q1[j] - q2[j]);
            worst = dq > worst ? dq : worst;
            total += q2[j];
        }
        CHECK(worst <= 1);
        CHECK(total == s2);
    }
#endif
}

/* nd_qmat_row bit for bit against the plain definition (its AVX-512 path
 * must give the scalar transform's values exactly, not just within
 * cq_dequantize's tolerance): stored value -> level, times norm / sqrt(128),
 * unnormalised Walsh-Hadamard transform with the butterflies in order */
static void row_exact(int bits, int rows, int in)
{
    size_t len;
    unsigned char *blob = random_blob(rows, in, bits, &len);
    nd_qmat w;
    CHECK(nd_qmat_init(&w, blob, len, rows, in, bits) == 0);
    const float *lv;
    int nl = nd_qlevels(bits, &lv), sb = bits == CQ_TERNARY ? 2 : bits;
    float *got = malloc(sizeof *got * (size_t)in), *want = malloc(sizeof *want * (size_t)in);
    const float rs = (float)(1.0 / sqrt((double)ND_QGROUP));
    for (int r = 0; r < rows; r++) {
        nd_qmat_row(&w, r, got);
        for (int g = 0; g < w.ng; g++) {
            const unsigned char *p = w.codes + (size_t)r * w.row_bytes + (size_t)g * 16 * sb;
            float x[ND_QGROUP], norm = nd_qmat_norm(&w, r, g) * rs;
            for (int j = 0; j < ND_QGROUP; j++) {
                int bit = j * sb, v = (p[bit / 8] >> (bit % 8)) & ((1 << sb) - 1);
                int k = bits == CQ_TERNARY ? (v == 3 ? 0 : v + 1) : v;
                x[j] = (k < nl ? lv[k] : 0.0f) * norm;
            }
            for (int h = 1; h < ND_QGROUP; h <<= 1)
                for (int i = 0; i < ND_QGROUP; i += 2 * h)
                    for (int j = i; j < i + h; j++) {
                        float a = x[j], b = x[j + h];
                        x[j] = a + b;
                        x[j + h] = a - b;
                    }
            int n = in - g * ND_QGROUP < ND_QGROUP ? in - g * ND_QGROUP : ND_QGROUP;
            memcpy(want + (size_t)g * ND_QGROUP, x, sizeof(float) * (size_t)n);
        }
        CHECK_MSG(!memcmp(got, want, sizeof(float) * (size_t)in), "nd_qmat_row bits %d row %d",
                  bits, r);
    }
    free(got);
    free(want);
    free(blob);
}

int main(void)
{
    test_act_group();
    printf("test_qkernels: variants");
    for (int k = 0; k < nd_qkernel_count(); k++)
        printf(" %s", nd_qkernel_get(k)->name);
    printf(" (best %s)\n", nd_qkernel_best()->name);
    const int row_widths[] = {2, 4, CQ_TERNARY};
    for (int i = 0; i < 3; i++)
        row_exact(row_widths[i], 5, 200); /* a padded second group */
    /* $NEEDLE_QKERNEL forces the kernel nd_qgemm's threaded driver runs;
     * one this CPU lacks means nothing to test here (ctest: skipped) */
    const char *want = getenv("NEEDLE_QKERNEL");
    if (want && *want && strcmp(nd_qkernel_best()->name, want)) {
        printf("test_qkernels: no kernel %s on this CPU\n", want);
        return 77;
    }
    const int widths[] = {2, 3, 4, CQ_TERNARY};
    for (int i = 0; i < 4; i++) { /* the constant levels are the codec's */
        float cb[CQ_MAX_LEVELS];
        const float *lv;
        int n = cq_codebook(widths[i], ND_QGROUP, cb);
        CHECK(nd_qlevels(widths[i], &lv) == n);
        for (int k = 0; k < n; k++)
            CHECK(lv[k] == cb[k]);
    }
    for (int i = 0; i < 4; i++) {
        one_case(widths[i], 1, 128, 1);
        one_case(widths[i], 37, 200, 1); /* odd rows, a padded group */
        one_case(widths[i], 5, 384, 7);  /* batch: a tile of 4 plus 3 */
        one_case(widths[i], 130, 512, 4);
        one_case(widths[i], 13, 384, 16); /* token tiles: one */
        one_case(widths[i], 50, 256, 37); /* three tiles, a partial one */
        one_case(widths[i], 7, 2048, 64);
        one_case(widths[i], 3, 640, 16);   /* fewer rows than a tile kernel's block */
        one_case(widths[i], 9, 2176, 20);  /* 17 groups: past the tile kernels' 16 */
        one_case(widths[i], 22, 1920, 33); /* 15 groups, three tiles, rows 4k + 2 */
    }
    return tu_finish("test_qkernels");
}
