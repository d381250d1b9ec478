/* The narrow op interface the model is written against.
 *
 * Every op works on flat float32 arrays; the model code (src/model/san.c)
 * is only a sequence of these calls, so a GPU backend (CUDA, Vulkan)
 * implements this table and nothing else changes. Shapes are row-major; N
 * is the number of token rows. Ops that depend on positions take an
 * nd_layout (backend/layout.h): which rows form which sequence, and which
 * sequences continue a shared prefix.
 *
 * Memory rule (every backend):
 * - An op's outputs (non-const pointers) must lie in memory from alloc.
 * - Its inputs may lie in alloc memory or be plain host memory: a device
 *   backend copies host inputs when the op is issued (fine for token ids,
 *   targets and index lists; big reused data such as weights belongs in
 *   alloc memory, see san_model_to_backend). The layout is host data.
 * - alloc memory is host-accessible (host-visible / managed / unified), but
 *   a device backend may run ops asynchronously, in issue order: call
 *   nd_backend_sync() before the host reads what ops wrote or writes what
 *   issued ops read. Scalar arguments are read at issue time. */
#ifndef ND_BACKEND_H
#define ND_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend/layout.h"

typedef struct nd_backend nd_backend;

struct nd_backend {
    const char *name;
    int threads;
    const char *detail; /* for progress lines, e.g. "OpenBLAS SkylakeX"; may be "" */
    int device;         /* 0: ops run on the host and finish before they return (CPU) */

    /* ready the float compute paths (nd_backend_get calls it; CPU: load
     * the BLAS and name it in detail); ND_OK or an error; NULL: nothing */
    int (*prepare)(const nd_backend *be);

    /* wait until every issued op has finished (NULL: nothing to wait for) */
    void (*sync)(const nd_backend *be);

    void *(*alloc)(const nd_backend *be, size_t bytes); /* zeroed */
    void (*free)(const nd_backend *be, void *p);

    /* C[M,N] = alpha * op(A) @ op(B) + beta * C (row-major, op = transpose if t*) */
    void (*matmul)(const nd_backend *be, int ta, int tb, int M, int N, int K, float alpha,
                   const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

    /* y = x * rstd * (1 + scale) per row of `dim`; scale NULL = plain rms_unit.
     * rstd (rows) may be NULL. Safe in place. */
    void (*rmsnorm)(const nd_backend *be, float *y, float *rstd, const float *x, const float *scale,
                    long rows, int dim);

    /* x0[t] = emb[tok[t]] * scale */
    void (*embed)(const nd_backend *be, float *x0, const float *emb, const int32_t *tok, long N,
                  int d, float scale);

    /* engram table indices [N, K] (docs/model.md §2.2); the n-gram reads the
     * previous tokens of each row's sequence (through its parent) */
    void (*engram_hash)(const nd_backend *be, int32_t *idx, const int32_t *tok, const nd_layout *L,
                        const int *orders, int n_orders, int heads, int slots);
    /* e[r] = concat_k table_k[idx[r,k]] (zero rows while pos[r] < order_k - 1) */
    void (*engram_gather)(const nd_backend *be, float *e, const float *tables, const int32_t *idx,
                          const nd_layout *L, const int *orders, int n_orders, int heads, int slots,
                          int sub);
    /* v[r] = sum_j taps[j] * vp[back(r, j*dil)] (terms before the sequence start are 0) */
    void (*engram_taps)(const nd_backend *be, float *v, const float *vp, const float *taps,
                        const nd_layout *L, int d, int dil);
    /* alpha = sigmoid(<rms_unit(u), rms_unit(k)> / sqrt(d)); bx = u + alpha * v,
     * or bx += alpha * v when accumulate (a second site on the same layer) */
    void (*engram_gate)(const nd_backend *be, float *bx, float *alpha, const float *u,
                        const float *k, const float *v, long N, int d, int accumulate);

    /* hyper-connection coefficients from the three projections of nx:
     * hpre = sigmoid(a_pre*pre + b_pre + 8*lane - 4),
     * hpost = 2*sigmoid(a_post*post + b_post - 4*(1-lane)),
     * M = sinkhorn20(a_res*res + b_res) */
    void (*hyper_coeffs)(const nd_backend *be, float *hpre, float *hpost, float *M,
                         const float *pre, const float *post, const float *res, float a_pre,
                         float a_post, float a_res, const float *b_pre, const float *b_post,
                         const float *b_res, int lane, long N, int n);
    /* u = sum_i hpre_i X_i */
    void (*lanes_combine)(const nd_backend *be, float *u, const float *hpre, const float *X, long N,
                          int n, int d);
    /* Xo_i = sum_j M_ij X_j + hpost_i * y */
    void (*lanes_update)(const nd_backend *be, float *Xo, const float *M, const float *X,
                         const float *hpost, const float *y, long N, int n, int d);
    /* X_i = x0 for every lane */
    void (*lanes_broadcast)(const nd_backend *be, float *X, const float *x0, long N, int n, int d);
    /* xm = mean_i X_i */
    void (*lanes_mean)(const nd_backend *be, float *xm, const float *X, long N, int n, int d);

    /* rotate q or k in place: x is [N, heads*hd], row r at position
     * L->pos[r]; cos/sin are [max position + 1, hd/2] */
    void (*rope)(const nd_backend *be, float *x, const float *cos_t, const float *sin_t,
                 const nd_layout *L, int heads, int hd);
    /* causal GQA attention, scale 1/sqrt(hd): q [N, H*hd], k/v [N, G*hd];
     * a row sees its parent segment's rows and its own segment's rows up to
     * itself; out [N, H*hd]; lse [N, H] = log-sum-exp of each score row */
    void (*attention)(const nd_backend *be, float *out, float *lse, const float *q, const float *k,
                      const float *v, const nd_layout *L, int H, int G, int hd);

    /* o = att * sigmoid(g) */
    void (*gate_sigmoid)(const nd_backend *be, float *o, const float *att, const float *g, long n);
    /* y = x + sigmoid(gate) * r */
    void (*residual_scaled)(const nd_backend *be, float *y, const float *x, const float *r,
                            float gate, long n);
    /* Hadamard MLP: h1 = fwht(d1*pad(z)) [N, hn]; out = (d3 * fwht(silu(d2*h1)))[:d];
     * then y = (x + out) - u  (u may be NULL: y = x + out). h1 is kept for backward. */
    void (*hadamard_mlp)(const nd_backend *be, float *y, float *h1, const float *x, const float *z,
                         const float *u, const float *d1, const float *d2, const float *d3, long N,
                         int d, int hn);

    /* dst[i] = src[rows[i]] (rows of d floats) */
    void (*gather_rows)(const nd_backend *be, float *dst, const float *src, const int32_t *rows,
                        long n, int d);
    /* dst[rows[i]] += src[i]; rows may repeat (summed in order i) */
    void (*scatter_add_rows)(const nd_backend *be, float *dst, const float *src,
                             const int32_t *rows, long n, int d);

    /* per-row cross-entropy: loss[r] = logsumexp(logits[r]) - logits[r][target[r]] */
    void (*cross_entropy)(const nd_backend *be, float *loss, const float *logits,
                          const int32_t *target, long N, int V);

    /* ---- backward ops ----
     * Conventions: d<name> is the gradient w.r.t. <name>. Parameter
     * gradients (dscale, dtaps, dd1, ...) are always ACCUMULATED (+=) and may
     * be NULL when not wanted (frozen). Activation gradients are SET unless
     * the comment says "+=". Reductions over rows are deterministic for a
     * given thread count. */

    /* in place: logits[r] <- weight[r] * (softmax(logits[r]) - onehot(target[r]));
     * weight NULL = all 1 */
    void (*cross_entropy_backward)(const nd_backend *be, float *logits, const int32_t *target,
                                   const float *weight, long N, int V);
    /* y = x*rstd*(1+scale): dx (+= if accumulate, else set), dscale +=;
     * scale NULL = 0 (plain rms_unit), rstd NULL = recomputed; dx may alias dy */
    void (*rmsnorm_backward)(const nd_backend *be, float *dx, float *dscale, const float *dy,
                             const float *x, const float *rstd, const float *scale, long rows,
                             int dim, int accumulate);
    /* demb[tok[t]] += dx0[t] * scale */
    void (*embed_backward)(const nd_backend *be, float *demb, const float *dx0, const int32_t *tok,
                           long N, int d, float scale);
    /* dtables[k][idx] += de rows (rows zeroed in forward get nothing) */
    void (*engram_gather_backward)(const nd_backend *be, float *dtables, const float *de,
                                   const int32_t *idx, const nd_layout *L, const int *orders,
                                   int n_orders, int heads, int slots, int sub);
    /* v = taps conv vp: dvp set (a prefix row also collects from the rows of
     * the segments that continue it), dtaps += */
    void (*engram_taps_backward)(const nd_backend *be, float *dvp, float *dtaps, const float *dv,
                                 const float *vp, const float *taps, const nd_layout *L, int d,
                                 int dil);
    /* bx (+)= alpha*v, alpha = sigmoid(<rms_unit(u), rms_unit(k)>/sqrt(d)): dk +=, dv +=,
     * du += the alpha path only (the u -> bx identity is the caller's) */
    void (*engram_gate_backward)(const nd_backend *be, float *du, float *dk, float *dv,
                                 const float *dbx, const float *u, const float *k, const float *v,
                                 const float *alpha, long N, int d);
    /* hyper_coeffs: dpre/dpost/dres set; da_* (scalars) and db_* += */
    void (*hyper_coeffs_backward)(const nd_backend *be, float *dpre, float *dpost, float *dres,
                                  float *da_pre, float *da_post, float *da_res, float *db_pre,
                                  float *db_post, float *db_res, const float *dhpre,
                                  const float *dhpost, const float *dM, const float *pre,
                                  const float *post, const float *res, const float *hpre,
                                  const float *hpost, float a_pre, float a_post, float a_res,
                                  const float *b_res, long N, int n);
    /* u = sum_i hpre_i X_i: dhpre set, dX += */
    void (*lanes_combine_backward)(const nd_backend *be, float *dhpre, float *dX, const float *du,
                                   const float *hpre, const float *X, long N, int n, int d);
    /* Xo = M X + hpost y: dM, dhpost, dy set; dX set (may alias dXo) */
    void (*lanes_update_backward)(const nd_backend *be, float *dX, float *dM, float *dhpost,
                                  float *dy, const float *dXo, const float *M, const float *X,
                                  const float *hpost, const float *y, long N, int n, int d);
    /* dx0 = sum_i dX_i */
    void (*lanes_broadcast_backward)(const nd_backend *be, float *dx0, const float *dX, long N,
                                     int n, int d);
    /* dX_i = dxm / n */
    void (*lanes_mean_backward)(const nd_backend *be, float *dX, const float *dxm, long N, int n,
                                int d);
    /* in place: rotate gradients back (transpose of rope) */
    void (*rope_backward)(const nd_backend *be, float *dx, const float *cos_t, const float *sin_t,
                          const nd_layout *L, int heads, int hd);
    /* causal GQA attention: dq, dk, dv set (out/lse from the forward; lse
     * is required here); a prefix's dk/dv sum what every continuing
     * segment's queries send them */
    void (*attention_backward)(const nd_backend *be, float *dq, float *dk, float *dv,
                               const float *dout, const float *q, const float *k, const float *v,
                               const float *out, const float *lse, const nd_layout *L, int H, int G,
                               int hd);
    /* o = att*sigmoid(g): datt, dg set (datt may alias dout) */
    void (*gate_sigmoid_backward)(const nd_backend *be, float *datt, float *dg, const float *dout,
                                  const float *att, const float *g, long n);
    /* y = x + sigmoid(gate)*r: dr set (may alias dy); dgate += (scalar); dx is dy
     * (caller aliases) */
    void (*residual_scaled_backward)(const nd_backend *be, float *dr, float *dgate, const float *dy,
                                     const float *r, float gate, long n);
    /* y = (x + out) - u with out = HadamardMLP(z): dz set; dd1, dd2, dd3 +=
     * (dx = dy and du = -dy are left to the caller) */
    void (*hadamard_mlp_backward)(const nd_backend *be, float *dz, float *dd1, float *dd2,
                                  float *dd3, const float *dy, const float *z, const float *h1,
                                  const float *d1, const float *d2, const float *d3, long N, int d,
                                  int hn);
    /* dst[r*dst_ld + c] = src[r*src_ld + c] for r < rows, c < cols: plain
     * copies (ld = cols) and packing/unpacking column blocks */
    void (*copy2d)(const nd_backend *be, float *dst, int dst_ld, const float *src, int src_ld,
                   long rows, int cols);
    /* y += alpha * x (n floats) */
    void (*add)(const nd_backend *be, float *y, const float *x, float alpha, long n);
};

static inline void nd_backend_sync(const nd_backend *be)
{
    if (be->sync)
        be->sync(be);
}

/* The CPU backend (cblas + OpenMP). threads <= 0: all cores. */
const nd_backend *nd_backend_cpu(int threads);

/* Pick a backend by name: "cpu"; "cuda" / "cuda:N"; "vulkan" / "vulkan:N"
 * (N: the device index; a software Vulkan device such as lavapipe only when
 * named by index or NEEDLE_VULKAN_SOFTWARE=1; a search for a GPU does not
 * even load software drivers); "auto": CUDA when a device is present, else
 * a Vulkan GPU, else the CPU (on Apple Silicon always the CPU with
 * Accelerate; its GPU only as "vulkan"). On Linux "auto" loads no plugin
 * unless a GPU device node exists (/dev/nvidiactl, /dev/nvidia0, /dev/dxg,
 * /dev/dri/renderD*; NEEDLE_GPU_PROBE=1 or 0 overrides). GPU backends are plugins
 * (libneedle_cuda.so, libneedle_vulkan.so) loaded at run time from the
 * directory of the program or library, or NEEDLE_PLUGIN_DIR. NULL + error
 * when the named backend is unavailable. */
const nd_backend *nd_backend_get(const char *name, int threads);

/* "cpu  float32  (2 threads, OpenBLAS Haswell)" or "vulkan  <device>, float32"
 * for progress lines; returns buf. */
const char *nd_backend_line(const nd_backend *be, char *buf, size_t n);

#endif
