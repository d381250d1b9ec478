/* The inference engine (issue 6): a .cact archive run in place (quantised
 * matmuls on its CQ blobs) or turned back into float32 SAN weights,
 * incremental decoding with a KV cache, and the tool-calling
 * session (prompt, grammar-constrained call, envelope) behind include/needle.h.
 *
 * Internal header: the public API is include/needle.h. */
#ifndef ND_ENGINE_H
#define ND_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "engine/qmat.h"
#include "io/cact.h"
#include "model/block.h"
#include "model/params.h"
#include "text/pyjson.h"
#include "text/tokenizer.h"

/* ---- loading ---- */

/* Config of the model an archive holds (from its header). */
int nd_cact_config(const cact_file *f, san_config *c);

/* Dequantise every tensor of a parsed archive into a float32 san_model:
 * CQ and FP16 blobs become float32, matrices stored [out, in] are transposed
 * back to (in, out) kernels and the mHC phi matrices from (L*k, n*d) back to
 * (L, n*d, k). The archive may be freed afterwards. */
int nd_cact_to_model(const cact_file *f, san_model *m);

/* The quantised path's matrices: views into the archive's CQ blobs (the
 * archive must outlive them). */
typedef struct {
    nd_qmat wq, wk, wv, wgate, wout; /* [out, in] */
} nd_qlayer;

typedef struct {
    nd_qmat emb;                        /* [V, d]: rows for the lookup, tied logits */
    nd_qlayer *layer;                   /* [L] */
    nd_qmat phi_pre, phi_post, phi_res; /* [L * k, n * d] */
    struct {
        nd_qmat table, wk, wv; /* [K * slots, sub], [d, K * sub] x 2 */
    } eng[SAN_MAX_SITES];
} nd_qweights;

/* Quantised path: only the small tensors (norms, gains, diagonals, taps)
 * are converted into m (its matrices stay NULL); q points into f. */
int nd_cact_to_qmodel(const cact_file *f, san_model *m, nd_qweights *q);
void nd_qweights_free(nd_qweights *q);
/* Bytes of weights one decoded token reads (all matrices once, one row per
 * engram table, the whole embedding for the logits). */
size_t nd_qweights_bytes_per_token(const nd_qweights *q, const san_model *m);
/* 1 when $NEEDLE_FLOAT asks for the dequantise-to-float path. */
int nd_engine_float_path(void);

/* The envelope's call list for a complete constrained call, the JSON
 * call[0..call_len) ([{"name":...,"arguments":{...}}, ...]), appended
 * to calls as [{"name": N, "arguments": A}, ...], each call once: one the
 * list repeats verbatim (the same name and arguments, as dumped) is left
 * out. *is_call: whether a call is left. */
int nd_call_list(const char *call, size_t call_len, nd_buf *calls, int *is_call);

struct needle_model;
/* The float path over `weights` instead of the archive's own matrices: the
 * archive (data, len; borrowed) gives the tokenizer, probe heads and
 * header, `weights` (same geometry; copied) every weight. */
struct needle_model *nd_model_load_float_weights(const void *data, size_t len,
                                                 const san_model *weights);
/* The float weights a model runs with (NULL on the quantised path). */
const san_model *nd_model_weights(const struct needle_model *M);

/* The archive's RAW tokenizer blob as a tokenizer. */
int nd_cact_tokenizer(const cact_file *f, nd_tokenizer **tok);
/* After loading from a mapped archive: unmap the pages loading touched
 * (tokenizer, small tensors, headers; they stay in the page cache), so
 * the process keeps only the pages the forward pass reads. */
void nd_cact_release_pages(const cact_file *f);

/* ---- incremental decoding ---- */

/* prompt tokens a session runs per forward: scratch scales with it (RSS:
 * ~25 KB a row), and fewer, larger chunks mean fewer thread handoffs a
 * prompt (two threads, 256-token prompt: 128 is ~11% faster than 64) */
#define ND_SESSION_CHUNK 128
/* rows a sliding KV cache holds past what a slide keeps: the batch of new
 * rows between two slides. A longer chunk runs in pieces of this once the
 * cache is full, so the cache's size does not grow with the chunk. */
#define ND_KV_SLIDE_ROWS 64
/* tokens of the context kept past the system prompt and tools for the
 * query and the answer: a longer tools block is refused */
#define ND_SESSION_ROOM 16
#define ND_ATT_MAX_HD 512
#define ND_VP_GROUP                                                                                \
    32 /* v' values per int8 scale */ /* largest head dim the cached attention takes */

/* Everything that depends on the tokens seen so far: per layer K (after
 * k_norm and RoPE) and V rows, per engram site the v' = e @ Wv rows (the
 * taps read v' at t - j*D), and the token history (the n-gram hash reads the
 * last max(order)-1 tokens). Rows are kept for every position, so rewinding
 * to an earlier length is just setting `len` (prefix reuse, reset). Storage
 * grows on demand up to max_seq_len. */
typedef struct {
    const san_model *m;
    const nd_backend *be;
    const nd_qweights *qw; /* non-NULL: quantised matmuls (nd_kv_use_quant) */
    nd_qact qa;            /* the current input's int8 activations */
    /* when set, called with the cells probe heads pool: layer -1 the x0
     * rows, then each layer's lane mean, for the n rows from position p0 */
    void (*cells_hook)(void *ctx, int layer, int p0, const float *cells, int n);
    void *cells_ctx;
    int len, cap, max_len;
    int faulted; /* rows [0, faulted) of every array have their pages mapped (nd_kv_map_rows) */
    int rows_hw; /* most rows ever held: the cache's resident part (the rest of cap is untouched) */
    int kv_window; /* attend only to the last kv_window keys (0 = all) */
    /* sliding window (nd_kv_slide): the first n_sink rows are pinned and
     * always attended (upstream's doc-prefix sinks); older rows after them
     * are dropped so the context never runs out. Row r >= n_sink holds
     * absolute position r + evicted (RoPE and the window use it). -1 = off. */
    int n_sink;
    long evicted;
    int32_t *tokens;
    /* kv_bits 8: K/V rows as int8 with one scale per (row, kv head);
     * otherwise float32 */
    int kv_int8;
    float *k, *v;                       /* [L][cap][kv_dim] (float cache) */
    int8_t *k8, *v8;                    /* [L][G][cap][hd] (int8 cache): a kv head's keys are one
                                         * contiguous stream for the attention to read */
    float *ks, *vs;                     /* [L][cap][G] scales of the int8 rows */
    float *rope_far_cos, *rope_far_sin; /* [chunk][hd/2]: the chunk's rows */
    size_t scratch_bytes;
    size_t scratch_keep;      /* the scratch's first bytes: kept for the state's life */
    size_t scratch_mapped;    /* the scratch's first bytes with pages known mapped */
    float *vp[SAN_MAX_SITES]; /* [cap][d] (float cache) */
    /* with the int8 cache, v' rows are int8 too, one scale per 32 values
     * (upstream's budget counts them so) */
    int vp_int8;
    int8_t *vp8[SAN_MAX_SITES]; /* [cap][d] */
    float *vps[SAN_MAX_SITES];  /* [cap][d / ND_VP_GROUP] */
    float *rope_freq;           /* [hd/2] RoPE frequencies (rows: nd_kv_rope_rows) */
    /* scratch for one chunk of up to `chunk` new tokens */
    int chunk;
    /* a sliding cache's batch of new rows between two slides (kv.c's
     * slide_high): min(chunk, ND_KV_SLIDE_ROWS) */
    int slide_rows;
    void *scratch;
    float *x0, *X, *Xn, *eng_e, *eng_k, *eng_v, *eng_vp, *xm, *hf, *att_s;
    int att_threads;  /* att_s holds score rows for this many threads */
    int big_parallel; /* this step's projections and attention may fork */
    /* until then (nd_wtime) forwards run on the calling thread only: a crew
     * helper of an earlier one kept it waiting (cores busy with other jobs) */
    double crew_off_until;
    int att_force; /* ND_ATT_* + 1 picks the attention kernel (tests); 0: the best */
    int32_t *eng_idx, *win_tok;
    nd_layout_buf lay; /* one sequence of the chunk's rows */
    /* the block's values for the chunk's rows (model/block.h): nothing kept
     * for a backward (rstd, lse NULL), q and k normalised in place */
    san_layer_acts la;
    /* Needle 3 (config generation 3): layer l's K and V rows (k_dim, v_dim
     * wide: k, v float; or k8, v8 [slot][cap][k_dim | v_dim] int8 with ks,
     * vs [slot][cap][G] scales) live in cache slot kv_slot[l], a CLA consumer's
     * slot being its producer's (it stores none of its own); with conv taps
     * cv holds the last pre-conv q|k|v rows that the taps of later rows read
     * (below); hada3 is the Hadamard MLP's geometry (a san_hada3_geom) */
    int gen3, kv_layers;
    int *kv_slot;
    float *cv;
    void *hada3;
    /* Needle 3's bounded history (kv.c): cv is a ring of cv_ring pre-conv
     * rows per layer ([L][cv_ring][q_dim + k_dim + v_dim]), row r at (r +
     * evicted) % cv_ring, holding rows from key cv_lo on; cv_pin
     * ([L][taps - 1][...]) the rows before row cv_pin_at (the pinned
     * prefix's end; -1 none; cv_pin_want: take it when a forward passes).
     * A local layer's slot (kv_local) keeps rows below lr_base in place and
     * later ones in a ring of lr_ring rows (0: off) from key lr_lo on;
     * lr_win: the local window; redo_from: rows from here must be run
     * again before the next forward; unbounded (tests): the old full
     * history; cv_hw: ring rows ever touched. */
    int *kv_local;
    float *cv_pin;
    int cv_ring, cv_pin_at, cv_pin_want, cv_hw;
    int lr_ring, lr_base, lr_win, redo_from, unbounded;
    long cv_lo, lr_lo;
} nd_kv_state;

/* int8 cache row of position row j, layer l, kv head g (k8 or v8) */
static inline int8_t *nd_kv_row8(const nd_kv_state *s, int8_t *base, int l, int g, int j)
{
    return base + (((size_t)l * (size_t)s->m->dims.G + (size_t)g) * (size_t)s->cap + (size_t)j) *
                      (size_t)s->m->dims.hd;
}

/* chunk: the most tokens one nd_kv_forward call processes at a time
 * (longer inputs are split). kv_window 0 = full causal attention. */
int nd_kv_init(nd_kv_state *s, const san_model *m, const nd_backend *be, int chunk, int kv_window);
void nd_kv_free(nd_kv_state *s);
/* Hand the chunk scratch's pages back to the system (the next forward
 * touches only the rows it runs: a turn of 30 tokens after a 64-token
 * chunk holds 30 rows' worth); its contents are not kept. */
void nd_kv_release_scratch(nd_kv_state *s);
/* Free the chunk scratch only (the state runs no more forwards): its
 * memory is back before the rows are copied or freed. */
void nd_kv_free_scratch(nd_kv_state *s);
/* Run the matrices from q (m then only needs its small tensors). */
void nd_kv_use_quant(nd_kv_state *s, const nd_qweights *q);
/* Store K/V as int8 rows with per-head scales when bits == 8 (the
 * header's kv_bits), float32 otherwise. Call before the first forward. */
void nd_kv_set_bits(nd_kv_state *s, int bits);
/* Turn the sliding window on with the first n_sink rows pinned: forwards
 * never fail for length, the oldest unpinned rows are dropped instead. */
void nd_kv_slide(nd_kv_state *s, int n_sink);
/* Bytes this state holds (scratch + the cache rows ever used: the rest of
 * its capacity is reserved address space, never touched); with the window
 * on it never exceeds nd_kv_bytes_bound. */
size_t nd_kv_bytes(const nd_kv_state *s);
size_t nd_kv_bytes_bound(const nd_kv_state *s);
/* Forget everything after the first `len` positions. */
void nd_kv_rewind(nd_kv_state *s, int len);
/* Run `n` new tokens at positions len..len+n-1 and append them. Logits of
 * every new row go to `logits` ([n, V]) when all_logits, else only the last
 * row's ([V]); logits may be NULL. */
int nd_kv_forward(nd_kv_state *s, const int32_t *tok, int n, float *logits, int all_logits);

/* The first `len` rows of a state (tokens, K/V of every layer, engram v'
 * rows): everything a later forward reads of them, so restoring a snapshot
 * of a prefix equals running that prefix again. */
typedef struct {
    int len, kv_int8;
    size_t bytes;
    void *data;
} nd_kv_snap;
/* rows must start at position 0 (nothing evicted before them) */
int nd_kv_snapshot(const nd_kv_state *s, int len, nd_kv_snap *out);
/* the same without the checks against len (the caller knows rows 0..len-1
 * are the prefix's): reads nothing a forward of s changes */
int nd_kv_snapshot_rows(const nd_kv_state *s, int len, nd_kv_snap *out);
/* Replace everything in s by the snapshot's rows (s's window settings
 * stay; the caller sets the sinks). */
int nd_kv_restore(nd_kv_state *s, const nd_kv_snap *snap);
void nd_kv_snap_free(nd_kv_snap *snap);

/* ---- prefix KV cache (per model) ----
 * The system + tools prefix's rows, keyed by SHA-256 of its token ids, kept
 * for the next session (or retrieved tool set) with the same prefix: an LRU
 * of a few entries shared by the model's sessions under a lock. */
struct needle_model;
/* entries 0 turns the cache off (and empties it); the default is 4, or
 * $NEEDLE_PREFIX_CACHE */
void nd_prefix_cache_limit(struct needle_model *M, int entries);
typedef struct {
    int entries;
    long hits, misses;
    size_t bytes;
} nd_prefix_cache_stats;
nd_prefix_cache_stats nd_prefix_cache_get_stats(struct needle_model *M);

/* Test hook: a session's decoder state (its retained tokens, sinks). */
struct needle_session;
const nd_kv_state *nd_session_kv(const struct needle_session *S);

/* Write an error envelope ({"success": false, "error": msg, "error_code":
 * code, ...}) into buf when it fits (else buf[0] = 0 when buf_len > 0).
 * Returns the envelope's length, or NEEDLE_EBUFFER when it does not fit. */
int nd_error_envelope(const char *msg, const char *code, char *buf, int buf_len);

#endif
