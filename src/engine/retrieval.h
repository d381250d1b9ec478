/* Tool retrieval (upstream doc/apis.md "Tool retrieval"): above
 * ND_RETRIEVAL_TOP_K declared tools, every tool's compact JSON and each
 * turn's query are embedded with the archive's contrastive head, and only
 * the ND_RETRIEVAL_TOP_K tools with the highest dot product (cosine: the
 * embeddings are unit length) enter the prompt and the grammar.
 *
 * The tool embeddings can persist in an index file keyed by the SHA-256
 * of the archive and of each tool's text. Layout (little-endian):
 *   "NDTIDX01", u32 version, u32 dim, u32 n, u32 0,
 *   u8 model_digest[32], u8 tools_digest[32] (over the tool digests),
 *   n x (u8 tool_digest[32], f32 emb[dim]),
 *   u8 file_digest[32] (SHA-256 of everything before it).
 * A file that does not check out (size, magic, digest) is refused and
 * rebuilt; one for another model is rebuilt; one for other tools lends
 * only the entries whose tool digest matches. Writes are atomic.
 *
 * Internal header. */
#ifndef ND_ENGINE_RETRIEVAL_H
#define ND_ENGINE_RETRIEVAL_H

#include <stddef.h>

#include "engine/grammar.h"
#include "engine/heads.h"
#include "text/pyjson.h"
#include "text/tokenizer.h"

#define ND_RETRIEVAL_TOP_K 5
/* Texts are cut to this many tokens before embedding, as upstream's
 * encode_for_retrieval does (max_len=256). */
#define ND_RETRIEVAL_MAX_TOKENS 256
/* When the best ND_RETRIEVAL_TOP_K tools do not fit, fewer are rendered,
 * leaving this many tokens of the context for the answer (the reasoning
 * and the call) beyond the session's own room; the best tool alone is
 * kept whatever it takes (the session says when even it does not fit). */
#define ND_RETRIEVAL_ANSWER_TOKENS 64

/* What happened to the index file. */
typedef enum {
    ND_INDEX_NONE,        /* no path: embeddings kept in memory only */
    ND_INDEX_REUSED,      /* fingerprints matched: loaded, file untouched */
    ND_INDEX_CREATED,     /* no file yet: written */
    ND_INDEX_STALE_MODEL, /* written by another model: rebuilt */
    ND_INDEX_STALE_TOOLS, /* other tools: matching entries kept, rest re-embedded */
    ND_INDEX_CORRUPT,     /* refused (truncated, bad digest, ...): rebuilt */
} nd_index_status;

typedef struct {
    int n, dim;
    float *emb;   /* [n, dim] */
    int embedded; /* tools embedded by the model here (not taken from the file) */
    nd_index_status status;
    char note[512]; /* why the file was refused / could not be written, or "" */
} nd_tool_index;

/* Everything the embeddings depend on. */
typedef struct {
    const san_model *m;
    const nd_backend *be;
    const nd_heads *heads;
    const nd_tokenizer *tok;
    const unsigned char *model_digest; /* 32 bytes */
} nd_embedder;

/* Embed one text (no BOS, cut to ND_RETRIEVAL_MAX_TOKENS; an empty text
 * embeds as the zero vector). */
int nd_embed_text(const nd_embedder *e, const char *text, size_t len, float *emb);

/* Embeddings of texts[0..n) (the tools' compact JSON), through the index
 * file at `path` when non-NULL. A file that cannot be written leaves a
 * note, not an error: the embeddings are still good. */
int nd_tool_index_build(nd_tool_index *ix, const nd_embedder *e, const char *const *texts,
                        const size_t *lens, int n, const char *path);
void nd_tool_index_free(nd_tool_index *ix);

/* The k (<= n) best tools for the query embedding q, best first; equal
 * scores keep declaration order. */
void nd_tool_index_top(const nd_tool_index *ix, const float *q, int k, int *sel);

/* grammars of recently rendered subsets kept per session */
#define ND_RETRIEVAL_CACHE 8

/* A session's retrieval state. */
typedef struct {
    int on; /* more than ND_RETRIEVAL_TOP_K tools and a contrastive head */
    nd_tool_index index;
    int sel[ND_RETRIEVAL_TOP_K], n_sel; /* the subset in the context, declaration order */
    char note[600];                     /* for the session's warnings, or "" */
    struct {
        int sel[ND_RETRIEVAL_TOP_K], k;
        long used; /* last use, for eviction */
        nd_grammar *gram;
        nd_buf text;
    } cache[ND_RETRIEVAL_CACHE];
    long clock;
    long compiled; /* subset grammars compiled (tests: the cache spares work) */
    /* context fit (nd_retrieval_fit): the prompt text before the tools,
     * the most tokens BOS + head + tools + "</tools>\n" may take, the
     * session's warnings before any turn and with this turn's note */
    nd_buf head, base_warn, warn;
    const nd_tokenizer *tok;
    int max_tokens;
    int dropped; /* of the top ND_RETRIEVAL_TOP_K, left out to fit (last select) */
} nd_retrieval;

/* Set up retrieval for the declared tools (a JSON array): off for at most
 * ND_RETRIEVAL_TOP_K tools, or (with a note) when the archive has no
 * contrastive head; else every tool is embedded, through the index file at
 * index_path when non-NULL. */
int nd_retrieval_init(nd_retrieval *r, const nd_embedder *e, const nd_pj *tools,
                      const char *index_path);
/* Choose the tools for `query`. When the subset differs from the one in
 * the context, *tools_text is replaced by its compact JSON and *gram by its
 * grammar, compiled for those tools only and kept in the cache (owned by
 * r: the last ND_RETRIEVAL_CACHE subsets; never the whole catalogue);
 * require_call carries over. */
int nd_retrieval_select(nd_retrieval *r, const nd_embedder *e, const nd_pj *tools,
                        const char *query, int require_call, nd_buf *tools_text, nd_grammar **gram);
/* Make nd_retrieval_select keep the rendered prompt within max_tokens:
 * `head` is the prompt before the tools block's contents (BOS not
 * included, one token is counted for it); `warnings` the session's
 * warnings so far, which nd_retrieval_warnings extends with the note of
 * the last turn that left tools out. Without this call nothing is left
 * out. */
int nd_retrieval_fit(nd_retrieval *r, const nd_tokenizer *tok, const char *head, size_t head_len,
                     int max_tokens, const char *warnings);
/* The session's warnings with the last select's note (NULL when
 * nd_retrieval_fit was not called). */
const char *nd_retrieval_warnings(const nd_retrieval *r);
void nd_retrieval_free(nd_retrieval *r);

#endif
