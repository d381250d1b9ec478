/* needle: run a tuned .cact tool-calling model from C.
 *
 * Two layers:
 *
 * 1. Handles. A needle_model is immutable once loaded and may be shared by
 *    any number of sessions and threads; a needle_session holds one
 *    conversation (KV cache, tools, grammar) and must be used by one thread
 *    at a time. Several models live in one process. Every handle keeps its
 *    own last error message; a failed constructor (NULL return) leaves its
 *    message in needle_thread_error() of the calling thread. No globals are
 *    touched on this path.
 *
 * 2. The upstream ABI (cactus-compute/needle needle/__init__.py drives
 *    libneedle through exactly these): needle_load, needle_init,
 *    needle_complete, needle_reset, needle_last_error. A thin layer over
 *    one global model + session, serialised by a mutex.
 *
 * needle_complete / needle_session_complete write one JSON object (the
 * envelope) into buf, NUL-terminated, and return its length in bytes
 * (excluding the NUL):
 *
 *   {"type": "call" | "respond", "success": true, "error": null,
 *    "error_code": null, "function_calls": [{"name": ..., "arguments": {...}}],
 *    "reasoning": "...", "confidence": 0.93, "prefill_tps": ..., "decode_tps": ...,
 *    "peak_ram_mb": ...}
 *
 * - type is "call" when function_calls is non-empty, "respond" for [].
 * - confidence, as upstream documents it (doc/apis.md), is the minimum of
 *   two signals: the archive's calibrated confidence head, sigmoid of its
 *   logit over the whole sequence (prompt, reasoning, call and closing
 *   markers; one full causal forward), and the decoding probability of the
 *   call: the minimum, over the call JSON's tokens, of the model's
 *   unconstrained softmax probability of the chosen token. An archive
 *   without the head (checkpoints that never trained it, e.g. from
 *   `needle init`) reports the decoding probability alone. The head is not
 *   fine-tuned, so upstream's Python client reports null for tuned weights;
 *   the engine cannot tell tuned archives apart and leaves that to the
 *   caller.
 * - prefill_tps / decode_tps: prompt tokens / prefill seconds and generated
 *   tokens / decode seconds of this turn; peak_ram_mb: the process's peak
 *   resident set (getrusage), so it covers everything in the process.
 * - When the model runs out of max_new_tokens before closing the call, the
 *   decoder switches to completing the JSON by the shortest path, so the
 *   call stays valid; if even that does not fit, success is false with
 *   error_code "max_new_tokens" and function_calls [].
 *
 * Errors: a negative return (NEEDLE_E*). For errors other than
 * NEEDLE_EBUFFER an error envelope ({"success": false, "error": "...",
 * "error_code": "...", ...}) is still written when it fits. A buffer too
 * small for the envelope returns NEEDLE_EBUFFER and writes only a NUL at
 * buf[0] (when buf_len > 0): never more than buf_len bytes.
 *
 * Conversation: the first complete(text) after needle_session_new / reset
 * renders the training template (docs/formats.md §3.2, §6.2):
 *   [<|im_start|>system\n SYSTEM <|im_end|>\n]
 *   <|im_start|>user\n<tools> TOOLS </tools>\n TEXT <|im_end|>\n<|im_start|>assistant\n
 * with TOOLS re-serialised compactly as training does (key order kept,
 * ensure_ascii, Python float repr). The model writes
 *   <think>REASONING</think>\n<tool_call>[...]</tool_call><|im_end|>
 * where the call list is constrained by the tools' schemas. A later
 * complete(text) after a "call" turn is the tool result:
 *   \n<|im_start|>user\n<tool_result> TEXT </tool_result><|im_end|>\n<|im_start|>assistant\n
 * (upstream defines no template for it; this is ours), and after a
 * "respond" turn a new user query:
 *   \n<|im_start|>user\n TEXT <|im_end|>\n<|im_start|>assistant\n
 * The system + tools prefix stays cached: reset rewinds to it.
 *
 * Tool retrieval (doc/apis.md): with more than 5 tools and a contrastive
 * head in the archive, each tool's compact JSON is embedded once when the
 * session is made, each first turn (after new / reset) embeds the query
 * (no BOS, at most 256 tokens), and only the 5 tools with the highest
 * cosine score enter the prompt and the grammar (the others cannot be
 * called); later turns of the conversation keep that subset. The
 * embeddings can persist in a tool index file (tool_index_path), keyed by
 * SHA-256 digests of the archive and of each tool: a matching file is
 * loaded and left untouched, one for other tools lends the entries that
 * still match, one for another model is rebuilt, and a damaged one is
 * refused (see needle_session_warnings) and rebuilt; writes are atomic.
 * An index that cannot be written is a warning, not an error. Without a
 * contrastive head every tool is rendered, with a warning. */
#ifndef NEEDLE_H
#define NEEDLE_H

#include <stddef.h>

/* NEEDLE_API marks the library's exported functions: libneedle is built
 * with hidden visibility, so these declarations are the whole of what
 * libneedle.so exports (tests/test_exports.py holds the two to each other).
 * On Windows the library's own build (NEEDLE_BUILDING) exports them from
 * the DLL; callers need no import attribute for functions. A caller may
 * define NEEDLE_API itself before including this header. */
#ifndef NEEDLE_API
#if defined(_WIN32) || defined(__CYGWIN__)
#ifdef NEEDLE_BUILDING
#define NEEDLE_API __declspec(dllexport)
#else
#define NEEDLE_API
#endif
#elif defined(__GNUC__) || defined(__clang__)
#define NEEDLE_API __attribute__((visibility("default")))
#else
#define NEEDLE_API
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define NEEDLE_OK 0
#define NEEDLE_EIO (-1)     /* file could not be read */
#define NEEDLE_EFORMAT (-2) /* malformed .cact, tools JSON, ... */
#define NEEDLE_ELIMIT (-4)  /* prompt longer than max_seq_len, too many tools, ... */
#define NEEDLE_ESHAPE (-5)  /* archive tensors do not fit the header's model */
#define NEEDLE_ENOMEM (-6)
#define NEEDLE_EARG (-7) /* NULL handle, bad argument */
#define NEEDLE_EUNSUPPORTED (-9)
#define NEEDLE_EBUFFER (-10) /* output buffer too small for the envelope */
#define NEEDLE_ESTATE (-11)  /* no model loaded / no session (global ABI) */

typedef struct needle_model needle_model;
typedef struct needle_session needle_session;

/* ---- handles ---- */

/* Load a .cact (dequantised to float32 at load). NULL on failure: see
 * needle_thread_error(). The buffer variant copies what it needs; the
 * caller may free `data` afterwards. */
NEEDLE_API needle_model *needle_model_load(const char *path);
NEEDLE_API needle_model *needle_model_load_buffer(const void *data, size_t len);
NEEDLE_API void needle_model_free(needle_model *m);
/* The built-in base model (upstream's engine answers with its base when no
 * weights are loaded): $NEEDLE_BASE_WEIGHTS if set, else needle-nano.cact
 * beside libneedle (or the program linking it statically), then in
 * ../share/needle from there, then in the installed data directory.
 * needle_default_weights_path writes the path it would load into buf. */
NEEDLE_API needle_model *needle_model_load_default(void);
NEEDLE_API int needle_default_weights_path(char *buf, size_t n);
/* Model geometry: max_seq_len and vocabulary size. */
NEEDLE_API int needle_model_max_seq_len(const needle_model *m);
NEEDLE_API const char *needle_model_error(const needle_model *m);

/* A session on `m` (which must outlive it). system may be NULL or "";
 * tools_json is any valid JSON text holding an array of tools
 * ({"name", "description", "parameters": JSON schema}). The system + tools
 * prefix is prefilled here. NULL on failure: see needle_thread_error(). */
NEEDLE_API needle_session *needle_session_new(needle_model *m, const char *system,
                                              const char *tools_json);
/* The same with upstream's tool_index_path (NULL: embeddings in memory
 * only; see "Tool retrieval" above). */
NEEDLE_API needle_session *needle_session_new_with_index(needle_model *m, const char *system,
                                                         const char *tools_json,
                                                         const char *tool_index_path);
NEEDLE_API void needle_session_free(needle_session *s);
/* One turn; see above. max_new_tokens <= 0 means 256. */
NEEDLE_API int needle_session_complete(needle_session *s, const char *text, int max_new_tokens,
                                       char *buf, int buf_len);
/* Rewind the conversation to just after the tools (kept cached). */
NEEDLE_API int needle_session_reset(needle_session *s);
/* Tokens of the cached system + tools prefix. */
NEEDLE_API int needle_session_context_tokens(const needle_session *s);
/* Bytes the session holds (KV cache at its current size, decoder scratch,
 * per-turn buffers), and the most it can ever hold: the cache is a window
 * of kv_window positions (plus the pinned system + tools prefix) that
 * slides, so a conversation never runs out of context. */
NEEDLE_API long long needle_session_memory_bytes(const needle_session *s);
NEEDLE_API long long needle_session_memory_bound(const needle_session *s);
/* Newline-separated warnings from compiling the tools' schemas (ignored
 * keywords, unsupported patterns), or "". */
NEEDLE_API const char *needle_session_warnings(const needle_session *s);
NEEDLE_API const char *needle_session_error(const needle_session *s);
/* on != 0: the answer must be at least one call (no [] refusal), like
 * tool_choice "required"; off by default. */
NEEDLE_API int needle_session_require_call(needle_session *s, int on);
/* Tools the session embedded with the model when it was made (those taken
 * from a matching tool index are not counted); 0 without retrieval. */
NEEDLE_API int needle_session_tools_embedded(const needle_session *s);
/* Compact JSON array of the tools in the current context: all declared
 * tools, or the retrieved subset of the last first turn ("" before it). */
NEEDLE_API const char *needle_session_context_tools(const needle_session *s);

/* The archive's probe heads directly (on error: needle_thread_error()).
 * needle_model_embed: the retrieval embedding of `text` (unit length);
 * writes min(dim, out_len) floats and returns dim, NEEDLE_EUNSUPPORTED
 * without a contrastive head. needle_model_head_confidence: the confidence
 * head's probability for the token ids[0..n) (a whole rendered sequence,
 * BOS first); 0 or NEEDLE_EUNSUPPORTED without the head. */
NEEDLE_API int needle_model_embed(const needle_model *m, const char *text, float *out, int out_len);
/* The dimension needle_model_embed returns, without running it. */
NEEDLE_API int needle_model_embed_dim(const needle_model *m);
NEEDLE_API int needle_model_head_confidence(const needle_model *m, const int *ids, int n,
                                            double *p);

/* The calling thread's last error (after a NULL from a constructor). */
NEEDLE_API const char *needle_thread_error(void);

/* ---- upstream ABI (one global model and session) ---- */

/* 0 on success. Replaces any loaded model (and drops its session). */
NEEDLE_API int needle_load(const unsigned char *cact, unsigned long long n);
/* >= 0: tokens of the tool context (with tool retrieval: of the part
 * before the tools); < 0: error. tool_index_path: see "Tool retrieval". */
NEEDLE_API int needle_init(const char *system, const char *tools_json, const char *tool_index_path);
NEEDLE_API int needle_complete(const char *text, int max_new_tokens, char *buf, int buf_len);
NEEDLE_API void needle_reset(void);
/* Upstream 3.x's embedding call: the loaded archive's embedding of `text`
 * (unit length). With out NULL and dim 0 it returns the dimension only;
 * else writes min(dim, dimension) floats and returns the dimension.
 * NEEDLE_EUNSUPPORTED when the archive has no embedding head. */
NEEDLE_API int needle_embed(const char *text, float *out, int dim);
/* Message of the last failed global call ("" if none). */
NEEDLE_API const char *needle_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
