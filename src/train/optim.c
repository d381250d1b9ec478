#include "train/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "core/status.h"
#include "core/threadpool.h"

long nd_warmup_steps(long S)
{
    long w = S / 20;
    if (w < 1)
        w = 1;
    if (w > S - 1)
        w = S - 1;
    return w < 0 ? 0 : w;
}

double nd_lr_schedule(double peak, long warmup, long total, long step)
{
    if (step < warmup) /* linear 0 -> peak; join_schedules switches at `warmup` */
        return peak * (double)step / (double)warmup;
    long decay = total - warmup;
    if (decay <= 0)
        return peak;
    long k = step - warmup;
    if (k > decay)
        k = decay;
    return peak * 0.5 * (1.0 + cos(3.14159265358979323846 * (double)k / (double)decay));
}

int nd_adamw_init(nd_adamw *o, size_t n, float peak_lr, long total_steps)
{
    memset(o, 0, sizeof *o);
    o->b1 = 0.9f;
    o->b2 = 0.999f;
    o->eps = 1e-8f;
    o->weight_decay = 1e-4f;
    o->max_norm = 1.0f;
    o->peak_lr = peak_lr;
    o->total_steps = total_steps;
    o->warmup_steps = nd_warmup_steps(total_steps);
    o->n = n;
    o->mu = nd_calloc_big(n ? n : 1, sizeof(float));
    o->nu = nd_calloc_big(n ? n : 1, sizeof(float));
    if (!o->mu || !o->nu) {
        nd_adamw_free(o);
        return nd_error(ND_ENOMEM, "out of memory for optimiser state");
    }
    return ND_OK;
}

void nd_adamw_free(nd_adamw *o)
{
    free(o->mu);
    free(o->nu);
    o->mu = o->nu = NULL;
}

typedef struct {
    const float *g;
    double *partial; /* one sum per thread */
} sumsq_args;

static void sumsq_share(void *p, long i0, long i1, int tid)
{
    const sumsq_args *a = p;
    double s = 0;
    for (long i = i0; i < i1; i++)
        s += (double)a->g[i] * a->g[i];
    a->partial[tid] = s;
}

/* The per-thread sums are added in thread order: the same bits for a given
 * thread count. */
double nd_global_norm(const float *g, size_t n)
{
    int nt = nd_get_threads();
    double stack[64], *partial = nt <= 64 ? stack : calloc((size_t)nt, sizeof *partial);
    double s = 0;
    if (!partial) { /* no memory for the partials: one thread */
        for (size_t i = 0; i < n; i++)
            s += (double)g[i] * g[i];
        return sqrt(s);
    }
    for (int t = 0; t < nt; t++)
        partial[t] = 0;
    sumsq_args a = {g, partial};
    nd_parallel_for((long)n, 1, sumsq_share, &a);
    for (int t = 0; t < nt; t++)
        s += partial[t];
    if (partial != stack)
        free(partial);
    return sqrt(s);
}

typedef struct {
    float *p, *g, *mu, *nu;
    float clip, b1, b2, bc1, bc2, eps, wd, lr;
} adamw_args;

static void adamw_range(void *ctx, long i0, long i1, int tid)
{
    (void)tid;
    const adamw_args *a = ctx;
    float clip = a->clip, b1 = a->b1, b2 = a->b2, bc1 = a->bc1, bc2 = a->bc2, eps = a->eps;
    float wd = a->wd, flr = a->lr;
    float *p = a->p, *g = a->g;
    for (long i = i0; i < i1; i++) {
        float gi = g[i] * clip;
        float m = b1 * a->mu[i] + (1.0f - b1) * gi;
        float v = b2 * a->nu[i] + (1.0f - b2) * gi * gi;
        a->mu[i] = m;
        a->nu[i] = v;
        float upd = (m / bc1) / (sqrtf(v / bc2) + eps) + wd * p[i];
        p[i] -= flr * upd;
    }
}

int nd_adamw_step(nd_adamw *o, float *p, float *g, double *gnorm, double *lr_used)
{
    double norm = nd_global_norm(g, o->n);
    if (gnorm)
        *gnorm = norm;
    if (!isfinite(norm))
        return nd_error(ND_ENUMERIC, "gradient is not finite (global norm %g)", norm);
    /* clip_by_global_norm: g / norm * max_norm when norm exceeds it */
    float clip = norm > o->max_norm ? (float)(o->max_norm / norm) : 1.0f;
    double lr = nd_lr_schedule(o->peak_lr, o->warmup_steps, o->total_steps, o->count);
    if (lr_used)
        *lr_used = lr;
    long t = o->count + 1;
    float bc1 = (float)(1.0 - pow(o->b1, (double)t)), bc2 = (float)(1.0 - pow(o->b2, (double)t));
    adamw_args a = {p,   g,   o->mu,  o->nu,           clip,     o->b1, o->b2,
                    bc1, bc2, o->eps, o->weight_decay, (float)lr};
    nd_parallel_for((long)o->n, 1, adamw_range, &a);
    o->count++;
    return ND_OK;
}
