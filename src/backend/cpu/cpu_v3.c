/* CPU ops of Needle 3's block: the causal q/k/v convolution and the
 * headwise attention gate (forward and backward). attention_ext lives
 * with attention (cpu_attention.c), engram_hash_seeded with engram_hash. */
#include <math.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"

typedef struct {
    float *y;
    const float *x, *taps;
    const nd_layout *L;
    int width, ntaps, window;
} qkv_taps_args;

/* taps that row r reads: j < ntaps, j < window (when set) */
static int taps_used(int ntaps, int window)
{
    return window > 0 && window < ntaps ? window : ntaps;
}

static void qkv_taps_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const qkv_taps_args *a = p;
    int w = a->width, nt = taps_used(a->ntaps, a->window);
    for (long r = r0; r < r1; r++) {
        float *yr = a->y + (size_t)r * w;
        for (int i = 0; i < w; i++)
            yr[i] = 0.0f;
        for (int j = 0; j < nt; j++) {
            long b = nd_layout_back(a->L, r, j);
            if (b < 0)
                break;
            const float *src = a->x + (size_t)b * w, *tj = a->taps + (size_t)j * w;
            for (int i = 0; i < w; i++)
                yr[i] += tj[i] * src[i];
        }
    }
}

void cpu_qkv_taps(const nd_backend *be, float *y, const float *x, const float *taps,
                  const nd_layout *L, int width, int ntaps, int window)
{
    (void)be;
    qkv_taps_args a = {y, x, taps, L, width, ntaps, window};
    nd_parallel_for(L->N, 1, qkv_taps_rows, &a);
}

typedef struct {
    float *dx, *dtaps;
    const float *dy, *x;
    const float *taps;
    const nd_layout *L;
    int width, ntaps, window;
} qkv_taps_bwd_args;

/* column chunks of 64 channels: every row's scatter into dx and every
 * tap's sum over rows stay within a chunk, in row order (deterministic) */
static void qkv_taps_bwd_chunks(void *p, long c0, long c1, int tid)
{
    (void)tid;
    const qkv_taps_bwd_args *a = p;
    int w = a->width, nt = taps_used(a->ntaps, a->window);
    long N = a->L->N;
    for (long c = c0; c < c1; c++) {
        int i0 = (int)c * 64, i1 = i0 + 64 < w ? i0 + 64 : w;
        for (long r = 0; r < N; r++)
            for (int i = i0; i < i1; i++)
                a->dx[(size_t)r * w + i] = 0.0f;
        for (int j = 0; j < nt; j++) {
            const float *tj = a->taps + (size_t)j * w;
            float *dtj = a->dtaps ? a->dtaps + (size_t)j * w : NULL;
            for (long r = 0; r < N; r++) {
                long b = nd_layout_back(a->L, r, j);
                if (b < 0)
                    continue;
                const float *dyr = a->dy + (size_t)r * w, *xb = a->x + (size_t)b * w;
                float *dxb = a->dx + (size_t)b * w;
                for (int i = i0; i < i1; i++) {
                    dxb[i] += tj[i] * dyr[i];
                    if (dtj)
                        dtj[i] += dyr[i] * xb[i];
                }
            }
        }
    }
}

void cpu_qkv_taps_backward(const nd_backend *be, float *dx, float *dtaps, const float *dy,
                           const float *x, const float *taps, const nd_layout *L, int width,
                           int ntaps, int window)
{
    (void)be;
    qkv_taps_bwd_args a = {dx, dtaps, dy, x, taps, L, width, ntaps, window};
    nd_parallel_for((width + 63) / 64, 1, qkv_taps_bwd_chunks, &a);
}

typedef struct {
    float *o, *dg;
    const float *att, *g, *dout;
    int H, hd;
} gate_heads_args;

static void gate_heads_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const gate_heads_args *a = p;
    int H = a->H, hd = a->hd;
    for (long r = r0; r < r1; r++)
        for (int h = 0; h < H; h++) {
            float s = san_sigmoid(a->g[(size_t)r * H + h]);
            const float *x = a->att + ((size_t)r * H + h) * hd;
            float *y = a->o + ((size_t)r * H + h) * hd;
            for (int i = 0; i < hd; i++)
                y[i] = x[i] * s;
        }
}

void cpu_gate_heads(const nd_backend *be, float *o, const float *att, const float *g, long N, int H,
                    int hd)
{
    (void)be;
    gate_heads_args a = {o, NULL, att, g, NULL, H, hd};
    nd_parallel_for(N, 1, gate_heads_rows, &a);
}

static void gate_heads_bwd_rows(void *p, long r0, long r1, int tid)
{
    (void)tid;
    const gate_heads_args *a = p;
    int H = a->H, hd = a->hd;
    for (long r = r0; r < r1; r++)
        for (int h = 0; h < H; h++) {
            float s = san_sigmoid(a->g[(size_t)r * H + h]);
            const float *x = a->att + ((size_t)r * H + h) * hd;
            const float *dy = a->dout + ((size_t)r * H + h) * hd;
            float *dx = a->o + ((size_t)r * H + h) * hd; /* datt */
            float acc = 0.0f;
            for (int i = 0; i < hd; i++) {
                acc += dy[i] * x[i];
                dx[i] = dy[i] * s; /* after reading dy[i]: datt may alias dout */
            }
            a->dg[(size_t)r * H + h] = acc * s * (1.0f - s);
        }
}

void cpu_gate_heads_backward(const nd_backend *be, float *datt, float *dg, const float *dout,
                             const float *att, const float *g, long N, int H, int hd)
{
    (void)be;
    gate_heads_args a = {datt, dg, att, g, dout, H, hd};
    nd_parallel_for(N, 1, gate_heads_bwd_rows, &a);
}
