/* OpenAI-compatible chat-completions requests over libcurl's multi
 * interface: up to `max_active` transfers at once on one thread, each POST
 * retried on transport errors, 429 and 5xx with exponential backoff plus
 * jitter (or the server's Retry-After, in seconds), then reported failed.
 * A reply body over ND_CHAT_MAX_REPLY (64 MiB, gen/chat_reply.h) is
 * abandoned and reported as such, not retried.
 * The API key goes only into the Authorization header: it is never part of
 * a message this module produces. Server text that a message quotes (an
 * error body, the service's error message) and the URL are redacted
 * (nd_redact_into: the key, any piece of it, Bearer tokens) before they are
 * cut short. */
#ifndef ND_CHAT_CLIENT_H
#define ND_CHAT_CLIENT_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *url;
    const char *api_key;
    int max_active;      /* concurrent transfers */
    int max_retries;     /* retries after the first attempt */
    double timeout_s;    /* whole transfer */
    double retry_base_s; /* first backoff; doubles per retry, plus up to 100% jitter */
    double retry_max_s;  /* cap on one wait (Retry-After included) */
    uint64_t seed;       /* jitter */
} nd_chat_opts;

typedef struct {
    void *tag;
    int ok;           /* 1: content holds the first choice's message text */
    long http_status; /* last status (0: no HTTP answer) */
    int attempts;
    char *content; /* malloc'd, NUL-terminated; caller frees */
    size_t content_len;
    char err[320]; /* why it failed */
} nd_chat_result;

typedef struct nd_chat nd_chat;

int nd_chat_new(const nd_chat_opts *o, nd_chat **out);
void nd_chat_free(nd_chat *c);
/* Queue a POST of this JSON body (copied). */
int nd_chat_submit(nd_chat *c, const char *body, size_t len, void *tag);
/* Requests queued, running or waiting to retry. */
size_t nd_chat_pending(const nd_chat *c);
/* Run until a request finishes: 1 with its result, 0 when none is pending,
 * negative on an internal error. */
int nd_chat_wait(nd_chat *c, nd_chat_result *res);

#endif
