/* Private layout of nd_tokenizer, shared by tokenizer.c (loading, decoding,
 * blob) and tok_encode.c (normalisation and BPE). */
#ifndef ND_TOKENIZER_INTERNAL_H
#define ND_TOKENIZER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

/* Open-addressing piece -> id table (ids index the tokenizer's arrays). */
typedef struct {
    int32_t *slots; /* -1 = empty */
    size_t mask;
} nd_piece_map;

struct nd_tokenizer {
    int n;
    const char **piece; /* into arena */
    uint32_t *plen;
    float *score;
    uint8_t *type; /* ND_SPM_* */
    char *arena;

    nd_piece_map normal;   /* NORMAL, USER_DEFINED, UNUSED: candidates for merges */
    nd_piece_map reserved; /* CONTROL, UNKNOWN, BYTE */
    uint32_t max_normal_len;
    int has_unused;
    int seg_ok; /* merges never cross a whitespace symbol (see tok_encode.c) */

    int unk_id, bos_id, eos_id, pad_id;
    int byte_ids[256];
    int byte_fallback;

    /* normaliser */
    int add_dummy_prefix, remove_extra_ws, escape_ws, ws_as_suffix;
    uint32_t *trie; /* darts-clone double array units (NULL = identity) */
    size_t trie_units;
    const char *norm_strs; /* NUL-separated replacement strings */
    size_t norm_len;
    char *unk_surface;

    /* user-defined symbols, grouped by first byte, longest first */
    int32_t *ud_ids;
    uint32_t ud_start[257];
};

uint64_t nd_piece_hash(const char *s, size_t len);
/* -1 if absent. */
int nd_piece_map_find(const nd_tokenizer *t, const nd_piece_map *m, const char *s, size_t len);

#endif
