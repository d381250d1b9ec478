/* The probe heads a .cact may carry after final_norm (upstream
 * architecture.py ContrastiveHead / ConfidenceHead, export.py
 * _head_tensors) and the tool retrieval built on the contrastive one.
 *
 * Both heads read "cells": for every token, x0 (the scaled embedding) and
 * the lane mean after each of the L layers, so T*(L+1) cells of d floats.
 * probe_pool: per probe k, softmax over the cells of dot(cell, probe_k) /
 * sqrt(d) (pad tokens excluded), the weighted sum of the cells; the P
 * pooled vectors concatenated. Contrastive: pooled @ proj, L2-normalised
 * (sqrt(sum p^2 + 1e-12)). Confidence: sigmoid(pooled @ proj + bias).
 * Computed in float32 with double accumulators (upstream casts the pooled
 * vector to the training dtype, bfloat16 for the release, before proj).
 *
 * Internal header. */
#ifndef ND_ENGINE_HEADS_H
#define ND_ENGINE_HEADS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "io/cact.h"
#include "engine/engine.h"
#include "model/params.h"

typedef struct {
    int present;
    int n_probes, out_dim; /* P, out */
    float *probes;         /* [P, d] */
    float *proj;           /* [out, P*d] (as stored: rows are outputs) */
    float *bias;           /* [out] */
} nd_probe_head;

typedef struct {
    nd_probe_head contrastive, confidence;
    const nd_qweights *qw; /* the model's quantised matrices, or NULL (float weights) */
} nd_heads;

/* Read the optional heads of a parsed archive whose model is `m` (its
 * layout says where final_norm ends). No heads is not an error. */
int nd_heads_load(const cact_file *f, const san_model *m, nd_heads *h);
void nd_heads_free(nd_heads *h);

/* The contrastive embedding (contrastive.out_dim floats, unit length) of
 * the tokens t[0..T). One full causal forward (the training forward, no
 * KV window) over them; 1 <= T <= max_seq_len. */
int nd_head_embed(const san_model *m, const nd_backend *be, const nd_heads *h, const int32_t *t,
                  int T, float *emb);
/* The confidence head's probability sigmoid(logit) for t[0..T). */
int nd_head_confidence(const san_model *m, const nd_backend *be, const nd_heads *h,
                       const int32_t *t, int T, double *p);

#endif
