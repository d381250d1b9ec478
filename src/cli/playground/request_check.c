/* The playground's socket-free request checks (see request_check.h). */
#define _POSIX_C_SOURCE 200809L
#include "cli/playground/request_check.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define HOST_MAX 260 /* longest Host / Origin value looked at */

static int lower(int c)
{
    return c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c;
}

/* Split "host[:port]" / "[v6][:port]" (lower-cased into host, which holds
 * HOST_MAX bytes); *port = -1 without one. 0, or -1 when malformed. */
static int split_hostport(const char *s, char *host, int *port)
{
    size_t n = strlen(s);
    if (!n || n >= HOST_MAX)
        return -1;
    const char *colon;
    size_t hl;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close)
            return -1;
        hl = (size_t)(close - s) + 1;
        colon = close[1] == ':' ? close + 1 : NULL;
        if (!colon && close[1])
            return -1;
    } else {
        colon = strchr(s, ':');
        if (colon && strchr(colon + 1, ':'))
            return -1; /* an IPv6 address needs its brackets */
        hl = colon ? (size_t)(colon - s) : n;
    }
    if (!hl)
        return -1;
    for (size_t i = 0; i < hl; i++) {
        int c = lower((unsigned char)s[i]);
        /* names, IPv4 and bracketed IPv6: nothing else belongs in a host */
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
              c == '_' || c == ':' || c == '[' || c == ']'))
            return -1;
        host[i] = (char)c;
    }
    host[hl] = 0;
    *port = -1;
    if (colon) {
        const char *p = colon + 1;
        long v = 0;
        if (!*p || strlen(p) > 5 || *p == '0') /* browsers never send "07860" */
            return -1;
        for (; *p; p++) {
            if (*p < '0' || *p > '9')
                return -1;
            v = v * 10 + (*p - '0');
        }
        if (v < 1 || v > 65535)
            return -1;
        *port = (int)v;
    }
    return 0;
}

/* An IPv4 literal, or an IPv6 literal in brackets. */
static int is_ip_literal(const char *host)
{
    unsigned char buf[sizeof(struct in6_addr)];
    if (host[0] != '[')
        return inet_pton(AF_INET, host, buf) == 1;
    size_t n = strlen(host);
    char inner[HOST_MAX];
    if (n < 3 || host[n - 1] != ']')
        return 0;
    memcpy(inner, host + 1, n - 2);
    inner[n - 2] = 0;
    return inet_pton(AF_INET6, inner, buf) == 1;
}

static int add_host(struct pg_access *a, const char *host, int port, int default_port)
{
    struct pg_hostport *h = realloc(a->hosts, (a->n_hosts + 1) * sizeof *h);
    if (!h)
        return -1;
    a->hosts = h;
    h[a->n_hosts].host = strdup(host);
    if (!h[a->n_hosts].host)
        return -1;
    h[a->n_hosts].port = port;
    h[a->n_hosts].default_port = default_port;
    a->n_hosts++;
    return 0;
}

static int add_origin(struct pg_access *a, const char *scheme, const char *host, int port,
                      int default_port)
{
    char buf[HOST_MAX + 32];
    if (port == default_port)
        snprintf(buf, sizeof buf, "%s://%s", scheme, host);
    else
        snprintf(buf, sizeof buf, "%s://%s:%d", scheme, host, port);
    char **o = realloc(a->origins, (a->n_origins + 1) * sizeof *o);
    if (!o)
        return -1;
    a->origins = o;
    if (!(o[a->n_origins] = strdup(buf)))
        return -1;
    a->n_origins++;
    return 0;
}

/* this server itself, reached over plain http */
static int add_self(struct pg_access *a, const char *host)
{
    return add_host(a, host, a->port, 80) || add_origin(a, "http", host, a->port, 80);
}

int pg_access_init(struct pg_access *a, const char *listen_host, int port,
                   const char *const *allow_origins, size_t n_allow, char *why, size_t why_len)
{
    memset(a, 0, sizeof *a);
    a->port = port;
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_flags = AI_NUMERICHOST;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(listen_host, NULL, &hints, &ai);
    if (gai) {
        snprintf(why, why_len, "--host %s: %s (a numeric IPv4/IPv6 address)", listen_host,
                 gai_strerror(gai));
        return -1;
    }
    char text[INET6_ADDRSTRLEN], host[HOST_MAX];
    int loopback = 0, wildcard = 0, oom = 0;
    if (ai->ai_family == AF_INET) {
        struct in_addr ad = ((const struct sockaddr_in *)ai->ai_addr)->sin_addr;
        inet_ntop(AF_INET, &ad, text, sizeof text);
        snprintf(host, sizeof host, "%s", text);
        loopback = (ntohl(ad.s_addr) >> 24) == 127;
        wildcard = ad.s_addr == htonl(INADDR_ANY);
    } else {
        struct in6_addr ad = ((const struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
        inet_ntop(AF_INET6, &ad, text, sizeof text);
        snprintf(host, sizeof host, "[%s]", text);
        loopback = !memcmp(&ad, &in6addr_loopback, sizeof ad);
        wildcard = !memcmp(&ad, &in6addr_any, sizeof ad);
    }
    freeaddrinfo(ai);
    if (wildcard)
        a->any_ip = 1; /* every address of this machine: any IP literal */
    else
        oom |= add_self(a, host);
    if (loopback || wildcard)
        oom |= add_self(a, "localhost") || add_self(a, "127.0.0.1") || add_self(a, "[::1]");
    for (size_t i = 0; i < n_allow && !oom; i++) {
        const char *o = allow_origins[i];
        const char *rest = NULL, *scheme = NULL;
        int dflt = 0;
        if (!strncmp(o, "http://", 7))
            rest = o + 7, scheme = "http", dflt = 80;
        else if (!strncmp(o, "https://", 8))
            rest = o + 8, scheme = "https", dflt = 443;
        char hp[HOST_MAX];
        size_t n = rest ? strlen(rest) : 0;
        if (n && rest[n - 1] == '/')
            n--; /* "http://box:7860/" as a browser's address bar shows it */
        int p;
        if (!rest || !n || n >= sizeof hp) {
            snprintf(why, why_len,
                     "--allow-origin %.200s: expected http://HOST[:PORT] or https://HOST[:PORT]",
                     o);
            pg_access_free(a);
            return -1;
        }
        memcpy(hp, rest, n);
        hp[n] = 0;
        if (split_hostport(hp, host, &p)) {
            snprintf(why, why_len,
                     "--allow-origin %.200s: not an origin (scheme://host[:port], no path, "
                     "no user)",
                     o);
            pg_access_free(a);
            return -1;
        }
        if (p < 0)
            p = dflt;
        oom |= add_host(a, host, p, dflt) || add_origin(a, scheme, host, p, dflt);
    }
    if (oom) {
        snprintf(why, why_len, "out of memory");
        pg_access_free(a);
        return -1;
    }
    return 0;
}

void pg_access_free(struct pg_access *a)
{
    for (size_t i = 0; i < a->n_hosts; i++)
        free(a->hosts[i].host);
    for (size_t i = 0; i < a->n_origins; i++)
        free(a->origins[i]);
    free(a->hosts);
    free(a->origins);
    memset(a, 0, sizeof *a);
}

int pg_host_ok(const struct pg_access *a, const char *hdr)
{
    char host[HOST_MAX];
    int port;
    if (!hdr || split_hostport(hdr, host, &port))
        return 0;
    for (size_t i = 0; i < a->n_hosts; i++) {
        const struct pg_hostport *h = &a->hosts[i];
        if (!strcmp(host, h->host) && (port == h->port || (port < 0 && h->port == h->default_port)))
            return 1;
    }
    /* a DNS-rebinding page always sends its own name: an IP literal means
     * the browser was pointed at this machine's address itself */
    return a->any_ip && is_ip_literal(host) && (port == a->port || (port < 0 && a->port == 80));
}

int pg_origin_ok(const struct pg_access *a, const char *origin)
{
    char buf[HOST_MAX + 16];
    size_t n = origin ? strlen(origin) : 0;
    if (!n || n >= sizeof buf)
        return 0;
    for (size_t i = 0; i <= n; i++)
        buf[i] = (char)lower((unsigned char)origin[i]);
    for (size_t i = 0; i < a->n_origins; i++)
        if (!strcmp(buf, a->origins[i]))
            return 1;
    if (a->any_ip && !strncmp(buf, "http://", 7)) {
        char host[HOST_MAX];
        int port;
        if (!split_hostport(buf + 7, host, &port) && is_ip_literal(host) &&
            (port == a->port || (port < 0 && a->port == 80)))
            return 1;
    }
    return 0;
}

int pg_media_type_is(const char *ctype, const char *want)
{
    if (!ctype)
        return 0;
    while (*ctype == ' ' || *ctype == '\t')
        ctype++;
    size_t n = strlen(want);
    for (size_t i = 0; i < n; i++)
        if (lower((unsigned char)ctype[i]) != want[i]) /* stops at ctype's NUL too */
            return 0;
    const char *p = ctype + n;
    while (*p == ' ' || *p == '\t')
        p++;
    return !*p || *p == ';';
}

/* ---- bodies ---- */

static json_t *parse_body(const char *body, size_t len, char *why, size_t why_len)
{
    json_error_t err;
    json_t *v = len ? json_loadb(body, len, 0, &err) : json_object();
    if (!v) {
        snprintf(why, why_len, "request body: invalid JSON at line %d column %d: %s", err.line,
                 err.column, err.text);
        return NULL;
    }
    if (!json_is_object(v)) {
        json_decref(v);
        snprintf(why, why_len, "request body: expected a JSON object");
        return NULL;
    }
    return v;
}

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* upstream accepts "tools" as the array itself or as a JSON text of it;
 * absent: no tools. 0 (*out malloc'd), 400 or 500 with why. */
static int tools_text(json_t *body, char **out, char *why, size_t why_len)
{
    json_t *t = json_object_get(body, "tools");
    *out = NULL;
    if (!t)
        *out = strdup("[]");
    else if (json_is_array(t))
        *out = json_dumps(t, JSON_COMPACT | JSON_PRESERVE_ORDER);
    else if (json_is_string(t)) {
        json_error_t err;
        json_t *parsed = json_loads(json_string_value(t), 0, &err);
        int is_array = json_is_array(parsed);
        json_decref(parsed);
        if (!parsed) {
            snprintf(why, why_len,
                     "request body: field \"tools\": the JSON text is invalid at line %d column "
                     "%d: %s",
                     err.line, err.column, err.text);
            return 400;
        }
        if (!is_array) {
            snprintf(why, why_len,
                     "request body: field \"tools\": the JSON text must be an array of tools");
            return 400;
        }
        *out = strdup(json_string_value(t));
    } else {
        snprintf(why, why_len,
                 "request body: field \"tools\" must be an array of tools or a JSON text of "
                 "one, not %s",
                 type_name(t));
        return 400;
    }
    if (!*out) {
        snprintf(why, why_len, "out of memory");
        return 500;
    }
    return 0;
}

int pg_parse_complete(const char *body, size_t len, struct pg_complete_req *out, char *why,
                      size_t why_len)
{
    memset(out, 0, sizeof *out);
    json_t *b = parse_body(body, len, why, why_len);
    if (!b)
        return -1;
    int rc = -1;
    json_t *q = json_object_get(b, "query");
    /* ours: "tool_choice": "required" forbids the [] answer */
    json_t *choice = json_object_get(b, "tool_choice");
    if (q && !json_is_string(q)) {
        snprintf(why, why_len, "request body: field \"query\" must be a string");
        goto out;
    }
    if (choice && !(json_is_string(choice) && (!strcmp(json_string_value(choice), "auto") ||
                                               !strcmp(json_string_value(choice), "required")))) {
        snprintf(why, why_len,
                 "request body: field \"tool_choice\" must be \"auto\" or \"required\"");
        goto out;
    }
    out->required = choice && !strcmp(json_string_value(choice), "required");
    if (tools_text(b, &out->tools, why, why_len))
        goto out;
    out->query = strdup(q ? json_string_value(q) : "");
    if (!out->query) {
        snprintf(why, why_len, "out of memory");
        goto out;
    }
    rc = 0;
out:
    json_decref(b);
    if (rc)
        pg_complete_req_free(out);
    return rc;
}

void pg_complete_req_free(struct pg_complete_req *r)
{
    free(r->tools);
    free(r->query);
    r->tools = r->query = NULL;
}

static int int_field(json_t *body, const char *key, int dflt, int lo, int hi, int *out, char *why,
                     size_t why_len)
{
    json_t *v = json_object_get(body, key);
    *out = dflt;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        snprintf(why, why_len, "request body: field \"%s\" must be an integer in [%d, %d]", key, lo,
                 hi);
        return -1;
    }
    *out = (int)json_integer_value(v);
    return 0;
}

/* one compact line per example, keys in the order given */
static char *examples_jsonl(json_t *ex)
{
    size_t n = 0, cap = 256, i;
    json_t *it;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    out[0] = 0;
    json_array_foreach(ex, i, it)
    {
        char *line = json_dumps(it, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
        if (!line) {
            free(out);
            return NULL;
        }
        size_t ln = strlen(line);
        if (n + ln + 2 > cap) {
            while (n + ln + 2 > cap)
                cap *= 2;
            char *grown = realloc(out, cap);
            if (!grown) {
                free(line);
                free(out);
                return NULL;
            }
            out = grown;
        }
        memcpy(out + n, line, ln);
        n += ln;
        out[n++] = '\n';
        out[n] = 0;
        free(line);
    }
    return out;
}

int pg_parse_finetune(const char *body, size_t len, struct pg_finetune_req *out, char *why,
                      size_t why_len)
{
    memset(out, 0, sizeof *out);
    out->lr = 0; /* 0 (also epochs, batch_size): the base's recommended setting */
    json_t *b = parse_body(body, len, why, why_len);
    if (!b)
        return 400;
    int code = 400;
    json_t *lrv = json_object_get(b, "lr");
    json_t *ex = json_object_get(b, "examples");
    json_t *key = json_object_get(b, "api_key");
    if (int_field(b, "epochs", 0, 1, 1000, &out->epochs, why, why_len) ||
        int_field(b, "batch_size", 0, 1, 4096, &out->batch_size, why, why_len) ||
        int_field(b, "max_len", 1024, 16, 1 << 16, &out->max_len, why, why_len))
        goto out;
    if (lrv &&
        !(json_is_number(lrv) && json_number_value(lrv) > 0 && json_number_value(lrv) < 10)) {
        snprintf(why, why_len, "request body: field \"lr\" must be a number in (0, 10)");
        goto out;
    }
    if (lrv)
        out->lr = json_number_value(lrv);
    if (json_is_string(ex) || json_is_array(ex)) {
        out->jsonl = json_is_string(ex) ? strdup(json_string_value(ex)) : examples_jsonl(ex);
        if (!out->jsonl) {
            snprintf(why, why_len, "out of memory");
            code = 500;
            goto out;
        }
    } else if (json_is_string(key) && json_string_length(key)) {
        /* upstream's flow: generate the examples with the chat API first */
        if (int_field(b, "samples", 200, 1, 100000, &out->samples, why, why_len))
            goto out;
        int rc = tools_text(b, &out->tools, why, why_len);
        if (rc) {
            code = rc;
            goto out;
        }
        json_t *parsed = json_loads(out->tools, 0, NULL);
        int ok = json_array_size(parsed) > 0;
        json_decref(parsed);
        if (!ok) {
            snprintf(why, why_len,
                     "request body: \"tools\" must be a non-empty array of tools to generate "
                     "examples for");
            goto out;
        }
        if (!(out->api_key = strdup(json_string_value(key)))) {
            snprintf(why, why_len, "out of memory");
            code = 500;
            goto out;
        }
    } else {
        snprintf(why, why_len,
                 "request body: give \"examples\" (JSONL text or an array of examples), or "
                 "\"api_key\" + \"tools\" (+ \"samples\") to generate them first");
        goto out;
    }
    code = 0;
out:
    json_decref(b);
    if (code)
        pg_finetune_req_free(out);
    return code;
}

void pg_finetune_req_free(struct pg_finetune_req *r)
{
    free(r->jsonl);
    free(r->tools);
    if (r->api_key) {
        memset(r->api_key, 0, strlen(r->api_key));
        free(r->api_key);
    }
    r->jsonl = r->tools = r->api_key = NULL;
}

int pg_warning_unsatisfiable(const char *line)
{
    /* src/engine/grammar_compile.c's texts for a constraint it had to drop
     * because no value meets it */
    static const char *const marks[] = {
        "'enum' is not a non-empty array",
        "maxLength < minLength",
        "maxItems < minItems",
        "fits the bounds",
        "pattern admits no string",
        "pattern needs",
    };
    for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++)
        if (strstr(line, marks[i]))
            return 1;
    return 0;
}
