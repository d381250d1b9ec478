/* Test helper for tests/test_fake_quant_numpy.py (src/model/fake_quant.c on
 * float32 files written by numpy):
 *
 *   fake_quant_tool fq BITS ROWS DIM IN OUT        nd_fq3_fake_quant
 *   fake_quant_tool act ACT_BITS ROWS DIM IN OUT    nd_fq3_act
 *   fake_quant_tool query ACT_BITS ROWS HD IN OUT   nd_fq3_query
 *   fake_quant_tool kv KV_BITS GROUP ROWS HD IN OUT nd_fq3_kv
 *   fake_quant_tool leaf PATH BITS GROUP IN OUT D0 [D1 ...]
 *                                                  nd_fq3_cq_ste_leaf; prints the rule
 *   fake_quant_tool rule PATH NDIM                  prints nd_fq3_leaf_rule
 *
 * IN and OUT are raw little-endian float32. Errors print
 * "ERROR <ND_NAME> <message>" and exit 3; usage errors exit 2. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "model/fake_quant.h"

static int fail(int rc)
{
    printf("ERROR %s %s\n", nd_status_name(rc), nd_last_error());
    return 3;
}

static float *load(const char *path, size_t n)
{
    FILE *f = fopen(path, "rb");
    float *x = malloc(n * sizeof *x + 1);
    size_t got = f && x ? fread(x, sizeof *x, n, f) : 0;
    if (f)
        fclose(f);
    if (got != n) {
        fprintf(stderr, "fake_quant_tool: %s: read %zu of %zu floats\n", path, got, n);
        free(x);
        return NULL;
    }
    return x;
}

static int save(const char *path, const float *y, size_t n)
{
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(y, sizeof *y, n, f) == n;
    if (f && fclose(f))
        ok = 0;
    if (!ok)
        fprintf(stderr, "fake_quant_tool: %s: write failed\n", path);
    return ok ? 0 : 1;
}

static long long num(const char *s)
{
    return strtoll(s, NULL, 10);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    const char *op = argv[1];
    nd_fq3_numerics nq;
    nd_fq3_defaults(&nq);
    if (!strcmp(op, "rule") && argc == 4) {
        printf("%d\n", nd_fq3_leaf_rule(argv[2], (int)num(argv[3])));
        return 0;
    }
    int64_t rows, dim;
    const char *in, *out;
    if (!strcmp(op, "leaf") && argc >= 8) {
        int ndim = argc - 7;
        int64_t shape[8];
        size_t n = 1;
        if (ndim > 8)
            return 2;
        for (int k = 0; k < ndim; k++) {
            shape[k] = num(argv[7 + k]);
            n *= (size_t)shape[k];
        }
        float *w = load(argv[5], n), *y = malloc(n * sizeof *y + 1);
        int rc = ND_ENOMEM, e = 1;
        if (w && y)
            rc = nd_fq3_cq_ste_leaf(argv[2], shape, ndim, w, y, (int)num(argv[3]),
                                    (int)num(argv[4]));
        if (rc < 0) {
            e = fail(rc);
        } else {
            printf("%d\n", rc);
            e = save(argv[6], y, n);
        }
        free(w);
        free(y);
        return e;
    }
    int rc;
    float *x = NULL, *y = NULL;
    if ((!strcmp(op, "fq") || !strcmp(op, "act") || !strcmp(op, "query")) && argc == 7) {
        rows = num(argv[3]);
        dim = num(argv[4]);
        in = argv[5];
        out = argv[6];
    } else if (!strcmp(op, "kv") && argc == 8) {
        nq.kv_bits = (int)num(argv[2]);
        nq.kv_group = (int)num(argv[3]);
        rows = num(argv[4]);
        dim = num(argv[5]);
        in = argv[6];
        out = argv[7];
    } else {
        fprintf(stderr, "fake_quant_tool: bad arguments\n");
        return 2;
    }
    size_t n = (size_t)(rows * dim);
    x = load(in, n);
    y = malloc(n * sizeof *y + 1);
    if (!x || !y) {
        free(x);
        free(y);
        return 1;
    }
    if (!strcmp(op, "fq")) {
        rc = nd_fq3_fake_quant(x, y, rows, dim, (int)num(argv[2]));
    } else if (!strcmp(op, "kv")) {
        rc = nd_fq3_validate(&nq);
        if (!rc)
            rc = nd_fq3_kv(&nq, x, y, rows, dim);
    } else {
        nq.act_bits = (int)num(argv[2]);
        rc = strcmp(op, "query") || nq.act_bits ? nd_fq3_validate(&nq) : ND_OK;
        if (!rc)
            rc = !strcmp(op, "act") ? nd_fq3_act(&nq, x, y, rows, dim)
                                    : nd_fq3_query(&nq, x, y, rows, dim);
    }
    int e = rc ? fail(rc) : save(out, y, n);
    free(x);
    free(y);
    return e;
}
