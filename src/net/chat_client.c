/* Chat-completions client on libcurl's multi interface (chat_client.h). */
#define _POSIX_C_SOURCE 200809L
#include "net/chat_client.h"

#include <ctype.h>
#include "net/curl_dl.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/status.h"
#include "gen/chat_reply.h"

typedef struct request {
    struct request *next;
    char *body;
    size_t body_len;
    void *tag;
    int attempts;
    double due; /* monotonic seconds: earliest start */
    CURL *easy; /* NULL unless running */
    char *resp;
    size_t resp_len, resp_cap;
    double retry_after; /* from the last answer's header, -1 if none */
    int too_big;        /* the reply passed ND_CHAT_MAX_REPLY: abandoned */
    int no_memory;      /* growing the reply buffer failed: abandoned */
} request;

struct nd_chat {
    nd_chat_opts o;
    CURLM *multi;
    struct curl_slist *headers;
    request *queue; /* waiting to (re)start, running or not */
    size_t pending;
    int active;
    uint64_t rng;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double jitter01(nd_chat *c)
{
    uint64_t x = c->rng += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return (double)((x ^ (x >> 31)) >> 11) / 9007199254740992.0;
}

int nd_chat_new(const nd_chat_opts *o, nd_chat **out)
{
    *out = NULL;
    if (!o->url || !o->url[0] || o->max_active < 1 || o->max_retries < 0)
        return nd_error(ND_EARG, "chat client: bad options");
    nd_chat *c = calloc(1, sizeof *c);
    if (!c)
        return ND_ENOMEM;
    c->o = *o;
    c->rng = o->seed ^ 0x6E6565646C65ull;
    c->multi = curl_multi_init();
    char auth[1024];
    if (o->api_key && strlen(o->api_key) + 24 > sizeof auth) {
        free(c);
        return nd_error(ND_EARG, "the API key is too long (over %zu bytes)", sizeof auth - 24);
    }
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", o->api_key ? o->api_key : "");
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    if (h)
        h = curl_slist_append(h, auth);
    if (h)
        h = curl_slist_append(h, "HTTP-Referer: https://github.com/cactus-compute/needle");
    if (h)
        h = curl_slist_append(h, "X-Title: needle");
    memset(auth, 0, sizeof auth);
    if (!c->multi || !h) {
        curl_slist_free_all(h);
        if (c->multi)
            curl_multi_cleanup(c->multi);
        free(c);
        return nd_error(ND_ENOMEM, "cannot set up libcurl");
    }
    c->headers = h;
    *out = c;
    return 0;
}

static void request_free(request *r)
{
    free(r->body);
    free(r->resp);
    free(r);
}

void nd_chat_free(nd_chat *c)
{
    if (!c)
        return;
    for (request *r = c->queue, *next; r; r = next) {
        next = r->next;
        if (r->easy) {
            curl_multi_remove_handle(c->multi, r->easy);
            curl_easy_cleanup(r->easy);
        }
        request_free(r);
    }
    curl_multi_cleanup(c->multi);
    curl_slist_free_all(c->headers);
    free(c);
}

int nd_chat_submit(nd_chat *c, const char *body, size_t len, void *tag)
{
    request *r = calloc(1, sizeof *r);
    if (!r || !(r->body = malloc(len + 1))) {
        free(r);
        return ND_ENOMEM;
    }
    memcpy(r->body, body, len);
    r->body[len] = 0;
    r->body_len = len;
    r->tag = tag;
    r->retry_after = -1;
    /* append: requests start in submission order */
    request **p = &c->queue;
    while (*p)
        p = &(*p)->next;
    *p = r;
    c->pending++;
    return 0;
}

size_t nd_chat_pending(const nd_chat *c)
{
    return c->pending;
}

static size_t on_body(char *data, size_t size, size_t n, void *ud)
{
    request *r = ud;
    size_t add = size * n;
    if (add > ND_CHAT_MAX_REPLY - r->resp_len) {
        r->too_big = 1; /* libcurl then ends the transfer with a write error */
        return 0;
    }
    if (r->resp_len + add + 1 > r->resp_cap) {
        size_t cap = r->resp_cap ? r->resp_cap : 4096;
        while (cap < r->resp_len + add + 1)
            cap *= 2;
        if (cap > ND_CHAT_MAX_REPLY + 1)
            cap = ND_CHAT_MAX_REPLY + 1;
        char *p = realloc(r->resp, cap);
        if (!p) {
            r->no_memory = 1;
            return 0;
        }
        r->resp = p;
        r->resp_cap = cap;
    }
    memcpy(r->resp + r->resp_len, data, add);
    r->resp_len += add;
    r->resp[r->resp_len] = 0;
    return add;
}

/* Retry-After: delay-seconds only (an HTTP date falls back to backoff). */
static size_t on_header(char *data, size_t size, size_t n, void *ud)
{
    request *r = ud;
    size_t len = size * n;
    static const char name[] = "retry-after:";
    if (len > sizeof name - 1) {
        size_t i = 0;
        while (i < sizeof name - 1 && tolower((unsigned char)data[i]) == name[i])
            i++;
        if (i == sizeof name - 1) {
            char val[32];
            size_t k = 0;
            for (i = sizeof name - 1; i < len && k + 1 < sizeof val; i++)
                if (!isspace((unsigned char)data[i]))
                    val[k++] = data[i];
            val[k] = 0;
            char *end;
            double s = strtod(val, &end);
            if (k && !*end && s >= 0)
                r->retry_after = s;
        }
    }
    return len;
}

static int start(nd_chat *c, request *r)
{
    CURL *e = curl_easy_init();
    if (!e)
        return nd_error(ND_ENOMEM, "cannot start a libcurl transfer");
    r->resp_len = 0;
    r->retry_after = -1;
    r->too_big = r->no_memory = 0;
    r->attempts++;
    curl_easy_setopt(e, CURLOPT_URL, c->o.url);
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, r->body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_len);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, c->headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(c->o.timeout_s * 1000));
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 30000L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    /* a Content-Length over the cap is refused before the body comes */
    curl_easy_setopt(e, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)ND_CHAT_MAX_REPLY);
    curl_easy_setopt(e, CURLOPT_PRIVATE, r);
    /* only HTTP(S): OPENROUTER_URL=file:///... must not read local files */
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(e, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    /* the key must not follow a redirect to another host */
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
    if (curl_multi_add_handle(c->multi, e) != CURLM_OK) {
        curl_easy_cleanup(e);
        return nd_error(ND_EIO, "cannot start a libcurl transfer");
    }
    r->easy = e;
    c->active++;
    return 0;
}

/* A transfer ended: 1 = finished (res filled), 0 = queued for a retry. */
static int finish(nd_chat *c, request *r, CURLcode code, nd_chat_result *res)
{
    long status = 0;
    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
    curl_multi_remove_handle(c->multi, r->easy);
    curl_easy_cleanup(r->easy);
    r->easy = NULL;
    c->active--;
    /* a reply over the cap comes back as large the next time: not retried */
    int too_big = r->too_big || code == CURLE_FILESIZE_EXCEEDED;
    int retryable = !too_big && (code != CURLE_OK || status == 429 || status >= 500);
    if (retryable && r->attempts <= c->o.max_retries) {
        double wait =
            c->o.retry_base_s * (double)(1u << (r->attempts - 1 < 20 ? r->attempts - 1 : 20));
        wait *= 1.0 + jitter01(c);
        if (r->retry_after >= 0 && code == CURLE_OK)
            wait = r->retry_after;
        if (wait > c->o.retry_max_s)
            wait = c->o.retry_max_s;
        r->due = now_s() + wait;
        return 0;
    }
    memset(res, 0, sizeof *res);
    res->tag = r->tag;
    res->http_status = status;
    res->attempts = r->attempts;
    /* server text (and the URL, which may carry anything) is redacted
     * before it is cut, so a cut never leaves a piece of the key behind */
    const char *key = c->o.api_key;
    char url[208];
    nd_redact_into(url, sizeof url, c->o.url, strlen(c->o.url), key, 200);
    if (too_big)
        snprintf(res->err, sizeof res->err, "reply from %s: over the %zu MiB limit", url,
                 ND_CHAT_MAX_REPLY >> 20);
    else if (r->no_memory)
        snprintf(res->err, sizeof res->err, "reply from %s: out of memory after %zu bytes", url,
                 r->resp_len);
    else if (code != CURLE_OK)
        snprintf(res->err, sizeof res->err, "%s: %s", url, curl_easy_strerror(code));
    else if (status < 200 || status >= 300) {
        char body[168];
        nd_redact_into(body, sizeof body, r->resp ? r->resp : "", r->resp ? r->resp_len : 0, key,
                       160);
        snprintf(res->err, sizeof res->err, "HTTP %ld%s: %s", status,
                 status == 401 || status == 403 ? " (check OPENROUTER_API_KEY)" : "", body);
    } else {
        int ok = nd_chat_parse_reply(r->resp, r->resp_len, key, &res->content, &res->content_len,
                                     res->err, sizeof res->err);
        res->ok = ok > 0;
    }
    if (retryable && r->attempts > 1) {
        size_t n = strlen(res->err);
        snprintf(res->err + n, sizeof res->err - n, " (after %d attempts)", r->attempts);
    }
    /* one line, and once more over the whole message */
    nd_redact(res->err, key);
    /* unlink */
    for (request **p = &c->queue; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            break;
        }
    c->pending--;
    request_free(r);
    return 1;
}

int nd_chat_wait(nd_chat *c, nd_chat_result *res)
{
    for (;;) {
        if (!c->pending)
            return 0;
        double t = now_s();
        for (request *r = c->queue; r; r = r->next)
            if (!r->easy && r->due <= t && c->active < c->o.max_active) {
                int rc = start(c, r);
                if (rc)
                    return rc;
            }
        int running = 0;
        if (curl_multi_perform(c->multi, &running) != CURLM_OK)
            return nd_error(ND_EIO, "libcurl multi interface failed");
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(c->multi, &left)) != NULL) {
            if (m->msg != CURLMSG_DONE)
                continue;
            char *priv = NULL;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &priv);
            request *r = (request *)(void *)priv;
            if (finish(c, r, m->data.result, res))
                return 1;
        }
        /* sleep until a socket is ready or the next waiting request is due
         * (a retry queued just now included) */
        double next_due = -1;
        for (request *r = c->queue; r; r = r->next)
            if (!r->easy && (next_due < 0 || r->due < next_due))
                next_due = r->due;
        int wait_ms = 1000;
        if (next_due >= 0 && c->active < c->o.max_active) {
            double d = (next_due - now_s()) * 1000;
            wait_ms = d < 0 ? 0 : d < 1000 ? (int)d + 1 : 1000;
        }
        if (c->active)
            curl_multi_poll(c->multi, NULL, 0, wait_ms, NULL);
        else if (wait_ms > 0) {
            struct timespec ts = {wait_ms / 1000, (long)(wait_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
}
