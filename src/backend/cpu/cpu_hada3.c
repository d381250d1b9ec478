/* CPU ops of Needle 3's Hadamard MLP (model/hada3.c): the element-wise
 * stage hada3_mix with its backward, and the row softmax of the cond
 * logits. See backend/ops.def for the meaning of every parameter. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/threadpool.h"

/* ---- hada3_mix ---- */

typedef struct {
    float *dst, *dsrc, *dcond, *dscale, *dbias;
    const float *src, *ddst, *scale, *p, *cu, *bias;
    const int32_t *doff, *soff;
    int drs, srs, rank, silu, cols;
    long N;
    const struct mix_plan *sp, *dp; /* soff's and doff's plans */
    float *buf;                     /* per thread: buf_floats each */
    size_t buf_floats;
} mix_args;

/* A row's places in address order. The blocked layouts put feature m of
 * row r at off[m] + r*rs with off[] made of runs of bb consecutive floats
 * N*bb floats apart: with N*bb a power of two every run of a row falls in
 * the same cache sets, and per-feature gathers and scatters in feature
 * order (through the permutations) evict each other's lines before they
 * are used up. Staged through the plan
 * a row is read and written run by run in address order (each line once,
 * whole) and the permuted access happens in a row-sized buffer in L1. */
typedef struct mix_plan {
    int32_t *pos;  /* cols: feature m's slot in address order; n (a zero slot) if off[m] < 0 */
    int32_t *feat; /* n: the feature in slot k (ties in feature order) */
    int32_t *run;  /* nrun triples: first offset, first slot, length */
    int n, nrun;
} mix_plan;

static int cmp_i64(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

static void plan_make(mix_plan *P, const int32_t *off, int cols)
{
    size_t c = (size_t)(cols > 0 ? cols : 1);
    P->pos = cpu_xalloc(sizeof(int32_t) * 5 * c);
    P->feat = P->pos + c;
    P->run = P->feat + c;
    int64_t *key = cpu_xalloc(sizeof(int64_t) * c); /* offset, then feature */
    int n = 0;
    for (int m = 0; m < cols; m++)
        if (off[m] >= 0)
            key[n++] = (int64_t)off[m] << 32 | m;
    qsort(key, (size_t)n, sizeof *key, cmp_i64);
    for (int k = 0; k < n; k++)
        P->feat[k] = (int32_t)(key[k] & 0xffffffff);
    free(key);
    for (int m = 0; m < cols; m++)
        P->pos[m] = n;
    int nrun = 0;
    for (int k = 0; k < n; k++) {
        int32_t o = off[P->feat[k]];
        P->pos[P->feat[k]] = k;
        if (nrun && o == P->run[3 * (nrun - 1)] + P->run[3 * (nrun - 1) + 2])
            P->run[3 * (nrun - 1) + 2]++;
        else {
            P->run[3 * nrun] = o;
            P->run[3 * nrun + 1] = k;
            P->run[3 * nrun + 2] = 1;
            nrun++;
        }
    }
    P->n = n;
    P->nrun = nrun;
}

/* Plans made once per offset table: a training step calls the mix ops
 * with the same few tables (the Hadamard MLP's layouts for the batch's
 * rows) in every layer, forward and backward, and sorting a table of n
 * features each time is serial work on the calling thread. Slots are
 * shared by all callers: a slot in use (refs > 0) is never replaced; when
 * every slot is in use a call makes a plan of its own. */
#define PLAN_SLOTS 8

typedef struct {
    mix_plan P;
    int32_t *key; /* the offsets the plan was made from (cols of them) */
    int cols, refs;
    unsigned long used;
} plan_slot;

static plan_slot plan_cache[PLAN_SLOTS];
static unsigned long plan_tick;
static long plan_made; /* plans sorted so far (cpu_hada3_plans_made) */
static pthread_mutex_t plan_mu = PTHREAD_MUTEX_INITIALIZER;

long cpu_hada3_plans_made(void)
{
    pthread_mutex_lock(&plan_mu);
    long n = plan_made;
    pthread_mutex_unlock(&plan_mu);
    return n;
}

/* the plan of off[0..cols): *slot is its cache slot, or -1 when the
 * caller owns it (plan_put frees it then) */
static const mix_plan *plan_get(const int32_t *off, int cols, int *slot, mix_plan *own)
{
    size_t kb = sizeof(int32_t) * (size_t)(cols > 0 ? cols : 1);
    pthread_mutex_lock(&plan_mu);
    for (int i = 0; i < PLAN_SLOTS; i++) {
        plan_slot *c = &plan_cache[i];
        if (c->key && c->cols == cols && !memcmp(c->key, off, sizeof(int32_t) * (size_t)cols)) {
            c->refs++;
            c->used = ++plan_tick;
            pthread_mutex_unlock(&plan_mu);
            *slot = i;
            return &c->P;
        }
    }
    plan_made++;
    pthread_mutex_unlock(&plan_mu);
    mix_plan P;
    plan_make(&P, off, cols);
    int32_t *key = cpu_xalloc(kb);
    memcpy(key, off, sizeof(int32_t) * (size_t)cols);
    pthread_mutex_lock(&plan_mu);
    int best = -1; /* an empty slot, else the least recently used one not in use */
    for (int i = 0; i < PLAN_SLOTS; i++) {
        const plan_slot *c = &plan_cache[i];
        if (c->refs)
            continue;
        if (!c->key) {
            best = i;
            break;
        }
        if (best < 0 || c->used < plan_cache[best].used)
            best = i;
    }
    if (best >= 0) {
        plan_slot *c = &plan_cache[best];
        free(c->P.pos);
        free(c->key);
        c->P = P;
        c->key = key;
        c->cols = cols;
        c->refs = 1;
        c->used = ++plan_tick;
        pthread_mutex_unlock(&plan_mu);
        *slot = best;
        return &c->P;
    }
    pthread_mutex_unlock(&plan_mu);
    free(key);
    *own = P;
    *slot = -1;
    return own;
}

static void plan_put(const mix_plan *P, int slot)
{
    if (slot < 0) {
        free(P->pos);
        return;
    }
    pthread_mutex_lock(&plan_mu);
    plan_cache[slot].refs--;
    pthread_mutex_unlock(&plan_mu);
}

/* S[k] = row[off of slot k] for every slot, S[n] = 0 */
static void plan_load(const mix_plan *P, float *S, const float *row)
{
    for (int i = 0; i < P->nrun; i++) {
        const int32_t *R = P->run + 3 * i;
        memcpy(S + R[1], row + R[0], sizeof(float) * (size_t)R[2]);
    }
    S[P->n] = 0.0f;
}

/* row[off of slot k] = V[feat[k]] for every slot, in address order */
static void plan_store(const mix_plan *P, float *row, const float *V)
{
    for (int i = 0; i < P->nrun; i++) {
        const int32_t *R = P->run + 3 * i;
        float *o = row + R[0];
        const int32_t *f = P->feat + R[1];
        for (int t = 0; t < R[2]; t++)
            o[t] = V[f[t]];
    }
}

/* g[m - m0] = 1 + sum_q p[q] cu[q*cols + m] for m in [m0, m1) */
static void mix_gain(float *g, const float *p, const float *cu, int rank, int cols, int m0, int m1)
{
    for (int m = m0; m < m1; m++)
        g[m - m0] = 1.0f;
    for (int q = 0; q < rank; q++) {
        float pq = p[q];
        const float *u = cu + (size_t)q * (size_t)cols;
        for (int m = m0; m < m1; m++)
            g[m - m0] += pq * u[m];
    }
}

/* Features are handled in chunks of MIX_CHUNK: gathered into contiguous
 * buffers, computed in straight loops that vectorise, scattered back. */
#define MIX_CHUNK 256

/* the forward's values of features [m0, m1) of row r, v[] holding their
 * inputs: scale (times the cond gain), bias, silu */
static void mix_values(const mix_args *a, long r, int m0, int m1, float *v)
{
    const float *sc = a->scale + m0;
    int w = m1 - m0;
    if (a->p) {
        float g[MIX_CHUNK];
        mix_gain(g, a->p + r * a->rank, a->cu, a->rank, a->cols, m0, m1);
        for (int k = 0; k < w; k++)
            v[k] *= sc[k] * g[k];
    } else
        for (int k = 0; k < w; k++)
            v[k] *= sc[k];
    if (a->bias)
        for (int k = 0; k < w; k++)
            v[k] += a->bias[m0 + k];
    if (a->silu)
        for (int k = 0; k < w; k++)
            v[k] = san_silu(v[k]);
}

static void mix_rows(void *ctx, long r0, long r1, int tid)
{
    const mix_args *a = ctx;
    int cols = a->cols;
    float v[MIX_CHUNK];
    float *S = a->buf + (size_t)tid * a->buf_floats, *O = S + a->sp->n + 1;
    for (long r = r0; r < r1; r++) {
        plan_load(a->sp, S, a->src + r * a->srs);
        for (int m0 = 0; m0 < cols; m0 += MIX_CHUNK) {
            int m1 = m0 + MIX_CHUNK < cols ? m0 + MIX_CHUNK : cols, w = m1 - m0;
            const int32_t *sp = a->sp->pos + m0;
            for (int k = 0; k < w; k++)
                v[k] = S[sp[k]];
            mix_values(a, r, m0, m1, v);
            memcpy(O + m0, v, sizeof(float) * (size_t)w);
        }
        plan_store(a->dp, a->dst + r * a->drs, O);
    }
}

/* A few rows (a decode step has one): gathered and scattered through the
 * offsets directly. Sorting two plans costs more than the cache misses
 * they avoid until a call has several rows (measured: plans made for one
 * row took 40% of a Needle 3 decode step). Writes go in feature order, so
 * where two features share an offset the later one wins, as in
 * plan_store. */
#define MIX_DIRECT_ROWS 8

static void mix_rows_direct(const mix_args *a)
{
    int cols = a->cols;
    float v[MIX_CHUNK];
    for (long r = 0; r < a->N; r++) {
        const float *in = a->src + r * a->srs;
        float *out = a->dst + r * a->drs;
        for (int m0 = 0; m0 < cols; m0 += MIX_CHUNK) {
            int m1 = m0 + MIX_CHUNK < cols ? m0 + MIX_CHUNK : cols, w = m1 - m0;
            const int32_t *so = a->soff + m0, *dof = a->doff + m0;
            for (int k = 0; k < w; k++)
                v[k] = so[k] >= 0 ? in[so[k]] : 0.0f;
            mix_values(a, r, m0, m1, v);
            for (int k = 0; k < w; k++)
                if (dof[k] >= 0)
                    out[dof[k]] = v[k];
        }
    }
}

void cpu_hada3_mix(const nd_backend *be, float *dst, const int32_t *doff, int drs, const float *src,
                   const int32_t *soff, int srs, const float *scale, const float *p,
                   const float *cu, int rank, const float *bias, int silu, long N, int cols)
{
    (void)be;
    mix_args a = {.dst = dst,
                  .src = src,
                  .scale = scale,
                  .p = p,
                  .cu = cu,
                  .bias = bias,
                  .doff = doff,
                  .soff = soff,
                  .drs = drs,
                  .srs = srs,
                  .rank = rank,
                  .silu = silu,
                  .cols = cols,
                  .N = N};
    if (N <= 0)
        return;
    if (N < MIX_DIRECT_ROWS) {
        mix_rows_direct(&a);
        return;
    }
    mix_plan own_s, own_d;
    int ss, ds;
    a.sp = plan_get(soff, cols, &ss, &own_s);
    a.dp = plan_get(doff, cols, &ds, &own_d);
    a.buf_floats = (size_t)a.sp->n + 1 + (size_t)cols;
    a.buf = cpu_xalloc(sizeof(float) * a.buf_floats * (size_t)nd_get_threads());
    nd_parallel_for(N, 16, mix_rows, &a);
    free(a.buf);
    plan_put(a.sp, ss);
    plan_put(a.dp, ds);
}

/* The backward runs over row shares; dscale / dbias sum per-thread
 * partials (double) in thread order, so a given thread count always gives
 * the same bits. */
typedef struct {
    const mix_args *a;
    double *part; /* nt slices of 2 * cols: dscale, dbias */
    int nt;
} mix_bwd_ctx;

static void mix_bwd_share(void *ctx, int tid, int team)
{
    const mix_bwd_ctx *C = ctx;
    const mix_args *a = C->a;
    int cols = a->cols;
    long r0, r1;
    nd_share(a->N, tid, team, &r0, &r1);
    double *ss = C->part ? C->part + (size_t)tid * 2 * (size_t)cols : NULL;
    double *sb = ss ? ss + cols : NULL;
    float g[MIX_CHUNK], v[MIX_CHUNK], e[MIX_CHUNK], t[MIX_CHUNK];
    /* v (the forward's input) enters only silu', dcond and dscale */
    const float *src = a->silu || a->dcond || ss ? a->src : NULL;
    float *E = a->buf + (size_t)tid * a->buf_floats, *S = E + a->dp->n + 1, *Tb = S + a->sp->n + 1;
    for (long r = r0; r < r1; r++) {
        plan_load(a->dp, E, a->ddst + r * a->drs);
        if (src)
            plan_load(a->sp, S, src + r * a->srs);
        for (int m0 = 0; m0 < cols; m0 += MIX_CHUNK) {
            int m1 = m0 + MIX_CHUNK < cols ? m0 + MIX_CHUNK : cols, w = m1 - m0;
            const float *sc = a->scale + m0;
            const int32_t *dpos = a->dp->pos + m0, *spos = a->sp->pos + m0;
            for (int k = 0; k < w; k++)
                e[k] = E[dpos[k]];
            if (src)
                for (int k = 0; k < w; k++)
                    v[k] = S[spos[k]];
            else
                memset(v, 0, sizeof(float) * (size_t)w);
            if (a->p)
                mix_gain(g, a->p + r * a->rank, a->cu, a->rank, cols, m0, m1);
            else
                for (int k = 0; k < w; k++)
                    g[k] = 1.0f;
            if (a->silu) /* e *= silu'(h) */
                for (int k = 0; k < w; k++) {
                    float h = sc[k] * g[k] * v[k] + (a->bias ? a->bias[m0 + k] : 0.0f);
                    float s = san_sigmoid(h);
                    e[k] *= s * (1.0f + h * (1.0f - s));
                }
            if (a->dsrc) {
                for (int k = 0; k < w; k++)
                    t[k] = e[k] * sc[k] * g[k];
                memcpy(Tb + m0, t, sizeof(float) * (size_t)w);
            }
            if (a->dcond) {
                float *dc = a->dcond + r * cols + m0;
                for (int k = 0; k < w; k++)
                    dc[k] = e[k] * sc[k] * v[k];
            }
            if (ss) {
                double *s1 = ss + m0, *s2 = sb + m0;
                for (int k = 0; k < w; k++) {
                    s1[k] += (double)(e[k] * g[k] * v[k]);
                    s2[k] += (double)e[k];
                }
            }
        }
        if (a->dsrc)
            plan_store(a->sp, a->dsrc + r * a->srs, Tb);
    }
}

void cpu_hada3_mix_backward(const nd_backend *be, float *dsrc, float *dcond, float *dscale,
                            float *dbias, const float *ddst, const int32_t *doff, int drs,
                            const float *src, const int32_t *soff, int srs, const float *scale,
                            const float *p, const float *cu, int rank, const float *bias, int silu,
                            long N, int cols)
{
    (void)be;
    if (N <= 0)
        return;
    mix_args a = {.dsrc = dsrc,
                  .dcond = dcond,
                  .dscale = dscale,
                  .dbias = dbias,
                  .ddst = ddst,
                  .src = src,
                  .scale = scale,
                  .p = p,
                  .cu = cu,
                  .bias = bias,
                  .doff = doff,
                  .soff = soff,
                  .drs = drs,
                  .srs = srs,
                  .rank = rank,
                  .silu = silu,
                  .cols = cols,
                  .N = N};
    /* a team no larger than the rows (16 at least each) and the partials */
    int nt = nd_get_threads();
    if (nt > (N + 15) / 16)
        nt = (int)((N + 15) / 16);
    mix_plan own_s, own_d;
    int ss, ds;
    a.sp = plan_get(soff, cols, &ss, &own_s);
    a.dp = plan_get(doff, cols, &ds, &own_d);
    a.buf_floats = (size_t)a.dp->n + (size_t)a.sp->n + 2 + (size_t)cols;
    a.buf = cpu_xalloc(sizeof(float) * a.buf_floats * (size_t)nt);
    mix_bwd_ctx C = {.a = &a, .nt = nt};
    int sums = dscale || dbias;
    if (sums)
        C.part = cpu_xalloc(sizeof(double) * (size_t)nt * 2 * (size_t)cols);
    nd_parallel_region(nt, mix_bwd_share, &C);
    if (sums)
        for (int m = 0; m < cols; m++) {
            double s = 0.0, b = 0.0;
            for (int t = 0; t < nt; t++) {
                s += C.part[(size_t)t * 2 * cols + m];
                b += C.part[(size_t)t * 2 * cols + cols + m];
            }
            if (dscale)
                dscale[m] += (float)s;
            if (dbias)
                dbias[m] += (float)b;
        }
    free(C.part);
    free(a.buf);
    plan_put(a.sp, ss);
    plan_put(a.dp, ds);
}

/* ---- softmax_rows ---- */

typedef struct {
    float *x;
    const float *dy, *y;
    int k;
} smx_args;

static void softmax_rows_body(void *ctx, long r0, long r1, int tid)
{
    (void)tid;
    const smx_args *a = ctx;
    int k = a->k;
    for (long r = r0; r < r1; r++) {
        float *x = a->x + r * k;
        float mx = x[0];
        for (int i = 1; i < k; i++)
            mx = x[i] > mx ? x[i] : mx;
        float s = 0.0f;
        for (int i = 0; i < k; i++) {
            x[i] = expf(x[i] - mx);
            s += x[i];
        }
        float inv = 1.0f / s;
        for (int i = 0; i < k; i++)
            x[i] *= inv;
    }
}

void cpu_softmax_rows(const nd_backend *be, float *x, long N, int k)
{
    (void)be;
    smx_args a = {.x = x, .k = k};
    nd_parallel_for(N, 256, softmax_rows_body, &a);
}

static void softmax_bwd_body(void *ctx, long r0, long r1, int tid)
{
    (void)tid;
    const smx_args *a = ctx;
    int k = a->k;
    for (long r = r0; r < r1; r++) {
        const float *y = a->y + r * k, *dy = a->dy + r * k;
        float *dx = a->x + r * k;
        float s = 0.0f;
        for (int i = 0; i < k; i++)
            s += y[i] * dy[i];
        for (int i = 0; i < k; i++)
            dx[i] = y[i] * (dy[i] - s);
    }
}

void cpu_softmax_rows_backward(const nd_backend *be, float *dx, const float *dy, const float *y,
                               long N, int k)
{
    (void)be;
    smx_args a = {.x = dx, .dy = dy, .y = y, .k = k};
    nd_parallel_for(N, 256, softmax_bwd_body, &a);
}
