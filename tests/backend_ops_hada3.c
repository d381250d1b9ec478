/* Conformance cases of Needle 3's Hadamard MLP ops (hada3_mix,
 * hada3_mix_backward, softmax_rows, softmax_rows_backward; see
 * test_backend_ops.c). The offset tables are the ones model/hada3.c
 * builds: rows padded from d to n features, the blocked layouts I
 * (i, r, j) and J (j, r, i) of n = ba * bb features, a permutation, and
 * the [:d] of the output (negative offsets). */
#include <stdlib.h>

#include "backend_ops.h"

#define F(k) ((float *)p[k])
#define CF(k) ((const float *)p[k])
#define CI32(k) ((const int32_t *)p[k])

#define TOL_EW 1e-5
#define TOL_RED 1e-4

/* i[]: N, cols, drs, srs, rank (0: no cond), silu, bias, [backward: dcond, dscale, dbias, src] */
static void is_mix(const nd_backend *be, const bo_case *c, void *const *p)
{
    int rank = (int)c->i[4];
    be->hada3_mix(be, F(0), CI32(1), (int)c->i[2], CF(2), CI32(3), (int)c->i[3], CF(4),
                  rank ? CF(5) : NULL, rank ? CF(6) : NULL, rank, c->i[6] ? CF(7) : NULL,
                  (int)c->i[5], c->i[0], (int)c->i[1]);
}

static void is_mix_bwd(const nd_backend *be, const bo_case *c, void *const *p)
{
    int rank = (int)c->i[4];
    be->hada3_mix_backward(be, F(8), c->i[7] ? F(9) : NULL, c->i[8] ? F(10) : NULL,
                           c->i[9] ? F(11) : NULL, CF(12), CI32(1), (int)c->i[2],
                           c->i[10] ? CF(2) : NULL, CI32(3), (int)c->i[3], CF(4),
                           rank ? CF(5) : NULL, rank ? CF(6) : NULL, rank, c->i[6] ? CF(7) : NULL,
                           (int)c->i[5], c->i[0], (int)c->i[1]);
}

static void is_smx(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->softmax_rows(be, F(0), c->i[0], (int)c->i[1]);
}

static void is_smx_bwd(const nd_backend *be, const bo_case *c, void *const *p)
{
    be->softmax_rows_backward(be, F(0), CF(1), CF(2), c->i[0], (int)c->i[1]);
}

/* offsets of n features of N rows: 0 row-major of width d (padding -1), 1
 * layout I, 2 layout J; perm: through a random permutation */
static void offsets(int32_t *o, int kind, int d, int ba, int bb, long N, int perm, int *rs)
{
    int n = ba * bb;
    for (int m = 0; m < n; m++) {
        int i = m / bb, j = m % bb;
        o[m] = kind == 0   ? (m < d ? m : -1)
               : kind == 1 ? (int32_t)(i * N * bb + j)
                           : (int32_t)(j * N * ba + i);
    }
    *rs = kind == 0 ? d : kind == 1 ? bb : ba;
    if (perm)
        for (int m = n - 1; m > 0; m--) {
            int k = (int)nd_rng_below(&bo_rng, (uint64_t)m + 1), t = o[m];
            o[m] = o[k];
            o[k] = t;
        }
}

static void cases_mix(int backward)
{
    /* N, d, ba, bb, src kind, dst kind, perm, cond, silu+bias */
    static const int cs[][9] = {{7, 12, 4, 4, 0, 1, 0, 0, 0},     {37, 24, 4, 8, 0, 2, 0, 0, 0},
                                {37, 24, 4, 8, 1, 1, 1, 1, 1},    {130, 100, 8, 16, 1, 2, 1, 1, 1},
                                {1, 3, 2, 2, 1, 1, 1, 1, 1},      {130, 100, 8, 16, 1, 0, 0, 0, 0},
                                {7, 16, 4, 4, 1, 0, 1, 0, 0},     {300, 768, 32, 32, 1, 2, 1, 1, 1},
                                {300, 768, 32, 32, 0, 2, 0, 0, 0}};
    for (size_t k = 0; k < sizeof cs / sizeof *cs; k++) {
        const int *s = cs[k];
        long N = s[0];
        int d = s[1], ba = s[2], bb = s[3], n = ba * bb;
        int32_t *so = malloc(sizeof(int32_t) * (size_t)n), *dso = malloc(sizeof(int32_t) * n);
        if (!so || !dso)
            exit(2);
        int srs, drs;
        offsets(so, s[4], d, ba, bb, N, s[6], &srs);
        offsets(dso, s[5], d, ba, bb, N, 0, &drs);
        long src_n = s[4] ? N * n : N * d, dst_n = s[5] ? N * n : N * d;
        for (int variant = 0; variant < (backward ? 2 : 1); variant++) {
            bo_case *c = bo_new(backward ? "hada3_mix_backward" : "hada3_mix",
                                backward ? TOL_RED : TOL_EW, backward ? is_mix_bwd : is_mix);
            bo_fout(c, backward ? 1 : dst_n, 1.0); /* 0: dst */
            bo_iin(c, n, dso);                     /* 1 */
            bo_fin(c, src_n, 1.0);                 /* 2: src */
            bo_iin(c, n, so);                      /* 3 */
            bo_fin(c, n, 1.0);                     /* 4: scale */
            bo_fin(c, N * 8, 0.2);                 /* 5: p */
            bo_fin(c, 8L * n, 0.5);                /* 6: cu */
            bo_fin(c, n, 0.5);                     /* 7: bias */
            /* the offset tables may also lie in the backend's memory (ops.def):
             * every third case gives them to the target that way */
            if (k % 3 == 2)
                c->b[1].host = c->b[3].host = 0;
            if (backward) {
                bo_fout(c, src_n, 1.0); /* 8: dsrc */
                bo_fout(c, N * n, 1.0); /* 9: dcond */
                bo_fout(c, n, 1.0);     /* 10: dscale */
                bo_fout(c, n, 1.0);     /* 11: dbias */
                bo_fin(c, dst_n, 1.0);  /* 12: ddst */
            }
            c->i[0] = N;
            c->i[1] = n;
            c->i[2] = drs;
            c->i[3] = srs;
            c->i[4] = s[7] ? 8 : 0;
            c->i[5] = s[8];
            c->i[6] = s[8];
            /* variant 1: frozen (no parameter gradients, no src unless silu) */
            c->i[7] = !variant && s[7];
            c->i[8] = !variant;
            c->i[9] = !variant && s[8];
            c->i[10] = !variant || s[8];
            bo_run(c);
        }
        free(so);
        free(dso);
    }
}

static void cases_softmax(int backward)
{
    static const int cs[][2] = {{1, 8}, {37, 8}, {130, 5}, {2048, 8}, {7, 1}};
    for (size_t k = 0; k < sizeof cs / sizeof *cs; k++) {
        long N = cs[k][0];
        int K = cs[k][1];
        bo_case *c = bo_new(backward ? "softmax_rows_backward" : "softmax_rows", TOL_EW,
                            backward ? is_smx_bwd : is_smx);
        bo_fout(c, N * K, 3.0);
        if (backward) {
            bo_fin(c, N * K, 1.0);
            bo_fin(c, N * K, 0.3);
        }
        c->i[0] = N;
        c->i[1] = K;
        bo_run(c);
    }
}

void bo_cases_hada3(void)
{
    cases_mix(0);
    cases_softmax(0);
    cases_mix(1);
    cases_softmax(1);
}
