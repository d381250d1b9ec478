/* Merge a LoRA adapter into a base model, as upstream `needle build --lora`
 * (finetune.py merge_lora): for every adapted kernel W (..., in, out),
 * W += scale * A @ B with A (..., in, r) and B (..., r, out), computed in
 * float32 and cast to the checkpoint's stored dtype before the add, so a
 * float16 checkpoint gets W16 + f16(scale * A @ B) rounded to float16.
 *
 * Adapter pickle (upstream finetune_local, or ours):
 *   {"lora": {"stack/layers/block/self_attn/q_proj/kernel": {"A": ..., "B": ...}, ...},
 *    "scale": float, "base": str, "rank": int} */
#ifndef ND_LORA_MERGE_H
#define ND_LORA_MERGE_H

#include "io/pickle.h"
#include "model/params.h"

typedef struct {
    int merged;  /* weight groups merged into the model */
    int skipped; /* groups for checkpoint tensors the model does not own (mtp_*) */
    int rank;
    double scale;
} lora_merge_info;

/* `params` is the checkpoint's params dict (gives each tensor's stored
 * dtype; NULL = float32). `what` names the adapter in messages. Shapes and
 * the rank are checked for every group before anything is modified. */
int lora_merge(san_model *m, const pv *params, const pv *adapter, const char *what,
               lora_merge_info *info);
int lora_merge_file(san_model *m, const pv *params, const char *adapter_path,
                    lora_merge_info *info);

#endif
