/* Causal grouped-query attention on the CPU, forward and backward, over a
 * segment layout (backend/layout.h).
 *
 * A query row of segment s sees two key spans: all rows of s's parent (the
 * shared prefix, when there is one) and the rows of s up to itself; with a
 * sliding window only the last `window` positions of them. Work is split
 * over (segment, head, block of 64 queries); each block is small GEMMs over
 * the part of the two spans that some query of the block sees (for a
 * window: at most window + 63 keys, whatever the sequence length), written
 * side by side into one score matrix.
 * With the OpenMP build of OpenBLAS, a GEMM inside our parallel region runs
 * on the calling thread, so the two levels do not fight (without OpenMP,
 * cpu_backend.c gives OpenBLAS one thread: our pool is the only level). */
#include "backend/cpu/blas.h"
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"

typedef struct {
    int seg, blk, keys;
} attn_block;

static int by_keys_desc(const void *a, const void *b)
{
    const attn_block *x = a, *y = b;
    if (x->keys != y->keys)
        return x->keys > y->keys ? -1 : 1;
    if (x->seg != y->seg)
        return x->seg < y->seg ? -1 : 1;
    return x->blk < y->blk ? -1 : x->blk > y->blk;
}

static int parent_len(const nd_layout *L, const nd_segment *s)
{
    return s->parent >= 0 ? L->seg[s->parent].len : 0;
}

/* First visible key of a query whose own key index is `last` (keys are
 * indexed by position): everything with a window of 0, else the keys
 * less than `window` positions back. */
static inline int first_key(int last, int window)
{
    return window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
}

/* The keys a block of queries [t0, t1) of a segment with plen parent rows
 * sees, as one span [kl, plen + t1) of key indices (parent rows first, then
 * the segment's own): np of them in the parent (from parent row kl), the
 * rest the own rows from o0. */
typedef struct {
    int kl, keys, np, o0, no;
} key_span;

static inline key_span block_span(int plen, int t0, int t1, int window)
{
    key_span s;
    s.kl = first_key(plen + t0, window);
    s.keys = plen + t1 - s.kl;
    s.np = s.kl < plen ? plen - s.kl : 0;
    s.o0 = s.kl > plen ? s.kl - plen : 0;
    s.no = t1 - s.o0;
    return s;
}

/* Query blocks of every segment, largest key count first (balances the
 * causal triangle under dynamic scheduling). *maxkeys: the widest score row
 * (a block's key span, block_span). */
static attn_block *attn_blocks(const nd_layout *L, int window, long *count, int *maxkeys)
{
    long n = 0;
    *maxkeys = 1;
    for (int s = 0; s < L->n_seg; s++)
        n += (L->seg[s].len + SAN_ATTN_QBLOCK - 1) / SAN_ATTN_QBLOCK;
    attn_block *b = malloc(sizeof *b * (size_t)(n ? n : 1));
    if (!b)
        return NULL;
    long i = 0;
    for (int s = 0; s < L->n_seg; s++) {
        const nd_segment *g = &L->seg[s];
        int plen = parent_len(L, g);
        for (int t0 = 0; t0 < g->len; t0 += SAN_ATTN_QBLOCK) {
            int t1 = t0 + SAN_ATTN_QBLOCK < g->len ? t0 + SAN_ATTN_QBLOCK : g->len;
            int keys = block_span(plen, t0, t1, window).keys;
            b[i++] = (attn_block){s, t0 / SAN_ATTN_QBLOCK, keys};
            *maxkeys = keys > *maxkeys ? keys : *maxkeys;
        }
    }
    qsort(b, (size_t)n, sizeof *b, by_keys_desc);
    *count = n;
    return b;
}

typedef struct {
    float *out, *lse;
    const float *q, *k, *v;
    const nd_layout *L;
    const attn_block *blocks;
    float **scratch; /* one score matrix per thread, made on first use */
    int H, rep, hd, vd, qs, ks, vs, os, maxkeys, window;
    float scale;
} attn_fwd_args;

static void attn_fwd_tasks(void *p, long lo, long hi, int tid)
{
    const attn_fwd_args *a = p;
    const nd_layout *L = a->L;
    int H = a->H, hd = a->hd, vd = a->vd, qs = a->qs, ks = a->ks, vs = a->vs, os = a->os;
    float scale = a->scale;
    if (!a->scratch[tid])
        a->scratch[tid] = cpu_xalloc((size_t)SAN_ATTN_QBLOCK * a->maxkeys * sizeof(float));
    float *S = a->scratch[tid];
    for (long task = lo; task < hi; task++) {
        const attn_block *bk = &a->blocks[task / H];
        int h = (int)(task % H), g = h / a->rep;
        const nd_segment *sg = &L->seg[bk->seg];
        int plen = parent_len(L, sg), p0 = plen ? L->seg[sg->parent].start : 0;
        int t0 = bk->blk * SAN_ATTN_QBLOCK;
        int t1 = t0 + SAN_ATTN_QBLOCK < sg->len ? t0 + SAN_ATTN_QBLOCK : sg->len;
        int rows = t1 - t0;
        key_span sp = block_span(plen, t0, t1, a->window);
        int keys = sp.keys, np = sp.np;
        long r0 = (long)sg->start + t0;
        const float *Q = a->q + (size_t)r0 * qs + (size_t)h * hd;
        const float *Ks = a->k + (size_t)(sg->start + sp.o0) * ks + (size_t)g * hd;
        const float *Vs = a->v + (size_t)(sg->start + sp.o0) * vs + (size_t)g * vd;
        const float *Kp = a->k + (size_t)(p0 + sp.kl) * ks + (size_t)g * hd;
        const float *Vp = a->v + (size_t)(p0 + sp.kl) * vs + (size_t)g * vd;
        if (np)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, np, hd, scale, Q, qs, Kp, ks,
                        0.0f, S, keys);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, sp.no, hd, scale, Q, qs, Ks, ks,
                    0.0f, S + np, keys);
        for (int r = 0; r < rows; r++) {
            float *s = S + (size_t)r * keys;
            /* span columns lo..last are visible */
            int last = plen + t0 + r - sp.kl;
            int lo = first_key(plen + t0 + r, a->window) - sp.kl;
            float mx = -FLT_MAX;
            for (int j = lo; j <= last; j++)
                mx = s[j] > mx ? s[j] : mx;
            float sum = 0.0f;
            for (int j = 0; j < lo; j++)
                s[j] = 0.0f;
            for (int j = lo; j <= last; j++) {
                s[j] = san_expf(s[j] - mx);
                sum += s[j];
            }
            float inv = 1.0f / sum;
            for (int j = lo; j <= last; j++)
                s[j] *= inv;
            for (int j = last + 1; j < keys; j++)
                s[j] = 0.0f;
            if (a->lse)
                a->lse[(size_t)(r0 + r) * H + h] = mx + logf(sum);
        }
        float *O = a->out + (size_t)r0 * os + (size_t)h * vd;
        if (np)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, vd, np, 1.0f, S, keys, Vp,
                        vs, 0.0f, O, os);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, vd, sp.no, 1.0f, S + np, keys,
                    Vs, vs, np ? 1.0f : 0.0f, O, os);
    }
}

/* per-thread scratch, indexed by tid (tid < nd_get_threads()) */
static float **scratch_new(int *count)
{
    *count = nd_get_threads();
    float **s = calloc((size_t)*count, sizeof *s);
    if (!s)
        abort();
    return s;
}

static void scratch_free(float **s, int count)
{
    for (int i = 0; i < count; i++)
        free(s[i]);
    free(s);
}

void cpu_attention(const nd_backend *be, float *out, float *lse, const float *q, const float *k,
                   const float *v, const nd_layout *L, int H, int G, int hd)
{
    cpu_attention_ext(be, out, lse, q, k, v, L, H, G, hd, hd, 0);
}

void cpu_attention_ext(const nd_backend *be, float *out, float *lse, const float *q, const float *k,
                       const float *v, const nd_layout *L, int H, int G, int hd, int vd, int window)
{
    (void)be;
    long nb;
    int maxkeys, nscratch;
    attn_block *blocks = attn_blocks(L, window, &nb, &maxkeys);
    if (!blocks)
        abort(); /* a few bytes per block: nothing sensible to do without them */
    attn_fwd_args a = {.out = out,
                       .lse = lse,
                       .q = q,
                       .k = k,
                       .v = v,
                       .L = L,
                       .blocks = blocks,
                       .scratch = scratch_new(&nscratch),
                       .H = H,
                       .rep = H / G,
                       .hd = hd,
                       .vd = vd,
                       .qs = H * hd,
                       .ks = G * hd,
                       .vs = G * vd,
                       .os = H * vd,
                       .maxkeys = maxkeys,
                       .window = window,
                       .scale = 1.0f / sqrtf((float)hd)};
    nd_parallel_for_dynamic(nb * H, 1, attn_fwd_tasks, &a);
    scratch_free(a.scratch, nscratch);
    free(blocks);
}

typedef struct {
    float *dq, *dk, *dv, *pbuf;
    const float *dout, *q, *k, *v, *out, *lse;
    const nd_layout *L;
    const size_t *poff;
    float **scratch; /* P, dP and D per thread, made on first use */
    int H, G, rep, hd, vd, qs, ks, vs, os, maxkeys, window;
    float scale;
} attn_bwd_args;

/* tasks [lo, hi): (segment, kv head) pairs */
static void attn_bwd_tasks(void *p, long lo, long hi, int tid)
{
    const attn_bwd_args *a = p;
    const nd_layout *L = a->L;
    int H = a->H, G = a->G, rep = a->rep, hd = a->hd, vd = a->vd, qs = a->qs, ks = a->ks;
    int vs = a->vs, os = a->os;
    float scale = a->scale;
    const float *q = a->q, *k = a->k, *v = a->v, *lse = a->lse;
    float *dq = a->dq;
    size_t bs = (size_t)SAN_ATTN_QBLOCK * a->maxkeys;
    if (!a->scratch[tid])
        a->scratch[tid] = cpu_xalloc((2 * bs + SAN_ATTN_QBLOCK) * sizeof(float));
    float *Pb = a->scratch[tid], *dP = Pb + bs, *Dr = dP + bs;
    for (long task = lo; task < hi; task++) {
        int s = (int)(task / G), g = (int)(task % G);
        const nd_segment *sg = &L->seg[s];
        int plen = parent_len(L, sg), p0 = plen ? L->seg[sg->parent].start : 0, T = sg->len;
        size_t kv0 = (size_t)sg->start * ks + (size_t)g * hd;
        size_t vv0 = (size_t)sg->start * vs + (size_t)g * vd;
        const float *Ks = k + kv0, *Vs = v + vv0;
        const float *Kp = k + (size_t)p0 * ks + (size_t)g * hd;
        const float *Vp = v + (size_t)p0 * vs + (size_t)g * vd;
        float *dKs = a->dk + kv0, *dVs = a->dv + vv0;
        float *dKp = plen ? a->pbuf + a->poff[s] + (size_t)plen * (hd + vd) * g : NULL;
        float *dVp = plen ? dKp + (size_t)plen * hd : NULL;
        for (int t = 0; t < T; t++) {
            for (int i = 0; i < hd; i++)
                dKs[(size_t)t * ks + i] = 0.0f;
            for (int i = 0; i < vd; i++)
                dVs[(size_t)t * vs + i] = 0.0f;
        }
        if (plen)
            memset(dKp, 0, sizeof(float) * (size_t)plen * (hd + vd));
        for (int h = g * rep; h < (g + 1) * rep; h++)
            for (int t0 = 0; t0 < T; t0 += SAN_ATTN_QBLOCK) {
                int t1 = t0 + SAN_ATTN_QBLOCK < T ? t0 + SAN_ATTN_QBLOCK : T;
                int rows = t1 - t0;
                key_span sp = block_span(plen, t0, t1, a->window);
                int keys = sp.keys, np = sp.np, no = sp.no;
                long r0 = (long)sg->start + t0;
                /* the span's parent rows from kl, own rows from o0 */
                const float *Kpb = Kp + (size_t)sp.kl * ks, *Vpb = Vp + (size_t)sp.kl * vs;
                const float *Ksb = Ks + (size_t)sp.o0 * ks, *Vsb = Vs + (size_t)sp.o0 * vs;
                float *dKpb = np ? dKp + (size_t)sp.kl * hd : NULL;
                float *dVpb = np ? dVp + (size_t)sp.kl * vd : NULL;
                float *dKsb = dKs + (size_t)sp.o0 * ks, *dVsb = dVs + (size_t)sp.o0 * vs;
                size_t qo = (size_t)r0 * qs + (size_t)h * hd;
                size_t oo = (size_t)r0 * os + (size_t)h * vd;
                const float *Q = q + qo, *dO = a->dout + oo, *O = a->out + oo;
                /* P = exp(scale * Q [Kp|Ks]^T - lse), causal in the own span */
                if (np)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, np, hd, scale, Q, qs,
                                Kpb, ks, 0.0f, Pb, keys);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, no, hd, scale, Q, qs,
                            Ksb, ks, 0.0f, Pb + np, keys);
                for (int r = 0; r < rows; r++) {
                    float *pr = Pb + (size_t)r * keys, l = lse[(size_t)(r0 + r) * H + h];
                    int last = plen + t0 + r - sp.kl;
                    int lo = first_key(plen + t0 + r, a->window) - sp.kl;
                    for (int j = 0; j < lo; j++)
                        pr[j] = 0.0f;
                    for (int j = lo; j <= last; j++)
                        pr[j] = san_expf(pr[j] - l);
                    for (int j = last + 1; j < keys; j++)
                        pr[j] = 0.0f;
                    const float *x = dO + (size_t)r * os, *y = O + (size_t)r * os;
                    float acc = 0.0f;
                    for (int i = 0; i < vd; i++)
                        acc += x[i] * y[i];
                    Dr[r] = acc;
                }
                /* dV += P^T dO; dP = dO V^T */
                if (np) {
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, np, vd, rows, 1.0f, Pb,
                                keys, dO, os, 1.0f, dVpb, vd);
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, np, vd, 1.0f, dO, os,
                                Vpb, vs, 0.0f, dP, keys);
                }
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, no, vd, rows, 1.0f, Pb + np,
                            keys, dO, os, 1.0f, dVsb, vs);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, no, vd, 1.0f, dO, os,
                            Vsb, vs, 0.0f, dP + np, keys);
                /* dS = P * (dP - rowsum(dO*O)); masked entries have P = 0 */
                for (int r = 0; r < rows; r++) {
                    float *ds = dP + (size_t)r * keys;
                    const float *pr = Pb + (size_t)r * keys;
                    float D = Dr[r];
                    for (int j = 0; j < keys; j++)
                        ds[j] = pr[j] * (ds[j] - D);
                }
                /* dQ = scale * dS K; dK += scale * dS^T Q */
                if (np) {
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, np, scale, dP,
                                keys, Kpb, ks, 0.0f, dq + qo, qs);
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, np, hd, rows, scale, dP,
                                keys, Q, qs, 1.0f, dKpb, hd);
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, no, scale, dP + np,
                            keys, Ksb, ks, np ? 1.0f : 0.0f, dq + qo, qs);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, no, hd, rows, scale, dP + np,
                            keys, Q, qs, 1.0f, dKsb, ks);
            }
    }
}

/* Parents' rows collect their children's buffers, children in order. Each
 * thread takes the same static share of every child's plen x G items, and
 * children of one parent have the same plen: a parent row has one writer,
 * which adds the children in segment order (no barrier needed). */
static void attn_bwd_parents(void *p, int tid, int team)
{
    const attn_bwd_args *a = p;
    const nd_layout *L = a->L;
    int G = a->G, hd = a->hd, vd = a->vd, ks = a->ks, vs = a->vs;
    for (int s = 0; s < L->n_seg; s++) {
        const nd_segment *sg = &L->seg[s];
        int plen = parent_len(L, sg);
        if (!plen)
            continue;
        int p0 = L->seg[sg->parent].start;
        long x0, x1;
        nd_share((long)plen * G, tid, team, &x0, &x1);
        for (long x = x0; x < x1; x++) {
            int t = (int)(x / G), g = (int)(x % G);
            const float *srck = a->pbuf + a->poff[s] + (size_t)plen * (hd + vd) * g;
            const float *src = srck + (size_t)t * hd,
                        *srcv = srck + (size_t)plen * hd + (size_t)t * vd;
            float *dK = a->dk + (size_t)(p0 + t) * ks + (size_t)g * hd;
            float *dV = a->dv + (size_t)(p0 + t) * vs + (size_t)g * vd;
            for (int i = 0; i < hd; i++)
                dK[i] += src[i];
            for (int i = 0; i < vd; i++)
                dV[i] += srcv[i];
        }
    }
}

/* Flash-style backward: probabilities are recomputed per 64-query block
 * from q, k and the saved lse. One task owns a (segment, kv head) pair and
 * walks all query heads of its group, so the segment's own dk/dv rows have
 * a single writer. What a segment's queries send to its parent's keys goes
 * to a private buffer, summed into the parent's rows afterwards in segment
 * order (deterministic for any thread count). */
void cpu_attention_backward(const nd_backend *be, float *dq, float *dk, float *dv,
                            const float *dout, const float *q, const float *k, const float *v,
                            const float *out, const float *lse, const nd_layout *L, int H, int G,
                            int hd)
{
    cpu_attention_ext_backward(be, dq, dk, dv, dout, q, k, v, out, lse, L, H, G, hd, hd, 0);
}

void cpu_attention_ext_backward(const nd_backend *be, float *dq, float *dk, float *dv,
                                const float *dout, const float *q, const float *k, const float *v,
                                const float *out, const float *lse, const nd_layout *L, int H,
                                int G, int hd, int vd, int window)
{
    (void)be;
    int maxkeys = 1, nscratch;
    /* private parent-gradient buffers: [dK | dV] of plen x hd per (child, g) */
    size_t *poff = malloc(sizeof *poff * (size_t)(L->n_seg + 1));
    if (!poff)
        abort();
    size_t ptotal = 0;
    for (int s = 0; s < L->n_seg; s++) {
        int plen = parent_len(L, &L->seg[s]);
        poff[s] = ptotal;
        ptotal += (size_t)plen * (hd + vd) * G;
        int kk = plen + L->seg[s].len;
        if (window > 0 && kk > window + SAN_ATTN_QBLOCK - 1)
            kk = window + SAN_ATTN_QBLOCK - 1; /* the widest block_span */
        maxkeys = kk > maxkeys ? kk : maxkeys;
    }
    attn_bwd_args a = {.dq = dq,
                       .dk = dk,
                       .dv = dv,
                       .pbuf = ptotal ? cpu_xalloc(ptotal * sizeof(float)) : NULL,
                       .dout = dout,
                       .q = q,
                       .k = k,
                       .v = v,
                       .out = out,
                       .lse = lse,
                       .L = L,
                       .poff = poff,
                       .scratch = scratch_new(&nscratch),
                       .H = H,
                       .G = G,
                       .rep = H / G,
                       .hd = hd,
                       .vd = vd,
                       .qs = H * hd,
                       .ks = G * hd,
                       .vs = G * vd,
                       .os = H * vd,
                       .maxkeys = maxkeys,
                       .window = window,
                       .scale = 1.0f / sqrtf((float)hd)};
    nd_parallel_for_dynamic((long)L->n_seg * G, 1, attn_bwd_tasks, &a);
    scratch_free(a.scratch, nscratch);
    if (ptotal)
        nd_parallel_region(0, attn_bwd_parents, &a);
    free(a.pbuf);
    free(poff);
}

typedef struct {
    float *dst;
    const float *src;
    const int32_t *rows;
    long n;
    int d;
} rows_args;

static void gather_range(void *p, long i0, long i1, int tid)
{
    (void)tid;
    const rows_args *a = p;
    for (long i = i0; i < i1; i++)
        memcpy(a->dst + (size_t)i * a->d, a->src + (size_t)a->rows[i] * a->d,
               sizeof(float) * (size_t)a->d);
}

void cpu_gather_rows(const nd_backend *be, float *dst, const float *src, const int32_t *rows,
                     long n, int d)
{
    (void)be;
    rows_args a = {dst, src, rows, n, d};
    nd_parallel_for(n, 1, gather_range, &a);
}

/* column chunks [c0, c1) of 64 floats: each element sums its rows in order i */
static void scatter_add_chunks(void *p, long c0, long c1, int tid)
{
    (void)tid;
    const rows_args *a = p;
    int d = a->d;
    for (long c = c0; c < c1; c++) {
        int j0 = (int)c * 64, j1 = j0 + 64 < d ? j0 + 64 : d;
        for (long i = 0; i < a->n; i++) {
            float *o = a->dst + (size_t)a->rows[i] * d;
            const float *x = a->src + (size_t)i * d;
            for (int j = j0; j < j1; j++)
                o[j] += x[j];
        }
    }
}

void cpu_scatter_add_rows(const nd_backend *be, float *dst, const float *src, const int32_t *rows,
                          long n, int d)
{
    (void)be;
    /* columns split across threads */
    rows_args a = {dst, src, rows, n, d};
    nd_parallel_for((d + 63) / 64, 1, scatter_add_chunks, &a);
}
