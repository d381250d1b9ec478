/* Needle 3's probe heads (upstream 3.x architecture.py probe_pool,
 * EmbeddingHead, ConfidenceHead, RouterHead): what needle_embed(), the
 * confidence score and the router read from a whole forward.
 *
 * They read "cells": for every token t, row 0 is x0 (the scaled token
 * embedding) and row l + 1 the lane mean after layer l, so L + 1 rows of d
 * floats. With k probes and q queries per head:
 *
 *   s[l,k,t] = cells[t,l] . probes[l,k] / sqrt(d)     (pad tokens: -inf)
 *   a[l,k]   = sum_t softmax_t(s[l,k,:]) cells[t,l]
 *   r[l,k]   = rms_unit(a[l,k]) * gain[l,k]            (eps 1e-6)
 *   u[q,l,k] = r[l,k] . query[q] / sqrt(d) + row_bias[q,l,k]
 *   pooled[q] = sum_{l,k} softmax_{l,k}(u[q,:,:]) r[l,k]   (q*d floats)
 *   out      = pooled @ proj + bias                    (proj (q*d, out))
 *
 * The embedding head has no bias and returns out / sqrt(|out|^2 + 1e-12);
 * the confidence head's one output is a logit, the router's three are
 * logits. The first softmax is online over t, so a forward can hand the
 * cells over chunk by chunk and layer by layer (san_probe3_add) without
 * holding T * (L + 1) rows. Float32 inputs, double accumulators.
 *
 * Internal header. */
#ifndef ND_MODEL_PROBE3_H
#define ND_MODEL_PROBE3_H

#include <stdint.h>

/* One head's tensors (borrowed; the caller owns them). */
typedef struct {
    int rows, k, q, d, out; /* rows = L + 1 */
    const float *probes;    /* [rows, k, d] */
    const float *gain;      /* [rows, k] */
    const float *query;     /* [q, d] */
    const float *row_bias;  /* [q, rows, k] */
    const float *proj;      /* [q * d, out] (the flax kernel's layout) */
    const float *bias;      /* [out], or NULL (the embedding head) */
    int normalise;          /* 1: the embedding head's unit-length output */
} san_probe3_head;

/* The running state of the first softmax (rows * k of them). */
typedef struct {
    const san_probe3_head *h;
    double *mx, *sum, *acc; /* [rows*k], [rows*k], [rows*k*d] */
    long seen;              /* non-pad cells pooled in row 0 */
} san_probe3_pool;

/* ND_OK or ND_ENOMEM / ND_ESHAPE (a head whose sizes are not positive). */
int san_probe3_begin(san_probe3_pool *p, const san_probe3_head *h);
/* Pool n cells of row `row` (0 = x0, l + 1 = after layer l), cells
 * [n, d]; keep[i] = 0 leaves cell i out (a pad token). */
void san_probe3_add(san_probe3_pool *p, int row, const float *cells, int n, const uint8_t *keep);
/* The head's outputs [out] from what was pooled; ND_EARG when no cell was
 * kept (every token a pad: upstream's softmax would be NaN). Frees the
 * state either way. */
int san_probe3_finish(san_probe3_pool *p, float *out);
void san_probe3_free(san_probe3_pool *p);

#endif
