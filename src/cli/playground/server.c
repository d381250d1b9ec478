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
#include <time.h>
#include <unistd.h>

#include "cli/playground/mhd_dl.h"
#include "cli/playground/playground.h"
#include "cli/playground/request_check.h"

/* generated at build time from src/cli/playground/index.html */
extern const unsigned char pg_page_html[];
extern const size_t pg_page_html_len;

static const char *server_workdir;
/* who may talk to us; published once the port is bound (NULL before) */
static struct pg_access access_cfg;
static const struct pg_access *access_ready;

struct request {
    char *body;
    size_t len, cap;
    long long limit;    /* this route's body limit */
    long long declared; /* Content-Length, or -1 */
    size_t reserved;    /* bytes of the global upload budget held */
    int refused;        /* answered before the body: discard what comes */
    unsigned deny_code; /* refused once the body is in (discarded), with deny_msg */
    char *deny_msg;
    int too_big, over_budget;
};

/* ---- the global upload budget: bytes buffered by all connections ---- */

static pthread_mutex_t budget_lock = PTHREAD_MUTEX_INITIALIZER;
static long long budget_used;

/* Raise rq's share to `want` bytes; -1 when that exceeds the budget. */
static int budget_grow(struct request *rq, size_t want)
{
    if (want <= rq->reserved)
        return 0;
    pthread_mutex_lock(&budget_lock);
    long long delta = (long long)(want - rq->reserved);
    int ok = budget_used + delta <= PG_UPLOAD_BUDGET_BYTES;
    if (ok) {
        budget_used += delta;
        rq->reserved = want;
    }
    pthread_mutex_unlock(&budget_lock);
    return ok ? 0 : -1;
}

static void budget_release(struct request *rq)
{
    pthread_mutex_lock(&budget_lock);
    budget_used -= (long long)rq->reserved;
    pthread_mutex_unlock(&budget_lock);
    rq->reserved = 0;
}

/* ---- model requests in flight: each holds a server thread ---- */

static pthread_mutex_t busy_lock = PTHREAD_MUTEX_INITIALIZER;
static int busy_handlers;

static int busy_enter(void)
{
    pthread_mutex_lock(&busy_lock);
    int ok = busy_handlers < PG_MAX_MODEL_REQUESTS;
    busy_handlers += ok;
    pthread_mutex_unlock(&busy_lock);
    return ok;
}

static void busy_leave(void)
{
    pthread_mutex_lock(&busy_lock);
    busy_handlers--;
    pthread_mutex_unlock(&busy_lock);
}

/* ---- per-connection deadlines ----
 * libmicrohttpd's timeout is an idle one: a client sending a byte now and
 * then keeps it alive forever. Each connection is tracked here from
 * accept to close; a watchdog thread shuts down the socket of one that
 * has not finished its request headers PG_HEADER_DEADLINE_S seconds after
 * it connected (or after its previous request), or its body
 * PG_BODY_DEADLINE_S seconds after the headers. MHD then sees the socket
 * end and closes the connection in its own thread. */

enum { PH_HEADERS, PH_BODY, PH_HANDLING };

struct conn_track {
    struct conn_track *prev, *next;
    int fd;
    int phase;
    int cut;
    double since;
};

static pthread_mutex_t conn_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t conn_cond = PTHREAD_COND_INITIALIZER;
static struct conn_track conn_list = {&conn_list, &conn_list, -1, 0, 0, 0};
static int watchdog_stop;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    (void)cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        struct conn_track *t = calloc(1, sizeof *t);
        if (!t || !ci) {
            free(t);
            return; /* untracked: only the idle timeout applies */
        }
        t->fd = ci->connect_fd;
        t->phase = PH_HEADERS;
        t->since = now_s();
        pthread_mutex_lock(&conn_lock);
        t->next = &conn_list;
        t->prev = conn_list.prev;
        conn_list.prev->next = t;
        conn_list.prev = t;
        pthread_mutex_unlock(&conn_lock);
        *socket_context = t;
    } else if (*socket_context) {
        /* MHD notifies before it closes the socket: under the lock the
         * watchdog never touches a descriptor that was reused */
        struct conn_track *t = *socket_context;
        pthread_mutex_lock(&conn_lock);
        t->prev->next = t->next;
        t->next->prev = t->prev;
        pthread_mutex_unlock(&conn_lock);
        free(t);
        *socket_context = NULL;
    }
}

static void conn_phase(struct MHD_Connection *c, int phase)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct conn_track *t = ci ? ci->socket_context : NULL;
    if (!t)
        return;
    pthread_mutex_lock(&conn_lock);
    t->phase = phase;
    t->since = now_s();
    pthread_mutex_unlock(&conn_lock);
}

static void *watchdog(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&conn_lock);
    while (!watchdog_stop) {
        double now = now_s();
        for (struct conn_track *t = conn_list.next; t != &conn_list; t = t->next) {
            double limit = t->phase == PH_HEADERS ? PG_HEADER_DEADLINE_S
                           : t->phase == PH_BODY  ? PG_BODY_DEADLINE_S
                                                  : -1;
            if (!t->cut && limit > 0 && now - t->since > limit) {
                shutdown(t->fd, SHUT_RDWR);
                t->cut = 1;
            }
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&conn_cond, &conn_lock, &ts);
    }
    pthread_mutex_unlock(&conn_lock);
    return NULL;
}

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
    if (!o) /* not UTF-8: callers quote peer text through printable() */
        o = json_pack("{s:s}", "error", "request refused");
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return send_json_owned(c, code, s);
}

/* A header value for an error message: printable ASCII, at most 100
 * characters (NULL: "(none)"). */
static const char *printable(const char *s, char *buf, size_t n)
{
    if (!s)
        return "(none)";
    size_t i = 0;
    for (; s[i] && i + 1 < n && i < 100; i++)
        buf[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    buf[i] = 0;
    return buf;
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

static enum MHD_Result route_complete(struct MHD_Connection *c, struct request *rq)
{
    char why[512];
    struct pg_complete_req req;
    if (pg_parse_complete(rq->body, rq->len, &req, why, sizeof why))
        return send_error(c, 400, why);
    int code = 200;
    char *out = pg_slot_complete(req.tools, req.query, req.required, &code);
    pg_complete_req_free(&req);
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

static enum MHD_Result route_finetune(struct MHD_Connection *c, struct request *rq)
{
    char why[512];
    struct pg_finetune_req req;
    int code = pg_parse_finetune(rq->body, rq->len, &req, why, sizeof why);
    if (!code) {
        code = pg_job_start(req.jsonl, req.tools, req.api_key, req.samples, req.epochs,
                            req.batch_size, req.lr, req.max_len, why, sizeof why);
        pg_finetune_req_free(&req);
    }
    if (code)
        return send_error(c, (unsigned)code, why);
    return send_bytes(c, 200, "{\"ok\":true}", 11, "application/json");
}

/* Checks on a request's headers, before its body is read: whom it comes
 * from (Host; Origin and Content-Type for POST) and whether its body fits
 * the route's limit and the global upload budget. 0 when it may go on,
 * or when refused with a body that fits the route's limit: deny_code and
 * deny_msg are set, the body is read and dropped, and the refusal answers
 * it (a client still sending when the server closes would see a reset
 * instead of the answer). 1 when refused now: the answer is queued (*ret
 * its result) and rq->refused set. */
static int deny(struct MHD_Connection *c, struct request *rq, unsigned code, const char *msg,
                enum MHD_Result *ret)
{
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (!(cl && strtoll(cl, NULL, 10) > rq->limit) && (rq->deny_msg = strdup(msg))) {
        rq->deny_code = code;
        rq->refused = 0;
        return 0;
    }
    *ret = send_error(c, code, msg);
    return 1;
}

static int refuse_early(struct MHD_Connection *c, struct request *rq, const char *url,
                        const char *method, enum MHD_Result *ret)
{
    const struct pg_access *acc = __atomic_load_n(&access_ready, __ATOMIC_ACQUIRE);
    char buf[128], msg[512];
    rq->refused = 1;
    if (!acc) {
        *ret = send_error(c, 503, "starting up");
        return 1;
    }
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (!pg_host_ok(acc, host)) {
        snprintf(msg, sizeof msg,
                 "Host %s is not this playground's address (it answers %s): refused as a "
                 "DNS-rebinding guard; to serve it under another name start it with "
                 "--allow-origin http://NAME:PORT",
                 printable(host, buf, sizeof buf), acc->n_origins ? acc->origins[0] : "its IP");
        return deny(c, rq, 403, msg, ret);
    }
    if (!strcmp(method, "POST")) {
        const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
        if (origin && !pg_origin_ok(acc, origin)) {
            snprintf(msg, sizeof msg,
                     "Origin %s may not change this playground (only its own page, or one "
                     "given with --allow-origin)",
                     printable(origin, buf, sizeof buf));
            return deny(c, rq, 403, msg, ret);
        }
        /* a page on another origin can POST text/plain, form or empty
         * bodies without asking (no CORS preflight); it cannot send these
         * types without the preflight this server never answers */
        const char *want =
            !strcmp(url, "/load-model") ? "application/octet-stream" : "application/json";
        const char *ctype = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
        if (!pg_media_type_is(ctype, want)) {
            snprintf(msg, sizeof msg, "POST %.64s needs Content-Type: %s (got %s)", url, want,
                     printable(ctype, buf, sizeof buf));
            return deny(c, rq, 415, msg, ret);
        }
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    rq->declared = cl ? strtoll(cl, NULL, 10) : -1;
    if (rq->declared > rq->limit) { /* refuse before reading it */
        snprintf(msg, sizeof msg, "request body too large: %lld bytes, the limit for %.64s is %lld",
                 rq->declared, url, rq->limit);
        *ret = send_error(c, 413, msg);
        return 1;
    }
    if (rq->declared > 0 && budget_grow(rq, (size_t)rq->declared + 1)) {
        snprintf(msg, sizeof msg,
                 "busy: uploads in progress hold the server's upload budget (%lld MiB); retry "
                 "when they finish",
                 PG_UPLOAD_BUDGET_BYTES >> 20);
        *ret = send_error(c, 503, msg);
        return 1;
    }
    rq->refused = 0;
    return 0;
}

/* Append an upload piece within the route's limit and the budget. */
static int take_upload(struct request *rq, const char *data, size_t n)
{
    if (rq->too_big || rq->over_budget)
        return 0;
    if ((long long)(rq->len + n) > rq->limit) {
        rq->too_big = 1;
        return 0;
    }
    if (rq->len + n + 1 > rq->cap) {
        size_t need = rq->len + n + 1, cap;
        if (rq->declared >= 0 && need <= (size_t)rq->declared + 1)
            cap = (size_t)rq->declared + 1; /* what it said it sends, at once */
        else
            for (cap = rq->cap ? rq->cap : 4096; cap < need; cap *= 2)
                ;
        if (budget_grow(rq, cap)) {
            rq->over_budget = 1;
            free(rq->body);
            rq->body = NULL;
            rq->len = rq->cap = 0;
            return 0;
        }
        char *b = realloc(rq->body, cap);
        if (!b)
            return -1;
        rq->body = b;
        rq->cap = cap;
    }
    memcpy(rq->body + rq->len, data, n);
    rq->len += n;
    rq->body[rq->len] = 0;
    return 0;
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
        conn_phase(c, PH_BODY);
        rq->limit = !strcmp(url, "/load-model") ? PG_MAX_UPLOAD_BYTES : PG_MAX_JSON_BYTES;
        enum MHD_Result ret = MHD_YES;
        refuse_early(c, rq, url, method, &ret);
        return ret;
    }
    if (*upload_size) {
        int rc = rq->refused || rq->deny_code ? 0 : take_upload(rq, upload, *upload_size);
        *upload_size = 0;
        return rc ? MHD_NO : MHD_YES;
    }
    if (rq->refused)
        return MHD_YES; /* answered already */
    conn_phase(c, PH_HANDLING);
    if (rq->deny_code)
        return send_error(c, rq->deny_code, rq->deny_msg);
    if (rq->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "request body too large: the limit for %.64s is %lld bytes", url,
                 rq->limit);
        return send_error(c, 413, msg);
    }
    if (rq->over_budget) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "busy: uploads in progress hold the server's upload budget (%lld MiB); retry "
                 "when they finish",
                 PG_UPLOAD_BUDGET_BYTES >> 20);
        return send_error(c, 503, msg);
    }

    if (!strcmp(method, "GET") || !strcmp(method, "HEAD")) {
        if (!strcmp(url, "/") || !strcmp(url, "/index.html"))
            return send_bytes(c, 200, pg_page_html, pg_page_html_len, "text/html; charset=utf-8");
        if (!strcmp(url, "/model"))
            return send_json_owned(c, 200, pg_slot_info_json());
        if (!strcmp(url, "/finetune/status"))
            return send_json_owned(c, 200, pg_job_status_json());
        if (!strcmp(url, "/finetune/defaults"))
            return send_json_owned(c, 200, pg_job_defaults_json());
        if (!strncmp(url, "/download/", 10))
            return serve_download(c, url + 10);
    } else if (is_post) {
        if (!strcmp(url, "/complete") || !strcmp(url, "/load-model")) {
            /* these run the model (or parse an archive) in this server
             * thread: keep threads free for everything else */
            if (!busy_enter())
                return send_error(c, 503,
                                  "busy: too many model requests in progress; retry shortly");
            enum MHD_Result ret =
                !strcmp(url, "/complete") ? route_complete(c, rq) : route_load_model(c, rq);
            busy_leave();
            return ret;
        }
        if (!strcmp(url, "/reset")) {
            pg_slot_reset();
            return send_bytes(c, 200, "{\"ok\":true}", 11, "application/json");
        }
        if (!strcmp(url, "/finetune"))
            return route_finetune(c, rq);
    }
    return send_error(c, 404, "not found");
}

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls,
                    enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)toe;
    struct request *rq = *con_cls;
    conn_phase(c, PH_HEADERS); /* keep-alive: the next request's headers */
    if (rq) {
        budget_release(rq);
        free(rq->deny_msg);
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

int pg_serve(const char *host, int port, const char *workdir, const char *const *allow_origins,
             size_t n_allow)
{
    server_workdir = workdir;
    char why[512];
    /* the --allow-origin values are checked before anything starts */
    if (pg_access_init(&access_cfg, host, port, allow_origins, n_allow, why, sizeof why)) {
        fprintf(stderr, "needle playground: %s\n", why);
        return 2;
    }
    pg_access_free(&access_cfg);
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
    int loopback = is_loopback(ai->ai_addr);
    if (!loopback)
        fprintf(stderr,
                "needle playground: WARNING: listening on %s, not loopback: anyone who can reach "
                "this address can run the model, upload archives and start fine-tunes\n",
                host);

    sigset_t stop;
    pg_block_stop_signals(&stop);

    /* a few event-loop threads (epoll/poll) serve every connection: a slow
     * client holds a socket, not a thread */
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG |
                     (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)port, NULL, NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_done, NULL, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        NULL, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)PG_SERVER_THREADS, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)PG_MAX_CONNECTIONS, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)PG_IDLE_TIMEOUT_S,
        /* all loopback clients share one address: a per-address cap there
         * would only let one local client lock out the others */
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)(loopback ? 0 : PG_MAX_CONNECTIONS_PER_IP),
        MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) {
        fprintf(stderr, "needle playground: cannot listen on %s:%d: %s\n", host, port,
                strerror(errno));
        return 1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int bound = info ? info->port : port;
    if (pg_access_init(&access_cfg, host, bound, allow_origins, n_allow, why, sizeof why)) {
        fprintf(stderr, "needle playground: %s\n", why);
        MHD_stop_daemon(d);
        return 1;
    }
    __atomic_store_n(&access_ready, &access_cfg, __ATOMIC_RELEASE);
    pthread_t wd;
    int wd_live = !pthread_create(&wd, NULL, watchdog, NULL);
    if (!wd_live)
        fprintf(stderr,
                "needle playground: no watchdog thread: only the %d s idle timeout "
                "bounds a connection\n",
                PG_IDLE_TIMEOUT_S);
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
    if (wd_live) {
        pthread_mutex_lock(&conn_lock);
        watchdog_stop = 1;
        pthread_cond_signal(&conn_cond);
        pthread_mutex_unlock(&conn_lock);
        pthread_join(wd, NULL);
    }
    MHD_stop_daemon(d);
    __atomic_store_n(&access_ready, NULL, __ATOMIC_RELEASE);
    pg_access_free(&access_cfg);
    return 0;
}
