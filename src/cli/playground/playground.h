/* needle playground: a local web UI over the engine (upstream
 * needle/playground). Three parts: the model slot (one loaded model and
 * its session, swapped under a lock), the fine-tune job (our own binary
 * run as child processes, one at a time) and the HTTP server
 * (libmicrohttpd) that routes upstream's endpoints to them. */
#ifndef ND_PLAYGROUND_H
#define ND_PLAYGROUND_H

#include <signal.h>
#include <stddef.h>

/* Body limits: a .cact upload, any JSON request; all bodies being
 * received at once share PG_UPLOAD_BUDGET_BYTES (503 beyond). */
#define PG_MAX_UPLOAD_BYTES (64ll << 20)
#define PG_MAX_JSON_BYTES (1ll << 20)
#define PG_UPLOAD_BUDGET_BYTES (2 * PG_MAX_UPLOAD_BYTES)

/* Connections: event-loop threads serving them all, at most this many
 * open (and per client address when not on loopback); the idle timeout,
 * and the deadlines for a request's headers (from connect, or from the
 * end of the previous request) and for its body. /complete and
 * /load-model run in a server thread: at most PG_MAX_MODEL_REQUESTS at
 * once (503 beyond), so threads stay free for the rest. */
#define PG_SERVER_THREADS 6
#define PG_MAX_CONNECTIONS 256
#define PG_MAX_CONNECTIONS_PER_IP 32
#define PG_IDLE_TIMEOUT_S 30
#define PG_HEADER_DEADLINE_S 10
#define PG_BODY_DEADLINE_S 120
#define PG_MAX_MODEL_REQUESTS (PG_SERVER_THREADS - 2)

/* ---- model slot (model_slot.c) ---- */

/* Load the initial model (NULL weights: none until one is uploaded or
 * fine-tuned). 0 on success, else prints why and returns 1. */
int pg_slot_init(const char *weights_path, int max_new_tokens);
void pg_slot_free(void);
/* {"name": ..., "loaded": bool, "max_seq_len": N}; caller frees. */
char *pg_slot_info_json(void);
/* One fresh turn with these tools (a new session when the tools differ
 * from the last call's, else a reset one); require_call: at least one call
 * (tool_choice "required"). Returns a malloc'd envelope JSON;
 * *http_status is 200, or 400 (bad tools / no model). */
char *pg_slot_complete(const char *tools_json, const char *query, int require_call,
                       int *http_status);
void pg_slot_reset(void);
/* Replace the model by one parsed from memory / a file. On failure the
 * loaded model stays and `why` holds the reason; returns 0 or -1. */
int pg_slot_load_buffer(const void *data, size_t len, const char *name, char *why, size_t why_len);
int pg_slot_load_path(const char *path, const char *name, char *why, size_t why_len);

/* ---- fine-tune job (finetune_job.c) ---- */

struct pg_job_config {
    const char *self_exe;  /* our binary, run as `needle finetune` / `needle build` */
    const char *base;      /* base checkpoint pickle */
    const char *tokenizer; /* SentencePiece model for finetune + build */
    const char *workdir;   /* where every produced file goes */
};
void pg_job_configure(const struct pg_job_config *cfg);
/* Start a fine-tune of `jsonl` (examples, one per line) with these
 * settings; with jsonl NULL, first `needle generate-data` `samples`
 * examples for tools_json with OPENROUTER_API_KEY = api_key (upstream's
 * flow; OPENROUTER_URL comes from our environment). 0: started; 409: one
 * is running; 400: bad request (why). */
int pg_job_start(const char *jsonl, const char *tools_json, const char *api_key, int samples,
                 int epochs, int batch_size, double lr, int max_len, char *why, size_t why_len);
/* epochs, batch_size or lr <= 0 above: the base's recommended setting
 * (pg_job_defaults_json). */
/* The settings the fine-tune form starts from: the base checkpoint's
 * recommended lr, lora_rank, lora_alpha, epochs, batch_size over `needle
 * finetune`'s own defaults, each with where it came from; caller frees. */
char *pg_job_defaults_json(void);
/* upstream's status object plus progress; caller frees. */
char *pg_job_status_json(void);
/* Whether NAME is a file this playground wrote (and may be served). */
int pg_job_produced(const char *name);
/* Stop a running job (SIGTERM to the child) and wait for it. */
void pg_job_shutdown(void);

/* ---- HTTP server (server.c) ---- */

/* Block SIGINT/SIGTERM in this thread (and every thread it starts later:
 * OpenMP workers, the server's) so that pg_serve's sigwait receives them;
 * call before anything starts threads. Ignores SIGPIPE. */
void pg_block_stop_signals(sigset_t *set);
/* Serve until SIGINT/SIGTERM, answering only requests addressed to this
 * server (Host) and, for POST, from its own page or one of
 * allow_origins (--allow-origin). Returns the exit code. */
int pg_serve(const char *host, int port, const char *workdir, const char *const *allow_origins,
             size_t n_allow);

#endif
