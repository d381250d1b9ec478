/* The Simple Attention Network forward pass (SPEC §1), llm.c style: one
 * activation struct sized once per (batch, seq) shape, one *_forward per
 * part, all compute through the backend's ops. */
#ifndef ND_SAN_H
#define ND_SAN_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/params.h"

/* Activations of one layer. Forward-only runs reuse one set for every
 * layer; training recomputes a layer into it from the saved lane state. */
typedef struct {
    float *nx, *nx_rstd;                 /* rms_unit of the flattened lanes [N, n*d], [N] */
    float *pre, *post, *res;             /* nx @ phi_* [N, n], [N, n], [N, n*n] */
    float *hpre, *hpost, *M;             /* hyper-connection coefficients */
    float *u;                            /* block input before the engram [N, d] */
    float *alpha, *bx;                   /* engram gates [sites, N], block input [N, d] */
    float *a, *a_rstd;                   /* zcrms(bx, norm_in) */
    float *q, *k, *v, *g;                /* projections [N, q_dim|kv_dim] (pre-norm for q, k) */
    float *qn, *kn, *q_rstd, *k_rstd;    /* normalised + rotated q, k */
    float *att, *lse;                    /* attention output [N, q_dim], lse [B, H, T] */
    float *o, *o2;                       /* gated attention, out_proj */
    float *pn, *pn_rstd;                 /* zcrms(o2, post_norm) */
    float *x1;                           /* after the attention residual */
    float *z, *z_rstd;                   /* zcrms(x1, pre_hada) */
    float *h1;                           /* fwht(d1 * z) [N, hada_n] */
    float *y;                            /* Block(bx) - u [N, d] */
} san_layer_acts;

typedef struct {
    int B, T;
    long N;
    float *rope_cos, *rope_sin;          /* [T, hd/2] */
    float *x0;                           /* scaled embeddings [N, d] */
    float *X, *Xn;                       /* lanes [N, n, d] (current, next) */
    int32_t *eng_idx;                    /* [N, K] */
    float *eng_e;                        /* [N, K*sub] */
    float *eng_vp;                       /* [N, d] scratch */
    float *eng_k[SAN_MAX_SITES], *eng_v[SAN_MAX_SITES];
    san_layer_acts l;
    float *xm, *hf, *hf_rstd;            /* lane mean, final norm */
    float *logits;                       /* [N, V] */
    float *X_saved;                      /* optional [(L+1), N, n, d] lane states */
    float *phi_cat;                      /* one layer's [phi_pre|phi_post|phi_res] [n*d, 2n+n^2] */
    float *proj;                         /* nx @ phi_cat [N, 2n+n^2] */
    san_layer_acts *layer_sets;          /* optional: every layer's activations kept */
    size_t bytes;                        /* size of the allocation */
    void *block;                         /* the one allocation */
    const nd_backend *be;
} san_acts;

/* Size the activations for B sequences of T tokens. save_lanes keeps every
 * layer's input lane state (for the backward pass); keep_layers also keeps
 * every layer's activations so the backward need not recompute them (about
 * san_layer_acts_bytes() per layer). */
int san_acts_create(san_acts *a, const nd_backend *be, const san_model *m, int B, int T,
                    int save_lanes, int keep_layers);
/* Approximate bytes of one layer's activations at this shape. */
size_t san_layer_acts_bytes(const san_model *m, int B, int T);
void san_acts_free(san_acts *a);

/* Forward of B*T tokens (row-major [B, T]); logits land in a->logits. */
int san_forward(const san_model *m, const san_weights *w, san_acts *a, const int32_t *tokens);

/* Pieces, exposed for focused tests and for the backward pass. */
void san_rope_tables(float *cos_t, float *sin_t, int T, int hd, double theta);
void san_engram_forward(const san_model *m, const san_weights *w, san_acts *a,
                        const int32_t *tokens);
void san_layer_forward(const san_model *m, const san_weights *w, san_acts *a, int layer,
                       const float *X, float *Xn);

#endif
