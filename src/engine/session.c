/* Models, sessions and the generation loop behind include/needle.h. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "core/mem.h"
#include "core/fileio.h"
#include "core/sha256.h"
#include "core/status.h"
#include "core/tuning.h"
#include "engine/copy_prior.h"
#include "engine/engine.h"
#include "engine/grammar.h"
#include "engine/model_internal.h"
#include "engine/heads.h"
#include "engine/prefix_cache.h"
#include "engine/retrieval.h"
#include "engine/choice_prior.h"
#include "engine/reason_prior.h"
#include "needle.h"
#include "text/pyjson.h"

struct needle_session {
    needle_model *model;
    nd_kv_state kv;
    nd_grammar *gram;   /* every declared tool */
    nd_grammar *active; /* the tools in the context: gram, or the retrieved subset's */
    nd_pj_doc *tools_doc;
    nd_retrieval rt;
    int require_call;
    char *warnings;
    char *system;
    nd_buf tools; /* compact TOOLS text of the context */
    int prefix_len;
    int turn; /* 0 fresh, 1 after a call, 2 after a respond */
    float *logits;
    float *biased; /* logits plus the copy prior's bonus */
    uint8_t *allowed;
    int *tokdist;
    nd_gram_state *stack;
    nd_copy_prior copy;
    nd_choice_prior choice;
    nd_reason_prior reason;
    int choosing; /* some allowed piece of this call step has a choice-prior bonus */
    char err[1024];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void set_err(char *dst, size_t cap)
{
    snprintf(dst, cap, "%s", nd_last_error());
}

const char *needle_thread_error(void)
{
    return nd_last_error();
}

/* ------------------------------------------------------------------ */
/* session                                                             */

/* the ASCII part of Python's str.isspace() (3.x strips the system text) */
static int py_space(char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

/* with_tools 0: stop after "<tools>" (the part retrieval never changes) */
static int render_prefix(const needle_session *S, nd_buf *b, int with_tools)
{
    int rc = ND_OK;
#define PUT(s) (rc = rc ? rc : nd_buf_put(b, s, strlen(s)))
    if (S->system && *S->system) {
        PUT("<|im_start|>system\n");
        PUT(S->system);
        PUT("<|im_end|>\n");
    }
    PUT("<|im_start|>user\n<tools>");
    if (with_tools) {
        rc = rc ? rc : nd_buf_put(b, S->tools.p, S->tools.n);
        PUT("</tools>\n");
    }
#undef PUT
    return rc;
}

static nd_embedder embedder(const needle_model *M)
{
    nd_embedder e = {&M->m, M->be, &M->heads, M->tok, M->digest};
    return e;
}

/* $NEEDLE_KV_WINDOW (`needle run --kv-window N` sets it): the number of
 * recent positions the session's cache keeps and attends to, in place of
 * the archive header's kv_window (256 is upstream's small-memory choice);
 * the system + tools prefix stays pinned either way. */
static int kv_window_env(int *kvw)
{
    const char *e = nd_tuning_get()->kv_window;
    if (!e || !*e)
        return ND_OK;
    char *end;
    long v = strtol(e, &end, 10);
    if (*end || v < 1 || v > (1L << 24))
        return nd_error(ND_EARG, "NEEDLE_KV_WINDOW='%s': expected a number of positions, 1 .. %ld",
                        e, 1L << 24);
    *kvw = (int)v;
    return ND_OK;
}

/* The one message for a tools block that does not fit the context, the
 * same from needle_session_new (all tools rendered) and from a retrieved
 * set's first turn: how many tokens it takes, how many fit, and what to
 * do about it. */
static int context_error(const needle_session *S, int tokens, int max_len)
{
    int n_tools = (int)nd_pj_root(S->tools_doc)->len;
    char hint[256];
    if (S->rt.on)
        snprintf(hint, sizeof hint,
                 "even the %d tools retrieval picked do not fit: shorten their descriptions or "
                 "schemas",
                 S->rt.n_sel);
    else if (n_tools > ND_RETRIEVAL_TOP_K)
        snprintf(hint, sizeof hint,
                 "the archive has no retrieval head, so all %d tools are rendered: declare "
                 "fewer tools or use an archive with a contrastive head",
                 n_tools);
    else
        snprintf(hint, sizeof hint, "shorten the tools' descriptions or schemas, or declare fewer");
    return nd_error(ND_ELIMIT,
                    "the tools do not fit the context: the system prompt and tools take %d "
                    "tokens, at most %d fit (max_seq_len %d less %d for the query and answer); %s",
                    tokens, max_len - ND_SESSION_ROOM, max_len, ND_SESSION_ROOM, hint);
}

/* the grammar's warnings, then retrieval's note */
static int join_warnings(needle_session *S, const char *g)
{
    size_t n = strlen(g) + strlen(S->rt.note) + 2;
    if (!(S->warnings = malloc(n)))
        return nd_error(ND_ENOMEM, "out of memory");
    snprintf(S->warnings, n, "%s%s%s", g, *g ? "\n" : "", S->rt.note);
    return ND_OK;
}

needle_session *needle_session_new(needle_model *M, const char *system, const char *tools_json)
{
    return needle_session_new_with_index(M, system, tools_json, NULL);
}

needle_session *needle_session_new_with_index(needle_model *M, const char *system,
                                              const char *tools_json, const char *tool_index_path)
{
    if (nd_tuning_refresh()) /* a C ABI entry: the switches from the environment */
        return NULL;
    if (tool_index_path && !*tool_index_path)
        tool_index_path = NULL;
    if (!M) {
        nd_error(ND_EARG, "needle_session_new: NULL model");
        return NULL;
    }
    if (!tools_json)
        tools_json = "[]";
    needle_session *S = calloc(1, sizeof *S);
    if (!S) {
        nd_error(ND_ENOMEM, "out of memory");
        return NULL;
    }
    S->model = M;
    int V = M->m.dims.V, rc;
    nd_pj_doc *doc = NULL;
    nd_buf pre = {0}, gwarn = {0};
    nd_idvec ids = {0};
    size_t col;
    if ((rc = nd_pj_parse(tools_json, strlen(tools_json), &doc, &col))) {
        nd_error_prefix(rc, "tools JSON");
        goto fail;
    }
    /* A catalogue larger than retrieval's pick is checked tool by tool
     * (errors and warnings for every tool now) but gets no grammar of its
     * own: the tools rendered for a query get theirs when chosen. */
    const nd_pj *root = nd_pj_root(doc);
    int big = root && root->type == ND_PJ_ARRAY && root->len > ND_RETRIEVAL_TOP_K;
    if (big ? (rc = nd_gram_validate(root, &gwarn)) : (rc = nd_gram_compile(root, &S->gram)))
        goto fail;
    S->active = S->gram;
    S->tools_doc = doc;
    doc = NULL;
    nd_embedder emb = embedder(M);
    if ((rc = nd_retrieval_init(&S->rt, &emb, nd_pj_root(S->tools_doc), tool_index_path)))
        goto fail;
    if ((big || S->rt.note[0]) &&
        (rc = join_warnings(S, big ? (gwarn.p ? gwarn.p : "") : nd_gram_warnings(S->gram))))
        goto fail;
    /* Needle 3 writes the tools with ensure_ascii=False and strips the
     * system text (the turn only when something is left) */
    if (!S->rt.on && (rc = nd_pj_dump_ex(nd_pj_root(S->tools_doc), 1, M->gen != 3, &S->tools)))
        goto fail;
    size_t sys_len = system ? strlen(system) : 0;
    if (system && M->gen == 3) {
        while (sys_len && py_space(system[sys_len - 1]))
            sys_len--;
        while (sys_len && py_space(system[0])) {
            system++;
            sys_len--;
        }
    }
    if (sys_len && !(S->system = strndup(system, sys_len))) {
        rc = nd_error(ND_ENOMEM, "out of memory");
        goto fail;
    }
    S->logits = malloc((size_t)V * sizeof *S->logits);
    S->biased = malloc((size_t)V * sizeof *S->biased);
    S->allowed = malloc((size_t)V);
    S->tokdist = malloc((size_t)V * sizeof *S->tokdist);
    S->stack = malloc((PIECE_MAX + 2) * sizeof *S->stack);
    if (!S->logits || !S->biased || !S->allowed || !S->tokdist || !S->stack) {
        rc = nd_error(ND_ENOMEM, "out of memory");
        goto fail;
    }
    float bonuses[ND_COPY_N_BONUS], choice[3];
    if ((rc = nd_copy_prior_setting(nd_tuning_get()->copy_prior, bonuses)) ||
        (rc = nd_copy_prior_init(&S->copy, M, bonuses)) ||
        (rc = nd_choice_prior_setting(nd_tuning_get()->choice_prior, choice)) ||
        (rc = nd_choice_prior_init(&S->choice, nd_pj_root(S->tools_doc), V, choice)) ||
        (rc = nd_reason_prior_init(&S->reason, nd_pj_root(S->tools_doc), V, M->id_think_end,
                                   choice[2])))
        goto fail;
    int kvw = M->kv_window;
    if ((rc = kv_window_env(&kvw)) ||
        (rc = nd_kv_init(&S->kv, &M->m, M->be, ND_SESSION_CHUNK, kvw)))
        goto fail;
    if (M->quant)
        nd_kv_use_quant(&S->kv, M->gen == 3 ? &M->qw3.q : &M->qw);
    nd_kv_set_bits(&S->kv, M->m.cfg.kv_bits);
    if ((rc = render_prefix(S, &pre, !S->rt.on)) || (rc = nd_idvec_push(&ids, M->id_bos)) ||
        (rc = nd_tokenizer_encode(M->tok, pre.p, pre.n, &ids)))
        goto fail;
    if ((long)ids.n + ND_SESSION_ROOM > M->m.cfg.max_seq_len) {
        rc = context_error(S, (int)ids.n, M->m.cfg.max_seq_len);
        goto fail;
    }
    /* retrieval renders the best-ranked tools that fit (and warns) */
    if (S->rt.on && (rc = nd_retrieval_fit(&S->rt, M->tok, pre.p, pre.n,
                                           M->m.cfg.max_seq_len - ND_SESSION_ROOM, S->warnings)))
        goto fail;
    /* every tool rendered (no retrieval head): one grammar over them all */
    if (!S->gram && !S->rt.on) {
        if ((rc = nd_gram_compile(nd_pj_root(S->tools_doc), &S->gram)))
            goto fail;
        S->active = S->gram;
    }
    /* a prefix seen before (same system + tools) skips its prefill */
    if (!nd_prefix_cache_lookup(&M->pc, ids.v, (int)ids.n, &S->kv)) {
        if ((rc = nd_kv_forward(&S->kv, ids.v, (int)ids.n, NULL, 0)))
            goto fail;
        /* lent, not copied: the copy is made when a second session needs it */
        nd_prefix_cache_lend(&M->pc, ids.v, (int)ids.n, &S->kv);
    }
    nd_kv_release_scratch(&S->kv); /* the prefix's 64-row chunks are done */
    S->prefix_len = (int)ids.n;
    /* the system + tools prefix are the window's sinks (upstream pins the
     * doc prefix): later turns slide past max_seq_len instead of failing */
    nd_kv_slide(&S->kv, S->prefix_len);
    nd_pj_free(doc);
    nd_buf_free(&pre);
    nd_buf_free(&gwarn);
    nd_idvec_free(&ids);
    return S;
fail:
    nd_pj_free(doc);
    nd_buf_free(&pre);
    nd_buf_free(&gwarn);
    nd_idvec_free(&ids);
    needle_session_free(S);
    return NULL;
}

void needle_session_free(needle_session *S)
{
    if (!S)
        return;
    /* rows this session lent to the prefix cache get their copy now: the
     * scratch goes first so the copy takes no more than the session had */
    nd_kv_free_scratch(&S->kv);
    if (S->model)
        nd_prefix_cache_release(&S->model->pc, &S->kv, 0);
    nd_kv_free(&S->kv);
    nd_gram_free(S->gram); /* active is gram or in retrieval's cache */
    nd_pj_free(S->tools_doc);
    nd_retrieval_free(&S->rt);
    free(S->warnings);
    free(S->system);
    nd_buf_free(&S->tools);
    free(S->logits);
    free(S->biased);
    free(S->allowed);
    free(S->tokdist);
    free(S->stack);
    nd_copy_prior_free(&S->copy);
    nd_choice_prior_free(&S->choice);
    nd_reason_prior_free(&S->reason);
    free(S);
}

int needle_session_reset(needle_session *S)
{
    if (!S)
        return NEEDLE_EARG;
    nd_kv_rewind(&S->kv, S->prefix_len);
    nd_kv_slide(&S->kv, S->prefix_len);
    S->turn = 0;
    return NEEDLE_OK;
}

int needle_session_context_tokens(const needle_session *S)
{
    return S ? S->prefix_len : NEEDLE_EARG;
}

long long needle_session_memory_bytes(const needle_session *S)
{
    if (!S)
        return NEEDLE_EARG;
    int V = S->model->m.dims.V;
    size_t own = sizeof *S + (size_t)V * (sizeof *S->logits + 1 + sizeof *S->tokdist);
    return (long long)(own + nd_kv_bytes(&S->kv));
}

long long needle_session_memory_bound(const needle_session *S)
{
    if (!S)
        return NEEDLE_EARG;
    int V = S->model->m.dims.V;
    size_t own = sizeof *S + (size_t)V * (sizeof *S->logits + 1 + sizeof *S->tokdist);
    return (long long)(own + nd_kv_bytes_bound(&S->kv));
}

const nd_kv_state *nd_session_kv(const needle_session *S)
{
    return &S->kv;
}

const char *needle_session_warnings(const needle_session *S)
{
    if (S && nd_retrieval_warnings(&S->rt))
        return nd_retrieval_warnings(&S->rt);
    if (S && S->warnings)
        return S->warnings;
    return S && S->gram ? nd_gram_warnings(S->gram) : "";
}

int needle_session_require_call(needle_session *S, int on)
{
    if (!S)
        return NEEDLE_EARG;
    S->require_call = on;
    if (S->gram)
        nd_gram_require_call(S->gram, on);
    if (S->active && S->active != S->gram)
        nd_gram_require_call(S->active, on);
    return NEEDLE_OK;
}

const char *needle_session_error(const needle_session *S)
{
    return S ? S->err : "NULL session";
}

/* ---- token masks ---- */

/* allowed[t] = 1 for every token whose bytes the grammar accepts from st;
 * tokdist[t] = distance to completion after it. Returns the count. With
 * the copy prior on, pieces that open or close a value are judged on the
 * way (pre[0..npre): the value written before, when st is inside one). */
static int grammar_mask(needle_session *S, const nd_gram_state *st, const unsigned char *pre,
                        int npre)
{
    const needle_model *M = S->model;
    const nd_grammar *g = S->active;
    memset(S->allowed, 0, (size_t)M->m.dims.V);
    int count = 0, copying = S->copy.bonus != 0.0f, names, enums;
    int weighing = nd_choice_prior_step(&S->choice, st, &names, &enums);
    S->choosing = 0; /* set once a piece gets a bonus: most steps add none */
    /* iterative DFS: stack[d] is the state after d bytes */
    int node_at[PIECE_MAX + 2];
    unsigned char path[PIECE_MAX + 1];
    signed char inval[PIECE_MAX + 2];
    float litw[PIECE_MAX + 2]; /* the enum value a path writes: said 1, else 0; none -1 */
    int keyw[PIECE_MAX + 2];   /* the same for an optional key the turn names */
    const uint64_t *key_mask = S->choice.key_mask;
    const char *num;
    int nlen;
    nd_gram_copy(&S->stack[0], st);
    inval[0] = copying ? (signed char)nd_gram_value_pos(st, &num, &nlen) : 0;
    litw[0] = enums ? nd_choice_prior_literal(&S->choice, g, st) : -1.0f;
    int at = nd_gram_value_pos(st, &num, &nlen);
    if (at == ND_GRAM_IN_STRING || at == ND_GRAM_IN_NUMBER)
        key_mask =
            NULL; /* a piece that ends a value is no key's: the value's end stays the model's */
    keyw[0] = key_mask ? nd_gram_key_marked(g, st, key_mask) : -1;
    node_at[0] = M->trie[0].child;
    int d = 0;
    while (d >= 0) {
        int c = node_at[d];
        if (c < 0) {
            d--;
            continue;
        }
        node_at[d] = M->trie[c].sibling;
        nd_gram_state *ns = &S->stack[d + 1];
        nd_gram_copy(ns, &S->stack[d]);
        if (!nd_gram_feed(g, ns, M->trie[c].byte))
            continue;
        if (copying) {
            path[d] = M->trie[c].byte;
            inval[d + 1] = (signed char)nd_gram_value_pos(ns, &num, &nlen);
        }
        if (enums) { /* a literal's weight holds past its end */
            float w = nd_choice_prior_literal(&S->choice, g, ns);
            litw[d + 1] = w >= 0.0f ? w : litw[d];
        }
        if (key_mask) { /* so does a key's */
            int w = nd_gram_key_marked(g, ns, key_mask);
            keyw[d + 1] = w >= 0 ? w : keyw[d];
        }
        if (M->trie[c].tok >= 0) {
            int dist = nd_gram_dist(g, ns);
            for (int t = M->trie[c].tok; t >= 0; t = M->tok_next[t]) {
                S->allowed[t] = 1;
                S->tokdist[t] = dist;
                count++;
                if (copying)
                    nd_copy_prior_token(&S->copy, t, pre, npre, path, d + 1, inval);
                if (weighing || key_mask) {
                    float b =
                        (names ? S->choice.tool_bonus * nd_choice_prior_name(&S->choice, ns) : 0) +
                        (enums && litw[d + 1] > 0 ? S->choice.enum_bonus * litw[d + 1] : 0) +
                        (key_mask && keyw[d + 1] > 0 ? S->choice.key_bonus : 0);
                    S->choice.bonus[t] = b;
                    S->choosing |= b != 0.0f;
                }
            }
        }
        if (d + 1 <= PIECE_MAX) {
            node_at[d + 1] = M->trie[c].child;
            d++;
        }
    }
    return count;
}

/* the first allowed index of the largest logit; the best value rides in
 * a register (reading lg[best] back made every step wait on the last
 * one's load: in bench decode's own pick, 3.5% of the caller's samples
 * in a two-thread 2-bit decode step) */
static int argmax_masked(const float *lg, const uint8_t *ok, int V)
{
    int best = -1;
    float bv = 0.0f;
    for (int i = 0; i < V; i++)
        if (ok[i] && (best < 0 || lg[i] > bv)) {
            best = i;
            bv = lg[i];
        }
    return best;
}

static double token_prob(const float *lg, int V, int id)
{
    float mx = lg[0];
    for (int i = 1; i < V; i++)
        mx = lg[i] > mx ? lg[i] : mx;
    double s = 0;
    for (int i = 0; i < V; i++)
        s += exp((double)(lg[i] - mx));
    return exp((double)(lg[id] - mx)) / s;
}

/* ---- envelope ---- */

static int put_str(nd_buf *b, const char *s, size_t n)
{
    nd_pj v = {0};
    v.type = ND_PJ_STRING;
    v.str = s;
    v.len = n;
    return nd_pj_dump(&v, 0, b);
}

typedef struct {
    int success, is_call;
    const char *error, *error_code;
    const char *calls; /* JSON text of the call list or NULL */
    size_t calls_len;
    const char *reasoning;
    size_t reasoning_len;
    double confidence; /* < 0: null */
    double prefill_tps, decode_tps;
} envelope;

static double peak_ram_mb(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru))
        return 0;
    return nd_maxrss_mb(ru.ru_maxrss);
}

static int write_envelope(const envelope *e, nd_buf *b)
{
    char num[64];
    int rc = ND_OK;
#define PUT(s) (rc = rc ? rc : nd_buf_put(b, s, strlen(s)))
    PUT("{\"type\": ");
    PUT(e->is_call ? "\"call\"" : "\"respond\"");
    PUT(", \"success\": ");
    PUT(e->success ? "true" : "false");
    PUT(", \"error\": ");
    if (e->error)
        rc = rc ? rc : put_str(b, e->error, strlen(e->error));
    else
        PUT("null");
    PUT(", \"error_code\": ");
    if (e->error_code)
        rc = rc ? rc : put_str(b, e->error_code, strlen(e->error_code));
    else
        PUT("null");
    PUT(", \"function_calls\": ");
    if (e->calls)
        rc = rc ? rc : nd_buf_put(b, e->calls, e->calls_len);
    else
        PUT("[]");
    PUT(", \"reasoning\": ");
    rc =
        rc ? rc : put_str(b, e->reasoning ? e->reasoning : "", e->reasoning ? e->reasoning_len : 0);
    PUT(", \"confidence\": ");
    if (e->confidence >= 0) {
        snprintf(num, sizeof num, "%.6g", e->confidence);
        PUT(num);
    } else {
        PUT("null");
    }
    snprintf(num, sizeof num, ", \"prefill_tps\": %.1f", e->prefill_tps);
    PUT(num);
    snprintf(num, sizeof num, ", \"decode_tps\": %.1f", e->decode_tps);
    PUT(num);
    snprintf(num, sizeof num, ", \"peak_ram_mb\": %.1f}", peak_ram_mb());
    PUT(num);
#undef PUT
    return rc;
}

static int emit(const envelope *e, char *buf, int buf_len)
{
    nd_buf b = {0};
    int rc = write_envelope(e, &b);
    if (rc) {
        nd_buf_free(&b);
        return rc;
    }
    if (!buf || buf_len <= 0 || b.n + 1 > (size_t)buf_len) {
        if (buf && buf_len > 0)
            buf[0] = 0;
        rc = nd_error(NEEDLE_EBUFFER, "the envelope is %zu bytes; the output buffer holds %d",
                      b.n + 1, buf_len);
        nd_buf_free(&b);
        return rc;
    }
    memcpy(buf, b.p, b.n + 1);
    int n = (int)b.n;
    nd_buf_free(&b);
    return n;
}

static const char *code_name(int rc)
{
    switch (rc) {
    case ND_EIO: return "io";
    case ND_EFORMAT: return "format";
    case ND_ELIMIT: return "limit";
    case ND_ENOMEM: return "out_of_memory";
    case ND_EARG: return "argument";
    default: return "internal";
    }
}

int nd_error_envelope(const char *msg, const char *code, char *buf, int buf_len)
{
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", nd_last_error());
    envelope e = {0};
    e.error = msg;
    e.error_code = code;
    e.confidence = -1;
    int w = emit(&e, buf, buf_len);
    nd_error(ND_OK, "%s", keep); /* the caller's message stays the thread's */
    return w;
}

/* error envelope when it fits; returns rc (negative) */
static int fail_turn(needle_session *S, int rc, char *buf, int buf_len)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", nd_last_error());
    snprintf(S->err, sizeof S->err, "%s", msg);
    envelope e = {0};
    e.error = msg;
    e.error_code = code_name(rc);
    e.confidence = -1;
    int w = emit(&e, buf, buf_len);
    (void)w;
    nd_error(rc, "%s", msg);
    return rc;
}

/* ---- one turn ---- */

static int run(needle_session *S, const int32_t *ids, int n, float *logits)
{
    return nd_kv_forward(&S->kv, ids, n, logits, 0);
}

/* What one turn builds up: the tokens it ran, the reasoning, the call. */
typedef struct {
    nd_buf seg, call;
    nd_idvec ids, gen_reason;
    int prefilled; /* input tokens run this turn */
    int budget;    /* tokens the turn may generate */
    int gen;       /* tokens generated so far */
    nd_gram_state st;
    double conf; /* lowest probability of a call token (> 1: none) */
    int complete;
} turn_state;

static void turn_state_free(turn_state *T)
{
    nd_buf_free(&T->seg);
    nd_buf_free(&T->call);
    nd_idvec_free(&T->ids);
    nd_idvec_free(&T->gen_reason);
}

/* The first turn: retrieval's pick, then the whole prompt on top of
 * whatever of it the cache already holds (the prefix, a cached tool set). */
static int first_turn_input(needle_session *S, const char *text, turn_state *T)
{
    needle_model *M = S->model;
    const nd_tokenizer *tk = M->tok;
    int max_len = M->m.cfg.max_seq_len, rc;
    nd_embedder emb = embedder(M);
    if (S->rt.on && (rc = nd_retrieval_select(&S->rt, &emb, nd_pj_root(S->tools_doc), text,
                                              S->require_call, &S->tools, &S->active)))
        return rc;
    if ((rc = render_prefix(S, &T->seg, 1)) || (rc = nd_buf_put(&T->seg, text, strlen(text))) ||
        (rc = nd_buf_put(&T->seg, "<|im_end|>\n<|im_start|>assistant\n", 33)) ||
        (rc = nd_idvec_push(&T->ids, M->id_bos)) ||
        (rc = nd_tokenizer_encode(tk, T->seg.p, T->seg.n, &T->ids)))
        return rc;
    const nd_idvec *ids = &T->ids;
    int sinks = S->prefix_len;
    if (S->rt.on) { /* the retrieved tools join the sinks for this conversation */
        nd_buf with = {0};
        nd_idvec wid = {0};
        if (!(rc = render_prefix(S, &with, 1)) && !(rc = nd_idvec_push(&wid, M->id_bos)))
            rc = nd_tokenizer_encode(tk, with.p, with.n, &wid);
        for (sinks = 0; sinks < (int)wid.n && sinks < (int)ids->n; sinks++)
            if (wid.v[sinks] != ids->v[sinks])
                break;
        nd_buf_free(&with);
        nd_idvec_free(&wid);
        if (rc)
            return rc;
    }
    int lcp = 0;
    while (lcp < S->kv.len && lcp < (int)ids->n && S->kv.tokens[lcp] == ids->v[lcp])
        lcp++;
    if (lcp >= (int)ids->n)
        lcp = (int)ids->n - 1;
    /* rows lent to the prefix cache that this turn rewrites (from lcp on, or
     * all of them when a cached tool set is restored) get their copy first */
    nd_prefix_cache_release(&M->pc, &S->kv, S->rt.on ? 0 : lcp);
    if (sinks + ND_SESSION_ROOM > max_len)
        return context_error(S, sinks, max_len);
    /* a retrieved tool set seen before: its prefix's rows from the cache */
    int cached = S->rt.on && lcp < sinks && sinks < (int)ids->n &&
                 nd_prefix_cache_lookup(&M->pc, ids->v, sinks, &S->kv);
    if (cached)
        lcp = sinks;
    nd_kv_rewind(&S->kv, lcp);
    nd_kv_slide(&S->kv, sinks);
    T->prefilled = (int)ids->n - lcp;
    if ((rc = run(S, ids->v + lcp, T->prefilled, S->logits)))
        return rc;
    if (S->rt.on && !cached && lcp < sinks) /* its rows are pinned: lend them */
        nd_prefix_cache_lend(&M->pc, ids->v, sinks, &S->kv);
    return ND_OK;
}

/* A later turn: the tool result (after a call) or the user's next message. */
static int next_turn_input(needle_session *S, const char *text, turn_state *T)
{
    needle_model *M = S->model;
    const char *open = S->turn == 1 ? "\n<|im_start|>user\n<tool_result>" : "\n<|im_start|>user\n";
    const char *close = S->turn == 1 ? "</tool_result><|im_end|>\n<|im_start|>assistant\n"
                                     : "<|im_end|>\n<|im_start|>assistant\n";
    int rc;
    if ((rc = nd_buf_put(&T->seg, open, strlen(open))) ||
        (rc = nd_buf_put(&T->seg, text, strlen(text))) ||
        (rc = nd_buf_put(&T->seg, close, strlen(close))) ||
        (rc = nd_tokenizer_encode(M->tok, T->seg.p, T->seg.n, &T->ids)))
        return rc;
    int skip = T->ids.n && T->ids.v[0] == M->id_space ? 1 : 0;
    T->prefilled = (int)T->ids.n - skip;
    return run(S, T->ids.v + skip, T->prefilled, S->logits);
}

/* The budget of the turn and the cap on its free reasoning (at most half
 * the budget, always leaving room for the shortest call: in bytes, a safe
 * bound on its tokens); an error when not even the markers fit. */
static int plan_budget(needle_session *S, int max_new_tokens, turn_state *T, int *think_cap)
{
    needle_model *M = S->model;
    int max_len = M->m.cfg.max_seq_len;
    /* the window slides: only max_seq_len past the sinks bounds a turn */
    int budget = max_len - S->kv.n_sink - ND_SESSION_ROOM, room = budget;
    if (budget > max_new_tokens)
        budget = max_new_tokens;
    int closing = 2; /* </tool_call> <|im_end|> */
    int reserve = (int)M->think_close.n + 1 + closing + 4;
    nd_gram_init(S->active, &T->st);
    int min_call = nd_gram_dist(S->active, &T->st);
    int cap = budget / 2;
    if (cap > budget - reserve - min_call)
        cap = budget - reserve - min_call;
    if (cap < (int)M->think_open.n)
        cap = (int)M->think_open.n;
    T->budget = budget;
    *think_cap = cap;
    if (budget >= (int)M->think_open.n + reserve)
        return ND_OK;
    /* say which of the two limits it is: the user's setting, or what the
     * context window has left once the prompt is in */
    if (budget < max_new_tokens)
        return nd_error(ND_ELIMIT,
                        "only %d tokens left in the context (max_seq_len %d) after the "
                        "prompt: too few for a tool call (at least %d needed)",
                        room < 0 ? 0 : room, max_len, (int)M->think_open.n + reserve);
    return nd_error(ND_ELIMIT,
                    "max_new_tokens %d is too small for a tool call (at least %d needed)", budget,
                    (int)M->think_open.n + reserve);
}

/* The opening of the answer; *thinking: whether free reasoning follows.
 * Needle 3 (3.x's target: "\u2581", then "<think>\n" + reasoning +
 * "\n</think>\n" only when the model reasons, else "<tool_call>" at once):
 * the model picks between the two markers. Needle 2: "▁<think>" forced. */
static int open_answer(needle_session *S, turn_state *T, int *thinking)
{
    needle_model *M = S->model;
    int rc;
    *thinking = 1;
    if (M->gen != 3) {
        if ((rc = run(S, M->think_open.v, (int)M->think_open.n, S->logits)))
            return rc;
        T->gen += (int)M->think_open.n;
        return ND_OK;
    }
    int lead = M->id_space >= 0 ? M->id_space : M->id_tool_call;
    if (lead == M->id_space) {
        if ((rc = run(S, &lead, 1, S->logits)))
            return rc;
        T->gen++;
    }
    *thinking = S->logits[M->id_think] > S->logits[M->id_tool_call];
    int open = *thinking ? M->id_think : M->id_tool_call;
    if ((rc = run(S, &open, 1, S->logits)))
        return rc;
    T->gen++;
    return ND_OK;
}

/* Whether the text s[0..n) ends in a cycle of 1..REASON_PERIOD bytes
 * repeated over more than REASON_PERIODIC bytes ("St St St St ...").
 * Why: the built-in base, given upstream's Contact tool, reasoned "The user
 * wants to describe S An St St St ..." to the cap, and the call's values
 * then copied the loop ("name": "be S St St ..."). */
#define REASON_PERIOD 16
#define REASON_PERIODIC 32
static int reasoning_loops(const unsigned char *s, size_t n)
{
    for (size_t p = 1; p <= REASON_PERIOD; p++) {
        if (n < REASON_PERIODIC + p)
            break;
        size_t i = n - REASON_PERIODIC - p;
        while (i < n - p && s[i] == s[i + p])
            i++;
        if (i == n - p)
            return 1;
    }
    return 0;
}

/* Free reasoning up to "</think>" (forced at think_cap, or once the
 * reasoning loops), then the closing markers. */
static int reason(needle_session *S, turn_state *T, int think_cap)
{
    needle_model *M = S->model;
    nd_buf text = {0}; /* the reasoning's bytes, for the loop guard */
    unsigned char pb[PIECE_MAX];
    int rc, len;
    for (;;) {
        int t = M->id_think_end;
        if (T->gen < think_cap && !reasoning_loops((const unsigned char *)text.p, text.n)) {
            const float *lg = nd_choice_prior_reason(&S->choice, M, S->logits, M->reason_ok);
            lg = nd_reason_prior_logits(&S->reason, M, &S->copy, lg, M->reason_ok);
            t = argmax_masked(lg, M->reason_ok, M->m.dims.V);
        }
        if (t == M->id_think_end)
            break;
        if (nd_piece_bytes(M->tok, t, pb, &len))
            nd_buf_put(&text, (const char *)pb, (size_t)len);
        nd_choice_prior_feed(&S->choice, M, t);
        nd_reason_prior_feed(&S->reason, M, &S->copy, t);
        nd_idvec_push(&T->gen_reason, t);
        if ((rc = run(S, &t, 1, S->logits))) {
            nd_buf_free(&text);
            return rc;
        }
        T->gen++;
    }
    nd_buf_free(&text);
    nd_idvec forced = {0};
    nd_idvec_push(&forced, M->id_think_end);
    for (size_t i = 0; i < M->think_close.n; i++)
        nd_idvec_push(&forced, M->think_close.v[i]);
    rc = run(S, forced.v, (int)forced.n, S->logits);
    T->gen += (int)forced.n;
    nd_idvec_free(&forced);
    return rc;
}

/* The value the call is writing (pos: nd_gram_value_pos's answer; vstart:
 * where a string value starts in T->call): *n of its bytes so far. */
static const unsigned char *value_so_far(const turn_state *T, int vstart, int *pos, int *n)
{
    const char *num = NULL;
    int nlen = 0;
    *pos = nd_gram_value_pos(&T->st, &num, &nlen);
    *n = 0;
    if (*pos == ND_GRAM_IN_NUMBER) {
        *n = nlen;
        return (const unsigned char *)num;
    }
    if (*pos == ND_GRAM_IN_STRING && vstart >= 0) {
        *n = (int)T->call.n - vstart;
        return (const unsigned char *)T->call.p + vstart;
    }
    *pos = 0;
    return NULL;
}

/* The logits the pick reads: the model's own, or with the copy prior's
 * bonus on the pieces grammar_mask and nd_copy_prior_mark marked. */
static const float *copy_prior(needle_session *S, const unsigned char *v, int pos, int n)
{
    if (S->copy.bonus == 0.0f)
        return S->logits;
    int V = S->model->m.dims.V;
    nd_copy_prior_mark(&S->copy, S->model, pos, v, n, S->allowed);
    memcpy(S->biased, S->logits, (size_t)V * sizeof *S->biased);
    nd_copy_prior_add(&S->copy, S->allowed, V, S->biased);
    return S->biased;
}

/* After one byte of the call (T->call ends with it): where the string
 * value being written starts (*vstart, after its quote) and where the
 * number being written starts (*nstart), else -1. A value just closed is
 * taken (nd_copy_prior_take), so the call's next values copy other words;
 * a call's arguments start afresh. Why: zero-shot, the base wrote
 * math.gcd(num1 40, num2 40) for "40 and 50" (its plan said 50) and c 6
 * for "a=2, b=6, and c=5"; fine-tuned on BFCL's file system, diff(file_name1
 * "a.txt", file_name2 "a.txt") for "compare 'a.txt' with 'old_a.txt'". */
static void call_value_fed(needle_session *S, turn_state *T, int *vstart, int *nstart)
{
    static const char args[] = "\"arguments\":{";
    const char *num;
    int nlen, n = (int)T->call.n, pos = nd_gram_value_pos(&T->st, &num, &nlen);
    const unsigned char *call = (const unsigned char *)T->call.p;
    if (pos == ND_GRAM_IN_STRING || pos == ND_GRAM_IN_NUMBER) {
        int *start = pos == ND_GRAM_IN_STRING ? vstart : nstart;
        if (*start < 0) /* a string starts after its quote, a number at its first byte */
            *start = pos == ND_GRAM_IN_STRING ? n : n - 1;
        return;
    }
    if (*vstart >= 0)
        nd_copy_prior_take(&S->copy, call + *vstart, n - 1 - *vstart, 0);
    else if (*nstart >= 0)
        nd_copy_prior_take(&S->copy, call + *nstart, n - 1 - *nstart, 1);
    else if (n >= (int)sizeof args - 1 &&
             !memcmp(call + n - (sizeof args - 1), args, sizeof args - 1))
        nd_copy_prior_untake(&S->copy);
    *vstart = *nstart = -1;
}

/* Only the allowed pieces that begin with `closer` (a string's quote, an
 * array's bracket), when there are any (a minLength or minItems not
 * reached leaves none). */
static void close_value(needle_session *S, int V, unsigned char closer)
{
    const needle_model *M = S->model;
    unsigned char b[PIECE_MAX];
    int len, closers = 0;
    for (int t = 0; t < V && !closers; t++)
        closers = S->allowed[t] && nd_piece_bytes(M->tok, t, b, &len) && len && b[0] == closer;
    for (int t = 0; t < V && closers; t++)
        if (S->allowed[t] && !(nd_piece_bytes(M->tok, t, b, &len) && len && b[0] == closer))
            S->allowed[t] = 0;
}

/* The grammar-constrained call, within the budget; then its closing tokens
 * when the call is complete. */
static int constrained_call(needle_session *S, turn_state *T)
{
    needle_model *M = S->model;
    int V = M->m.dims.V, closing = 2, rc, vstart = -1, nstart = -1;
    unsigned char pb[PIECE_MAX];
    T->conf = 2.0;
    nd_choice_prior_call(&S->choice, S->active);
    nd_copy_prior_untake(&S->copy); /* the call copies what its reasoning copied */
    while (!nd_gram_done(&T->st)) {
        int left = T->budget - T->gen - closing;
        if (left <= 0)
            break;
        int pos, vn;
        const unsigned char *v = value_so_far(T, vstart, &pos, &vn);
        nd_copy_prior_call_key(&S->copy, T->call.p, (int)T->call.n,
                               vstart >= 0   ? vstart - 1
                               : nstart >= 0 ? nstart
                                             : (int)T->call.n);
        nd_copy_prior_begin(&S->copy, V, pos, v, vn);
        int n_ok = grammar_mask(S, &T->st, v, vn);
        if (!n_ok)
            break;
        /* every later token shortens the way to a closed list by >= 1 byte
         * (single-byte pieces exist), so keep within reach of the budget */
        int reach = left - 1, best_d = 1 << 30;
        for (int i = 0; i < V; i++)
            if (S->allowed[i] && S->tokdist[i] < best_d)
                best_d = S->tokdist[i];
        if (reach < best_d)
            reach = best_d;
        for (int i = 0; i < V; i++)
            if (S->allowed[i] && S->tokdist[i] > reach)
                S->allowed[i] = 0;
        if (pos == ND_GRAM_IN_STRING &&
            (nd_copy_prior_runs_on(&S->copy, v, vn) || nd_copy_prior_quote_done(&S->copy, v, vn) ||
             (nd_gram_string_item(&T->st) && nd_copy_prior_tag_done(&S->copy, v, vn))))
            close_value(S, V, '"');
        else if (pos != ND_GRAM_IN_STRING && nd_gram_in_array(&T->st) &&
                 nd_copy_prior_runs_on(&S->copy, (const unsigned char *)T->call.p, (int)T->call.n))
            close_value(S, V, ']');
        const float *lg = copy_prior(S, v, pos, vn);
        if (S->choosing) {
            if (lg != S->biased)
                memcpy(S->biased, lg, (size_t)V * sizeof *S->biased);
            nd_choice_prior_add(&S->choice, S->allowed, V, S->biased);
            lg = S->biased;
        }
        int t = argmax_masked(lg, S->allowed, V);
        double p = token_prob(S->logits, V, t); /* the model's own confidence */
        T->conf = p < T->conf ? p : T->conf;
        int len;
        nd_piece_bytes(M->tok, t, pb, &len);
        for (int i = 0; i < len; i++) {
            nd_gram_feed(S->active, &T->st, pb[i]);
            nd_buf_put(&T->call, (const char *)pb + i, 1);
            call_value_fed(S, T, &vstart, &nstart);
        }
        if ((rc = run(S, &t, 1, S->logits)))
            return rc;
        T->gen++;
    }
    T->complete = nd_gram_done(&T->st);
    if (T->complete) {
        int32_t fin[2] = {M->id_tool_call_end, M->id_im_end};
        if ((rc = run(S, fin, 2, NULL)))
            return rc;
        T->gen += 2;
    }
    return ND_OK;
}

/* The envelope's confidence: Needle 3, the confidence head's calibrated
 * probability over the whole sequence where the archive has one, else
 * null; Needle 2, upstream's signal: the minimum of the calibrated head
 * over the whole sequence and the decoding probability of the call. */
static int turn_confidence(needle_session *S, const turn_state *T, double *conf)
{
    needle_model *M = S->model;
    int rc;
    *conf = T->conf <= 1.0 ? T->conf : -1;
    if (M->gen == 3) {
        *conf = -1;
        const nd_qhead3 *ch = nd_model_head3(M, 2);
        if (T->complete && ch) {
            float logit;
            if ((rc = nd_head3_run(M, ch, S->kv.tokens, S->kv.len, &logit)))
                return rc;
            *conf = 1.0 / (1.0 + exp(-(double)logit));
        }
    } else if (T->complete && M->heads.confidence.present) {
        double head;
        if ((rc = nd_head_confidence(&M->m, M->be, &M->heads, S->kv.tokens, S->kv.len, &head)))
            return rc;
        *conf = *conf >= 0 && *conf < head ? *conf : head;
    }
    return ND_OK;
}

/* Why each call once (engine.h): the built-in base, fine-tuned, now and
 * then writes one call twice for one request ("13.2 gallons in liters":
 * gallon_to_liter twice; 1-5% of answers on the held-out sets), which a
 * host would run twice. A user who wants the same thing done twice says
 * it in a later turn. */
int nd_call_list(const char *call, size_t call_len, nd_buf *calls, int *is_call)
{
    nd_pj_doc *doc = NULL;
    int rc = nd_pj_parse(call, call_len, &doc, NULL);
    if (rc)
        return nd_error_prefix(rc, "internal: the constrained call is not valid JSON (%.*s)",
                               (int)(call_len < 512 ? call_len : 512), call);
    const nd_pj *arr = nd_pj_root(doc);
    /* each kept call's text in calls */
    size_t *start = calloc(arr->len + 1, sizeof *start), *len = calloc(arr->len + 1, sizeof *len);
    if (!start || !len) {
        free(start);
        free(len);
        nd_pj_free(doc);
        return nd_error(ND_ENOMEM, "out of memory");
    }
    int kept = 0;
    nd_buf_put(calls, "[", 1);
    for (size_t i = 0; i < arr->len; i++) {
        const nd_pj *c = arr->items[i];
        size_t at = calls->n;
        if (kept)
            nd_buf_put(calls, ", ", 2);
        size_t st = calls->n;
        nd_buf_put(calls, "{\"name\": ", 9);
        nd_pj_dump(nd_pj_get(c, "name"), 0, calls);
        nd_buf_put(calls, ", \"arguments\": ", 15);
        nd_pj_dump(nd_pj_get(c, "arguments"), 0, calls);
        nd_buf_put(calls, "}", 1);
        size_t n = calls->n - st;
        int repeat = 0;
        for (int k = 0; k < kept && !repeat; k++)
            repeat = len[k] == n && !memcmp(calls->p + start[k], calls->p + st, n);
        if (repeat) {
            calls->n = at;
            continue;
        }
        start[kept] = st;
        len[kept++] = n;
    }
    nd_buf_put(calls, "]", 1);
    *is_call = kept > 0;
    free(start);
    free(len);
    nd_pj_free(doc);
    return ND_OK;
}

/* 3. the envelope of a finished turn (the session's next turn kind set):
 * *written is emit's result (the length, or an error when it does not fit);
 * the return value an error before it (the turn then failed) */
static int turn_envelope(needle_session *S, const turn_state *T, double secs_prefill,
                         double secs_decode, char *buf, int buf_len, int *written)
{
    needle_model *M = S->model;
    char *rtext = NULL;
    size_t rlen = 0;
    nd_buf calls = {0};
    int rc = nd_tokenizer_decode(M->tok, T->gen_reason.v, T->gen_reason.n, &rtext, &rlen);
    if (rc)
        return rc;
    envelope e = {0};
    e.reasoning = rtext;
    e.reasoning_len = rlen;
    e.prefill_tps = T->prefilled / (secs_prefill > 1e-9 ? secs_prefill : 1e-9);
    e.decode_tps = T->gen / (secs_decode > 1e-9 ? secs_decode : 1e-9);
    if (M->gen == 3) { /* 3.x: the reasoning between "<think>\n" and "\n</think>" */
        while (rlen && strchr(" \t\n\r\v\f", rtext[rlen - 1]))
            rtext[--rlen] = 0;
        while (rlen && strchr(" \t\n\r\v\f", e.reasoning[0])) {
            e.reasoning++;
            rlen--;
        }
        e.reasoning_len = rlen;
    }
    if ((rc = turn_confidence(S, T, &e.confidence)) ||
        (T->complete && (rc = nd_call_list(T->call.p, T->call.n, &calls, &e.is_call)))) {
        free(rtext);
        nd_buf_free(&calls);
        return rc;
    }
    if (T->complete) {
        e.success = 1;
        e.calls = calls.p;
        e.calls_len = calls.n;
        S->turn = e.is_call ? 1 : 2;
    } else {
        e.success = 0;
        e.error = "max_new_tokens ran out before the tool call was complete";
        e.error_code = "max_new_tokens";
        S->turn = 2;
    }
    *written = emit(&e, buf, buf_len);
    if (*written < 0)
        set_err(S->err, sizeof S->err);
    nd_buf_free(&calls);
    free(rtext);
    return ND_OK;
}

int needle_session_complete(needle_session *S, const char *text, int max_new_tokens, char *buf,
                            int buf_len)
{
    if (!S) {
        nd_error_envelope("needle_session_complete: NULL session", "argument", buf, buf_len);
        nd_error(ND_EARG, "needle_session_complete: NULL session");
        return NEEDLE_EARG;
    }
    if (!text)
        text = "";
    if (max_new_tokens <= 0)
        max_new_tokens = 256;
    turn_state T = {0};
    int start_turn = S->turn, start_len = S->kv.len, rc, think_cap, thinking;
    long start_evicted = S->kv.evicted;
    double t0 = now_s(), t1 = t0;
    /* 1. the new input tokens, on top of the cache; 2. generate */
    /* a tool's result is no request: no choice or reasoning prior on the
     * turn after it */
    rc = nd_choice_prior_turn(&S->choice, S->turn == 1 ? "" : text);
    if (!rc)
        nd_reason_prior_turn(&S->reason, S->turn != 1, &S->choice);
    if (!rc && !(rc = nd_copy_prior_set(&S->copy, text, S->system)) &&
        !(rc = S->turn == 0 ? first_turn_input(S, text, &T) : next_turn_input(S, text, &T))) {
        t1 = now_s();
        if (!(rc = plan_budget(S, max_new_tokens, &T, &think_cap)) &&
            !(rc = open_answer(S, &T, &thinking)) &&
            (!thinking || !(rc = reason(S, &T, think_cap))))
            rc = constrained_call(S, &T);
    }
    /* the scratch's pages go back between turns: a turn holds the rows of
     * its own longest chunk, not those of the longest chunk ever run */
    nd_kv_release_scratch(&S->kv);
    int written = 0;
    if (!rc && !(rc = turn_envelope(S, &T, t1 - t0, now_s() - t1, buf, buf_len, &written))) {
        turn_state_free(&T); /* the turn ran: only the envelope may not have fit */
        return written;
    }
    S->turn = start_turn;
    if (start_turn) { /* rows dropped by this turn's slides moved the rest */
        long back = start_len - (S->kv.evicted - start_evicted);
        nd_kv_rewind(&S->kv, back > S->kv.n_sink ? (int)back : S->kv.n_sink);
    }
    turn_state_free(&T);
    return fail_turn(S, rc, buf, buf_len);
}

/* ------------------------------------------------------------------ */
/* retrieval and confidence heads                                      */

int needle_session_tools_embedded(const needle_session *S)
{
    return S ? S->rt.index.embedded : NEEDLE_EARG;
}

const char *needle_session_context_tools(const needle_session *S)
{
    return S && S->tools.p ? S->tools.p : "";
}

/* Needle 3: the embedding head over [BOS=2] + enc(text), the ids 3.x's
 * run.py feeds a prompt with (no EOS, nothing rendered around the text) */
static int embed3(const needle_model *M, const char *text, float *out, int out_len)
{
    const nd_qhead3 *h = nd_model_head3(M, 1);
    if (!h)
        return nd_error(ND_EUNSUPPORTED,
                        "this Needle 3 archive has no embedding head (embedding_head was not "
                        "exported): embed() needs one");
    nd_idvec ids = {0};
    float *v = malloc((size_t)h->out * sizeof *v);
    int rc = v ? nd_idvec_push(&ids, M->id_bos) : nd_error(ND_ENOMEM, "out of memory");
    if (!rc)
        rc = nd_tokenizer_encode(M->tok, text, strlen(text), &ids);
    if (!rc && (long)ids.n > M->m.cfg.max_seq_len)
        rc = nd_error(ND_ELIMIT, "the text is %zu tokens with BOS; at most %d fit (max_seq_len)",
                      ids.n, M->m.cfg.max_seq_len);
    if (!rc)
        rc = nd_head3_run(M, h, ids.v, (int)ids.n, v);
    if (!rc && out)
        memcpy(out, v, (size_t)(out_len < h->out ? out_len : h->out) * sizeof *v);
    free(v);
    nd_idvec_free(&ids);
    return rc ? rc : h->out;
}

int needle_model_embed(const needle_model *M, const char *text, float *out, int out_len)
{
    if (!M || !text || (!out && out_len > 0))
        return nd_error(ND_EARG, "needle_model_embed: NULL argument");
    if (M->gen == 3)
        return embed3(M, text, out, out_len);
    if (!M->heads.contrastive.present)
        return nd_error(ND_EUNSUPPORTED, "the archive has no contrastive head");
    int dim = M->heads.contrastive.out_dim;
    float *v = malloc((size_t)dim * sizeof *v);
    if (!v)
        return nd_error(ND_ENOMEM, "out of memory");
    nd_embedder e = embedder(M);
    int rc = nd_embed_text(&e, text, strlen(text), v);
    if (!rc)
        memcpy(out, v, (size_t)(out_len < dim ? out_len : dim) * sizeof *v);
    free(v);
    return rc ? rc : dim;
}

int needle_model_embed_dim(const needle_model *M)
{
    if (!M)
        return nd_error(ND_EARG, "needle_model_embed_dim: NULL model");
    if (M->gen == 3) {
        const nd_qhead3 *h = nd_model_head3(M, 1);
        return h ? h->out
                 : nd_error(ND_EUNSUPPORTED,
                            "this Needle 3 archive has no embedding head "
                            "(embedding_head was not exported): embed() needs one");
    }
    if (!M->heads.contrastive.present)
        return nd_error(ND_EUNSUPPORTED, "the archive has no contrastive head");
    return M->heads.contrastive.out_dim;
}

int needle_model_head_confidence(const needle_model *M, const int *ids, int n, double *p)
{
    if (!M || !ids || !p)
        return nd_error(ND_EARG, "needle_model_head_confidence: NULL argument");
    if (M->gen == 3) {
        const nd_qhead3 *h = nd_model_head3(M, 2);
        float logit;
        int rc = h ? nd_head3_run(M, h, (const int32_t *)ids, n, &logit)
                   : nd_error(ND_EUNSUPPORTED, "this Needle 3 archive has no confidence head");
        if (!rc)
            *p = 1.0 / (1.0 + exp(-(double)logit));
        return rc;
    }
    if (!M->heads.confidence.present)
        return nd_error(ND_EUNSUPPORTED, "the archive has no confidence head");
    return nd_head_confidence(&M->m, M->be, &M->heads, (const int32_t *)ids, n, p);
}
