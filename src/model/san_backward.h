/* Backward pass of the SAN: layer by layer in reverse, recomputing each
 * layer's activations from its saved input lanes (like upstream's remat),
 * so memory holds one layer's activations plus the lane states. */
#ifndef ND_SAN_BACKWARD_H
#define ND_SAN_BACKWARD_H

#include "model/lora.h"
#include "model/san.h"

typedef struct {
    float *dX, *dXn;                                      /* lane gradients [N, n, d] */
    float *dhf, *dxm;                                     /* [N, d] */
    float *dhsel;                                         /* [logit rows, d] */
    float *dy, *dx1, *dz, *dpn, *dbx, *do2, *du;          /* [N, d] */
    float *do_, *datt, *dg, *dqn, *dq;                    /* [N, q_dim] */
    float *dkn, *dk, *dv;                                 /* [N, kv_dim] */
    float *da;                                            /* [N, d] */
    float *dhpre, *dhpost, *dM;                           /* [N, n], [N, n], [N, n*n] */
    float *dpre, *dpost, *dres;                           /* same */
    float *dnx;                                           /* [N, n*d] */
    float *dnx_tmp;                                       /* [n*d, n*n] unpacking phi gradients */
    float *deng_k[SAN_MAX_SITES], *deng_v[SAN_MAX_SITES]; /* [N, d] */
    float *deng_vp, *deng_e;                              /* [N, d], [N, eng_dim] */
    float *lora_tmp;                                      /* [N, rank] */
    /* Needle 3: gradients after the q/k/v conv (before it: dq, dk, dv) and
     * what each CLA consumer's attention sends its producer's k and v */
    float *dqc, *dkc, *dvc;
    float *cla_dk[SAN_MAX_CLA], *cla_dv[SAN_MAX_CLA];
    void *block;
    const nd_backend *be;
} san_grad_acts;

/* rows: the most rows a batch has; logit_rows: the most rows whose logits
 * are taken (san_backward_rows) */
int san_grad_acts_create(san_grad_acts *g, const nd_backend *be, const san_model *m, long rows,
                         long logit_rows, int lora_rank);
void san_grad_acts_free(san_grad_acts *g);

/* What to differentiate. Either or both may be set. */
typedef struct {
    san_weights *full;    /* += gradients of every base parameter (NULL: frozen) */
    const san_lora *lora; /* adapter layout (NULL: no adapter) */
    const float *lora_w;  /* adapter values (A, B) */
    float *lora_g;        /* += gradients of A and B */
} san_grad_target;

/* Given a completed forward (acts made with save_lanes) whose logits have
 * been replaced in place by dLoss/dlogits, accumulate parameter gradients.
 * `w` must be the weights the forward used (LoRA merged in). */
int san_backward(const san_model *m, const san_weights *w, san_acts *a, san_grad_acts *g,
                 const san_grad_target *tgt, const int32_t *tokens);
/* The same after san_logits_rows: a->logits holds dLoss/dlogits of those n
 * rows only. */
int san_backward_rows(const san_model *m, const san_weights *w, san_acts *a, san_grad_acts *g,
                      const san_grad_target *tgt, const int32_t *tokens, const int32_t *rows,
                      long n);

/* The same in pieces, for a loss taken a slice of logit rows at a time
 * (after san_forward_hidden; a->logits holds one slice's dLoss/dlogits):
 * san_backward_logits_range sets g->dhf of the contiguous rows r0..r0+n
 * (every row once, before san_backward_finish); or san_backward_begin
 * zeroes g->dhf and san_backward_logits_rows adds the listed rows' (a
 * slice taken by san_logits_rows). Full gradients of the embedding add
 * up across slices. san_backward_finish runs the layers. */
void san_backward_logits_range(const san_model *m, const san_weights *w, san_acts *a,
                               san_grad_acts *g, const san_grad_target *tgt, long r0, long n);
void san_backward_begin(san_acts *a, san_grad_acts *g, int d);
void san_backward_logits_rows(const san_model *m, const san_weights *w, san_acts *a,
                              san_grad_acts *g, const san_grad_target *tgt, const int32_t *rows,
                              long n);
int san_backward_finish(const san_model *m, const san_weights *w, san_acts *a, san_grad_acts *g,
                        const san_grad_target *tgt, const int32_t *tokens);

#endif
