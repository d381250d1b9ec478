/* Hugging Face downloads with libcurl: resolve URLs, resume, size and
 * sha256 checks, atomic rename (see hf_download.h). */
#define _POSIX_C_SOURCE 200809L
#include "net/hf_download.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/fileio.h"
#include "core/sha256.h"
#include "core/status.h"

#ifdef NEEDLE_HAVE_CURL
#include "net/curl_dl.h"
#include <jansson.h>
#endif

static const char *endpoint(void)
{
    const char *e = getenv("HF_ENDPOINT");
    return e && *e ? e : ND_HF_DEFAULT_ENDPOINT;
}

int nd_hf_offline(void)
{
    const char *v = getenv("HF_HUB_OFFLINE");
    if (!v)
        return 0;
    return !strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
           !strcasecmp(v, "on");
}

/* percent-encode all but unreserved characters (and '/' when keep_slash) */
static void url_quote(const char *s, int keep_slash, char *out, size_t n)
{
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && k + 4 < n; p++) {
        if (isalnum(*p) || strchr("-._~", *p) || (keep_slash && *p == '/'))
            out[k++] = (char)*p;
        else
            k += (size_t)snprintf(out + k, n - k, "%%%02X", *p);
    }
    out[k] = 0;
}

void nd_hf_url(const char *repo, const char *file, const char *revision, char *buf, size_t n)
{
    char rev[512], f[2048];
    url_quote(revision ? revision : "main", 0, rev, sizeof rev); /* "refs/pr/1" -> %2F */
    url_quote(file, 1, f, sizeof f);
    const char *ep = endpoint();
    size_t el = strlen(ep);
    while (el && ep[el - 1] == '/')
        el--;
    snprintf(buf, n, "%.*s/%s/resolve/%s/%s", (int)el, ep, repo, rev, f);
}

static int offline_error(const char *repo, const char *file, const char *dest, const char *rev,
                         const char *why)
{
    char url[4096];
    nd_hf_url(repo, file, rev, url, sizeof url);
    return nd_error(ND_EIO,
                    "%s: missing and %s. Download it on a connected machine (Hugging Face %s, "
                    "file %s: %s, or `needle download %s/%s`) and put it at %s",
                    dest, why, repo, file, url, repo, file, dest);
}

#ifndef NEEDLE_HAVE_CURL

int nd_hf_download(const char *repo, const char *file, const char *dest, const nd_hf_opts *o,
                   int *not_found)
{
    if (not_found)
        *not_found = 0;
    return offline_error(repo, file, dest, o ? o->revision : NULL,
                         "this needle was built without libcurl (no downloads)");
}

int nd_hf_list(const char *repo, const char *revision, char ***files, int *count)
{
    (void)revision;
    *files = NULL;
    *count = 0;
    return nd_error(ND_EUNSUPPORTED,
                    "cannot list %s: this needle was built without libcurl (no downloads)", repo);
}

#else

/* mkdir -p of dest's parent; the directories made are listed (top first)
 * so that a failed download can take them back */
typedef struct {
    char path[8][4096];
    int n;
} made_dirs;

static int make_parents(const char *dest, made_dirs *made)
{
    char dir[4096];
    made->n = 0;
    snprintf(dir, sizeof dir, "%s", dest);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return ND_OK;
    *slash = 0;
    size_t len = strlen(dir);
    for (size_t i = 1; i <= len; i++) {
        if (dir[i] != '/' && dir[i] != 0)
            continue;
        char c = dir[i];
        dir[i] = 0;
        if (mkdir(dir, 0777) == 0) {
            if (made->n < 8)
                snprintf(made->path[made->n++], sizeof made->path[0], "%s", dir);
        } else if (errno != EEXIST) {
            return nd_error(ND_EIO, "%s: cannot create directory: %s", dir, strerror(errno));
        }
        dir[i] = c;
    }
    return ND_OK;
}

static void unmake_parents(const made_dirs *made)
{
    for (int i = made->n - 1; i >= 0; i--)
        rmdir(made->path[i]); /* only ever empty ones */
}

static int sha256_file(const char *path, char hex[65])
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return nd_error(ND_EIO, "%s: cannot read back: %s", path, strerror(errno));
    nd_sha256_ctx s;
    nd_sha256_init(&s);
    static unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        nd_sha256_update(&s, buf, n);
    int bad = ferror(f);
    fclose(f);
    if (bad)
        return nd_error(ND_EIO, "%s: read error", path);
    unsigned char d[32];
    nd_sha256_final(&s, d);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    return ND_OK;
}

/* ETag value without W/ and quotes, lower case; "" if absent */
static void etag_clean(const char *v, char *out, size_t n)
{
    while (*v == ' ')
        v++;
    if (!strncmp(v, "W/", 2))
        v += 2;
    size_t k = 0;
    for (; *v && *v != '\r' && *v != '\n' && k + 1 < n; v++)
        if (*v != '"')
            out[k++] = (char)tolower((unsigned char)*v);
    while (k && out[k - 1] == ' ')
        k--;
    out[k] = 0;
}

static int is_sha256_hex(const char *s)
{
    if (strlen(s) != 64)
        return 0;
    for (; *s; s++)
        if (!isxdigit((unsigned char)*s))
            return 0;
    return 1;
}

/* Git's blob id of a file, the Hub's ETag for files outside LFS:
 * SHA-1("blob <size>\0" + content). SHA-1 here only matches what the
 * server states; it guards against truncation and corruption, not attack. */
typedef struct {
    uint32_t h[5];
    uint64_t bytes;
    unsigned char buf[64];
    size_t fill;
} sha1_ctx;

static uint32_t rol(uint32_t x, int k)
{
    return (x << k) | (x >> (32 - k));
}

static void sha1_block(sha1_ctx *c, const unsigned char *b)
{
    uint32_t w[80];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)b[4 * i] << 24 | (uint32_t)b[4 * i + 1] << 16 |
               (uint32_t)b[4 * i + 2] << 8 | b[4 * i + 3];
    for (int i = 16; i < 80; i++)
        w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    uint32_t a = c->h[0], bb = c->h[1], cc = c->h[2], d = c->h[3], e = c->h[4];
    for (int i = 0; i < 80; i++) {
        uint32_t f, k;
        if (i < 20) {
            f = (bb & cc) | (~bb & d);
            k = 0x5A827999u;
        } else if (i < 40) {
            f = bb ^ cc ^ d;
            k = 0x6ED9EBA1u;
        } else if (i < 60) {
            f = (bb & cc) | (bb & d) | (cc & d);
            k = 0x8F1BBCDCu;
        } else {
            f = bb ^ cc ^ d;
            k = 0xCA62C1D6u;
        }
        uint32_t t = rol(a, 5) + f + e + k + w[i];
        e = d;
        d = cc;
        cc = rol(bb, 30);
        bb = a;
        a = t;
    }
    c->h[0] += a;
    c->h[1] += bb;
    c->h[2] += cc;
    c->h[3] += d;
    c->h[4] += e;
}

static void sha1_update(sha1_ctx *c, const void *data, size_t n)
{
    const unsigned char *p = data;
    c->bytes += n;
    while (n) {
        size_t k = 64 - c->fill < n ? 64 - c->fill : n;
        memcpy(c->buf + c->fill, p, k);
        c->fill += k;
        p += k;
        n -= k;
        if (c->fill == 64) {
            sha1_block(c, c->buf);
            c->fill = 0;
        }
    }
}

static void sha1_hex(sha1_ctx *c, char hex[41])
{
    uint64_t bits = c->bytes * 8;
    unsigned char pad = 0x80, zero = 0, len[8];
    sha1_update(c, &pad, 1);
    while (c->fill != 56)
        sha1_update(c, &zero, 1);
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)(bits >> (56 - 8 * i));
    sha1_update(c, len, 8);
    for (int i = 0; i < 5; i++)
        snprintf(hex + 8 * i, 9, "%08x", (unsigned)c->h[i]);
}

static int git_blob_id(const char *path, long long size, char hex[41])
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return nd_error(ND_EIO, "%s: cannot read back: %s", path, strerror(errno));
    sha1_ctx c = {{0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u, 0xC3D2E1F0u}, 0, {0}, 0};
    char head[64];
    int hl = snprintf(head, sizeof head, "blob %lld", size);
    sha1_update(&c, head, (size_t)hl + 1); /* the NUL too */
    static unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        sha1_update(&c, buf, n);
    int bad = ferror(f);
    fclose(f);
    if (bad)
        return nd_error(ND_EIO, "%s: read error", path);
    sha1_hex(&c, hex);
    return ND_OK;
}

static int is_hex(const char *s, size_t len)
{
    if (strlen(s) != len)
        return 0;
    for (; *s; s++)
        if (!isxdigit((unsigned char)*s))
            return 0;
    return 1;
}

typedef struct {
    FILE *out;
    const char *part;
    long status;           /* of the response being received */
    long long offset;      /* bytes already in .part when the request started */
    long long range_start; /* from Content-Range of a 206, -1 if none */
    long long length;      /* Content-Length of the final response, -1 */
    long long linked_size; /* X-Linked-Size, -1 */
    char linked_etag[128]; /* X-Linked-Etag (sha256 of LFS files) */
    char etag[128];        /* ETag of the final response */
    int started;           /* body of the final response seen */
    int truncated;         /* a 200 to a Range request: restarted from 0 */
    char errbody[512];     /* start of an error response's body */
    size_t errlen;
    FILE *progress;
    int tty;
    const char *name;
    double t0, last_print;
    int last_decile;
} dl_state;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int header_is(const char *line, size_t n, const char *name, const char **value)
{
    size_t k = strlen(name);
    if (n <= k || strncasecmp(line, name, k) || line[k] != ':')
        return 0;
    *value = line + k + 1;
    while (**value == ' ')
        (*value)++;
    return 1;
}

static size_t on_header(char *buf, size_t size, size_t nitems, void *ctx)
{
    dl_state *st = ctx;
    size_t n = size * nitems;
    char line[1024];
    size_t k = n < sizeof line - 1 ? n : sizeof line - 1;
    memcpy(line, buf, k);
    line[k] = 0;
    const char *v;
    if (!strncmp(line, "HTTP/", 5)) {
        /* a new response (redirects, 100-continue): its own status and body */
        const char *sp = strchr(line, ' ');
        st->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        st->length = -1;
        st->range_start = -1;
        st->etag[0] = 0;
    } else if (header_is(line, k, "x-linked-size", &v)) {
        st->linked_size = strtoll(v, NULL, 10);
    } else if (header_is(line, k, "x-linked-etag", &v)) {
        etag_clean(v, st->linked_etag, sizeof st->linked_etag);
    } else if (header_is(line, k, "etag", &v)) {
        etag_clean(v, st->etag, sizeof st->etag);
    } else if (header_is(line, k, "content-length", &v)) {
        st->length = strtoll(v, NULL, 10);
    } else if (header_is(line, k, "content-range", &v)) {
        /* "bytes START-END/TOTAL" */
        const char *p = strstr(v, "bytes ");
        if (p)
            st->range_start = strtoll(p + 6, NULL, 10);
    }
    return n;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *ctx)
{
    dl_state *st = ctx;
    size_t n = size * nmemb;
    if (st->status >= 300 || st->status < 200) {
        /* keep the start of an error page for the message, write nothing */
        size_t room = sizeof st->errbody - 1 - st->errlen;
        size_t k = n < room ? n : room;
        memcpy(st->errbody + st->errlen, data, k);
        st->errlen += k;
        st->errbody[st->errlen] = 0;
        return n;
    }
    if (!st->started) {
        st->started = 1;
        if (st->status == 200 && st->offset > 0) {
            /* the server ignored the Range: start the file again */
            if (ftruncate(fileno(st->out), 0) != 0 || fseek(st->out, 0, SEEK_SET) != 0)
                return 0;
            st->offset = 0;
            st->truncated = 1;
        } else if (st->status == 206 && st->range_start != st->offset) {
            return 0; /* a range we did not ask for */
        }
    }
    return fwrite(data, 1, n, st->out) == n ? n : 0;
}

static int on_progress(void *ctx, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    (void)ultotal;
    (void)ulnow;
    dl_state *st = ctx;
    if (!st->progress || !st->started)
        return 0;
    double t = now_s();
    long long done = st->offset + (long long)dlnow;
    long long total = st->linked_size > 0 ? st->linked_size
                                          : (dltotal > 0 ? st->offset + (long long)dltotal : -1);
    double rate = (double)dlnow / (t - st->t0 > 1e-3 ? t - st->t0 : 1e-3) / 1e6;
    if (st->tty) {
        if (t - st->last_print < 0.1)
            return 0;
        st->last_print = t;
        char bar[31];
        int fill = total > 0 ? (int)(30.0 * (double)done / (double)total) : 0;
        for (int i = 0; i < 30; i++)
            bar[i] = i < fill ? '#' : ' ';
        bar[30] = 0;
        fprintf(st->progress, "\r  %-9s %s [%s] %.1f/%.1f MB  %.1f MB/s\033[K", "fetch", st->name,
                bar, (double)done / 1e6, total > 0 ? (double)total / 1e6 : 0.0, rate);
    } else {
        /* a log: a line every 10% or every 10 s */
        int decile = total > 0 ? (int)(10 * done / total) : 0;
        if (decile <= st->last_decile && t - st->last_print < 10)
            return 0;
        st->last_decile = decile;
        st->last_print = t;
        if (total > 0)
            fprintf(st->progress, "  %-9s %s %3d%%  %.1f/%.1f MB  %.1f MB/s\n", "fetch", st->name,
                    (int)(100 * done / total), (double)done / 1e6, (double)total / 1e6, rate);
        else
            fprintf(st->progress, "  %-9s %s %.1f MB  %.1f MB/s\n", "fetch", st->name,
                    (double)done / 1e6, rate);
    }
    fflush(st->progress);
    return 0;
}

/* A GET of url with HF's conventions: redirects followed, HF_TOKEN as a
 * Bearer header (curl drops custom Authorization headers on redirects to
 * other hosts, as the CDN wants). The caller frees the returned list. */
static struct curl_slist *hf_request_setup(CURL *c, const char *url, char *errbuf)
{
    struct curl_slist *hdrs = NULL;
    const char *token = getenv("HF_TOKEN");
    if (token && *token) {
        char auth[4200];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        hdrs = curl_slist_append(hdrs, auth);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "needle-c/0.1.0");
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    return hdrs;
}

int nd_hf_download(const char *repo, const char *file, const char *dest, const nd_hf_opts *o,
                   int *not_found)
{
    const char *rev = o && o->revision ? o->revision : "main";
    if (not_found)
        *not_found = 0;
    if (nd_hf_offline())
        return offline_error(repo, file, dest, rev, "HF_HUB_OFFLINE is set (no network)");
    /* a regular file or nothing: never through a link, a device or a dir */
    int rc = nd_output_check(dest, NULL, NULL);
    if (rc)
        return rc;
    static made_dirs made; /* large; downloads run one at a time */
    rc = make_parents(dest, &made);
    if (rc)
        return rc;
    char url[4096], part[4096];
    nd_hf_url(repo, file, rev, url, sizeof url);
    snprintf(part, sizeof part, "%s.part", dest);

    dl_state st = {0};
    st.part = part;
    st.linked_size = -1;
    st.length = -1;
    st.range_start = -1;
    st.last_decile = -1;
    st.progress = o ? o->progress : NULL;
    st.tty = st.progress && isatty(fileno(st.progress));
    const char *slash = strrchr(file, '/');
    st.name = slash ? slash + 1 : file;
    int lrc = nd_curl_load(); /* before the .part file exists */
    if (lrc)
        return lrc;
    st.out = fopen(part, "ab");
    if (!st.out)
        return nd_error(ND_EIO, "%s: cannot write: %s", part, strerror(errno));
    fseek(st.out, 0, SEEK_END);
    st.offset = ftell(st.out);

    /* init/cleanup per download (reference counted by libcurl): nothing of
     * libcurl's or its TLS library's stays allocated afterwards */
    curl_global_init(CURL_GLOBAL_DEFAULT);
    CURL *c = curl_easy_init();
    if (!c) {
        fclose(st.out);
        curl_global_cleanup();
        return nd_error(ND_ENOMEM, "libcurl: cannot start a transfer");
    }
    char errbuf[CURL_ERROR_SIZE] = "", range[64];
    struct curl_slist *hdrs = hf_request_setup(c, url, errbuf);
    const char *token = getenv("HF_TOKEN");
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &st);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &st);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &st);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
    /* a stalled connection (under 1 KB/s for 60 s) fails and can be resumed */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
    if (st.offset > 0) {
        snprintf(range, sizeof range, "%lld-", st.offset);
        curl_easy_setopt(c, CURLOPT_RANGE, range);
        if (st.progress)
            fprintf(st.progress, "  %-9s %s: resuming %s after %.1f MB\n", "fetch", st.name, part,
                    (double)st.offset / 1e6);
    }
    st.t0 = now_s();
    CURLcode cr = curl_easy_perform(c);
    if (st.tty)
        fprintf(st.progress, "\r\033[K");
    int ok_close = fflush(st.out) == 0 && fsync(fileno(st.out)) == 0;
    ok_close &= fclose(st.out) == 0;
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(c);
    curl_global_cleanup();

    struct stat sb;
    long long have = stat(part, &sb) == 0 ? (long long)sb.st_size : -1;
    if (st.status == 416) {
        /* nothing past our offset: the .part may already be whole */
        cr = CURLE_OK;
    } else if (st.status >= 400 || (cr == CURLE_OK && st.status >= 300)) {
        if (have == 0) {
            unlink(part);
            unmake_parents(&made);
        }
        if (st.status == 404 && not_found)
            *not_found = 1;
        const char *hint = st.status == 401 || st.status == 403
                               ? (token && *token ? " (HF_TOKEN was sent; does it grant access "
                                                    "to this repository?)"
                                                  : " (a gated or private repository needs "
                                                    "HF_TOKEN=<your token>)")
                           : st.status == 404 ? " (no such repository, revision or file)"
                                              : "";
        return nd_error(ND_EIO, "%s: HTTP %ld%s", url, st.status, hint);
    }
    if (cr != CURLE_OK) {
        if (have > 0)
            return nd_error(ND_EIO,
                            "%s: download interrupted after %.1f MB (%s); %s kept: run the same "
                            "command again to resume",
                            url, (double)have / 1e6, errbuf[0] ? errbuf : curl_easy_strerror(cr),
                            part);
        unlink(part);
        unmake_parents(&made);
        return nd_error(ND_EIO,
                        "%s: %s. Without network: download %s (Hugging Face %s) elsewhere and "
                        "put it at %s",
                        url, errbuf[0] ? errbuf : curl_easy_strerror(cr), file, repo, dest);
    }
    if (!ok_close)
        return nd_error(ND_EIO, "%s: write error: %s", part, strerror(errno));

    /* size: X-Linked-Size (LFS), else what the final response announced */
    long long want = st.linked_size;
    if (want < 0 && st.length >= 0 && st.status != 416)
        want = st.offset + st.length;
    if (want >= 0 && have != want) {
        if (have > want) {
            unlink(part);
            return nd_error(ND_EFORMAT,
                            "%s: got %lld bytes but the server states %lld; the download was "
                            "discarded, run again",
                            url, have, want);
        }
        return nd_error(ND_EIO, "%s: incomplete: %lld of %lld bytes; %s kept: run again to resume",
                        url, have, want, part);
    }
    /* sha256: X-Linked-Etag of LFS files, else an ETag that is one */
    const char *sum = is_sha256_hex(st.linked_etag) ? st.linked_etag
                      : is_sha256_hex(st.etag)      ? st.etag
                                                    : NULL;
    if (sum) {
        char got[65];
        if ((rc = sha256_file(part, got)))
            return rc;
        if (strcmp(got, sum)) {
            unlink(part);
            return nd_error(ND_EFORMAT,
                            "%s: sha256 %s does not match the server's %s; the download was "
                            "discarded (%s not written)",
                            url, got, sum, dest);
        }
    }
    /* outside LFS: the ETag is the git blob id */
    int blob_checked = 0;
    if (!sum && !st.linked_etag[0] && is_hex(st.etag, 40)) {
        char got[41];
        if ((rc = git_blob_id(part, have, got)))
            return rc;
        if (strcmp(got, st.etag)) {
            unlink(part);
            return nd_error(ND_EFORMAT,
                            "%s: git blob id %s does not match the server's ETag %s; the "
                            "download was discarded (%s not written)",
                            url, got, st.etag, dest);
        }
        blob_checked = 1;
    }
    if (rename(part, dest) != 0)
        return nd_error(ND_EIO, "%s: cannot rename to %s: %s", part, dest, strerror(errno));
    if (st.progress)
        fprintf(st.progress, "  %-9s %s  %.2f MB%s\n", "fetched", dest, (double)have / 1e6,
                sum            ? "  sha256 ok"
                : blob_checked ? "  git blob id ok"
                               : "");
    return ND_OK;
}

typedef struct {
    char *data;
    size_t len;
} mem_buf;

static size_t to_mem(char *data, size_t size, size_t nmemb, void *ctx)
{
    mem_buf *b = ctx;
    size_t n = size * nmemb;
    if (b->len + n > (64u << 20))
        return 0; /* a repository listing is never this big */
    char *p = realloc(b->data, b->len + n + 1);
    if (!p)
        return 0;
    memcpy(p + b->len, data, n);
    b->data = p;
    b->len += n;
    b->data[b->len] = 0;
    return n;
}

int nd_hf_list(const char *repo, const char *revision, char ***files, int *count)
{
    *files = NULL;
    *count = 0;
    if (nd_hf_offline())
        return nd_error(ND_EIO, "cannot list %s: HF_HUB_OFFLINE is set (no network); name the file",
                        repo);
    char url[4096], rev[512];
    url_quote(revision ? revision : "main", 0, rev, sizeof rev);
    const char *ep = endpoint();
    size_t el = strlen(ep);
    while (el && ep[el - 1] == '/')
        el--;
    snprintf(url, sizeof url, "%.*s/api/models/%s/revision/%s", (int)el, ep, repo, rev);
    int lrc = nd_curl_load();
    if (lrc)
        return lrc;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    CURL *c = curl_easy_init();
    if (!c) {
        curl_global_cleanup();
        return nd_error(ND_ENOMEM, "libcurl: cannot start a transfer");
    }
    mem_buf b = {0};
    char errbuf[CURL_ERROR_SIZE] = "";
    struct curl_slist *hdrs = hf_request_setup(c, url, errbuf);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, to_mem);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
    CURLcode cr = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(c);
    curl_global_cleanup();
    int rc = ND_OK;
    if (cr != CURLE_OK)
        rc = nd_error(ND_EIO, "%s: %s", url, errbuf[0] ? errbuf : curl_easy_strerror(cr));
    else if (status != 200)
        rc = nd_error(ND_EIO, "%s: HTTP %ld", url, status);
    json_t *root = NULL, *sib;
    if (!rc) {
        json_error_t je;
        root = json_loadb(b.data ? b.data : "", b.len, 0, &je);
        sib = root ? json_object_get(root, "siblings") : NULL;
        if (!json_is_array(sib))
            rc = nd_error(ND_EFORMAT, "%s: not a repository listing (no siblings array)", url);
    }
    if (!rc) {
        size_t n = json_array_size(sib);
        char **out = calloc(n + 1, sizeof *out);
        int k = 0;
        for (size_t i = 0; out && i < n; i++) {
            const char *name =
                json_string_value(json_object_get(json_array_get(sib, i), "rfilename"));
            if (name && !(out[k] = strdup(name)))
                break;
            k += name ? 1 : 0;
        }
        if (!out) {
            rc = nd_error(ND_ENOMEM, "out of memory");
        } else {
            *files = out;
            *count = k;
        }
    }
    json_decref(root);
    free(b.data);
    return rc;
}

#endif
