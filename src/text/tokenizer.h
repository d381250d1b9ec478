/* SentencePiece-compatible BPE tokenizer.
 *
 * Loaded from a SentencePiece .model (protobuf) or from the tokenizer blob
 * stored in a .cact file (docs/formats.md §4.3). Encoding reproduces SentencePiece
 * 0.1.97's BPE encoder id for id: the model's normaliser (identity, or a
 * precompiled charsmap such as nmt_nfkc), whitespace handling, user-defined
 * symbols matched atomically, merges by piece score, byte fallback.
 *
 * A tokenizer is immutable after loading; encode/decode may be called from
 * several threads at once. */
#ifndef ND_TOKENIZER_H
#define ND_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "io/spm_model.h"

typedef struct nd_tokenizer nd_tokenizer;

/* Growable id vector; encode appends to it. Zero-initialise before use. */
typedef struct {
    int32_t *v;
    size_t n, cap;
} nd_idvec;

int nd_idvec_push(nd_idvec *iv, int32_t id);
void nd_idvec_free(nd_idvec *iv);

/* Piece types of the .cact blob (docs/formats.md §4.3). */
enum {
    ND_TK_NORMAL = 0,
    ND_TK_UNKNOWN = 1,
    ND_TK_CONTROL = 2,
    ND_TK_USER_DEFINED = 3,
    ND_TK_BYTE = 4,
};

/* Load from a file: a .cact tokenizer blob if the bytes parse exactly as one,
 * else a SentencePiece .model. */
int nd_tokenizer_load(const char *path, nd_tokenizer **out);
int nd_tokenizer_from_spm(const nd_spm_model *m, nd_tokenizer **out);
/* The blob carries no normaliser: it means identity normalisation without
 * whitespace collapsing, as upstream's reference encoder does. */
int nd_tokenizer_from_blob(const unsigned char *blob, size_t len, nd_tokenizer **out);
void nd_tokenizer_free(nd_tokenizer *t);

/* Serialise as a .cact tokenizer blob (malloc'd; caller frees), typed the
 * way upstream's exporter does: only the ten chat markers are USER_DEFINED. */
int nd_tokenizer_write_blob(const nd_tokenizer *t, unsigned char **blob, size_t *len);
/* The same as a given model generation's exporter writes it: 2 as above; 3
 * types all 24 of 3.x's chat markers USER_DEFINED (the ten plus <context>,
 * <image>, <speech>, <tts>, <imagen>, <extract>, <schema> and their closing
 * tags) and writes 3.x's fixed special ids PAD 0, EOS 1, BOS 2, UNK 3. */
int nd_tokenizer_write_blob_gen(const nd_tokenizer *t, int generation, unsigned char **blob,
                                size_t *len);

int nd_tokenizer_vocab_size(const nd_tokenizer *t);
int nd_tokenizer_pad_id(const nd_tokenizer *t); /* -1 if the model has none */
int nd_tokenizer_eos_id(const nd_tokenizer *t);
int nd_tokenizer_bos_id(const nd_tokenizer *t);
int nd_tokenizer_unk_id(const nd_tokenizer *t);
/* Piece bytes of `id` (not NUL-terminated in general; *len set), or NULL. */
const char *nd_tokenizer_piece(const nd_tokenizer *t, int id, size_t *len);
float nd_tokenizer_score(const nd_tokenizer *t, int id);
int nd_tokenizer_type(const nd_tokenizer *t, int id); /* ND_SPM_* or -1 */
/* Id of a piece string as SentencePiece's PieceToId (unk id if absent). */
int nd_tokenizer_piece_to_id(const nd_tokenizer *t, const char *s, size_t len);

/* Encode `len` bytes of text, appending ids to *out. Any bytes are accepted
 * (invalid UTF-8 becomes U+FFFD as in SentencePiece). */
int nd_tokenizer_encode(const nd_tokenizer *t, const char *text, size_t len, nd_idvec *out);

/* Optional memo of merge results for repeated words, for encoding many
 * texts with one tokenizer (results are identical with or without it).
 * Not thread-safe: one cache per thread. NULL from new on OOM. */
typedef struct nd_tok_cache nd_tok_cache;
nd_tok_cache *nd_tok_cache_new(void);
void nd_tok_cache_free(nd_tok_cache *c);
int nd_tokenizer_encode_cached(const nd_tokenizer *t, nd_tok_cache *cache, const char *text,
                               size_t len, nd_idvec *out);

/* Decode ids to text (malloc'd, NUL-terminated; *len excludes the NUL).
 * Byte pieces are reassembled, U+2581 becomes a space, the leading dummy
 * prefix space is dropped, control pieces vanish. */
int nd_tokenizer_decode(const nd_tokenizer *t, const int32_t *ids, size_t n, char **text,
                        size_t *len);

#endif
