/* The engine's model object (struct needle_model), shared by the model
 * loader (model.c) and sessions (session.c). Internal to src/engine. */
#ifndef ND_ENGINE_MODEL_INTERNAL_H
#define ND_ENGINE_MODEL_INTERNAL_H

#include <stdint.h>

#include "engine/engine.h"
#include "engine/heads.h"
#include "engine/prefix_cache.h"
#include "needle.h"

#define PIECE_MAX 64

/* vocabulary as a byte trie (pieces with U+2581 as ' ', byte pieces as their byte) */
typedef struct {
    int child, sibling, tok; /* first token id ending here (-1), chained by tok_next */
    unsigned char byte;
} trie_node;

struct needle_model {
    san_model m;
    cact_file arch; /* quantised path: the archive the matrices are read from */
    nd_qweights qw;
    int quant;
    nd_tokenizer *tok;
    const nd_backend *be;
    int kv_window;
    trie_node *trie;
    int n_trie;
    int *tok_next;
    uint8_t *reason_ok; /* tokens allowed while reasoning */
    int id_bos, id_im_end, id_think_end, id_tool_call_end, id_space;
    nd_idvec think_open;      /* target start: "▁<think>" as training encodes it */
    nd_idvec think_close;     /* "\n<tool_call>" after </think> */
    nd_heads heads;           /* probe heads (retrieval, confidence), when exported */
    unsigned char digest[32]; /* SHA-256 of the archive: keys the tool index */
    nd_prefix_cache pc;       /* system + tools prefixes' KV rows, shared by sessions */
    char err[1024];
};

/* the bytes a token stands for (U+2581 as ' ', byte pieces as their byte);
 * 0 for control and unknown pieces */
int nd_piece_bytes(const nd_tokenizer *t, int id, unsigned char *out, int *len);

#endif
