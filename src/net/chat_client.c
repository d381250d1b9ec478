/* Chat-completions client on libcurl's multi interface (chat_client.h). */
#define _POSIX_C_SOURCE 200809L
#include "net/chat_client.h"

#include <ctype.h>
#include "net/curl_dl.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/status.h"

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

/* Replace every copy of the key in s by "***": a message may quote a
 * server's answer, and a misbehaving server could echo the header. */
static void redact(const nd_chat *c, char *s)
{
    const char *k = c->o.api_key;
    size_t kn = k ? strlen(k) : 0;
    if (kn < 4)
        return;
    char *p;
    while ((p = strstr(s, k)) != NULL) {
        memcpy(p, "***", 3);
        memmove(p + 3, p + kn, strlen(p + kn) + 1);
    }
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
    if (r->resp_len + add + 1 > r->resp_cap) {
        size_t cap = r->resp_cap ? r->resp_cap : 4096;
        while (cap < r->resp_len + add + 1)
            cap *= 2;
        if (cap > ((size_t)64 << 20))
            return 0; /* a reply over 64 MiB: abort the transfer */
        char *p = realloc(r->resp, cap);
        if (!p)
            return 0;
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

/* choices[0].message.content of a 2xx answer, or why not. */
static int extract_content(nd_chat *c, request *r, nd_chat_result *res)
{
    json_error_t je;
    json_t *root = json_loadb(r->resp ? r->resp : "", r->resp_len, 0, &je);
    if (!root) {
        snprintf(res->err, sizeof res->err, "the reply is not JSON (line %d column %d: %s)",
                 je.line, je.column, je.text);
        return 0;
    }
    json_t *choice = json_array_get(json_object_get(root, "choices"), 0);
    json_t *content = json_object_get(json_object_get(choice, "message"), "content");
    json_t *error = json_object_get(root, "error");
    int ok = 0;
    if (json_is_string(content)) {
        size_t n = json_string_length(content);
        res->content = malloc(n + 1);
        if (res->content) {
            memcpy(res->content, json_string_value(content), n);
            res->content[n] = 0;
            res->content_len = n;
            ok = 1;
        } else {
            snprintf(res->err, sizeof res->err, "out of memory");
        }
    } else if (error) {
        json_t *msg = json_object_get(error, "message");
        snprintf(res->err, sizeof res->err, "the service answered an error: %.200s",
                 json_is_string(msg) ? json_string_value(msg) : "(no message)");
    } else {
        snprintf(res->err, sizeof res->err, "the reply has no choices[0].message.content string");
    }
    json_decref(root);
    redact(c, res->err);
    return ok;
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
    int retryable = code != CURLE_OK || status == 429 || status >= 500;
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
    if (code != CURLE_OK)
        snprintf(res->err, sizeof res->err, "%.200s: %s", c->o.url, curl_easy_strerror(code));
    else if (status < 200 || status >= 300)
        snprintf(res->err, sizeof res->err, "HTTP %ld%s: %.160s", status,
                 status == 401 || status == 403 ? " (check OPENROUTER_API_KEY)" : "",
                 r->resp ? r->resp : "");
    else
        res->ok = extract_content(c, r, res);
    if (retryable && r->attempts > 1) {
        size_t n = strlen(res->err);
        snprintf(res->err + n, sizeof res->err - n, " (after %d attempts)", r->attempts);
    }
    for (char *p = res->err; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    redact(c, res->err);
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
