/* Needle 3's probe heads (src/model/probe3.c).
 *
 *   test_probe3              properties: the pooled result does not depend
 *                            on the order or chunking of the cells; pad
 *                            tokens are left out; no tokens and bad sizes
 *                            are errors
 *   test_probe3 dump SEED ROWS K Q D OUT T NORM BIAS
 *                            random head + cells + keep, and the head's
 *                            output, as text on stdout for
 *                            tests/test_probe3_numpy.py (which computes
 *                            the same from upstream's probe_pool math) */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "model/probe3.h"
#include "testutil.h"

typedef struct {
    san_probe3_head h;
    float *probes, *gain, *query, *row_bias, *proj, *bias, *cells; /* cells [T, rows, d] */
    uint8_t *keep;
    int T;
} fixture;

static float urand(unsigned long long *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(*s >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

static float *rand_array(unsigned long long *s, size_t n, float scale, float offset)
{
    float *a = malloc(n * sizeof *a);
    for (size_t i = 0; a && i < n; i++)
        a[i] = offset + scale * urand(s);
    return a;
}

static void fixture_make(fixture *f, unsigned long long seed, int rows, int k, int q, int d,
                         int out, int T, int norm, int bias)
{
    unsigned long long s = seed * 2654435761ULL + 1;
    memset(f, 0, sizeof *f);
    f->T = T;
    f->probes = rand_array(&s, (size_t)rows * k * d, 1.0f, 0.0f);
    f->gain = rand_array(&s, (size_t)rows * k, 0.5f, 1.0f);
    f->query = rand_array(&s, (size_t)q * d, 1.0f, 0.0f);
    f->row_bias = rand_array(&s, (size_t)q * rows * k, 0.5f, 0.0f);
    f->proj = rand_array(&s, (size_t)q * d * out, 0.2f, 0.0f);
    f->bias = bias ? rand_array(&s, (size_t)out, 0.5f, 0.0f) : NULL;
    f->cells = rand_array(&s, (size_t)T * rows * d, 2.0f, 0.0f);
    f->keep = malloc((size_t)T);
    for (int t = 0; t < T; t++) /* about one token in five is a pad, never the first */
        f->keep[t] = t == 0 || urand(&s) > -0.6f;
    f->h = (san_probe3_head){rows,    k,        q,           d,       out,     f->probes,
                             f->gain, f->query, f->row_bias, f->proj, f->bias, norm};
}

static void fixture_free(fixture *f)
{
    free(f->probes);
    free(f->gain);
    free(f->query);
    free(f->row_bias);
    free(f->proj);
    free(f->bias);
    free(f->cells);
    free(f->keep);
}

/* The cells of row `row`, tokens t0..t0+n, packed [n, d] into buf. */
static const float *row_cells(const fixture *f, int row, int t0, int n, float *buf)
{
    int d = f->h.d;
    for (int i = 0; i < n; i++)
        memcpy(buf + (size_t)i * d, f->cells + ((size_t)(t0 + i) * f->h.rows + row) * d,
               (size_t)d * sizeof *buf);
    return buf;
}

/* The head over the fixture: chunks of `chunk` tokens, rows in forward
 * order (reverse: last row first, chunks last first). */
static int run_head(const fixture *f, int chunk, int reverse, const uint8_t *keep, float *out)
{
    san_probe3_pool p;
    int rc = san_probe3_begin(&p, &f->h);
    if (rc)
        return rc;
    float *buf = malloc((size_t)chunk * f->h.d * sizeof *buf);
    int nchunks = (f->T + chunk - 1) / chunk;
    for (int ci = 0; ci < nchunks; ci++) {
        int c = reverse ? nchunks - 1 - ci : ci;
        int t0 = c * chunk, n = f->T - t0 < chunk ? f->T - t0 : chunk;
        for (int ri = 0; ri < f->h.rows; ri++) {
            int r = reverse ? f->h.rows - 1 - ri : ri;
            san_probe3_add(&p, r, row_cells(f, r, t0, n, buf), n, keep ? keep + t0 : NULL);
        }
    }
    free(buf);
    return san_probe3_finish(&p, out);
}

static void test_properties(void)
{
    fixture f;
    fixture_make(&f, 7, 5, 3, 4, 16, 6, 37, 0, 1);
    float a[6], b[6], c[6];
    CHECK(run_head(&f, 37, 0, f.keep, a) == ND_OK);
    CHECK(run_head(&f, 5, 1, f.keep, b) == ND_OK);
    CHECK(run_head(&f, 1, 0, f.keep, c) == ND_OK);
    CHECK_MSG(tu_rel_err(b, a, 6, 1e-6) < 1e-6, "chunked in reverse: %g",
              tu_rel_err(b, a, 6, 1e-6));
    CHECK_MSG(tu_rel_err(c, a, 6, 1e-6) < 1e-6, "one token at a time: %g",
              tu_rel_err(c, a, 6, 1e-6));
    /* a pad token's cells do not count: changing them changes nothing */
    int pad = -1;
    for (int t = 0; t < f.T && pad < 0; t++)
        if (!f.keep[t])
            pad = t;
    CHECK(pad > 0);
    for (int j = 0; pad > 0 && j < f.h.rows * f.h.d; j++)
        f.cells[(size_t)pad * f.h.rows * f.h.d + j] += 3.0f;
    CHECK(run_head(&f, 8, 0, f.keep, b) == ND_OK);
    CHECK(tu_rel_err(b, a, 6, 1e-6) < 1e-6);
    /* ... and without the mask they do */
    CHECK(run_head(&f, 8, 0, NULL, c) == ND_OK);
    CHECK(tu_rel_err(c, a, 6, 1e-6) > 1e-4);
    /* every token a pad */
    uint8_t *none = calloc((size_t)f.T, 1);
    CHECK(run_head(&f, 8, 0, none, c) == ND_EARG);
    free(none);
    fixture_free(&f);

    /* the embedding head's output is unit length */
    fixture_make(&f, 9, 3, 2, 2, 8, 12, 9, 1, 0);
    float e[12];
    CHECK(run_head(&f, 4, 0, f.keep, e) == ND_OK);
    double ss = 0;
    for (int i = 0; i < 12; i++)
        ss += (double)e[i] * e[i];
    CHECK_MSG(fabs(ss - 1.0) < 1e-5, "|e|^2 = %g", ss);
    f.h.k = 0;
    san_probe3_pool p;
    CHECK(san_probe3_begin(&p, &f.h) == ND_ESHAPE);
    fixture_free(&f);
}

static void print_array(const char *name, const float *a, size_t n)
{
    printf("%s", name);
    for (size_t i = 0; i < n; i++)
        printf(" %.9g", a[i]);
    printf("\n");
}

static int mode_dump(char **v)
{
    int rows = atoi(v[1]), k = atoi(v[2]), q = atoi(v[3]), d = atoi(v[4]), out = atoi(v[5]);
    int T = atoi(v[6]), norm = atoi(v[7]), bias = atoi(v[8]);
    fixture f;
    fixture_make(&f, strtoull(v[0], NULL, 10), rows, k, q, d, out, T, norm, bias);
    float *o = malloc((size_t)out * sizeof *o);
    int rc = run_head(&f, 3, 0, f.keep, o);
    if (rc) {
        fprintf(stderr, "test_probe3: %s\n", nd_last_error());
        return 1;
    }
    printf("sizes %d %d %d %d %d %d %d %d\n", rows, k, q, d, out, T, norm, bias);
    print_array("probes", f.probes, (size_t)rows * k * d);
    print_array("gain", f.gain, (size_t)rows * k);
    print_array("query", f.query, (size_t)q * d);
    print_array("row_bias", f.row_bias, (size_t)q * rows * k);
    print_array("proj", f.proj, (size_t)q * d * out);
    if (bias)
        print_array("bias", f.bias, (size_t)out);
    print_array("cells", f.cells, (size_t)T * rows * d);
    printf("keep");
    for (int t = 0; t < T; t++)
        printf(" %d", f.keep[t]);
    printf("\n");
    print_array("out", o, (size_t)out);
    free(o);
    fixture_free(&f);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 11 && !strcmp(argv[1], "dump"))
        return mode_dump(argv + 2);
    if (argc != 1) {
        fprintf(stderr, "usage: test_probe3 [dump SEED ROWS K Q D OUT T NORM BIAS]\n");
        return 2;
    }
    test_properties();
    return tu_finish("test_probe3");
}
