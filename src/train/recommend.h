/* Recommended fine-tune settings a checkpoint carries (`needle convert
 * --recommend`): what `needle finetune` uses for the settings the user
 * does not give. Stored as the top-level pickle key needle_c_recommended,
 * beside config rather than inside it: upstream's load_checkpoint builds
 * TransformerConfig(**config), which refuses a key it does not know, and
 * ignores top-level keys other than params and config. */
#ifndef ND_RECOMMEND_H
#define ND_RECOMMEND_H

#include "io/pickle.h"

#define ND_RECOMMEND_KEY "needle_c_recommended"

/* The settings a checkpoint may recommend, by their finetune flag. */
enum { ND_REC_LR, ND_REC_LORA_RANK, ND_REC_LORA_ALPHA, ND_REC_EPOCHS, ND_REC_BATCH_SIZE, ND_REC_N };

typedef struct {
    int has[ND_REC_N];
    double value[ND_REC_N]; /* integer settings hold whole numbers */
} nd_recommend;

/* Key name ("lr", "lora_rank", ...) and flag ("--lr", "--lora-rank", ...). */
const char *nd_recommend_key(int which);
const char *nd_recommend_flag(int which);

/* Parse "lr=1e-3,lora_rank=16": known keys, valid values, no repeats.
 * Errors name the item and what is allowed. */
int nd_recommend_parse(const char *spec, nd_recommend *r);

/* Read root[ND_RECOMMEND_KEY] of a checkpoint tree; none there leaves r
 * empty. A malformed record is an error naming `what` and the key. */
int nd_recommend_from_tree(const pv *root, const char *what, nd_recommend *r);

/* The same from a checkpoint file. */
int nd_recommend_read(const char *path, nd_recommend *r);

/* The record as a pickle dict (ints for integer settings), or NULL. */
pv *nd_recommend_to_pv(const nd_recommend *r);

/* Number of settings r holds. */
int nd_recommend_count(const nd_recommend *r);

#endif
