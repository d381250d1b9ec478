/* The Simple Attention Network forward pass (docs/model.md §2), llm.c style: one
 * activation struct sized once for the most rows a batch can have, one
 * *_forward per part, all compute through the backend's ops. Which rows
 * form which sequence is the acts' layout (backend/layout.h): a padded
 * [B, T] batch, or packed examples sharing a prompt prefix. */
#ifndef ND_SAN_H
#define ND_SAN_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/block.h"
#include "model/params.h"

typedef struct {
    long N;                     /* rows of the current layout */
    long cap_rows, cap_logits;  /* capacities: rows, rows of logits */
    int max_pos;                /* rope tables cover positions < max_pos */
    nd_layout_buf lay;          /* the current layout (a->lay.L) */
    float *rope_cos, *rope_sin; /* [max_pos, hd/2] */
    float *x0;                  /* scaled embeddings [N, d] */
    float *X, *Xn;              /* lanes [N, n, d] (current, next) */
    int32_t *eng_idx;           /* [N, K] */
    float *eng_e;               /* [N, K*sub] */
    float *eng_vp;              /* [N, d] scratch */
    float *eng_k[SAN_MAX_SITES], *eng_v[SAN_MAX_SITES];
    san_layer_acts l;
    float *xm, *hf, *hf_rstd; /* lane mean, final norm */
    float *logits;            /* [cap_logits, V] */
    float *hsel;              /* hf rows whose logits are wanted [cap_logits, d] */
    float *X_saved;           /* optional saved lane states [slots, N, n, d] */
    int lane_every;           /* layers l with l % lane_every == 0 have their input
                                 lanes saved (slot l / lane_every); the backward
                                 recomputes the others a segment at a time into
                                 lane_every - 1 slots after the n_lane_cp saved ones */
    int n_lane_cp;
    float *phi_cat;             /* one layer's [phi_pre|phi_post|phi_res] [n*d, 2n+n^2] */
    float *proj;                /* nx @ phi_cat [N, 2n+n^2] */
    san_layer_acts *layer_sets; /* optional: layers 0..n_kept-1's activations kept */
    int n_kept;
    san_layer_acts l_scratch; /* the set recomputed layers use */
    /* Needle 3: the Hadamard MLP geometry (a san_hada3_geom), and the k/v
     * each CLA pair's producer hands its consumer [N, k_dim], [N, v_dim] */
    void *hada3;
    float *cla_k[SAN_MAX_CLA], *cla_v[SAN_MAX_CLA];
    /* Needle 3 training numerics (model/fake_quant.h): NULL (the default)
     * is the float forward; else 3.x's quant=True forward (the engram
     * lookups, the layers' activations, q, k, v and the final hidden are
     * fake-quantised; the weights are whatever w holds). Needle 2 models
     * ignore it. */
    const nd_fq3_numerics *quant;
    size_t bytes; /* size of the allocation */
    void *block;  /* the one allocation */
    const nd_backend *be;
} san_acts;

/* Size the activations for B sequences of T tokens (the layout is set to
 * that dense batch). save_lanes keeps every layer's input lane state (for
 * the backward pass; > 1: every save_lanes-th layer's, san_lane_slots);
 * keep_layers also keeps every layer's activations so the backward need
 * not recompute them (about san_layer_acts_bytes() per layer). */
int san_acts_create(san_acts *a, const nd_backend *be, const san_model *m, int B, int T,
                    int save_lanes, int keep_layers);
/* The same for packed batches: at most cap_rows rows in cap_seg segments,
 * positions below max_pos, logits for at most cap_logits rows. The layout
 * starts empty: fill a->lay, then san_acts_use_layout. Here keep_layers is
 * the number of layers (from the first) whose activations are kept; the
 * backward recomputes the others. */
int san_acts_create_rows(san_acts *a, const nd_backend *be, const san_model *m, long cap_rows,
                         int cap_seg, int max_pos, long cap_logits, int save_lanes,
                         int keep_layers);
/* Check a->lay against the capacities and make it the current layout. */
int san_acts_use_layout(san_acts *a);
/* Lane-state slots the backward needs when every `every`-th layer's input
 * lanes are saved (1: every layer's): the saved ones plus every - 1 for
 * the segment the backward recomputes. Each is N * n * d floats. */
int san_lane_slots(int L, int every);
/* Approximate bytes of one layer's activations for N rows. */
size_t san_layer_acts_bytes(const san_model *m, long N);
void san_acts_free(san_acts *a);

/* Forward of the layout's rows; logits of every row land in a->logits
 * (needs cap_logits >= N). */
int san_forward(const san_model *m, const san_weights *w, san_acts *a, const int32_t *tokens);
/* Forward up to the final norm (a->hf), no logits. */
int san_forward_hidden(const san_model *m, const san_weights *w, san_acts *a,
                       const int32_t *tokens);
/* Logits of n chosen rows (a row may repeat) into a->logits [n, V]; their
 * hf rows are kept in a->hsel for the backward. */
int san_logits_rows(const san_model *m, const san_weights *w, san_acts *a, const int32_t *rows,
                    long n);

/* Logits of the n rows r0.. (contiguous) into a->logits [n, V]
 * (n <= cap_logits): the trainer's loss a slice of rows at a time. */
int san_logits_range(const san_model *m, const san_weights *w, san_acts *a, long r0, long n);

/* Pieces, exposed for focused tests and for the backward pass. */
void san_rope_tables(float *cos_t, float *sin_t, int T, int hd, double theta);
void san_engram_forward(const san_model *m, const san_weights *w, san_acts *a,
                        const int32_t *tokens);
/* a->eng_e after a gather: with a->quant on a Needle 3 model, 3.x's A8
 * rounding of each row (the lookup before key_proj/value_proj). */
int san_engram_quant(const san_model *m, san_acts *a);
/* Layer `layer` of the block (model/block.h) over the layout's rows into
 * a->l: float products through the backend's matmul, full causal attention
 * over the layout. */
int san_layer_forward_batch(const san_model *m, const san_weights *w, san_acts *a, int layer,
                            const float *X, float *Xn);

#endif
