#define _POSIX_C_SOURCE 200809L
#include "model/cq.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp16.h"
#include "core/np_random.h"
#include "core/status.h"
#include "core/threadpool.h"

/* Bit-level agreement with numpy depends on evaluating each product and
 * sum separately, in the order written. */
#pragma STDC FP_CONTRACT OFF

#define LM_SAMPLES 400000
#define LM_ITERS 200
#define NP_BUFSIZE 8192 /* numpy's ufunc buffer: reductions run in blocks */
#define NP_PW_BLOCK 128 /* numpy's pairwise-summation leaf size */

static const double ternary_c = 1.2240064;

static int group_valid(int group);

/* ------------------------------------------------------------------ */
/* numpy summation order                                                */

/* numpy's pairwise_sum_DOUBLE */
static double np_pairwise_f64(const double *a, size_t n)
{
    if (n < 8) {
        double res = 0.0;
        for (size_t i = 0; i < n; i++)
            res += a[i];
        return res;
    }
    if (n <= NP_PW_BLOCK) {
        double r[8];
        size_t i;
        for (int j = 0; j < 8; j++)
            r[j] = a[j];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++)
                r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++)
            res += a[i];
        return res;
    }
    size_t n2 = n / 2;
    n2 -= n2 % 8;
    return np_pairwise_f64(a, n2) + np_pairwise_f64(a + n2, n - n2);
}

/* np.add.reduce of a contiguous float64 vector: pairwise within buffer
 * blocks of 8192, blocks added in order onto 0. */
static double np_sum_f64(const double *a, size_t n)
{
    double s = 0.0;
    for (size_t lo = 0; lo < n; lo += NP_BUFSIZE)
        s += np_pairwise_f64(a + lo, n - lo < NP_BUFSIZE ? n - lo : NP_BUFSIZE);
    return s;
}

/* numpy's pairwise_sum_FLOAT (float32 accumulation) */
static float np_pairwise_f32(const float *a, size_t n)
{
    if (n < 8) {
        float res = 0.0f;
        for (size_t i = 0; i < n; i++)
            res += a[i];
        return res;
    }
    if (n <= NP_PW_BLOCK) {
        float r[8];
        size_t i;
        for (int j = 0; j < 8; j++)
            r[j] = a[j];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++)
                r[j] += a[i + j];
        float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++)
            res += a[i];
        return res;
    }
    size_t n2 = n / 2;
    n2 -= n2 % 8;
    return np_pairwise_f32(a, n2) + np_pairwise_f32(a + n2, n - n2);
}

/* ------------------------------------------------------------------ */
/* Lloyd-Max codebooks                                                  */

static pthread_once_t lm_once = PTHREAD_ONCE_INIT;
static int lm_status;
static double lm_levels[3][CQ_MAX_LEVELS];

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* number of x[i] <= v in sorted x (searchsorted side='right') */
static size_t count_le(const double *x, size_t n, double v)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (x[mid] <= v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int lloyd_one(const double *x, size_t n, int levels, double *c)
{
    double bnd[CQ_KV_MAX_LEVELS];
    for (int k = 0; k < levels; k++)
        c[k] = x[(size_t)(((double)k + 0.5) / (double)levels * (double)n)];
    for (int it = 0; it < LM_ITERS; it++) {
        for (int k = 0; k + 1 < levels; k++)
            bnd[k] = (c[k] + c[k + 1]) / 2.0;
        for (int k = 0; k + 2 < levels; k++)
            if (!(bnd[k] <= bnd[k + 1]))
                return ND_ENUMERIC; /* never happens for sorted samples */
        /* upstream: idx = searchsorted(bnd, x) (cell k holds
         * bnd[k-1] < x <= bnd[k]), then c[k] = x[idx == k].mean(); with x
         * sorted each cell is a contiguous run */
        size_t start = 0;
        for (int k = 0; k < levels; k++) {
            size_t end = k + 1 < levels ? count_le(x, n, bnd[k]) : n;
            if (end > start)
                c[k] = np_sum_f64(x + start, end - start) / (double)(end - start);
            if (end > start)
                start = end;
        }
    }
    qsort(c, (size_t)levels, sizeof *c, cmp_double);
    return ND_OK;
}

/* the sorted samples of every width */
static double *lm_samples(void)
{
    double *x = malloc(LM_SAMPLES * sizeof *x);
    if (!x)
        return NULL;
    nd_np_random r;
    nd_np_random_seed(&r, 0);
    for (size_t i = 0; i < LM_SAMPLES; i++)
        x[i] = nd_np_random_gauss(&r);
    qsort(x, LM_SAMPLES, sizeof *x, cmp_double);
    return x;
}

static void lm_compute(void)
{
    double *x = lm_samples();
    if (!x) {
        lm_status = ND_ENOMEM;
        return;
    }
    for (int b = 2; b <= 4 && !lm_status; b++)
        lm_status = lloyd_one(x, LM_SAMPLES, 1 << b, lm_levels[b - 2]);
    free(x);
}

int cq_lloyd_max(int bits, const double **levels, int *n_levels)
{
    if (bits < 2 || bits > 4)
        return nd_error(ND_EARG, "Lloyd-Max codebooks exist for 2, 3 and 4 bits, not %d", bits);
    pthread_once(&lm_once, lm_compute);
    if (lm_status)
        return nd_error(lm_status, "could not derive the Lloyd-Max codebooks");
    *levels = lm_levels[bits - 2];
    *n_levels = 1 << bits;
    return ND_OK;
}

/* KV widths 1 and 5..7 (3.x maybe_quant_kv at KV_BITS < 8): derived on
 * first use only (the 128-level run takes a moment) */
static pthread_once_t lm_wide_once = PTHREAD_ONCE_INIT;
static int lm_wide_status;
static double lm_wide[3][CQ_KV_MAX_LEVELS];

static void lm_wide_compute(void)
{
    double *x = lm_samples();
    if (!x) {
        lm_wide_status = ND_ENOMEM;
        return;
    }
    for (int b = 5; b <= 7 && !lm_wide_status; b++)
        lm_wide_status = lloyd_one(x, LM_SAMPLES, 1 << b, lm_wide[b - 5]);
    free(x);
}

int cq_kv_codebook(int bits, int group, float *out)
{
    if (bits < 1 || bits > 7)
        return nd_error(ND_EARG, "CQ KV widths are 1 to 7 bits, not %d", bits);
    if (!group_valid(group))
        return nd_error(ND_EARG, "CQ group size must be a power of two in [8, 4096], got %d",
                        group);
    double s = sqrt((double)group);
    if (bits == 1) {                              /* upstream's closed form: +-E|N(0,1)| */
        double c = sqrt(2.0 / 3.141592653589793); /* math.pi */
        out[0] = (float)(-c / s);
        out[1] = (float)(c / s);
        return 2;
    }
    const double *lv = NULL;
    int n = 1 << bits;
    if (bits <= 4) {
        int rc = cq_lloyd_max(bits, &lv, &n);
        if (rc)
            return rc;
    } else {
        pthread_once(&lm_wide_once, lm_wide_compute);
        if (lm_wide_status)
            return nd_error(lm_wide_status, "could not derive the Lloyd-Max codebooks");
        lv = lm_wide[bits - 5];
    }
    for (int i = 0; i < n; i++)
        out[i] = (float)(lv[i] / s);
    return n;
}

static int group_valid(int group)
{
    return group >= 8 && group <= 4096 && (group & (group - 1)) == 0;
}

int cq_codebook(int bits, int group, float *out)
{
    if (!group_valid(group))
        return nd_error(ND_EARG, "CQ group size must be a power of two in [8, 4096], got %d",
                        group);
    double s = sqrt((double)group);
    if (bits == CQ_TERNARY) {
        out[0] = (float)(-ternary_c / s);
        out[1] = (float)(0.0 / s);
        out[2] = (float)(ternary_c / s);
        return 3;
    }
    /* (initialised: inlined here, gcc cannot see that a nonzero rc is the
     * only way out without them) */
    const double *lv = NULL;
    int n = 0, rc = cq_lloyd_max(bits, &lv, &n);
    if (rc)
        return rc;
    for (int i = 0; i < n; i++)
        out[i] = (float)(lv[i] / s);
    return n;
}

int cq_header_codebooks(int group, float out[CQ_HEADER_CODEBOOK_LEN])
{
    int o = 0;
    for (int b = 2; b <= 4; b++) {
        int n = cq_codebook(b, group, out + o);
        if (n < 0)
            return n;
        o += n;
    }
    return ND_OK;
}

int cq_nearest_index(float v, const float *cb, int n)
{
    int pos = 0;
    if (isnan(v))
        pos = n; /* numpy sorts NaN last */
    else
        while (pos < n && cb[pos] < v)
            pos++;
    if (pos < 1)
        pos = 1;
    if (pos > n - 1)
        pos = n - 1;
    float dl = fabsf(v - cb[pos - 1]), dr = fabsf(v - cb[pos]);
    return dl <= dr ? pos - 1 : pos;
}

/* ------------------------------------------------------------------ */
/* sizes and packing                                                    */

int cq_bits_valid(int bits)
{
    return bits == 2 || bits == 3 || bits == 4 || bits == CQ_TERNARY;
}

static int stored_bits(int bits)
{
    return bits == CQ_TERNARY ? 2 : bits;
}

int64_t cq_in_pad(int64_t in_dim, int group)
{
    return (in_dim + group - 1) / group * group;
}

size_t cq_row_bytes(int64_t in_dim, int bits, int group)
{
    return (size_t)cq_in_pad(in_dim, group) * (size_t)stored_bits(bits) / 8;
}

size_t cq_blob_bytes(int64_t out, int64_t in_dim, int bits, int group)
{
    if (out < 0 || in_dim < 0 || !group_valid(group) || !cq_bits_valid(bits))
        return 0;
    uint64_t in_pad = (uint64_t)cq_in_pad(in_dim, group);
    if (in_pad > (1ull << 40) || (uint64_t)out > (1ull << 40))
        return 0;
    uint64_t row = in_pad * (uint64_t)stored_bits(bits) / 8 + in_pad / (uint64_t)group * 2;
    if (row && (uint64_t)out > UINT64_MAX / row)
        return 0;
    uint64_t total = row * (uint64_t)out;
    if (total > (uint64_t)SIZE_MAX)
        return 0;
    return (size_t)total;
}

void cq_pack_indices(const uint8_t *idx, size_t n, int bits, unsigned char *out)
{
    int sb = stored_bits(bits);
    memset(out, 0, n * (size_t)sb / 8);
    for (size_t k = 0; k < n; k++) {
        unsigned v = idx[k];
        if (bits == CQ_TERNARY)
            v = v == 0 ? 3u : v - 1u;
        size_t bit = k * (size_t)sb;
        for (int b = 0; b < sb; b++, bit++)
            if (v >> b & 1u)
                out[bit >> 3] |= (unsigned char)(1u << (bit & 7));
    }
}

void cq_unpack_indices(const unsigned char *in, size_t n, int bits, uint8_t *idx)
{
    int sb = stored_bits(bits);
    for (size_t k = 0; k < n; k++) {
        unsigned v = 0;
        size_t bit = k * (size_t)sb;
        for (int b = 0; b < sb; b++, bit++)
            v |= (unsigned)(in[bit >> 3] >> (bit & 7) & 1u) << b;
        if (bits == CQ_TERNARY)
            v = v == 3 ? 0u : v + 1u;
        idx[k] = (uint8_t)v;
    }
}

/* ------------------------------------------------------------------ */
/* quantise / dequantise                                               */

static int parity(unsigned v)
{
    int p = 0;
    for (; v; v &= v - 1)
        p ^= 1;
    return p;
}

/* upstream's Walsh matrix: float32 +-1 (Sylvester order) divided by
 * sqrt(group), each entry rounded to float32 */
static float *hadamard(int group)
{
    float *h = malloc((size_t)group * (size_t)group * sizeof *h);
    if (!h)
        return NULL;
    float e = (float)(1.0 / sqrt((double)group));
    for (int i = 0; i < group; i++)
        for (int j = 0; j < group; j++)
            h[(size_t)i * (size_t)group + (size_t)j] = parity((unsigned)(i & j)) ? -e : e;
    return h;
}

/* y = x @ H, each output rounded once to float32 from a float64 sum of the
 * exact products. Upstream runs numpy's float32 matmul, whose rounding
 * depends on the BLAS build and CPU (OpenBLAS kernels differ); the
 * correctly rounded value is the one closest to all of them, so indices
 * differ from any particular upstream run only at near-ties. */
static void rotate(const float *x, const float *h, int group, float *y)
{
    double acc[4096];
    for (int j = 0; j < group; j++)
        acc[j] = 0.0;
    for (int l = 0; l < group; l++) {
        const double xl = x[l];
        const float *row = h + (size_t)l * (size_t)group;
        for (int j = 0; j < group; j++)
            acc[j] += xl * (double)row[j];
    }
    for (int j = 0; j < group; j++)
        y[j] = (float)acc[j];
}

int cq_kv_roundtrip(const float *w, int64_t rows, int64_t in_dim, int bits, int group, float *out)
{
    float cb[CQ_KV_MAX_LEVELS];
    int ncb = cq_kv_codebook(bits, group, cb);
    if (ncb < 0)
        return ncb;
    if (rows < 0 || in_dim < 1)
        return nd_error(ND_EARG, "CQ of %lld rows of %lld", (long long)rows, (long long)in_dim);
    float *h = hadamard(group);
    float *g = malloc((size_t)group * 3 * sizeof *g);
    if (!h || !g) {
        free(h);
        free(g);
        return nd_error(ND_ENOMEM, "out of memory");
    }
    float *rot = g + group, *sq = rot + group;
    int64_t ng = cq_in_pad(in_dim, group) / group;
    for (int64_t r = 0; r < rows; r++) {
        const float *wr = w + (size_t)r * (size_t)in_dim;
        for (int64_t gi = 0; gi < ng; gi++) {
            /* what cq_quantize stores: the group's norm as FP16 and each
             * unit coordinate's nearest level; then cq_dequantize */
            for (int j = 0; j < group; j++) {
                int64_t c = gi * group + j;
                g[j] = c < in_dim ? wr[c] : 0.0f;
            }
            rotate(g, h, group, rot);
            for (int j = 0; j < group; j++)
                sq[j] = rot[j] * rot[j];
            float norm = sqrtf(np_pairwise_f32(sq, (size_t)group));
            float den = isnan(norm) || norm >= 1e-12f ? norm : 1e-12f;
            float n16 = nd_half_to_float(nd_float_to_half(norm));
            for (int j = 0; j < group; j++)
                g[j] = cb[cq_nearest_index(rot[j] / den, cb, ncb)] * n16;
            rotate(g, h, group, rot);
            for (int j = 0; j < group; j++) {
                int64_t c = gi * group + j;
                if (c < in_dim)
                    out[(size_t)r * (size_t)in_dim + (size_t)c] = rot[j];
            }
        }
    }
    free(h);
    free(g);
    return ND_OK;
}

/* Rows of one CQ matrix, shared by cq_quantize and cq_dequantize. */
typedef struct {
    const float *w_in, *h, *cb;
    float *w_out;
    const unsigned char *blob_in, *norms_in;
    unsigned char *blob_out, *norms_out;
    int64_t in_dim, in_pad, ng;
    size_t rb;
    int bits, group, ncb;
    atomic_int fail;
} cq_rows_args;

static void quantize_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    cq_rows_args *a = p;
    int group = a->group, ncb = a->ncb;
    int64_t in_dim = a->in_dim, ng = a->ng;
    float *g = malloc((size_t)group * 3 * sizeof *g);
    uint8_t *idx = malloc((size_t)a->in_pad);
    if (!g || !idx) {
        atomic_store(&a->fail, 1);
        free(g);
        free(idx);
        return;
    }
    float *rot = g + group, *sq = g + 2 * group;
    for (int64_t r = r0; r < r1; r++) {
        const float *wr = a->w_in + (size_t)r * (size_t)in_dim;
        for (int64_t gi = 0; gi < ng; gi++) {
            for (int j = 0; j < group; j++) {
                int64_t c = gi * group + j;
                g[j] = c < in_dim ? wr[c] : 0.0f;
            }
            rotate(g, a->h, group, rot);
            for (int j = 0; j < group; j++)
                sq[j] = rot[j] * rot[j];
            float norm = sqrtf(np_pairwise_f32(sq, (size_t)group));
            float den = isnan(norm) || norm >= 1e-12f ? norm : 1e-12f;
            for (int j = 0; j < group; j++)
                idx[gi * group + j] = (uint8_t)cq_nearest_index(rot[j] / den, a->cb, ncb);
            uint16_t hn = nd_float_to_half(norm);
            unsigned char *np = a->norms_out + ((size_t)r * (size_t)ng + (size_t)gi) * 2;
            np[0] = (unsigned char)(hn & 0xff);
            np[1] = (unsigned char)(hn >> 8);
        }
        cq_pack_indices(idx, (size_t)a->in_pad, a->bits, a->blob_out + (size_t)r * a->rb);
    }
    free(g);
    free(idx);
}

int cq_quantize(const float *w, int64_t out, int64_t in_dim, int bits, int group,
                unsigned char *blob)
{
    if (!cq_bits_valid(bits))
        return nd_error(ND_EARG, "CQ supports 2, 3, 4 bits or ternary, not %d", bits);
    float cb[CQ_MAX_LEVELS];
    int ncb = cq_codebook(bits, group, cb);
    if (ncb < 0)
        return ncb;
    if (!cq_blob_bytes(out, in_dim, bits, group) && out && in_dim)
        return nd_error(ND_ELIMIT, "CQ matrix [%lld, %lld] is too large", (long long)out,
                        (long long)in_dim);
    float *h = hadamard(group);
    if (!h)
        return nd_error(ND_ENOMEM, "out of memory");
    int64_t in_pad = cq_in_pad(in_dim, group);
    size_t rb = cq_row_bytes(in_dim, bits, group);
    cq_rows_args a = {.w_in = w,
                      .h = h,
                      .cb = cb,
                      .blob_out = blob,
                      .norms_out = blob + rb * (size_t)out,
                      .in_dim = in_dim,
                      .in_pad = in_pad,
                      .ng = in_pad / group,
                      .rb = rb,
                      .bits = bits,
                      .group = group,
                      .ncb = ncb};
    atomic_init(&a.fail, 0);
    nd_parallel_for((long)out, 1, quantize_rows, &a);
    free(h);
    return atomic_load(&a.fail) ? nd_error(ND_ENOMEM, "out of memory") : ND_OK;
}

static void dequantize_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    cq_rows_args *a = p;
    int group = a->group, ncb = a->ncb;
    int64_t in_dim = a->in_dim, ng = a->ng;
    float *g = malloc((size_t)group * 2 * sizeof *g);
    uint8_t *idx = malloc((size_t)a->in_pad);
    if (!g || !idx) {
        atomic_store(&a->fail, 1);
        free(g);
        free(idx);
        return;
    }
    float *rot = g + group;
    for (int64_t r = r0; r < r1; r++) {
        cq_unpack_indices(a->blob_in + (size_t)r * a->rb, (size_t)a->in_pad, a->bits, idx);
        for (int64_t gi = 0; gi < ng; gi++) {
            const unsigned char *np = a->norms_in + ((size_t)r * (size_t)ng + (size_t)gi) * 2;
            float norm = nd_half_to_float((uint16_t)(np[0] | np[1] << 8));
            for (int j = 0; j < group; j++) {
                uint8_t k = idx[gi * group + j];
                g[j] = (k < ncb ? a->cb[k] : 0.0f) * norm;
            }
            rotate(g, a->h, group, rot);
            for (int j = 0; j < group; j++) {
                int64_t c = gi * group + j;
                if (c < in_dim)
                    a->w_out[(size_t)r * (size_t)in_dim + (size_t)c] = rot[j];
            }
        }
    }
    free(g);
    free(idx);
}

int cq_dequantize(const unsigned char *blob, size_t blob_len, int64_t out, int64_t in_dim, int bits,
                  int group, float *w)
{
    if (!cq_bits_valid(bits))
        return nd_error(ND_EFORMAT, "CQ tensor has unsupported bits %d", bits);
    float cb[CQ_MAX_LEVELS];
    int ncb = cq_codebook(bits, group, cb);
    if (ncb < 0)
        return ncb;
    size_t need = cq_blob_bytes(out, in_dim, bits, group);
    if ((!need && out && in_dim) || need != blob_len)
        return nd_error(ND_EFORMAT, "CQ blob is %zu bytes, [%lld, %lld] at %d bits needs %zu",
                        blob_len, (long long)out, (long long)in_dim, bits, need);
    float *h = hadamard(group);
    if (!h)
        return nd_error(ND_ENOMEM, "out of memory");
    int64_t in_pad = cq_in_pad(in_dim, group);
    size_t rb = cq_row_bytes(in_dim, bits, group);
    cq_rows_args a = {.h = h,
                      .cb = cb,
                      .w_out = w,
                      .blob_in = blob,
                      .norms_in = blob + rb * (size_t)out,
                      .in_dim = in_dim,
                      .in_pad = in_pad,
                      .ng = in_pad / group,
                      .rb = rb,
                      .bits = bits,
                      .group = group,
                      .ncb = ncb};
    atomic_init(&a.fail, 0);
    nd_parallel_for((long)out, 1, dequantize_rows, &a);
    free(h);
    return atomic_load(&a.fail) ? nd_error(ND_ENOMEM, "out of memory") : ND_OK;
}

/* ------------------------------------------------------------------ */
/* bits maps                                                           */

/* replace every non-overlapping occurrence of `from` with `to`, in place */
static void replace_all(char *s, size_t cap, const char *from, const char *to)
{
    char tmp[512];
    size_t fl = strlen(from), o = 0;
    const char *p = s;
    while (*p && o + 1 < sizeof tmp) {
        if (!strncmp(p, from, fl)) {
            size_t tl = strlen(to);
            if (o + tl >= sizeof tmp)
                break;
            memcpy(tmp + o, to, tl);
            o += tl;
            p += fl;
        } else {
            tmp[o++] = *p++;
        }
    }
    tmp[o] = 0;
    snprintf(s, cap, "%s", tmp);
}

void cq_canonical_name(const char *name, char *out, size_t cap)
{
    char s[512], t[512];
    snprintf(s, sizeof s, "%s", name);
    /* ^layer\d+\. -> attn. */
    if (!strncmp(s, "layer", 5) && isdigit((unsigned char)s[5])) {
        size_t p = 5;
        while (isdigit((unsigned char)s[p]))
            p++;
        if (s[p] == '.') {
            snprintf(t, sizeof t, "attn.%s", s + p + 1);
            memcpy(s, t, sizeof s);
        }
    }
    /* ^engrams?_?(\d+)[./]? -> engram\1. */
    if (!strncmp(s, "engram", 6)) {
        size_t p = 6;
        if (s[p] == 's')
            p++;
        if (s[p] == '_')
            p++;
        size_t d0 = p;
        while (isdigit((unsigned char)s[p]))
            p++;
        if (p > d0) {
            size_t d1 = p;
            if (s[p] == '.' || s[p] == '/')
                p++;
            snprintf(t, sizeof t, "engram%.*s.%s", (int)(d1 - d0), s + d0, s + p);
            memcpy(s, t, sizeof s);
        }
    }
    if (!strncmp(s, "stack/", 6))
        memmove(s, s + 6, strlen(s + 6) + 1);
    replace_all(s, sizeof s, "layers/block/self_attn/", "attn.");
    replace_all(s, sizeof s, "mtp_block/self_attn/", "mtp.");
    size_t n = strlen(s);
    if (n >= 7 && !strcmp(s + n - 7, "/kernel"))
        s[n - 7] = 0;
    if (!strcmp(s, "embedding/embedding"))
        strcpy(s, "embedding");
    /* ^(engram\d+\.)embedding$ -> \1tables */
    if (!strncmp(s, "engram", 6) && isdigit((unsigned char)s[6])) {
        size_t p = 6;
        while (isdigit((unsigned char)s[p]))
            p++;
        if (s[p] == '.' && !strcmp(s + p + 1, "embedding"))
            strcpy(s + p + 1, "tables");
    }
    for (char *c = s; *c; c++)
        if (*c == '/')
            *c = '.';
    snprintf(out, cap, "%s", s);
}

static void strip(const char *b, const char *e, char *out, size_t cap)
{
    while (b < e && isspace((unsigned char)*b))
        b++;
    while (e > b && isspace((unsigned char)e[-1]))
        e--;
    snprintf(out, cap, "%.*s", (int)(e - b), b);
}

static int parse_width(const char *v, int *bits)
{
    char *end;
    errno = 0;
    double f = strtod(v, &end);
    if (*v && !*end && !errno && f == 1.58) {
        *bits = CQ_TERNARY;
        return 0;
    }
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno)
        return -1;
    *bits = (x == 2 || x == 3 || x == 4) ? (int)x : -1 - (int)(x > 0 && x < 1000 ? x : 0);
    return 0;
}

int cq_bits_map_parse(const char *spec, cq_bits_map *m)
{
    memset(m, 0, sizeof *m);
    m->default_bits = -1;
    const char *p = spec ? spec : "";
    int cap = 0, rc = ND_OK;
    for (;;) {
        const char *e = strchr(p, ',');
        if (!e)
            e = p + strlen(p);
        char part[256], key[256], val[64];
        strip(p, e, part, sizeof part);
        if (part[0]) {
            char *eq = strchr(part, '=');
            if (!eq) {
                rc = nd_error(ND_EARG, "bits map '%s': entry '%s' is not name=bits", spec, part);
                goto fail;
            }
            strip(part, eq, key, sizeof key);
            strip(eq + 1, eq + 1 + strlen(eq + 1), val, sizeof val);
            int b;
            if (parse_width(val, &b)) {
                rc = nd_error(ND_EARG, "bits map '%s': '%s' is not a width", spec, val);
                goto fail;
            }
            if (b < 0) {
                rc = nd_error(ND_EARG, "bits map '%s' has unsupported width %s (2, 3, 4 or 1.58)",
                              spec, val);
                goto fail;
            }
            if (!strcmp(key, "default")) {
                m->default_bits = b;
            } else {
                char canon[128];
                cq_canonical_name(key, canon, sizeof canon);
                int i;
                for (i = 0; i < m->n; i++)
                    if (!strcmp(m->keys[i], canon))
                        break;
                if (i == m->n) {
                    if (m->n == cap) {
                        int nc = cap ? cap * 2 : 8;
                        void *k = realloc(m->keys, (size_t)nc * sizeof *m->keys);
                        if (k)
                            m->keys = k;
                        void *bb = k ? realloc(m->bits, (size_t)nc * sizeof *m->bits) : NULL;
                        if (!bb) {
                            rc = nd_error(ND_ENOMEM, "out of memory");
                            goto fail;
                        }
                        m->bits = bb;
                        cap = nc;
                    }
                    snprintf(m->keys[m->n++], sizeof m->keys[0], "%s", canon);
                }
                m->bits[i] = b;
            }
        }
        if (!*e)
            break;
        p = e + 1;
    }
    if (m->default_bits < 0) {
        rc = nd_error(ND_EARG, "bits map '%s' needs a default=<b> entry", spec ? spec : "");
        goto fail;
    }
    return ND_OK;
fail:
    cq_bits_map_free(m);
    return rc;
}

void cq_bits_map_free(cq_bits_map *m)
{
    free(m->keys);
    free(m->bits);
    memset(m, 0, sizeof *m);
}

int cq_bits_for(const cq_bits_map *m, const char *name)
{
    char canon[512];
    cq_canonical_name(name, canon, sizeof canon);
    int best = -1;
    size_t best_len = 0;
    for (int i = 0; i < m->n; i++) {
        size_t l = strlen(m->keys[i]);
        if (!strncmp(canon, m->keys[i], l) && (best < 0 || l > best_len)) {
            best = i;
            best_len = l;
        }
    }
    return best >= 0 ? m->bits[best] : m->default_bits;
}
