/* Causal grouped-query attention over a segment layout, flash style: no
 * T x T buffers, scores live one 32-wide tile at a time.
 *
 * A query at position t of segment s sees two key spans: every row of s's
 * parent (the shared prefix, plen rows) and the rows of s up to itself. We
 * number a block's keys kk = 0 .. plen + t1 - 1: kk < plen is parent row
 * kk, else own row kk - plen; query t sees kk <= plen + t.
 *
 * Work blocks are ATT_BLOCK consecutive rows of one segment (dev_layout's
 * blk_seg/blk_t0), 4 warps x 4 rows. Inside a warp a tile puts one key (or
 * query) on each lane for the dot products, then broadcasts the lane
 * values with shuffles while each lane accumulates dims lane + 32c.
 *
 * forward   (block of queries, head): online softmax; out, lse.
 * dq        (block of queries, head): p = exp(s - lse), ds = p (dp - D).
 * dk, dv    (block of keys, kv head): every query that sees these keys,
 *           for each head of the group: the own segment's queries at or
 *           after the key, then (a parent) all rows of each child in
 *           order. One writer per dk/dv row: deterministic, no atomics.
 *
 * attention_ext generalises all three: v (and out, dout) have head dim vd
 * (q and k hd), and a window > 0 hides keys more than window - 1 before
 * the query (in key order: kk >= first_key(plen + t)); attention is the
 * case vd = hd, window 0. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_common.cuh"

#define ATT_THREADS (ATT_WARPS * 32)
#define NEG_INF (-INFINITY)

/* key kk of a block in segment sg (parent span first) -> row */
__device__ __forceinline__ long key_row(const nd_segment &sg, int p0, int plen, int kk)
{
    return kk < plen ? (long)p0 + kk : (long)sg.start + (kk - plen);
}

/* the first key a query whose last key is `last` sees (window 0: all) */
__device__ __forceinline__ int first_key(int last, int window)
{
    return window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
}

__device__ __forceinline__ float dot_shared(const float *a, const float *b, int hd)
{
    float s = 0.0f;
    for (int i = 0; i < hd; i++)
        s += a[i] * b[i];
    return s;
}

/* ---- forward ---- */

template <int CH>
__global__ void __launch_bounds__(ATT_THREADS)
    k_attention(float *out, float *lse, const float *q, const float *k, const float *v,
                dev_layout L, int H, int G, int hd, int vd, int window, float scale)
{
    extern __shared__ float att_sh[];
    int kst = hd + 1, vst = vd + 1; /* padded strides: lane j reading row j is conflict-free */
    float *Qs = att_sh, *Ks = Qs + ATT_BLOCK * hd, *Vs = Ks + ATT_TILE * kst;
    int b = blockIdx.x, h = blockIdx.y, g = h / (H / G);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const nd_segment sg = L.seg[L.blk_seg[b]];
    int plen = sg.parent >= 0 ? L.seg[sg.parent].len : 0;
    int p0 = sg.parent >= 0 ? L.seg[sg.parent].start : 0;
    int t0 = L.blk_t0[b], t1 = min(t0 + ATT_BLOCK, sg.len);
    int qs = H * hd, ks = G * hd, vs = G * vd, os = H * vd, nkeys = plen + t1;
    int kstart = first_key(plen + t0, window) / ATT_TILE * ATT_TILE;

    for (int e = threadIdx.x; e < ATT_BLOCK * hd; e += blockDim.x) {
        int rr = e / hd, i = e % hd, t = t0 + rr;
        Qs[e] = t < t1 ? q[((long)sg.start + t) * qs + (long)h * hd + i] : 0.0f;
    }
    float acc[ATT_ROWS][CH], m[ATT_ROWS], l[ATT_ROWS];
#pragma unroll
    for (int rr = 0; rr < ATT_ROWS; rr++) {
        m[rr] = NEG_INF;
        l[rr] = 0.0f;
#pragma unroll
        for (int c = 0; c < CH; c++)
            acc[rr][c] = 0.0f;
    }
    for (int k0 = kstart; k0 < nkeys; k0 += ATT_TILE) {
        __syncthreads(); /* Qs loaded; the previous tile is no longer read */
        for (int e = threadIdx.x; e < ATT_TILE * hd; e += blockDim.x) {
            int j = e / hd, i = e % hd, kk = k0 + j;
            Ks[j * kst + i] =
                kk < nkeys ? k[key_row(sg, p0, plen, kk) * ks + (long)g * hd + i] : 0.0f;
        }
        for (int e = threadIdx.x; e < ATT_TILE * vd; e += blockDim.x) {
            int j = e / vd, i = e % vd, kk = k0 + j;
            Vs[j * vst + i] =
                kk < nkeys ? v[key_row(sg, p0, plen, kk) * vs + (long)g * vd + i] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < ATT_ROWS; rr++) {
            int qi = w * ATT_ROWS + rr, t = t0 + qi; /* warp-uniform */
            int last = plen + t, lo = first_key(last, window);
            /* a tile with no visible key is skipped: every other has one */
            if (t >= t1 || k0 > last || k0 + ATT_TILE <= lo)
                continue;
            int kk = k0 + lane;
            bool vis = kk <= last && kk >= lo;
            float s = vis ? scale * dot_shared(Qs + qi * hd, Ks + lane * kst, hd) : NEG_INF;
            float mt = warp_max(s), mnew = fmaxf(m[rr], mt);
            float corr = san_expf(m[rr] - mnew); /* 0 on the first tile (m = -inf) */
            float p = vis ? san_expf(s - mnew) : 0.0f;
            l[rr] = l[rr] * corr + warp_sum(p);
            m[rr] = mnew;
#pragma unroll
            for (int c = 0; c < CH; c++)
                acc[rr][c] *= corr;
            for (int j = 0; j < ATT_TILE; j++) {
                float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
                for (int c = 0; c < CH; c++) {
                    int i = lane + 32 * c;
                    if (i < vd)
                        acc[rr][c] += pj * Vs[j * vst + i];
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < ATT_ROWS; rr++) {
        int t = t0 + w * ATT_ROWS + rr;
        if (t >= t1)
            continue;
        long row = (long)sg.start + t;
        float inv = 1.0f / l[rr];
#pragma unroll
        for (int c = 0; c < CH; c++) {
            int i = lane + 32 * c;
            if (i < vd)
                out[row * os + (long)h * vd + i] = acc[rr][c] * inv;
        }
        if (lse && lane == 0)
            lse[row * H + h] = m[rr] + logf(l[rr]);
    }
}

static void check_heads(int H, int G, int hd, int vd)
{
    if (hd < 1 || hd > ATT_MAX_HD || vd < 1 || vd > ATT_MAX_HD || G < 1 || H % G) {
        fprintf(stderr,
                "needle cuda: attention with %d heads, %d kv heads, head dims %d/%d "
                "(need H a multiple of G, head dims 1..%d)\n",
                H, G, hd, vd, ATT_MAX_HD);
        abort();
    }
}

/* dynamic shared memory over the default 48 KB needs an opt-in per kernel */
template <typename K> static void allow_shared(K kernel, size_t bytes)
{
    if (bytes > 48 * 1024)
        CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <int CH>
static void attention_launch(cuda_ctx *C, float *out, float *lse, const float *q, const float *k,
                             const float *v, const dev_layout &L, int H, int G, int hd, int vd,
                             int window)
{
    size_t sh = sizeof(float) * ((size_t)ATT_BLOCK * hd + (size_t)ATT_TILE * (hd + 1) +
                                 (size_t)ATT_TILE * (vd + 1));
    allow_shared(k_attention<CH>, sh);
    dim3 grid((unsigned)L.n_blk, (unsigned)H);
    k_attention<CH><<<grid, ATT_THREADS, sh, C->stream>>>(out, lse, q, k, v, L, H, G, hd, vd,
                                                          window, 1.0f / sqrtf((float)hd));
    CUDA_LAUNCHED();
}

void cuda_attention(const nd_backend *be, float *out, float *lse, const float *q, const float *k,
                    const float *v, const nd_layout *L, int H, int G, int hd)
{
    cuda_attention_ext(be, out, lse, q, k, v, L, H, G, hd, hd, 0);
}

void cuda_attention_ext(const nd_backend *be, float *out, float *lse, const float *q,
                        const float *k, const float *v, const nd_layout *L, int H, int G, int hd,
                        int vd, int window)
{
    if (L->N <= 0 || L->n_seg <= 0)
        return;
    check_heads(H, G, hd, vd);
    window = window > 0 ? window : 0;
    cuda_ctx *C = cuda_op_begin(be);
    long N = L->N;
    const float *dq = STAGE(C, q, N * H * hd), *dk = STAGE(C, k, N * G * hd);
    const float *dv = STAGE(C, v, N * G * vd);
    dev_layout dl = cuda_layout(C, L);
    if (dl.n_blk <= 0)
        return;
    switch (((hd > vd ? hd : vd) + 31) / 32) {
    case 1: attention_launch<1>(C, out, lse, dq, dk, dv, dl, H, G, hd, vd, window); break;
    case 2: attention_launch<2>(C, out, lse, dq, dk, dv, dl, H, G, hd, vd, window); break;
    case 3: attention_launch<3>(C, out, lse, dq, dk, dv, dl, H, G, hd, vd, window); break;
    default: attention_launch<4>(C, out, lse, dq, dk, dv, dl, H, G, hd, vd, window); break;
    }
}

/* ---- backward ---- */

/* D[r, h] = <dout, out> of each query row and head, one thread each,
 * summed in index order as the CPU does: ds = p (dp - D) cancels where a
 * query sees few keys (a sliding window), so D should round like the
 * reference's */
__global__ void k_attention_rowdot(float *D, const float *dout, const float *out, long N, int H,
                                   int hd)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * H)
        return;
    const float *a = dout + i * hd, *b = out + i * hd; /* [N, H*hd]: row r head h at i*hd */
    float s = 0.0f;
    for (int c = 0; c < hd; c++)
        s += a[c] * b[c];
    D[i] = s;
}

/* dq for a block of queries and one head: p = exp(scale q.k - lse),
 * dp = dout.v, ds = p (dp - D), dq = scale * sum ds k */
template <int CH>
__global__ void __launch_bounds__(ATT_THREADS)
    k_attention_dq(float *dq, const float *dout, const float *q, const float *k, const float *v,
                   const float *lse, const float *D, dev_layout L, int H, int G, int hd, int vd,
                   int window, float scale)
{
    extern __shared__ float att_sh[];
    int kst = hd + 1, vst = vd + 1;
    float *Qs = att_sh, *dOs = Qs + ATT_BLOCK * hd, *Ks = dOs + ATT_BLOCK * vd,
          *Vs = Ks + ATT_TILE * kst;
    int b = blockIdx.x, h = blockIdx.y, g = h / (H / G);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const nd_segment sg = L.seg[L.blk_seg[b]];
    int plen = sg.parent >= 0 ? L.seg[sg.parent].len : 0;
    int p0 = sg.parent >= 0 ? L.seg[sg.parent].start : 0;
    int t0 = L.blk_t0[b], t1 = min(t0 + ATT_BLOCK, sg.len);
    int qs = H * hd, ks = G * hd, vs = G * vd, os = H * vd, nkeys = plen + t1;
    int kstart = first_key(plen + t0, window) / ATT_TILE * ATT_TILE;

    for (int e = threadIdx.x; e < ATT_BLOCK * hd; e += blockDim.x) {
        int rr = e / hd, i = e % hd, t = t0 + rr;
        Qs[e] = t < t1 ? q[((long)sg.start + t) * qs + (long)h * hd + i] : 0.0f;
    }
    for (int e = threadIdx.x; e < ATT_BLOCK * vd; e += blockDim.x) {
        int rr = e / vd, i = e % vd, t = t0 + rr;
        dOs[e] = t < t1 ? dout[((long)sg.start + t) * os + (long)h * vd + i] : 0.0f;
    }
    float rl[ATT_ROWS], rD[ATT_ROWS], acc[ATT_ROWS][CH];
#pragma unroll
    for (int rr = 0; rr < ATT_ROWS; rr++) {
        int t = t0 + w * ATT_ROWS + rr;
        long row = (long)sg.start + (t < t1 ? t : t0);
        rl[rr] = lse[row * H + h];
        rD[rr] = D[row * H + h];
#pragma unroll
        for (int c = 0; c < CH; c++)
            acc[rr][c] = 0.0f;
    }
    for (int k0 = kstart; k0 < nkeys; k0 += ATT_TILE) {
        __syncthreads();
        for (int e = threadIdx.x; e < ATT_TILE * hd; e += blockDim.x) {
            int j = e / hd, i = e % hd, kk = k0 + j;
            Ks[j * kst + i] =
                kk < nkeys ? k[key_row(sg, p0, plen, kk) * ks + (long)g * hd + i] : 0.0f;
        }
        for (int e = threadIdx.x; e < ATT_TILE * vd; e += blockDim.x) {
            int j = e / vd, i = e % vd, kk = k0 + j;
            Vs[j * vst + i] =
                kk < nkeys ? v[key_row(sg, p0, plen, kk) * vs + (long)g * vd + i] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < ATT_ROWS; rr++) {
            int qi = w * ATT_ROWS + rr, t = t0 + qi;
            int last = plen + t, lo = first_key(last, window);
            if (t >= t1 || k0 > last || k0 + ATT_TILE <= lo)
                continue;
            int kk = k0 + lane;
            float ds = 0.0f;
            if (kk <= last && kk >= lo) {
                float s = scale * dot_shared(Qs + qi * hd, Ks + lane * kst, hd);
                float p = san_expf(s - rl[rr]);
                float dp = dot_shared(dOs + qi * vd, Vs + lane * vst, vd);
                ds = p * (dp - rD[rr]);
            }
            for (int j = 0; j < ATT_TILE; j++) {
                float dj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
                for (int c = 0; c < CH; c++) {
                    int i = lane + 32 * c;
                    if (i < hd)
                        acc[rr][c] += dj * Ks[j * kst + i];
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < ATT_ROWS; rr++) {
        int t = t0 + w * ATT_ROWS + rr;
        if (t >= t1)
            continue;
        long row = (long)sg.start + t;
#pragma unroll
        for (int c = 0; c < CH; c++) {
            int i = lane + 32 * c;
            if (i < hd)
                dq[row * qs + (long)h * hd + i] = scale * acc[rr][c];
        }
    }
}

/* One query tile of a dk/dv block: queries rows [q0, q0 + nq) (head h);
 * causal: query position (row - own segment start) must be >= the key's
 * position, else (a child's rows) every key is seen. */
template <int CH>
__device__ __forceinline__ void
dkdv_tile(float (&adk)[ATT_ROWS][CH], float (&adv)[ATT_ROWS][CH], float *Qt, float *dOt, float *lt,
          float *Dt, const float *Kb, const float *Vb, const float *q, const float *dout,
          const float *lse, const float *D, long q0, int nq, int qpos0, int causal, int qoff,
          int window, int u0, int nkb, int H, int h, int hd, int vd, float scale)
{
    int kst = hd + 1, vst = vd + 1, qs = H * hd, os = H * vd;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    __syncthreads(); /* the previous tile is no longer read */
    for (int e = threadIdx.x; e < ATT_TILE * hd; e += blockDim.x) {
        int j = e / hd, i = e % hd;
        Qt[j * kst + i] = j < nq ? q[(q0 + j) * qs + (long)h * hd + i] : 0.0f;
    }
    for (int e = threadIdx.x; e < ATT_TILE * vd; e += blockDim.x) {
        int j = e / vd, i = e % vd;
        dOt[j * vst + i] = j < nq ? dout[(q0 + j) * os + (long)h * vd + i] : 0.0f;
    }
    for (int j = threadIdx.x; j < ATT_TILE; j += blockDim.x) {
        lt[j] = j < nq ? lse[(q0 + j) * H + h] : 0.0f;
        Dt[j] = j < nq ? D[(q0 + j) * H + h] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < ATT_ROWS; rr++) {
        int ki = w * ATT_ROWS + rr, u = u0 + ki; /* the key's position in its segment */
        if (ki >= nkb)
            continue;
        /* this lane's query sees key u? (warp-uniform skip when none does) */
        /* window: the query's key index (qoff + its position) - the key's */
        int sees = lane < nq && (!causal || qpos0 + lane >= u) &&
                   (window <= 0 || qoff + qpos0 + lane - u < window);
        if (!__any_sync(0xffffffffu, sees))
            continue;
        float p = 0.0f, ds = 0.0f;
        if (sees) {
            float s = scale * dot_shared(Qt + lane * kst, Kb + ki * hd, hd);
            p = san_expf(s - lt[lane]);
            float dp = dot_shared(dOt + lane * vst, Vb + ki * vd, vd);
            ds = p * (dp - Dt[lane]);
        }
        for (int j = 0; j < ATT_TILE; j++) {
            float pj = __shfl_sync(0xffffffffu, p, j), dj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
            for (int c = 0; c < CH; c++) {
                int i = lane + 32 * c;
                if (i < vd)
                    adv[rr][c] += pj * dOt[j * vst + i];
                if (i < hd)
                    adk[rr][c] += dj * Qt[j * kst + i];
            }
        }
    }
}

template <int CH>
__global__ void __launch_bounds__(ATT_THREADS)
    k_attention_dkdv(float *dk, float *dv, const float *dout, const float *q, const float *k,
                     const float *v, const float *lse, const float *D, dev_layout L, int H, int G,
                     int hd, int vd, int window, float scale)
{
    extern __shared__ float att_sh[];
    int kst = hd + 1, vst = vd + 1;
    float *Kb = att_sh, *Vb = Kb + ATT_BLOCK * hd, *Qt = Vb + ATT_BLOCK * vd,
          *dOt = Qt + ATT_TILE * kst, *lt = dOt + ATT_TILE * vst, *Dt = lt + ATT_TILE;
    int b = blockIdx.x, g = blockIdx.y, rep = H / G;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int s = L.blk_seg[b];
    const nd_segment sg = L.seg[s];
    int u0 = L.blk_t0[b], nkb = min(ATT_BLOCK, sg.len - u0);
    int ks = G * hd, vs = G * vd;
    /* queries past this key index see none of the block's keys (window) */
    int qend = window > 0 ? u0 + nkb - 1 + window : 0x7fffffff;

    for (int e = threadIdx.x; e < ATT_BLOCK * hd; e += blockDim.x) {
        int kr = e / hd, i = e % hd;
        Kb[e] = kr < nkb ? k[((long)sg.start + u0 + kr) * ks + (long)g * hd + i] : 0.0f;
    }
    for (int e = threadIdx.x; e < ATT_BLOCK * vd; e += blockDim.x) {
        int kr = e / vd, i = e % vd;
        Vb[e] = kr < nkb ? v[((long)sg.start + u0 + kr) * vs + (long)g * vd + i] : 0.0f;
    }
    float adk[ATT_ROWS][CH], adv[ATT_ROWS][CH];
#pragma unroll
    for (int rr = 0; rr < ATT_ROWS; rr++)
#pragma unroll
        for (int c = 0; c < CH; c++) {
            adk[rr][c] = 0.0f;
            adv[rr][c] = 0.0f;
        }
    for (int h = g * rep; h < (g + 1) * rep; h++) {
        /* the own segment's queries from the block's first key on */
        for (int t = u0; t < sg.len && t < qend; t += ATT_TILE) {
            int nq = min(ATT_TILE, sg.len - t);
            dkdv_tile<CH>(adk, adv, Qt, dOt, lt, Dt, Kb, Vb, q, dout, lse, D, (long)sg.start + t,
                          nq, t, 1, 0, window, u0, nkb, H, h, hd, vd, scale);
        }
        /* a shared prefix: every row of every continuation sees it all */
        for (int ci = L.child_off[s]; ci < L.child_off[s + 1]; ci++) {
            const nd_segment ch = L.seg[L.child[ci]];
            for (int t = 0; t < ch.len && sg.len + t < qend; t += ATT_TILE) {
                int nq = min(ATT_TILE, ch.len - t);
                dkdv_tile<CH>(adk, adv, Qt, dOt, lt, Dt, Kb, Vb, q, dout, lse, D,
                              (long)ch.start + t, nq, t, 0, sg.len, window, u0, nkb, H, h, hd, vd,
                              scale);
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < ATT_ROWS; rr++) {
        int ki = w * ATT_ROWS + rr;
        if (ki >= nkb)
            continue;
        long row = (long)sg.start + u0 + ki;
#pragma unroll
        for (int c = 0; c < CH; c++) {
            int i = lane + 32 * c;
            if (i < hd)
                dk[row * ks + (long)g * hd + i] = scale * adk[rr][c];
            if (i < vd)
                dv[row * vs + (long)g * vd + i] = adv[rr][c];
        }
    }
}

template <int CH>
static void attention_backward_launch(cuda_ctx *C, float *dq, float *dk, float *dv,
                                      const float *dout, const float *q, const float *k,
                                      const float *v, const float *lse, const float *D,
                                      const dev_layout &L, int H, int G, int hd, int vd, int window)
{
    float scale = 1.0f / sqrtf((float)hd);
    size_t tiles = (size_t)ATT_TILE * (hd + 1) + (size_t)ATT_TILE * (vd + 1);
    size_t sh_dq = sizeof(float) * ((size_t)ATT_BLOCK * (hd + vd) + tiles);
    allow_shared(k_attention_dq<CH>, sh_dq);
    k_attention_dq<CH><<<dim3((unsigned)L.n_blk, (unsigned)H), ATT_THREADS, sh_dq, C->stream>>>(
        dq, dout, q, k, v, lse, D, L, H, G, hd, vd, window, scale);
    CUDA_LAUNCHED();
    size_t sh_kv = sizeof(float) * ((size_t)ATT_BLOCK * (hd + vd) + tiles + 2 * (size_t)ATT_TILE);
    allow_shared(k_attention_dkdv<CH>, sh_kv);
    k_attention_dkdv<CH><<<dim3((unsigned)L.n_blk, (unsigned)G), ATT_THREADS, sh_kv, C->stream>>>(
        dk, dv, dout, q, k, v, lse, D, L, H, G, hd, vd, window, scale);
    CUDA_LAUNCHED();
}

void cuda_attention_backward(const nd_backend *be, float *dq, float *dk, float *dv,
                             const float *dout, const float *q, const float *k, const float *v,
                             const float *out, const float *lse, const nd_layout *L, int H, int G,
                             int hd)
{
    cuda_attention_ext_backward(be, dq, dk, dv, dout, q, k, v, out, lse, L, H, G, hd, hd, 0);
}

void cuda_attention_ext_backward(const nd_backend *be, float *dq, float *dk, float *dv,
                                 const float *dout, const float *q, const float *k, const float *v,
                                 const float *out, const float *lse, const nd_layout *L, int H,
                                 int G, int hd, int vd, int window)
{
    if (L->N <= 0 || L->n_seg <= 0)
        return;
    check_heads(H, G, hd, vd);
    window = window > 0 ? window : 0;
    cuda_ctx *C = cuda_op_begin(be);
    long N = L->N;
    const float *ddo = STAGE(C, dout, N * H * vd), *dqin = STAGE(C, q, N * H * hd);
    const float *dkin = STAGE(C, k, N * G * hd), *dvin = STAGE(C, v, N * G * vd);
    const float *dout_fwd = STAGE(C, out, N * H * vd), *dlse = STAGE(C, lse, N * H);
    dev_layout dl = cuda_layout(C, L);
    if (dl.n_blk <= 0)
        return;
    float *D = (float *)cuda_scratch(C, sizeof(float) * (size_t)N * H);
    k_attention_rowdot<<<cuda_blocks(N * H, 128), 128, 0, C->stream>>>(D, ddo, dout_fwd, N, H, vd);
    CUDA_LAUNCHED();
#define ATT_BWD(CH)                                                                                \
    attention_backward_launch<CH>(C, dq, dk, dv, ddo, dqin, dkin, dvin, dlse, D, dl, H, G, hd, vd, \
                                  window)
    switch (((hd > vd ? hd : vd) + 31) / 32) {
    case 1: ATT_BWD(1); break;
    case 2: ATT_BWD(2); break;
    case 3: ATT_BWD(3); break;
    default: ATT_BWD(4); break;
    }
#undef ATT_BWD
}
