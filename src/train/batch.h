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

/* Default memory for kept layer activations in finetune/eval: with the
 * weights, optimiser and lane states, a needle2 LoRA run on tool-calling
 * data stays under 2 GB. */
#define ND_ACT_BUDGET_MB 1024.0
/* Rows of one micro-batch (a batch runs as several when larger). */
#define ND_MICRO_ROWS 2048L

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

/* Buffers sized for any B examples of ts, or, when max_rows > 0, for
 * batches of at most max_rows rows and max_items loss positions (see
 * nd_batch_caps). */
int nd_batcher_create(nd_batcher *bt, const san_model *m, const nd_backend *be, san_lora *lora,
                      const nd_token_set *ts, int B, int mode, int full_grads, long max_rows,
                      long max_items, long max_group_rows, double act_budget_mb);
/* The most rows, loss positions and rows of one prefix group of the
 * batches idx[0..n) cut into B (raised into *rows, *items, *group_rows),
 * and the rows all of them compute (added to *total_rows); group_rows and
 * total_rows may be NULL. 0, or -1 out of memory. */
int nd_batch_caps(const nd_token_set *ts, int mode, const size_t *idx, size_t n, int B, long *rows,
                  long *items, long *group_rows, double *total_rows);
void nd_batcher_free(nd_batcher *bt);
/* One step over examples idx[0..rows) (rows <= B); see nd_trainer_step. */
int nd_batcher_step(nd_batcher *bt, const size_t *idx, int rows, int grad, double *loss,
                    double *masked);
/* After a step: each example's summed loss and loss positions (rows). */
void nd_batcher_example_losses(const nd_batcher *bt, int rows, double *loss_sum, double *positions);

/* Fisher-Yates with rng (upstream-compatible order is the caller's). */
void nd_shuffle_indices(size_t *idx, size_t n, nd_rng *rng);
/* Each example's tool set as a dense id (same system + tools block, same
 * id); malloc'd, NULL when out of memory. */
int32_t *nd_tool_set_ids(const nd_dataset *ds, size_t n);
/* One epoch's order, in place: the seeded shuffle of (seed, epoch) applied
 * to the previous order (as finetune does, so a resume replays it), then
 * --group-by-tools when set_of is given (tmp: n scratch). */
void nd_epoch_order(size_t *idx, size_t n, int B, uint64_t seed, int epoch, const int32_t *set_of,
                    size_t *tmp);
/* --group-by-tools: order idx[0..n) by tool set, cut into batches of B and
 * shuffle the batches (the short last one stays last); tmp: n scratch. */
void nd_group_by_tools(size_t *idx, size_t n, int B, const int32_t *set_of, nd_rng *rng,
                       size_t *tmp);

#endif
