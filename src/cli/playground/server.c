/* The playground's HTTP server on libmicrohttpd: upstream's routes
 * (needle/playground/server.py), our embedded page, body limits, and a
 * download route that serves only files the playground itself wrote. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/playground/mhd_dl.h"
#include "cli/playground/playground.h"

/* generated at build time from src/cli/playground/index.html */
extern const unsigned char pg_page_html[];
extern const size_t pg_page_html_len;

static const char *server_workdir;

struct request {
    char *body;
    size_t len, cap;
    long long limit;
    int too_big;
};

static enum MHD_Result send_bytes(struct MHD_Connection *c, unsigned code, const void *data,
                                  size_t len, const char *ctype)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

/* Send a malloc'd JSON text and free it. */
static enum MHD_Result send_json_owned(struct MHD_Connection *c, unsigned code, char *json)
{
    if (!json)
        return send_bytes(c, 500, "{\"error\":\"out of memory\"}", 25, "application/json");
    enum MHD_Result ret = send_bytes(c, code, json, strlen(json), "application/json");
    free(json);
    return ret;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned code, const char *msg)
{
    json_t *o = json_pack("{s:s}", "error", msg);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return send_json_owned(c, code, s);
}

/* A plain file name: [A-Za-z0-9._-], not starting with '.', no "..". */
static int safe_name(const char *s)
{
    if (!*s || *s == '.' || strlen(s) > 128 || strstr(s, ".."))
        return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == '-'))
            return 0;
    return 1;
}

static enum MHD_Result serve_download(struct MHD_Connection *c, const char *name)
{
    if (!safe_name(name))
        return send_error(c, 400, "download: invalid file name");
    if (!pg_job_produced(name))
        return send_error(c, 404, "download: no such file produced by this playground");
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", server_workdir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        if (fd >= 0)
            close(fd);
        return send_error(c, 404, "download: file vanished");
    }
    struct MHD_Response *r = MHD_create_response_from_fd((uint64_t)st.st_size, fd);
    if (!r) {
        close(fd);
        return MHD_NO;
    }
    char disp[256];
    snprintf(disp, sizeof disp, "attachment; filename=\"%s\"", name);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
    MHD_add_response_header(r, "Content-Disposition", disp);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

static json_t *parse_body(struct request *rq, char *why, size_t why_len)
{
    json_error_t err;
    json_t *v = rq->len ? json_loadb(rq->body, rq->len, 0, &err) : json_object();
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

/* upstream accepts "tools" as a JSON text or as the array itself */
static char *tools_text(json_t *body)
{
    json_t *t = json_object_get(body, "tools");
    if (!t)
        return strdup("[]");
    if (json_is_string(t))
        return strdup(json_string_value(t));
    return json_dumps(t, JSON_COMPACT | JSON_PRESERVE_ORDER);
}

static enum MHD_Result route_complete(struct MHD_Connection *c, struct request *rq)
{
    char why[512];
    json_t *body = parse_body(rq, why, sizeof why);
    if (!body)
        return send_error(c, 400, why);
    json_t *q = json_object_get(body, "query");
    if (q && !json_is_string(q)) {
        json_decref(body);
        return send_error(c, 400, "request body: field \"query\" must be a string");
    }
    /* ours: "tool_choice": "required" forbids the [] answer */
    json_t *choice = json_object_get(body, "tool_choice");
    if (choice && !(json_is_string(choice) && (!strcmp(json_string_value(choice), "auto") ||
                                               !strcmp(json_string_value(choice), "required")))) {
        json_decref(body);
        return send_error(c, 400,
                          "request body: field \"tool_choice\" must be \"auto\" or "
                          "\"required\"");
    }
    int required = choice && !strcmp(json_string_value(choice), "required");
    char *tools = tools_text(body);
    int code = 200;
    char *out =
        tools ? pg_slot_complete(tools, q ? json_string_value(q) : "", required, &code) : NULL;
    free(tools);
    json_decref(body);
    return send_json_owned(c, (unsigned)code, out);
}

static enum MHD_Result route_load_model(struct MHD_Connection *c, struct request *rq)
{
    const char *hdr = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Filename");
    const char *name = "model.cact";
    if (hdr) {
        const char *slash = strrchr(hdr, '/');
        if (safe_name(slash ? slash + 1 : hdr))
            name = slash ? slash + 1 : hdr;
    }
    char why[512];
    if (pg_slot_load_buffer(rq->body ? rq->body : "", rq->len, name, why, sizeof why)) {
        char msg[700];
        snprintf(msg, sizeof msg, "%s: not loaded (the previous model stays): %s", name, why);
        return send_error(c, 400, msg);
    }
    return send_json_owned(c, 200, pg_slot_info_json());
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

static enum MHD_Result route_finetune(struct MHD_Connection *c, struct request *rq)
{
    char why[512];
    json_t *body = parse_body(rq, why, sizeof why);
    if (!body)
        return send_error(c, 400, why);
    int epochs, batch, max_len;
    double lr = 1e-4;
    json_t *lrv = json_object_get(body, "lr");
    json_t *ex = json_object_get(body, "examples");
    char *jsonl = NULL;
    int code = 400;
    if (int_field(body, "epochs", 3, 1, 1000, &epochs, why, sizeof why) ||
        int_field(body, "batch_size", 16, 1, 4096, &batch, why, sizeof why) ||
        int_field(body, "max_len", 1024, 16, 1 << 16, &max_len, why, sizeof why))
        goto out;
    if (lrv &&
        !(json_is_number(lrv) && json_number_value(lrv) > 0 && json_number_value(lrv) < 10)) {
        snprintf(why, sizeof why, "request body: field \"lr\" must be a number in (0, 10)");
        goto out;
    }
    if (lrv)
        lr = json_number_value(lrv);
    if (json_is_string(ex)) {
        jsonl = strdup(json_string_value(ex));
    } else if (json_is_array(ex)) {
        /* one compact line per example, keys in the order given */
        size_t cap = 1, n = 0, i;
        json_t *it;
        jsonl = calloc(1, 1);
        json_array_foreach(ex, i, it)
        {
            char *line = json_dumps(it, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
            size_t ln = line ? strlen(line) : 0;
            char *grown = line ? realloc(jsonl, cap + ln + 1) : NULL;
            if (!grown) {
                free(line);
                free(jsonl);
                jsonl = NULL;
                break;
            }
            jsonl = grown;
            memcpy(jsonl + n, line, ln);
            n += ln;
            jsonl[n++] = '\n';
            jsonl[n] = 0;
            cap += ln + 1;
            free(line);
        }
    } else if (json_is_string(json_object_get(body, "api_key")) &&
               json_string_length(json_object_get(body, "api_key"))) {
        /* upstream's flow: generate the examples with the chat API first */
        int samples;
        if (int_field(body, "samples", 200, 1, 100000, &samples, why, sizeof why))
            goto out;
        json_error_t err;
        char *tools = tools_text(body);
        json_t *parsed = tools ? json_loads(tools, 0, &err) : NULL;
        int ok = json_is_array(parsed) && json_array_size(parsed) > 0;
        json_decref(parsed);
        if (!ok) {
            free(tools);
            snprintf(why, sizeof why,
                     "request body: \"tools\" must be a non-empty array of "
                     "tools to generate examples for");
            goto out;
        }
        code = pg_job_start(NULL, tools, json_string_value(json_object_get(body, "api_key")),
                            samples, epochs, batch, lr, max_len, why, sizeof why);
        free(tools);
        goto out;
    } else {
        snprintf(why, sizeof why,
                 "request body: give \"examples\" (JSONL text or an array of examples), or "
                 "\"api_key\" + \"tools\" (+ \"samples\") to generate them first");
        goto out;
    }
    if (!jsonl) {
        snprintf(why, sizeof why, "out of memory");
        code = 500;
        goto out;
    }
    code = pg_job_start(jsonl, NULL, NULL, 0, epochs, batch, lr, max_len, why, sizeof why);
out:
    free(jsonl);
    json_decref(body);
    if (code)
        return send_error(c, (unsigned)code, why);
    return send_bytes(c, 200, "{\"ok\":true}", 11, "application/json");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    (void)cls;
    (void)version;
    int is_post = !strcmp(method, "POST");
    struct request *rq = *con_cls;
    if (!rq) {
        rq = calloc(1, sizeof *rq);
        if (!rq)
            return MHD_NO;
        *con_cls = rq;
        rq->limit = !strcmp(url, "/load-model") ? PG_MAX_UPLOAD_BYTES : PG_MAX_JSON_BYTES;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoll(cl, NULL, 10) > rq->limit) /* refuse before reading it */
            return send_error(c, 413, "request body too large");
        return MHD_YES;
    }
    if (*upload_size) {
        if (!rq->too_big && (long long)(rq->len + *upload_size) > rq->limit)
            rq->too_big = 1;
        if (!rq->too_big) {
            if (rq->len + *upload_size + 1 > rq->cap) {
                size_t cap = rq->cap ? rq->cap : 4096;
                while (cap < rq->len + *upload_size + 1)
                    cap *= 2;
                char *b = realloc(rq->body, cap);
                if (!b)
                    return MHD_NO;
                rq->body = b;
                rq->cap = cap;
            }
            memcpy(rq->body + rq->len, upload, *upload_size);
            rq->len += *upload_size;
            rq->body[rq->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (rq->too_big)
        return send_error(c, 413, "request body too large");

    if (!strcmp(method, "GET") || !strcmp(method, "HEAD")) {
        if (!strcmp(url, "/") || !strcmp(url, "/index.html"))
            return send_bytes(c, 200, pg_page_html, pg_page_html_len, "text/html; charset=utf-8");
        if (!strcmp(url, "/model"))
            return send_json_owned(c, 200, pg_slot_info_json());
        if (!strcmp(url, "/finetune/status"))
            return send_json_owned(c, 200, pg_job_status_json());
        if (!strncmp(url, "/download/", 10))
            return serve_download(c, url + 10);
    } else if (is_post) {
        if (!strcmp(url, "/complete"))
            return route_complete(c, rq);
        if (!strcmp(url, "/reset")) {
            pg_slot_reset();
            return send_bytes(c, 200, "{\"ok\":true}", 11, "application/json");
        }
        if (!strcmp(url, "/load-model"))
            return route_load_model(c, rq);
        if (!strcmp(url, "/finetune"))
            return route_finetune(c, rq);
    }
    return send_error(c, 404, "not found");
}

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls,
                    enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    (void)toe;
    struct request *rq = *con_cls;
    if (rq) {
        free(rq->body);
        free(rq);
        *con_cls = NULL;
    }
}

void pg_block_stop_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, set, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static int is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return !memcmp(a, &in6addr_loopback, sizeof *a);
    }
    return 0;
}

int pg_serve(const char *host, int port, const char *workdir)
{
    server_workdir = workdir;
    char why[512];
    if (pg_mhd_load(why, sizeof why)) {
        fprintf(stderr, "needle playground: %s\n", why);
        return 1;
    }
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
    hints.ai_socktype = SOCK_STREAM;
    char port_text[16];
    snprintf(port_text, sizeof port_text, "%d", port);
    int gai = getaddrinfo(host, port_text, &hints, &ai);
    if (gai) {
        fprintf(stderr, "needle playground: --host %s: %s (a numeric IPv4/IPv6 address)\n", host,
                gai_strerror(gai));
        return 2;
    }
    if (!is_loopback(ai->ai_addr))
        fprintf(stderr,
                "needle playground: WARNING: listening on %s, not loopback: anyone who can reach "
                "this address can run the model, upload archives and start fine-tunes\n",
                host);

    sigset_t stop;
    pg_block_stop_signals(&stop);

    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     MHD_USE_ERROR_LOG | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)port, NULL, NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_done, NULL, MHD_OPTION_CONNECTION_LIMIT, (unsigned)64,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) {
        fprintf(stderr, "needle playground: cannot listen on %s:%d: %s\n", host, port,
                strerror(errno));
        return 1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int bound = info ? info->port : port;
    char *model = pg_slot_info_json();
    printf("needle playground ready: http://%s%s%s:%d  %s\n", strchr(host, ':') ? "[" : "", host,
           strchr(host, ':') ? "]" : "", bound, model ? model : "");
    free(model);
    fflush(stdout);

    int sig = 0;
    while (sigwait(&stop, &sig))
        ;
    fprintf(stderr, "needle playground: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    pg_job_shutdown();
    MHD_stop_daemon(d);
    return 0;
}
