/* Needle 3's probe heads: see probe3.h for the math. */
#include "model/probe3.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

int san_probe3_begin(san_probe3_pool *p, const san_probe3_head *h)
{
    memset(p, 0, sizeof *p);
    if (h->rows < 1 || h->k < 1 || h->q < 1 || h->d < 1 || h->out < 1)
        return nd_error(ND_ESHAPE, "probe head with sizes rows %d, k %d, q %d, d %d, out %d",
                        h->rows, h->k, h->q, h->d, h->out);
    size_t m = (size_t)h->rows * (size_t)h->k;
    p->h = h;
    p->mx = malloc(m * sizeof *p->mx);
    p->sum = calloc(m, sizeof *p->sum);
    p->acc = calloc(m * (size_t)h->d, sizeof *p->acc);
    if (!p->mx || !p->sum || !p->acc) {
        san_probe3_free(p);
        return nd_error(ND_ENOMEM, "out of memory for a probe head");
    }
    for (size_t i = 0; i < m; i++)
        p->mx[i] = -INFINITY;
    return ND_OK;
}

void san_probe3_free(san_probe3_pool *p)
{
    free(p->mx);
    free(p->sum);
    free(p->acc);
    p->mx = p->sum = p->acc = NULL;
}

/* Online softmax: rescale what was summed under the old maximum when a
 * larger score arrives, so the cells can come in any order. */
static void pool_one(double *mx, double *sum, double *acc, const float *cell, int d, double s)
{
    if (s > *mx) {
        double f = *sum > 0 ? exp(*mx - s) : 0;
        *sum *= f;
        for (int j = 0; j < d; j++)
            acc[j] *= f;
        *mx = s;
    }
    double w = exp(s - *mx);
    *sum += w;
    for (int j = 0; j < d; j++)
        acc[j] += w * (double)cell[j];
}

void san_probe3_add(san_probe3_pool *p, int row, const float *cells, int n, const uint8_t *keep)
{
    const san_probe3_head *h = p->h;
    int d = h->d, K = h->k;
    double inv_sqrt_d = 1.0 / sqrt((double)d);
    for (int i = 0; i < n; i++) {
        if (keep && !keep[i])
            continue;
        const float *c = cells + (size_t)i * (size_t)d;
        for (int k = 0; k < K; k++) {
            size_t m = (size_t)row * (size_t)K + (size_t)k;
            const float *pr = h->probes + m * (size_t)d;
            double s = 0;
            for (int j = 0; j < d; j++)
                s += (double)c[j] * (double)pr[j];
            pool_one(&p->mx[m], &p->sum[m], p->acc + m * (size_t)d, c, d, s * inv_sqrt_d);
        }
        if (row == 0)
            p->seen++;
    }
}

/* r[m] = rms_unit(acc[m] / sum[m]) * gain[m], in place over acc */
static void normalise_pooled(san_probe3_pool *p)
{
    const san_probe3_head *h = p->h;
    int d = h->d;
    size_t M = (size_t)h->rows * (size_t)h->k;
    for (size_t m = 0; m < M; m++) {
        double *a = p->acc + m * (size_t)d, ss = 0;
        for (int j = 0; j < d; j++) {
            a[j] /= p->sum[m];
            ss += a[j] * a[j];
        }
        double f = (double)h->gain[m] / sqrt(ss / d + 1e-6);
        for (int j = 0; j < d; j++)
            a[j] *= f;
    }
}

/* pooled[qi] = softmax over (l, k) of r . query[qi] / sqrt(d) + row_bias */
static int query_pool(const san_probe3_pool *p, double *pooled)
{
    const san_probe3_head *h = p->h;
    int d = h->d;
    size_t M = (size_t)h->rows * (size_t)h->k;
    double *u = malloc(M * sizeof *u);
    if (!u)
        return nd_error(ND_ENOMEM, "out of memory for a probe head");
    double inv_sqrt_d = 1.0 / sqrt((double)d);
    for (int qi = 0; qi < h->q; qi++) {
        const float *qv = h->query + (size_t)qi * (size_t)d;
        double mx = -INFINITY, z = 0;
        for (size_t m = 0; m < M; m++) {
            const double *r = p->acc + m * (size_t)d;
            double s = 0;
            for (int j = 0; j < d; j++)
                s += r[j] * (double)qv[j];
            u[m] = s * inv_sqrt_d + (double)h->row_bias[(size_t)qi * M + m];
            if (u[m] > mx)
                mx = u[m];
        }
        for (size_t m = 0; m < M; m++)
            z += (u[m] = exp(u[m] - mx));
        double *out = pooled + (size_t)qi * (size_t)d;
        memset(out, 0, (size_t)d * sizeof *out);
        for (size_t m = 0; m < M; m++) {
            const double *r = p->acc + m * (size_t)d;
            for (int j = 0; j < d; j++)
                out[j] += u[m] / z * r[j];
        }
    }
    free(u);
    return ND_OK;
}

int san_probe3_finish(san_probe3_pool *p, float *out)
{
    const san_probe3_head *h = p->h;
    int rc = ND_OK;
    size_t qd = (size_t)h->q * (size_t)h->d;
    double *pooled = NULL;
    if (!p->seen) {
        rc = nd_error(ND_EARG, "a probe head over no tokens (every token a pad)");
        goto done;
    }
    if (!(pooled = malloc(qd * sizeof *pooled))) {
        rc = nd_error(ND_ENOMEM, "out of memory for a probe head");
        goto done;
    }
    normalise_pooled(p);
    if ((rc = query_pool(p, pooled)))
        goto done;
    double ss = 0;
    for (int o = 0; o < h->out; o++) {
        double s = h->bias ? (double)h->bias[o] : 0.0;
        for (size_t i = 0; i < qd; i++)
            s += pooled[i] * (double)h->proj[i * (size_t)h->out + (size_t)o];
        out[o] = (float)s;
        ss += s * s;
    }
    if (h->normalise) {
        float inv = (float)(1.0 / sqrt(ss + 1e-12));
        for (int o = 0; o < h->out; o++)
            out[o] *= inv;
    }
done:
    free(pooled);
    san_probe3_free(p);
    return rc;
}
