/* Upstream checkpoint files (pickle or safetensors) <-> san_model.
 *
 * The whole pickle tree is kept beside the model so that tensors we do not
 * use (mtp_*, probe heads) and metadata (step, run) survive a round trip. */
#ifndef ND_CHECKPOINT_H
#define ND_CHECKPOINT_H

#include <stdint.h>

#include "io/pickle.h"
#include "model/params.h"

#define SAN_CHECKPOINT_FORMAT 2

/* Read a checkpoint or adapter file into the pickle-shaped tree, the
 * generation told by content, not name: a safetensors file (8-byte header
 * length, then '{'; io/safetensors.h) or a pickle (protocol byte 0x80).
 * A name ending in .safetensors is read as safetensors whatever it holds,
 * so that a damaged one gets the safetensors reader's message. */
int ckpt_file_load(const char *path, pv **out);
/* Write a tree atomically: safetensors when path ends in .safetensors
 * (upstream 3.x's rule), else a pickle. */
int ckpt_file_save(const pv *root, const char *path);
int ckpt_path_is_safetensors(const char *path);
/* Whether the file's first bytes are a safetensors header (0: a pickle,
 * anything else, or unreadable). */
int ckpt_file_is_safetensors(const char *path);

/* Load `path` into a freshly created model (float16/64 -> float32).
 * If tree_out is non-NULL it receives the parsed pickle (caller decrefs).
 * Errors name the file and, for tensors, the flax path and the expected
 * shape. */
int ckpt_load(const char *path, san_model *m, pv **tree_out);

/* Same from a parsed tree (`what` names it in messages). */
int ckpt_from_tree(const pv *root, const char *what, san_model *m);

/* Build the pickle tree for `m` (float32 arrays). Tensors of `base` that
 * the model does not own (mtp_*, heads) and its top-level extra keys
 * (step, run) are carried over; base may be NULL. */
pv *ckpt_to_tree(const san_model *m, const pv *base);

/* ckpt_to_tree + atomic write. */
int ckpt_save(const char *path, const san_model *m, const pv *base);

/* Convert every float32/float64 array under root["params"] to `dtype`
 * (ND_F16 or ND_F32), round to nearest even as numpy's astype: upstream's
 * float16 checkpoints (average_checkpoints) store params this way. */
int ckpt_tree_params_to_dtype(pv *root, nd_dtype dtype);

/* A fresh checkpoint tree as upstream's model.init makes it: the model's
 * tensors plus the mtp_* tensors, all from upstream's initialisers. */
pv *ckpt_fresh_tree(const san_model *m, uint64_t seed);

/* Lookup helpers over the nested params dict ("a/b/c" paths). */
const pv *ckpt_tree_get(const pv *params, const char *path);
int ckpt_tree_set(pv *params, const char *path, pv *val); /* steals val */

#endif
