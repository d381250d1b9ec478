/* CPU backward of the hyper-connection lanes ops (combine, update,
 * broadcast, mean): split from cpu_backward.c, same conventions. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"

/* Returns <g, x> (DOT_LANES partial sums, as fdot) and does dx += h g in
 * the same pass, sharing the loads of g. dx must not overlap g or x. */
static inline float dot_axpy(float *restrict dx, const float *restrict g, const float *restrict x,
                             float h, int n)
{
    float acc[DOT_LANES] = {0};
    int i = 0;
    for (; i + DOT_LANES <= n; i += DOT_LANES)
        for (int j = 0; j < DOT_LANES; j++) {
            acc[j] += g[i + j] * x[i + j];
            dx[i + j] += h * g[i + j];
        }
    for (int j = 0; i < n; i++, j++) {
        acc[j] += g[i] * x[i];
        dx[i] += h * g[i];
    }
    return lanes_sum(acc, DOT_LANES);
}

/* Row bodies of the lanes backward ops share one argument block: dX/dM/dy
 * are outputs, G the incoming gradient (dXo, du or dxm), see each op. */
typedef struct {
    float *dX, *dM, *dh, *dy;
    const float *G, *M, *X, *h, *y;
    int n, d, alias;
} lanes_bwd_args;

static void combine_bwd_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const lanes_bwd_args *a = p;
    int n = a->n, d = a->d;
    for (long r = r0; r < r1; r++)
        for (int i = 0; i < n; i++)
            a->dh[r * n + i] = dot_axpy(a->dX + (r * n + i) * d, a->G + r * d,
                                        a->X + (r * n + i) * d, a->h[r * n + i], d);
}

void cpu_lanes_combine_backward(const nd_backend *be, float *dhpre, float *dX, const float *du,
                                const float *hpre, const float *X, long N, int n, int d)
{
    (void)be;
    lanes_bwd_args a = {.dX = dX, .dh = dhpre, .G = du, .X = X, .h = hpre, .n = n, .d = d};
    nd_parallel_for(N, 1, combine_bwd_rows, &a);
}

/* lanes_update_backward walks each row once in chunks of LU_CHUNK columns
 * for up to LU_MAXN lanes; its partial sums, (LU_MAXN^2 + LU_MAXN) x
 * LU_CHUNK floats, stay in L1. */
#define LU_CHUNK 16
#define LU_MAXN 8
#define LU_INLINE static inline __attribute__((always_inline))

/* One chunk of one row: G, X are n rows of LU_CHUNK columns `stride` apart,
 * y one. Adds the lane-wise partial products of <G_i, y> to acc[i] and of
 * <G_i, X_j> to acc[n + i n + j]; sets dy = sum_i hp_i G_i and
 * dX_j = sum_i M_ij G_i for these columns in dyc, dxc. The caller stores
 * dxc only after this: dX may alias G. */
LU_INLINE void lu_chunk(float (*restrict acc)[LU_CHUNK], float *restrict dyc,
                        float (*restrict dxc)[LU_CHUNK], const float *restrict G,
                        const float *restrict X, const float *restrict y, long stride,
                        const float *restrict hp, const float *restrict M, int n)
{
    for (int k = 0; k < LU_CHUNK; k++)
        dyc[k] = 0.0f;
    for (int j = 0; j < n; j++)
        for (int k = 0; k < LU_CHUNK; k++)
            dxc[j][k] = 0.0f;
            /* unrolled when n is a constant: straight-line code, dyc and dxc in
             * registers (about twice as fast as the loop for n = 4) */
#pragma GCC unroll 8
    for (int i = 0; i < n; i++) {
        const float *g = G + i * stride;
        for (int k = 0; k < LU_CHUNK; k++) {
            dyc[k] += hp[i] * g[k];
            acc[i][k] += g[k] * y[k];
        }
        for (int j = 0; j < n; j++) {
            const float *x = X + j * stride;
            float m = M[i * n + j];
            for (int k = 0; k < LU_CHUNK; k++) {
                acc[n + i * n + j][k] += g[k] * x[k];
                dxc[j][k] += m * g[k];
            }
        }
    }
}

/* One row (n <= LU_MAXN lanes of width d): all outputs in one pass. Inlined
 * so that a constant n unrolls the lane loops. */
LU_INLINE void lu_row(float *dXr, float *dMr, float *dhp, float *dyr, const float *G,
                      const float *Mr, const float *Xr, const float *hp, const float *yr, int n,
                      int d)
{
    float acc[LU_MAXN * LU_MAXN + LU_MAXN][LU_CHUNK], dyc[LU_CHUNK];
    float dxc[LU_MAXN][LU_CHUNK];
    memset(acc, 0, (size_t)(n * n + n) * sizeof acc[0]);
    int c = 0;
    for (; c + LU_CHUNK <= d; c += LU_CHUNK) {
        lu_chunk(acc, dyc, dxc, G + c, Xr + c, yr + c, d, hp, Mr, n);
        memcpy(dyr + c, dyc, sizeof dyc);
        for (int j = 0; j < n; j++)
            memcpy(dXr + j * d + c, dxc[j], sizeof dxc[j]);
    }
    if (c < d) {
        /* the last w columns, zero-padded to a full chunk: the padding adds
         * exact zeros to the partial sums and is not stored */
        int w = d - c;
        float tg[LU_MAXN][LU_CHUNK] = {{0}}, tx[LU_MAXN][LU_CHUNK] = {{0}};
        float ty[LU_CHUNK] = {0};
        for (int i = 0; i < n; i++) {
            memcpy(tg[i], G + i * d + c, (size_t)w * sizeof(float));
            memcpy(tx[i], Xr + i * d + c, (size_t)w * sizeof(float));
        }
        memcpy(ty, yr + c, (size_t)w * sizeof(float));
        lu_chunk(acc, dyc, dxc, tg[0], tx[0], ty, LU_CHUNK, hp, Mr, n);
        memcpy(dyr + c, dyc, (size_t)w * sizeof(float));
        for (int j = 0; j < n; j++)
            memcpy(dXr + j * d + c, dxc[j], (size_t)w * sizeof(float));
    }
    for (int i = 0; i < n; i++) {
        dhp[i] = lanes_sum(acc[i], LU_CHUNK);
        for (int j = 0; j < n; j++)
            dMr[i * n + j] = lanes_sum(acc[n + i * n + j], LU_CHUNK);
    }
}

/* The original multi-pass form, for rows of more than LU_MAXN lanes. */
static void lu_row_generic(float *dX, float *dM, float *dhpost, float *dyr, const float *G,
                           const float *Mr, const float *Xr, const float *hp, const float *yr,
                           float *tmp, int n, int d)
{
    for (int c = 0; c < d; c++)
        dyr[c] = 0.0f;
    for (int i = 0; i < n; i++) {
        const float *gi = G + i * d;
        for (int c = 0; c < d; c++)
            dyr[c] += hp[i] * gi[c];
        dhpost[i] = fdot(gi, yr, d);
        for (int j = 0; j < n; j++)
            dM[i * n + j] = fdot(gi, Xr + j * d, d);
    }
    /* dX_j = sum_i M_ij dXo_i, built in tmp when dX aliases dXo */
    float *out = tmp ? tmp : dX;
    for (int j = 0; j < n; j++) {
        float *o = out + j * d;
        for (int c = 0; c < d; c++)
            o[c] = 0.0f;
        for (int i = 0; i < n; i++) {
            float m = Mr[i * n + j];
            const float *gi = G + i * d;
            for (int c = 0; c < d; c++)
                o[c] += m * gi[c];
        }
    }
    if (tmp)
        memcpy(dX, tmp, (size_t)n * d * sizeof *tmp);
}

/* rows of more than LU_MAXN lanes; tmp (per share) when dX aliases dXo */
static void update_bwd_rows_generic(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const lanes_bwd_args *a = p;
    int n = a->n, d = a->d;
    float *tmp = a->alias ? cpu_xalloc((size_t)n * d * sizeof *tmp) : NULL;
    for (long r = r0; r < r1; r++)
        lu_row_generic(a->dX + r * n * d, a->dM + r * n * n, a->dh + r * n, a->dy + r * d,
                       a->G + r * n * d, a->M + r * n * n, a->X + r * n * d, a->h + r * n,
                       a->y + r * d, tmp, n, d);
    free(tmp);
}

static void update_bwd_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const lanes_bwd_args *a = p;
    int n = a->n, d = a->d;
    for (long r = r0; r < r1; r++) {
        float *dXr = a->dX + r * n * d, *dMr = a->dM + r * n * n, *dhp = a->dh + r * n,
              *dyr = a->dy + r * d;
        const float *G = a->G + r * n * d, *Mr = a->M + r * n * n, *Xr = a->X + r * n * d;
        const float *hp = a->h + r * n, *yr = a->y + r * d;
        if (n == 4) /* the model's lane count, unrolled */
            lu_row(dXr, dMr, dhp, dyr, G, Mr, Xr, hp, yr, 4, d);
        else
            lu_row(dXr, dMr, dhp, dyr, G, Mr, Xr, hp, yr, n, d);
    }
}

void cpu_lanes_update_backward(const nd_backend *be, float *dX, float *dM, float *dhpost, float *dy,
                               const float *dXo, const float *M, const float *X, const float *hpost,
                               const float *y, long N, int n, int d)
{
    (void)be;
    lanes_bwd_args a = {dX, dM, dhpost, dy, dXo, M, X, hpost, y, n, d, dX == dXo};
    nd_parallel_for(N, 1, n > LU_MAXN ? update_bwd_rows_generic : update_bwd_rows, &a);
}

/* dx0 (in a->dy) = sum of the lanes of dX (in a->G) */
static void broadcast_bwd_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const lanes_bwd_args *a = p;
    int n = a->n, d = a->d;
    for (long r = r0; r < r1; r++) {
        float *o = a->dy + r * d;
        const float *g = a->G + r * n * d;
        for (int c = 0; c < d; c++)
            o[c] = g[c];
        for (int i = 1; i < n; i++)
            for (int c = 0; c < d; c++)
                o[c] += g[i * d + c];
    }
}

void cpu_lanes_broadcast_backward(const nd_backend *be, float *dx0, const float *dX, long N, int n,
                                  int d)
{
    (void)be;
    lanes_bwd_args a = {.dy = dx0, .G = dX, .n = n, .d = d};
    nd_parallel_for(N, 1, broadcast_bwd_rows, &a);
}

static void mean_bwd_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const lanes_bwd_args *a = p;
    int n = a->n, d = a->d;
    float inv = 1.0f / (float)n;
    for (long r = r0; r < r1; r++)
        for (int i = 0; i < n; i++) {
            float *o = a->dX + (r * n + i) * d;
            const float *g = a->G + r * d;
            for (int c = 0; c < d; c++)
                o[c] = g[c] * inv;
        }
}

void cpu_lanes_mean_backward(const nd_backend *be, float *dX, const float *dxm, long N, int n,
                             int d)
{
    (void)be;
    lanes_bwd_args a = {.dX = dX, .G = dxm, .n = n, .d = d};
    nd_parallel_for(N, 1, mean_bwd_rows, &a);
}
