/* Training batches drawn from a tokenised dataset, three ways:
 *   shared  - examples at their own lengths, common prefixes run once (default)
 *   packed  - examples at their own lengths, nothing shared
 *   padded  - upstream's literal batching: B rows of fit_max_len tokens
 * All three give the same loss and gradients (up to float rounding); the
 * first two compute logits only where the loss is. */
#ifndef ND_BATCH_H
#define ND_BATCH_H

#include <stddef.h>

#include "core/rng.h"
#include "io/jsonl.h"
#include "text/render.h"
#include "train/trainer.h"

typedef enum { ND_BATCH_SHARED = 0, ND_BATCH_PACKED = 1, ND_BATCH_PADDED = 2 } nd_batching;

/* "shared" | "packed" | "padded" -> mode; -1 if unknown */
int nd_batching_parse(const char *s);
const char *nd_batching_name(int mode);

typedef struct {
    nd_trainer tr;
    const nd_token_set *ts;
    int mode, B;
    int32_t *ids; /* padded mode: [B, T] */
    float *mask;
    nd_seq_example *ex; /* packed modes: [B] */
} nd_batcher;

/* Buffers sized for any B examples of ts. */
int nd_batcher_create(nd_batcher *bt, const san_model *m, const nd_backend *be, san_lora *lora,
                      const nd_token_set *ts, int B, int mode, int full_grads);
void nd_batcher_free(nd_batcher *bt);
/* One step over examples idx[0..rows) (rows <= B); see nd_trainer_step. */
int nd_batcher_step(nd_batcher *bt, const size_t *idx, int rows, int grad, double *loss,
                    double *masked);
/* After a step: each example's summed loss and loss positions (rows). */
void nd_batcher_example_losses(const nd_batcher *bt, int rows, double *loss_sum, double *positions);
/* Rows one step over idx[0..rows) computes (without running it). */
long nd_batcher_rows(nd_batcher *bt, const size_t *idx, int rows);

/* Fisher-Yates with rng (upstream-compatible order is the caller's). */
void nd_shuffle_indices(size_t *idx, size_t n, nd_rng *rng);
/* Each example's tool set as a dense id (same system + tools block, same
 * id); malloc'd, NULL when out of memory. */
int32_t *nd_tool_set_ids(const nd_dataset *ds, size_t n);
/* --group-by-tools: order idx[0..n) by tool set, cut into batches of B and
 * shuffle the batches (the short last one stays last); tmp: n scratch. */
void nd_group_by_tools(size_t *idx, size_t n, int B, const int32_t *set_of, nd_rng *rng,
                       size_t *tmp);

#endif
