/* A needle_model from a training checkpoint instead of a .cact: the float
 * weights, no quantisation, with the engine's decoder and grammar, so a
 * fine-tune can be scored before export (needle eval-calls --checkpoint).
 *
 * Internal header: the public API is include/needle.h. */
#ifndef ND_ENGINE_FROM_CHECKPOINT_H
#define ND_ENGINE_FROM_CHECKPOINT_H

#include "needle.h"

/* ckpt: checkpoint pickle (upstream format, float32 or float16); lora: an
 * adapter merged exactly as `needle build --lora` merges it (W += scale *
 * A @ B, rounded to the checkpoint's stored dtype), or NULL; tokenizer: a
 * SentencePiece .model or RAW blob whose piece count is the model's vocab.
 * NULL with nd_last_error() naming the file at fault. */
needle_model *nd_model_from_checkpoint(const char *ckpt, const char *lora, const char *tokenizer);

#endif
