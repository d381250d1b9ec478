/* The SAN block (SPEC §1): one layer's forward, written once for the
 * trainer and the engine. What differs between them is abstracted:
 *
 *  - matrix products go through a weights view (san_wview): the trainer's
 *    multiplies float kernels with the backend's matmul, the engine's runs
 *    its quantised kernels on the archive's matrices (or float ones);
 *  - attention goes through an attention source (san_attn_src): a batch
 *    layout (full causal attention over the batch's rows) or the engine's
 *    KV cache (append the chunk's K/V rows, attend over the history); it
 *    also says where the rows sit for RoPE;
 *  - everything elementwise runs through the backend's ops.
 *
 * san_layer_forward calls them in the block's one op order. */
#ifndef ND_BLOCK_H
#define ND_BLOCK_H

#include "backend/backend.h"
#include "model/fake_quant.h"
#include "model/params.h"

/* Activations of one layer. Forward-only runs reuse one set for every
 * layer; training recomputes a layer into it from the saved lane state.
 * The engine leaves the *_rstd and lse fields NULL (nothing is saved for a
 * backward) and points qn at q and kn at k (normalised in place). */
typedef struct {
    float *nx, *nx_rstd;              /* rms_unit of the flattened lanes [N, n*d], [N] */
    float *pre, *post, *res;          /* nx @ phi_* [N, n], [N, n], [N, n*n] */
    float *hpre, *hpost, *M;          /* hyper-connection coefficients */
    float *u;                         /* block input before the engram [N, d] */
    float *alpha, *bx;                /* engram gates [sites, N], block input [N, d] */
    float *a, *a_rstd;                /* zcrms(bx, norm_in) */
    float *q, *k, *v, *g;             /* projections [N, q_dim|kv_dim] (pre-norm for q, k) */
    float *qn, *kn, *q_rstd, *k_rstd; /* normalised + rotated q, k */
    float *att, *lse;                 /* attention output [N, q_dim], lse [N, H] */
    float *o, *o2;                    /* gated attention, out_proj */
    float *pn, *pn_rstd;              /* zcrms(o2, post_norm) */
    float *x1;                        /* after the attention residual */
    float *z, *z_rstd;                /* zcrms(x1, pre_hada) */
    float *h1;                        /* fwht(d1 * z) [N, hada_n] (Needle 2) */
    float *y;                         /* Block(bx) - u [N, d] */
    /* Needle 3: q/k/v after the causal conv (they alias q, k, v when the
     * config has no conv taps), and what the MLP keeps for the backward
     * (san_hada3_saved_per_row floats a row); the MLP writes into y */
    float *qc, *kc, *vc;
    float *hsaved;
} san_layer_acts;

/* The block's matrix products, each a group of matrices reading one input
 * (an implementation may run a group as one product). Outputs are dense
 * [rows, out] arrays (dims of san_dims; for Needle 2 k_dim = v_dim =
 * kv_dim and gate_dim = o_dim = q_dim):
 *   SAN_W_PHI:  x = nx [rows, n*d]  -> y[0] pre [n], y[1] post [n], y[2] res [n*n]
 *   SAN_W_QKVG: x = a  [rows, d]    -> y[0] q [q_dim], y[1] k [k_dim], y[2] v [v_dim],
 *                                      y[3] gate [gate_dim]
 *   SAN_W_OUT:  x = o  [rows, o_dim] -> y[0] o2 [d] */
typedef enum { SAN_W_PHI, SAN_W_QKVG, SAN_W_OUT } san_wgroup;

typedef struct san_wview san_wview;
struct san_wview {
    /* layer's products of group grp; returns ND_OK or an error code */
    int (*apply)(const san_wview *v, int layer, san_wgroup grp, const float *x, int rows,
                 float *const *y);
};

typedef struct san_attn_src san_attn_src;
struct san_attn_src {
    /* where the rows sit: RoPE rotates row r by position L->pos[r], with
     * the angles of row p of the tables */
    const nd_layout *L;
    const float *rope_cos, *rope_sin; /* [positions, hd/2] */
    /* att [rows, q_dim] from the rotated q [rows, q_dim], k and v
     * [rows, kv_dim] of layer `layer` (lse [rows, H] where the source
     * keeps it; may be NULL) */
    int (*attend)(const san_attn_src *src, int layer, const float *q, const float *k,
                  const float *v, float *att, float *lse);
    /* Needle 3's causal q/k/v conv of layer `layer` (which: 0 q, 1 k, 2 v):
     * y [rows, width] from the rows' pre-conv values x, the taps reaching
     * back over rows the source holds from earlier calls (the engine's
     * decode state). NULL: the backend's qkv_taps over L. */
    int (*conv)(const san_attn_src *src, int layer, int which, float *y, const float *x,
                const float *taps, int width, int ntaps, int window);
};

/* Everything a layer's forward reads besides its input lanes. */
typedef struct {
    const san_model *m;       /* dims and config */
    const san_weights *w;     /* the small tensors: norms, gains, hyper-connection
                               * parameters, Hadamard diagonals (the matrices go
                               * through wv) */
    const nd_backend *be;     /* the elementwise ops */
    const san_wview *wv;      /* the matrix products */
    const san_attn_src *attn; /* the attention */
    /* engram key and value rows [rows, d] of each site, for these rows */
    const float *eng_k[SAN_MAX_SITES], *eng_v[SAN_MAX_SITES];
    /* Needle 3: the Hadamard MLP's geometry (model/hada3.h); for a CLA
     * consumer layer, the producer's k (normalised, rotated) and v (after
     * the conv), which its attention reads instead of its own */
    const void *hada3; /* const san_hada3_geom * */
    const float *cla_k, *cla_v;
    /* Needle 3 training numerics (model/fake_quant.h): NULL is the float
     * forward; else the activations, q, k and v go through 3.x's
     * quant=True fake quantisation (in place, on the host, so the
     * backward's weight gradients read the quantised values and its input
     * gradients pass straight through). Needle 2 layers ignore it. */
    const nd_fq3_numerics *quant;
} san_block;

/* Layer l of the block over N rows: lanes X [N, n, d] -> Xn, the
 * intermediate values in A. Returns ND_OK or the first error of a product
 * or the attention. */
int san_layer_forward(const san_block *b, san_layer_acts *A, int l, int N, const float *X,
                      float *Xn);

/* Needle 3: layer l's slices of the Hadamard MLP weights (hw: a
 * san_hada3_w of model/hada3.h) or of their gradients (hg: a
 * san_hada3_grad; g bound to the gradient buffer). */
void san_hada3_slices(const san_model *m, const san_weights *w, int l, void *hw);
void san_hada3_grad_slices(const san_model *m, san_weights *g, int l, void *hg);

#endif
