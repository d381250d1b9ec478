/* Chat-template rendering and token ids/loss mask of a training example,
 * byte for byte as upstream finetune.py's render_example / _encode /
 * fit_max_len, in the Needle 2 (2.x) or Needle 3 (3.x) form
 * (docs/formats.md §3.2-§3.4, §3.6). */
#ifndef ND_RENDER_H
#define ND_RENDER_H

#include <stddef.h>
#include <stdint.h>

#include "io/jsonl.h"
#include "text/pyjson.h"
#include "text/tokenizer.h"

/* Model generations, each with its own chat template (docs/formats.md
 * §3.6): 2 = Needle 2 (cactus-needle 2.x), 3 = Needle 3 (3.x). 0 anywhere a
 * generation is taken means ND_RENDER_GEN_DEFAULT. */
#define ND_RENDER_GEN_DEFAULT 2

/* Upstream 3.x's fixed special ids (tokenizer.py PAD_ID, EOS_ID, BOS_ID):
 * its _encode uses these, not the tokenizer model's own fields. */
#define ND_V3_PAD_ID 0
#define ND_V3_EOS_ID 1
#define ND_V3_BOS_ID 2

/* 0 -> ND_RENDER_GEN_DEFAULT; 2 and 3 as they are; anything else -1. */
int nd_render_generation(int generation);

/* Render one example object into prompt and target (appended to the
 * buffers) with the given generation's template. Errors name the offending
 * field, e.g. "query must be a string". */
int nd_render_example_gen(const nd_pj *ex, int generation, nd_buf *prompt, nd_buf *target);
/* The Needle 2 template (nd_render_example_gen with generation 2). */
int nd_render_example(const nd_pj *ex, nd_buf *prompt, nd_buf *target);

/* [BOS] + enc(prompt) + enc(target) + [EOS], untruncated, appended to ids;
 * *n_prompt = 1 + len(enc(prompt)), the positions whose mask is 0. BOS and
 * EOS are the tokenizer's for generation 2, ND_V3_* for generation 3.
 * `cache` may be NULL (see nd_tokenizer_encode_cached). */
int nd_render_encode(const nd_tokenizer *t, nd_tok_cache *cache, int generation,
                     const nd_example *ex, nd_idvec *ids, size_t *n_prompt);

/* The tokenizer a model of `model_vocab` rows may train with: generation 2
 * needs exactly model_vocab pieces, generation 3 at most (3.x's
 * get_tokenizer(vocab_size); rows past the pieces are never targets).
 * `path` names the tokenizer in the error. */
int nd_render_check_vocab(const nd_tokenizer *t, int generation, long model_vocab,
                          const char *path);

/* Upstream's fit_max_len: the smallest 128 * 2^k covering `longest`,
 * capped by `cap` (so `cap` itself when cap < 128). */
size_t nd_fit_max_len(size_t longest, size_t cap);

/* _encode's truncate-and-pad into max_len slots: ids[:max_len] then pad_id;
 * mask 0 on the first n_prompt positions, 1 after, 0 on padding. Returns 1
 * if the example was truncated. */
int nd_render_pack(const int32_t *ids, size_t n, size_t n_prompt, size_t max_len, int32_t pad_id,
                   int32_t *ids_out, float *mask_out);

/* A whole dataset, tokenised: n rows of max_len ids and mask. */
typedef struct {
    size_t n, max_len;
    int32_t *ids;
    float *mask;
    int32_t *len;     /* each example's tokens after truncation (the rest is padding) */
    size_t longest;   /* longest untruncated example, in tokens */
    size_t truncated; /* examples cut to max_len (upstream does so silently) */
} nd_token_set;

/* max_len = nd_fit_max_len(longest, cap). Encodes with d->generation's
 * rules; pads with the tokenizer's pad id (0 if it has none) for generation
 * 2, ND_V3_PAD_ID for generation 3. */
int nd_dataset_tokenize(const nd_dataset *d, const nd_tokenizer *t, size_t cap, nd_token_set *out);
void nd_token_set_free(nd_token_set *s);

#endif
