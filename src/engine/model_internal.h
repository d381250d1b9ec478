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

/* ---- Needle 3 archives (tag 0x05E12A84, load.c) ----
 *
 * nd_cact3_config: the header as a generation-3 san_config (3.x semantics;
 * attention_gate, hada_factor_mode and the split permutations are read
 * from the tensors, which say them; the header has no field for cla_pairs
 * or engram_bank_ids, so the model is one without them).
 *
 * nd_cact3_to_qmodel: the quantised view. m gets the small tensors in
 * float (norms, q/k/v taps, attn_gate, the Hadamard MLP's d1 d2 b2 d3 d4,
 * Kronecker factors w1a..w3b and cond_v / cond_u, the mHC gains and biases,
 * the engram taps, final_norm), stacked along L as san_weights has them;
 * its matrices stay NULL and q points into f, which must outlive q.
 *
 * nd_cact3_to_model: every tensor dequantised into a float san_model (the
 * engine's float path; CQ rows back to (in, out) kernels). The archive may
 * be freed afterwards. Both check every record's dtype and shape against
 * the header's geometry first (hostile input), and the Hadamard tables
 * against the permutations 3.x derives. */
typedef struct {
    int code;             /* 1 embedding, 2 confidence, 3 router */
    int k, q, out;        /* probes per row (L+1 rows), queries, outputs */
    nd_qmat probes;       /* [(L+1) * k, d] */
    nd_qmat query;        /* [q, d] */
    nd_qmat proj;         /* [out, q * d] */
    float *gain;          /* (L+1, k) */
    float *row_bias;      /* (q, L+1, k) */
    float *bias;          /* (out) */
    float calibration[3]; /* router only */
    /* the matrices dequantised, in model/probe3.h's layouts */
    float *probes_f; /* [L+1, k, d] */
    float *query_f;  /* [q, d] */
    float *proj_f;   /* [q * d, out] (the flax kernel's layout) */
} nd_qhead3;

typedef struct {
    /* emb [V, d] (its first out_vocab rows are the logits head when
     * out_vocab > 0); layer[l]: wq [H*qk, d], wk [G*qk, d], wv [G*v, d],
     * wgate [H*v or H (headwise), d], wout [d, H*v]; phi_pre / phi_post
     * [L*n, n*d], phi_res [L*n*n, n*d]; eng[s]: table [K*slots, sub],
     * wk / wv [d, K*sub] */
    nd_qweights q;
    int32_t *perm1, *perm2; /* hada_n entries: hada_p1 / hada_p2 */
    int n_heads;            /* probe heads, in the manifest's order */
    nd_qhead3 head[3];
} nd_qweights3;

int nd_cact3_config(const cact_file *f, san_config *c);
int nd_cact3_to_qmodel(const cact_file *f, san_model *m, nd_qweights3 *q);
int nd_cact3_to_model(const cact_file *f, san_model *m);
void nd_qweights3_free(nd_qweights3 *q);

struct needle_model {
    san_model m;
    cact_file arch; /* quantised path (and every Needle 3 model): the archive */
    nd_qweights qw;
    int quant;
    /* 2 or 3: the archive's generation. A Needle 3 model's matrices are
     * qw3.q (quantised path); qw3's probe heads (float copies) serve both
     * paths, their CQ views only the quantised one. */
    int gen;
    nd_qweights3 qw3;
    nd_tokenizer *tok;
    const nd_backend *be;
    int kv_window;
    trie_node *trie;
    int n_trie;
    int *tok_next;
    uint8_t *reason_ok; /* tokens allowed while reasoning */
    int id_bos, id_im_end, id_think_end, id_tool_call_end, id_space;
    int id_think, id_tool_call; /* Needle 3: the model picks one after "\u2581" */
    nd_idvec think_open;        /* target start: "▁<think>" as training encodes it */
    nd_idvec think_close;       /* "\n<tool_call>" after </think> */
    nd_heads heads;             /* probe heads (retrieval, confidence), when exported */
    unsigned char digest[32];   /* SHA-256 of the archive: keys the tool index */
    nd_prefix_cache pc;         /* system + tools prefixes' KV rows, shared by sessions */
    char err[1024];
};

/* Needle 3 probe head of the given code (1 embedding, 2 confidence, 3
 * router), or NULL when the archive has none. */
const nd_qhead3 *nd_model_head3(const struct needle_model *M, int code);
/* Run the whole of t[0..T) through a fresh cache (full causal attention)
 * and pool its cells with head h (model/probe3.h): out gets h->out floats
 * (the embedding head's unit-length). Pad ids (0) are left out of the
 * pooling. */
int nd_head3_run(const struct needle_model *M, const nd_qhead3 *h, const int32_t *t, int T,
                 float *out);

/* the bytes a token stands for (U+2581 as ' ', byte pieces as their byte);
 * 0 for control and unknown pieces */
int nd_piece_bytes(const nd_tokenizer *t, int id, unsigned char *out, int *len);
/* The vocabulary's byte trie, tok_next and reason_ok, from M->tok and
 * M->m.dims.V (the load does this; exposed for the tests). */
int nd_model_build_trie(needle_model *M);

#endif
