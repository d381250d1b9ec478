/* Packing a batch of examples into the rows the model actually needs.
 *
 * Upstream pads every example of a batch to one length and runs all of
 * it. Here each example runs at its own length, and examples that begin
 * with the same tokens (in fine-tune data: BOS, system prompt and the
 * whole tools block) run that prefix once: the prefix becomes a parent
 * segment and each example's remainder a child that attends to it
 * (backend/layout.h). The model is causal, so the loss and gradients are
 * those of the padded batch, up to float rounding. */
#ifndef ND_PACK_H
#define ND_PACK_H

#include <stdint.h>

#include "backend/layout.h"

typedef struct {
    const int32_t *ids; /* len tokens */
    const float *mask;  /* len loss weights: mask[t] weighs the prediction of ids[t] */
    int len;
} nd_seq_example;

typedef struct {
    int cap;   /* examples */
    int count; /* examples in the current plan */
    int n_groups;
    int *order;   /* [cap] example indices, group by group */
    int *gstart;  /* [cap + 1] each group's first index into order */
    int *gplen;   /* [cap] each group's shared prefix (0: none) */
    long rows;    /* rows of the packed batch */
    long real;    /* sum of the examples' lengths */
    int32_t *lcp; /* scratch [cap] */
    long *best;   /* scratch [cap + 1] */
    int *from;    /* scratch [cap + 1] */
} nd_pack_plan;

int nd_pack_plan_init(nd_pack_plan *p, int cap);
void nd_pack_plan_free(nd_pack_plan *p);
/* Plan a batch. share = 0: every example its own segment (no padding, no
 * sharing). With share, examples are ordered by their tokens and cut into
 * the groups that save the most rows (each group's prefix is the common
 * prefix of its members, kept at least one token short of the shortest so
 * every member keeps a row of its own). Returns 0, or -1 if count > cap. */
int nd_pack_plan_make(nd_pack_plan *p, const nd_seq_example *ex, int count, int share);

/* Rows of groups [g0, g1) of the plan. */
long nd_pack_group_rows(const nd_pack_plan *p, const nd_seq_example *ex, int g0, int g1);
/* Lay groups [g0, g1) of the plan out (all: 0, p->n_groups): segments into
 * lay, the packed tokens into tok, and for each of their examples the row
 * of each position: row_of[off[b] + t] for t < ex[b].len, with off[b] =
 * sum of earlier lengths. 0, or -1 when lay's capacity is too small. */
int nd_pack_layout(const nd_pack_plan *p, const nd_seq_example *ex, int g0, int g1,
                   nd_layout_buf *lay, int32_t *tok, int32_t *row_of);

#endif
