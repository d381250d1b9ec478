/* The playground's request checks that need no socket and no model: whom
 * it answers (Host, Origin, Content-Type) and the JSON bodies of
 * /complete and /finetune, parsed into plain structs. server.c calls
 * these; tests/fuzz/fuzz_playground.c drives them directly. */
#ifndef ND_PG_REQUEST_CHECK_H
#define ND_PG_REQUEST_CHECK_H

#include <stddef.h>

/* One acceptable Host: a lower-case name or address ("[::1]" with its
 * brackets) and a port. */
struct pg_hostport {
    char *host;
    int port;
    int default_port; /* 80 or 443: a Host header without a port means this */
};

/* Who may talk to the playground. */
struct pg_access {
    struct pg_hostport *hosts; /* Host header values answered */
    size_t n_hosts;
    char **origins; /* Origin values accepted on POST (lower-case, no '/') */
    size_t n_origins;
    int port;   /* the port listened on */
    int any_ip; /* bound to a wildcard address: any IP-literal Host on `port` */
};

/* Build the allow lists for a server listening on numeric address
 * `listen_host` (as given to --host) and `port` (the bound one), plus each
 * --allow-origin value (scheme://host[:port], http or https, no path).
 * 0, or -1 with the reason (naming the bad value) in `why`. */
int pg_access_init(struct pg_access *a, const char *listen_host, int port,
                   const char *const *allow_origins, size_t n_allow, char *why, size_t why_len);
void pg_access_free(struct pg_access *a);
/* Whether a Host header value (NULL: none sent) names this server. */
int pg_host_ok(const struct pg_access *a, const char *host);
/* Whether an Origin header value is this server's own origin or an
 * allowed one. */
int pg_origin_ok(const struct pg_access *a, const char *origin);
/* Whether a Content-Type header value (NULL: none) has media type `want`
 * (case-insensitive, parameters such as charset ignored). */
int pg_media_type_is(const char *ctype, const char *want);

/* A /complete body. Strings are malloc'd; pg_complete_req_free. */
struct pg_complete_req {
    char *tools; /* compact JSON text of an array */
    char *query;
    int required; /* tool_choice "required" */
};
/* 0, or -1 with a message naming the field in `why` (answer 400). */
int pg_parse_complete(const char *body, size_t len, struct pg_complete_req *out, char *why,
                      size_t why_len);
void pg_complete_req_free(struct pg_complete_req *r);

/* A /finetune body: examples as JSONL text, or tools + api_key to
 * generate them first (upstream's flow). */
struct pg_finetune_req {
    char *jsonl;   /* examples, one per line; NULL in the generate flow */
    char *tools;   /* generate flow: compact JSON text of a non-empty array */
    char *api_key; /* generate flow */
    int samples, epochs, batch_size, max_len;
    double lr; /* epochs, batch_size, lr: 0 when not given (pg_job_start uses the base's) */
};
/* 0, or the HTTP status to answer (400, 500 out of memory) with the
 * reason in `why`. */
int pg_parse_finetune(const char *body, size_t len, struct pg_finetune_req *out, char *why,
                      size_t why_len);
void pg_finetune_req_free(struct pg_finetune_req *r);

/* Whether one line of the grammar compiler's warnings (needle_session_
 * warnings) reports a constraint no value can meet (an empty enum,
 * maxLength < minLength, ...): the compiler drops it and warns; the
 * playground refuses such a schema instead of answering a call that
 * breaks it. */
int pg_warning_unsatisfiable(const char *line);

#endif
