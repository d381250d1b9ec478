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
#include "core/tuning.h"

#ifdef NEEDLE_HAVE_CURL
#include "net/curl_dl.h"
#include "net/hf_listing.h"
#include <sys/statvfs.h>
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

/* Transfers end when under 1 KB/s for this many seconds (a stalled or
 * silent server); small API requests also when not done within twice
 * that (a trickle). NEEDLE_HF_STALL_S overrides the default. */
#define STALL_DEFAULT_S 60
#define LISTING_CAP_MIB 64

static int stall_seconds(int *out)
{
    const char *v = nd_tuning_get()->hf_stall_s;
    *out = STALL_DEFAULT_S;
    if (!v || !*v)
        return ND_OK;
    char *end;
    errno = 0;
    long s = strtol(v, &end, 10);
    if (*end || errno || s < 1 || s > 86400)
        return nd_error(ND_EARG, "NEEDLE_HF_STALL_S=%s: not a whole number of seconds in 1..86400",
                        v);
    *out = (int)s;
    return ND_OK;
}

static long api_timeout(int stall)
{
    return 2L * stall;
}

/* why a callback stopped a transfer */
enum {
    STOP_NONE,
    STOP_WRITE,     /* writing the .part failed (write_errno) */
    STOP_SPACE,     /* the stated size does not fit in the free space */
    STOP_TOO_LONG,  /* more bytes than the stated size */
    STOP_BAD_RANGE, /* a 206 for a range not asked for */
    STOP_CHANGED,   /* a 206 whose ETag is not the one resumed */
};

typedef struct {
    FILE *out;
    const char *part;
    const char *meta; /* the .part's validator (ETag or Last-Modified) */
    long status;      /* of the response being received */
    long long offset; /* bytes in .part when the request started */
    long long got;    /* body bytes written by this request */
    /* the first response that states them: what the request resolved to */
    long long claim_size; /* X-Linked-Size, -1 */
    char claim_sha[65];   /* sha256 (X-Linked-Etag, or an ETag that is one), "" */
    char claim_blob[41];  /* git blob id (the ETag outside LFS), "" */
    /* the response being received */
    long long range_start; /* Content-Range "bytes START-END/TOTAL", -1 */
    long long range_total; /* TOTAL of Content-Range (also "bytes * /TOTAL"), -1 */
    long long length;      /* Content-Length, -1 */
    long long linked_size; /* X-Linked-Size, -1 */
    char linked_etag[128]; /* X-Linked-Etag, cleaned */
    char etag[128];        /* ETag, cleaned */
    char raw_etag[256];    /* ETag as sent (for If-Range), "" if weak or unquoted */
    char lastmod[128];     /* Last-Modified as sent */
    char location[1024];   /* Location of the last redirect */
    char resumed[256];     /* the validator sent in If-Range, "" */
    long long want;        /* the file's size as stated, -1 */
    int started;           /* the body of a 2xx response began */
    int truncated;         /* a 200 to a Range request: restarted from 0 */
    int stop;              /* STOP_* */
    int write_errno;
    long long space_need, space_free;
    char errbody[512]; /* start of an error response's body */
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

/* a header value up to CR/LF, kept only when printable ASCII (it is sent
 * back in If-Range), else "" */
static void header_raw(const char *v, char *out, size_t n)
{
    size_t k = 0;
    for (; *v && *v != '\r' && *v != '\n'; v++) {
        if ((unsigned char)*v < 0x20 || (unsigned char)*v >= 0x7f || k + 1 >= n) {
            out[0] = 0;
            return;
        }
        out[k++] = *v;
    }
    while (k && out[k - 1] == ' ')
        k--;
    out[k] = 0;
}

/* the directory a path lives in, for statvfs */
static void dir_of(const char *path, char *out, size_t n)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(out, n, ".");
    else if (slash == path)
        snprintf(out, n, "/");
    else
        snprintf(out, n, "%.*s", (int)(slash - path), path);
}

/* "1.5 MB", "3.2 TB", ... */
static const char *human(long long bytes, char *buf, size_t n)
{
    static const char *const unit[] = {"bytes", "kB", "MB", "GB", "TB", "PB", "EB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1000 && u < 6)
        v /= 1000, u++;
    if (u == 0)
        snprintf(buf, n, "%lld bytes", bytes);
    else
        snprintf(buf, n, "%.1f %s", v, unit[u]);
    return buf;
}

/* The .part's validator file: the ETag (strong) or Last-Modified of the
 * response the .part's bytes came from, sent back as If-Range on resume. */
static void meta_write(const dl_state *st)
{
    const char *v = st->raw_etag[0] ? st->raw_etag : st->lastmod;
    if (!*v) {
        unlink(st->meta);
        return;
    }
    FILE *f = fopen(st->meta, "w");
    if (!f)
        return; /* then the next run starts over instead of resuming */
    int ok = fprintf(f, "%s\n", v) > 0;
    if (fclose(f) != 0 || !ok)
        unlink(st->meta);
}

static void meta_read(const char *meta, char *out, size_t n)
{
    char line[512] = "";
    out[0] = 0;
    FILE *f = fopen(meta, "r");
    if (!f)
        return;
    if (fgets(line, sizeof line, f))
        header_raw(line, out, n);
    fclose(f);
}

/* End of a response's headers: take the claims of the first response
 * that makes them, and for the body of a 2xx check the range, the
 * validator and the free space before a byte is written. */
static int headers_done(dl_state *st)
{
    if (st->claim_size < 0 && st->linked_size >= 0)
        st->claim_size = st->linked_size;
    if (!st->claim_sha[0] && !st->claim_blob[0]) {
        /* later responses (the CDN after a redirect) cannot change it;
         * is_hex checked the lengths (64 and 40 characters) */
        if (is_hex(st->linked_etag, 64))
            memcpy(st->claim_sha, st->linked_etag, 65);
        else if (!st->linked_etag[0] && is_hex(st->etag, 64))
            memcpy(st->claim_sha, st->etag, 65);
        else if (!st->linked_etag[0] && is_hex(st->etag, 40))
            memcpy(st->claim_blob, st->etag, 41);
    }
    if (st->status != 200 && st->status != 206)
        return 1;
    if (st->status == 206) {
        if (st->range_start != st->offset) {
            st->stop = STOP_BAD_RANGE;
            return 0;
        }
        /* the validator resumed with: an entity tag ("...") or a date */
        const char *now = st->resumed[0] == '"' ? st->raw_etag : st->lastmod;
        if (st->resumed[0] && now[0] && strcmp(st->resumed, now)) {
            st->stop = STOP_CHANGED; /* the server ignored If-Range */
            return 0;
        }
    } else {
        if (st->offset > 0) {
            /* a 200 to a Range request (If-Range did not match, or no
             * ranges): the whole file again */
            if (ftruncate(fileno(st->out), 0) != 0 || fseek(st->out, 0, SEEK_SET) != 0) {
                st->write_errno = errno;
                st->stop = STOP_WRITE;
                return 0;
            }
            st->offset = 0;
            st->truncated = 1;
        }
        meta_write(st);
    }
    long long total = st->status == 206 ? st->range_total : st->length;
    if (st->status == 206 && total < 0 && st->length >= 0)
        total = st->offset + st->length;
    st->want = st->claim_size >= 0 ? st->claim_size : total;
    if (st->want >= 0) {
        char dir[4096];
        struct statvfs vf;
        dir_of(st->part, dir, sizeof dir);
        if (statvfs(dir, &vf) == 0) {
            long long avail = (long long)vf.f_bavail * (long long)vf.f_frsize;
            long long need = st->want - st->offset;
            if (need > avail) {
                st->space_need = need;
                st->space_free = avail;
                st->stop = STOP_SPACE;
                return 0;
            }
        }
    }
    return 1;
}

/* One header line as curl hands it (not terminated), as a C string cut to
 * the buffer; returns its length. */
static size_t header_copy(const char *buf, size_t n, char *line, size_t cap)
{
    size_t k = n < cap - 1 ? n : cap - 1;
    memcpy(line, buf, k);
    line[k] = 0;
    return k;
}

static size_t on_header(char *buf, size_t size, size_t nitems, void *ctx)
{
    dl_state *st = ctx;
    size_t n = size * nitems;
    char line[2048];
    size_t k = header_copy(buf, n, line, sizeof line);
    const char *v;
    if (!strcmp(line, "\r\n") || !strcmp(line, "\n"))
        return headers_done(st) ? n : 0;
    if (!strncmp(line, "HTTP/", 5)) {
        /* a new response (redirects, 100-continue): its own status and body */
        const char *sp = strchr(line, ' ');
        st->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        st->length = st->range_start = st->range_total = st->linked_size = -1;
        st->linked_etag[0] = st->etag[0] = st->raw_etag[0] = st->lastmod[0] = 0;
    } else if (header_is(line, k, "x-linked-size", &v)) {
        st->linked_size = strtoll(v, NULL, 10);
    } else if (header_is(line, k, "x-linked-etag", &v)) {
        etag_clean(v, st->linked_etag, sizeof st->linked_etag);
    } else if (header_is(line, k, "etag", &v)) {
        etag_clean(v, st->etag, sizeof st->etag);
        /* If-Range takes strong validators only: a quoted entity tag */
        if (*v == '"')
            header_raw(v, st->raw_etag, sizeof st->raw_etag);
    } else if (header_is(line, k, "last-modified", &v)) {
        header_raw(v, st->lastmod, sizeof st->lastmod);
    } else if (header_is(line, k, "location", &v)) {
        size_t l = strcspn(v, "\r\n");
        snprintf(st->location, sizeof st->location, "%.*s", (int)l, v);
    } else if (header_is(line, k, "content-length", &v)) {
        st->length = strtoll(v, NULL, 10);
    } else if (header_is(line, k, "content-range", &v)) {
        /* "bytes START-END/TOTAL", "bytes * /TOTAL" (416), TOTAL may be "*" */
        const char *p = strstr(v, "bytes ");
        if (p) {
            p += 6;
            st->range_start = isdigit((unsigned char)*p) ? strtoll(p, NULL, 10) : -1;
            const char *t = strchr(p, '/');
            st->range_total = t && isdigit((unsigned char)t[1]) ? strtoll(t + 1, NULL, 10) : -1;
        }
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
    st->started = 1;
    if (st->want >= 0 && st->offset + st->got + (long long)n > st->want) {
        st->stop = STOP_TOO_LONG;
        return 0;
    }
    errno = 0;
    if (fwrite(data, 1, n, st->out) != n) {
        st->write_errno = errno ? errno : EIO;
        st->stop = STOP_WRITE;
        return 0;
    }
    st->got += (long long)n;
    return n;
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
    long long total =
        st->want > 0 ? st->want : (dltotal > 0 ? st->offset + (long long)dltotal : -1);
    if (total > 0 && done > total)
        done = total; /* a server sending more is cut off at the size it states */
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

/* A GET of url with HF's conventions: redirects followed (http and https
 * only; https only from an https endpoint), HF_TOKEN as a Bearer header
 * (curl drops custom Authorization headers on redirects to other hosts, as
 * the CDN wants), stalls and a silent server ended after `stall` seconds.
 * extra: one more header line or NULL. The caller frees *hdrs. */
static int hf_request_setup(CURL *c, const char *url, char *errbuf, int stall, const char *extra,
                            struct curl_slist **hdrs)
{
    *hdrs = NULL;
    const char *token = getenv("HF_TOKEN");
    if (token && *token) {
        char auth[4200];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        *hdrs = curl_slist_append(*hdrs, auth);
    }
    if (extra)
        *hdrs = curl_slist_append(*hdrs, extra);
    int https_only = !strncasecmp(endpoint(), "https://", 8);
    if (curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https") != CURLE_OK ||
        curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, https_only ? "https" : "http,https") !=
            CURLE_OK) {
        /* libcurl before 7.85: the bitmask options CURLOPT_PROTOCOLS (181)
         * and CURLOPT_REDIR_PROTOCOLS (182), named by number because the
         * newer headers mark them deprecated */
        long all = CURLPROTO_HTTP | CURLPROTO_HTTPS;
        if (curl_easy_setopt(c, (CURLoption)(CURLOPTTYPE_LONG + 181), all) != CURLE_OK ||
            curl_easy_setopt(c, (CURLoption)(CURLOPTTYPE_LONG + 182),
                             https_only ? (long)CURLPROTO_HTTPS : all) != CURLE_OK)
            return nd_error(ND_EUNSUPPORTED,
                            "libcurl cannot be limited to http and https (it lacks "
                            "CURLOPT_PROTOCOLS_STR and CURLOPT_PROTOCOLS); not downloading");
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "needle-c/0.1.0");
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, *hdrs);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    /* a proxy's "200 Connection established" is no answer of the server's */
    curl_easy_setopt(c, CURLOPT_SUPPRESS_CONNECT_HEADERS, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
    /* under 1 KB/s for `stall` seconds, waiting for an answer included */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)stall);
    return ND_OK;
}

/* A message for a failed transfer, server-chosen text escaped: a refused
 * redirect, a stall, else curl's words. */
static void transfer_error(CURLcode cr, const char *errbuf, const char *location, int stall,
                           char *out, size_t n)
{
    char esc[1200];
    if (cr == CURLE_UNSUPPORTED_PROTOCOL && location && location[0]) {
        snprintf(out, n,
                 "the server redirected to %s, which is refused (only http and https are "
                 "followed, only https from an https endpoint)",
                 nd_hf_escape(location, strlen(location), esc, 400));
    } else if (cr == CURLE_OPERATION_TIMEDOUT) {
        snprintf(out, n,
                 "the server stalled (%s; transfers end after %d s under 1 KB/s, "
                 "NEEDLE_HF_STALL_S)",
                 nd_hf_escape(errbuf[0] ? errbuf : curl_easy_strerror(cr),
                              strlen(errbuf[0] ? errbuf : curl_easy_strerror(cr)), esc, 400),
                 stall);
    } else {
        const char *m = errbuf[0] ? errbuf : curl_easy_strerror(cr);
        nd_hf_escape(m, strlen(m), out, n);
    }
}

/* "; the server said: ..." from an error page, escaped, or "" */
static void server_said(const char *body, size_t len, char *out, size_t n)
{
    out[0] = 0;
    while (len && (*body == ' ' || *body == '\n' || *body == '\r' || *body == '\t'))
        body++, len--;
    while (len && (body[len - 1] == ' ' || body[len - 1] == '\n' || body[len - 1] == '\r' ||
                   body[len - 1] == '\t'))
        len--;
    if (!len || n < 40)
        return;
    char esc[400];
    snprintf(out, n, "; the server said: %s",
             nd_hf_escape(body, len > 200 ? 200 : len, esc, sizeof esc));
}

/* One GET of url into st->out from st->offset (Range and If-Range when
 * resuming). */
static CURLcode transfer(dl_state *st, const char *url, char *errbuf, int stall)
{
    CURL *c = curl_easy_init();
    if (!c) {
        snprintf(errbuf, CURL_ERROR_SIZE, "libcurl: cannot start a transfer");
        return CURLE_OUT_OF_MEMORY;
    }
    char range[64], if_range[300];
    snprintf(if_range, sizeof if_range, "If-Range: %s", st->resumed);
    struct curl_slist *hdrs;
    if (hf_request_setup(c, url, errbuf, stall, st->offset > 0 ? if_range : NULL, &hdrs)) {
        snprintf(errbuf, CURL_ERROR_SIZE, "%s", nd_last_error());
        curl_slist_free_all(hdrs);
        curl_easy_cleanup(c);
        return CURLE_UNSUPPORTED_PROTOCOL;
    }
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, st);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, st);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, st);
    if (st->offset > 0) {
        snprintf(range, sizeof range, "%lld-", st->offset);
        curl_easy_setopt(c, CURLOPT_RANGE, range);
    }
    st->t0 = now_s();
    CURLcode cr = curl_easy_perform(c);
    if (st->tty)
        fprintf(st->progress, "\r\033[K");
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(c);
    return cr;
}

/* the .part (and its validator) gone */
static void drop_part(const dl_state *st)
{
    unlink(st->part);
    unlink(st->meta);
}

/* One download's names and outcome, handed from phase to phase of
 * nd_hf_download (the transfer's own state is the dl_state). */
typedef struct {
    const char *repo, *file, *dest;
    char url[4096], part[4096], meta[4200];
    int stall;
    made_dirs *made; /* the parents this download created */
    char errbuf[CURL_ERROR_SIZE];
    CURLcode cr;     /* of the last transfer */
    int ok_close;    /* the .part was flushed, synced and closed */
    int close_errno; /* why not */
} dl_job;

/* Everything before the first byte: the stall limit, dest checked and its
 * parents made, the URL and .part names, the transfer state, libcurl loaded
 * (before the .part file exists). */
static int download_prepare(dl_job *job, dl_state *st, const char *rev, const nd_hf_opts *o)
{
    int rc = stall_seconds(&job->stall);
    if (rc)
        return rc;
    /* a regular file or nothing: never through a link, a device or a dir */
    if ((rc = nd_output_check(job->dest, NULL, NULL)))
        return rc;
    rc = make_parents(job->dest, job->made);
    if (rc)
        return rc;
    nd_hf_url(job->repo, job->file, rev, job->url, sizeof job->url);
    snprintf(job->part, sizeof job->part, "%s.part", job->dest);
    snprintf(job->meta, sizeof job->meta, "%s.part.validator", job->dest);

    memset(st, 0, sizeof *st);
    st->part = job->part;
    st->meta = job->meta;
    st->claim_size = -1;
    st->last_decile = -1;
    st->progress = o ? o->progress : NULL;
    st->tty = st->progress && isatty(fileno(st->progress));
    const char *slash = strrchr(job->file, '/');
    st->name = slash ? slash + 1 : job->file;
    return nd_curl_load();
}

/* Open the .part for this attempt (emptied when restarting) and decide
 * where to resume: only from a .part whose validator the server can
 * confirm, else from 0. On failure st->out is closed. */
static int open_part(dl_state *st, int restart)
{
    st->out = fopen(st->part, restart ? "wb" : "ab");
    if (!st->out)
        return nd_error(ND_EIO, "%s: cannot write: %s", st->part, strerror(errno));
    fseek(st->out, 0, SEEK_END);
    st->offset = ftell(st->out);
    st->resumed[0] = 0;
    if (st->offset > 0) {
        /* resume only what the server can confirm is the same file */
        meta_read(st->meta, st->resumed, sizeof st->resumed);
        if (!st->resumed[0]) {
            if (ftruncate(fileno(st->out), 0) != 0 || fseek(st->out, 0, SEEK_SET) != 0) {
                int e = errno;
                fclose(st->out);
                return nd_error(ND_EIO, "%s: cannot truncate: %s", st->part, strerror(e));
            }
            if (st->progress)
                fprintf(st->progress,
                        "  %-9s %s: %s has no ETag or Last-Modified to resume with; "
                        "starting over\n",
                        "fetch", st->name, st->part);
            st->offset = 0;
        } else if (st->progress) {
            fprintf(st->progress, "  %-9s %s: resuming %s after %.1f MB\n", "fetch", st->name,
                    st->part, (double)st->offset / 1e6);
        }
    }
    return ND_OK;
}

/* the per-response fields back to "nothing received yet" */
static void reset_response(dl_state *st)
{
    st->got = 0;
    st->want = -1;
    st->stop = STOP_NONE;
    st->status = 0;
    st->errlen = 0;
    st->errbody[0] = 0;
    st->location[0] = 0;
    st->started = 0;
}

/* flush, sync and close the .part; job->ok_close says whether all three
 * worked, job->close_errno why not */
static void close_part(dl_job *job, dl_state *st)
{
    errno = 0;
    job->ok_close = fflush(st->out) == 0 && fsync(fileno(st->out)) == 0;
    job->close_errno = errno;
    if (fclose(st->out) != 0 && job->ok_close) {
        job->ok_close = 0;
        job->close_errno = errno;
    }
}

/* The transfer into the .part, started over once (without Range) when a
 * resume cannot go on. Its outcome is left in job and st for the checks. */
static int download_attempts(dl_job *job, dl_state *st)
{
    /* init/cleanup per download (reference counted by libcurl): nothing of
     * libcurl's or its TLS library's stays allocated afterwards */
    curl_global_init(CURL_GLOBAL_DEFAULT);
    job->errbuf[0] = 0;
    job->cr = CURLE_OK;
    job->ok_close = 1;
    job->close_errno = 0;
    int restart = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        int rc = open_part(st, restart);
        if (rc) {
            curl_global_cleanup();
            return rc;
        }
        if (restart)
            unlink(job->meta);
        reset_response(st);
        job->errbuf[0] = 0;
        job->cr = transfer(st, job->url, job->errbuf, job->stall);
        close_part(job, st);
        struct stat sb;
        long long have = stat(job->part, &sb) == 0 ? (long long)sb.st_size : -1;
        long long total = st->range_total >= 0 ? st->range_total : st->claim_size;
        /* start over (once, without Range) when a resume cannot go on: a
         * 416 the .part is not the whole file for, a range not asked for,
         * a file that changed under the same name */
        restart = (st->status == 416 && st->offset > 0 && (total < 0 || have != total)) ||
                  (st->offset > 0 && (st->stop == STOP_BAD_RANGE || st->stop == STOP_CHANGED));
        if (!restart)
            break;
        if (st->progress)
            fprintf(st->progress, "  %-9s %s: the server cannot continue %s; starting over\n",
                    "fetch", st->name, job->part);
    }
    curl_global_cleanup();
    return ND_OK;
}

/* A transfer that the body callbacks stopped (st->stop): the error, the
 * .part dropped unless it holds something worth resuming. ND_OK if none. */
static int stopped_error(const dl_job *job, const dl_state *st, long long have)
{
    switch (st->stop) {
    case STOP_SPACE: {
        char need[32], avail[32], dir[4096];
        dir_of(job->part, dir, sizeof dir);
        if (have == 0) {
            drop_part(st);
            unmake_parents(job->made);
        }
        return nd_error(ND_EIO,
                        "%s: refused: the server states %lld bytes (%s still to fetch) but %s "
                        "has only %s free; nothing more was written",
                        job->url, st->want, human(st->space_need, need, sizeof need), dir,
                        human(st->space_free, avail, sizeof avail));
    }
    case STOP_WRITE:
        if (have <= 0) {
            drop_part(st);
            unmake_parents(job->made);
        }
        return nd_error(ND_EIO, "writing %s: %s%s", job->part, strerror(st->write_errno),
                        have > 0 ? " (kept: run the same command again to resume)" : "");
    case STOP_TOO_LONG:
        drop_part(st);
        return nd_error(ND_EFORMAT,
                        "%s: the server sent more than the %lld bytes it states; the download "
                        "was discarded",
                        job->url, st->want);
    case STOP_BAD_RANGE:
        drop_part(st);
        return nd_error(ND_EFORMAT,
                        "%s: the server answered with a range that was not asked for; the "
                        "download was discarded",
                        job->url);
    case STOP_CHANGED:
        drop_part(st);
        return nd_error(ND_EFORMAT,
                        "%s: the file changed on the server during the download; discarded, run "
                        "again",
                        job->url);
    }
    return ND_OK;
}

/* An HTTP error status as the final answer (a 416 to a resume is not one:
 * the .part may be the whole file), with a hint for the statuses a user can
 * act on and the start of the server's page. */
static int http_error(const dl_job *job, const dl_state *st, long long have, int *not_found)
{
    if (have == 0) {
        drop_part(st);
        unmake_parents(job->made);
    }
    if (st->status == 404 && not_found)
        *not_found = 1;
    const char *token = getenv("HF_TOKEN");
    const char *hint = st->status == 401 || st->status == 403
                           ? (token && *token ? " (HF_TOKEN was sent; does it grant access "
                                                "to this repository?)"
                                              : " (a gated or private repository needs "
                                                "HF_TOKEN=<your token>)")
                       : st->status == 404 ? " (no such repository, revision or file)"
                                           : "";
    char said[300];
    server_said(st->errbody, st->errlen, said, sizeof said);
    return nd_error(ND_EIO, "%s: HTTP %ld%s%s", job->url, st->status, hint, said);
}

/* A transfer curl ended with an error: a .part with bytes is kept to
 * resume; else it and the parents made go, and the message says how to
 * get the file without network (unless a redirect was refused or the
 * server stalled, where that would not help). */
static int transfer_failed(const dl_job *job, const dl_state *st, long long have)
{
    char msg[1600];
    transfer_error(job->cr, job->errbuf, st->location, job->stall, msg, sizeof msg);
    if (have > 0)
        return nd_error(ND_EIO,
                        "%s: download interrupted after %.1f MB (%s); %s kept: run the same "
                        "command again to resume",
                        job->url, (double)have / 1e6, msg, job->part);
    drop_part(st);
    unmake_parents(job->made);
    if (job->cr == CURLE_UNSUPPORTED_PROTOCOL || job->cr == CURLE_OPERATION_TIMEDOUT)
        return nd_error(ND_EIO, "%s: %s", job->url, msg);
    return nd_error(ND_EIO,
                    "%s: %s. Without network: download %s (Hugging Face %s) elsewhere and "
                    "put it at %s",
                    job->url, msg, job->file, job->repo, job->dest);
}

/* The .part's size against the one stated: the first stated X-Linked-Size,
 * else what the final response states (Content-Range's total,
 * Content-Length). Too long is discarded; too short is kept to resume. */
static int check_size(const dl_job *job, const dl_state *st, long long have)
{
    int is416 = st->status == 416 && st->offset > 0;
    long long want = is416 ? (st->range_total >= 0 ? st->range_total : st->claim_size) : st->want;
    if (want < 0 && st->status == 206) {
        drop_part(st);
        return nd_error(ND_EFORMAT,
                        "%s: the server resumed without stating the size; the download was "
                        "discarded, run again",
                        job->url);
    }
    /* a 200 without a size (chunked): its end was framed by HTTP */
    if (want >= 0 && have != want) {
        if (have > want) {
            drop_part(st);
            return nd_error(ND_EFORMAT,
                            "%s: got %lld bytes but the server states %lld; the download was "
                            "discarded, run again",
                            job->url, have, want);
        }
        return nd_error(ND_EIO, "%s: incomplete: %lld of %lld bytes; %s kept: run again to resume",
                        job->url, have, want, job->part);
    }
    return ND_OK;
}

/* The .part's content against what the server states: sha256 from the
 * first response that stated one (X-Linked-Etag of LFS files, else an ETag
 * that is one; a later answer's, the CDN's, does not replace it), else the
 * git blob id (the ETag outside LFS). *checked: "" (nothing stated) or what
 * was checked, for the closing line. */
static int check_content(const dl_job *job, const dl_state *st, long long have,
                         const char **checked)
{
    *checked = "";
    int rc;
    if (st->claim_sha[0]) {
        char got[65];
        if ((rc = sha256_file(job->part, got)))
            return rc;
        if (strcmp(got, st->claim_sha)) {
            drop_part(st);
            return nd_error(ND_EFORMAT,
                            "%s: sha256 %s does not match the server's %s; the download was "
                            "discarded (%s not written)",
                            job->url, got, st->claim_sha, job->dest);
        }
        *checked = "  sha256 ok";
    } else if (st->claim_blob[0]) {
        char got[41];
        if ((rc = git_blob_id(job->part, have, got)))
            return rc;
        if (strcmp(got, st->claim_blob)) {
            drop_part(st);
            return nd_error(ND_EFORMAT,
                            "%s: git blob id %s does not match the server's ETag %s; the "
                            "download was discarded (%s not written)",
                            job->url, got, st->claim_blob, job->dest);
        }
        *checked = "  git blob id ok";
    }
    return ND_OK;
}

int nd_hf_download(const char *repo, const char *file, const char *dest, const nd_hf_opts *o,
                   int *not_found)
{
    const char *rev = o && o->revision ? o->revision : "main";
    if (not_found)
        *not_found = 0;
    if (nd_hf_offline())
        return offline_error(repo, file, dest, rev, "HF_HUB_OFFLINE is set (no network)");
    static made_dirs made; /* large; downloads run one at a time */
    dl_job job;
    dl_state st;
    job.repo = repo;
    job.file = file;
    job.dest = dest;
    job.made = &made;
    int rc = download_prepare(&job, &st, rev, o);
    if (rc)
        return rc;
    if ((rc = download_attempts(&job, &st)))
        return rc;

    /* what the transfer left: the first failure found is reported */
    struct stat sb;
    long long have = stat(job.part, &sb) == 0 ? (long long)sb.st_size : -1;
    if ((rc = stopped_error(&job, &st, have)))
        return rc;
    int is416 = st.status == 416 && st.offset > 0;
    if (!is416 && (st.status >= 400 || (job.cr == CURLE_OK && st.status >= 300)))
        return http_error(&job, &st, have, not_found);
    if (job.cr != CURLE_OK)
        return transfer_failed(&job, &st, have);
    if (!job.ok_close)
        return nd_error(ND_EIO, "writing %s: %s", job.part,
                        strerror(job.close_errno ? job.close_errno : EIO));
    const char *checked;
    if ((rc = check_size(&job, &st, have)) || (rc = check_content(&job, &st, have, &checked)))
        return rc;
    if (rename(job.part, dest) != 0)
        return nd_error(ND_EIO, "%s: cannot rename to %s: %s", job.part, dest, strerror(errno));
    unlink(job.meta);
    if (st.progress)
        fprintf(st.progress, "  %-9s %s  %.2f MB%s\n", "fetched", dest, (double)have / 1e6,
                checked);
    return ND_OK;
}

typedef struct {
    char *data;
    size_t len, cap;
    int over;            /* the answer passed the cap */
    char location[1024]; /* Location of the last redirect */
} mem_buf;

static size_t mem_header(char *buf, size_t size, size_t nitems, void *ctx)
{
    mem_buf *b = ctx;
    size_t n = size * nitems;
    char line[2048];
    size_t k = header_copy(buf, n, line, sizeof line);
    const char *v;
    if (header_is(line, k, "location", &v))
        snprintf(b->location, sizeof b->location, "%.*s", (int)strcspn(v, "\r\n"), v);
    return n;
}

static size_t to_mem(char *data, size_t size, size_t nmemb, void *ctx)
{
    mem_buf *b = ctx;
    size_t n = size * nmemb;
    if (b->len + n > ((size_t)LISTING_CAP_MIB << 20)) {
        b->over = 1; /* a repository listing is never this big */
        return 0;
    }
    if (b->len + n + 1 > b->cap) { /* doubling: a copy per byte, not per chunk */
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p)
            return 0;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, n);
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
    int stall;
    int rc = stall_seconds(&stall);
    if (rc)
        return rc;
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
    struct curl_slist *hdrs;
    rc = hf_request_setup(c, url, errbuf, stall, NULL, &hdrs);
    CURLcode cr = CURLE_OK;
    long status = 0;
    int timed_out = 0; /* the total limit, not a stall */
    if (!rc) {
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, to_mem);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, mem_header);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, &b);
        /* a small API answer: a total limit too, against a slow trickle */
        curl_easy_setopt(c, CURLOPT_TIMEOUT, api_timeout(stall));
        double t0 = now_s();
        cr = curl_easy_perform(c);
        /* curl's clock starts a little after ours and may stop a hair
         * before the limit by our count: allow half a second */
        timed_out =
            cr == CURLE_OPERATION_TIMEDOUT && now_s() - t0 >= (double)api_timeout(stall) - 0.5;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    }
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(c);
    curl_global_cleanup();
    char msg[1600];
    if (rc) {
        /* hf_request_setup said why */
    } else if (b.over) {
        rc = nd_error(ND_ELIMIT, "%s: the server's answer is over the %d MiB limit", url,
                      LISTING_CAP_MIB);
    } else if (timed_out) {
        rc = nd_error(ND_EIO,
                      "%s: the server did not finish its answer within %ld s (the limit for API "
                      "answers: twice NEEDLE_HF_STALL_S)",
                      url, api_timeout(stall));
    } else if (cr != CURLE_OK) {
        transfer_error(cr, errbuf, b.location, stall, msg, sizeof msg);
        rc = nd_error(ND_EIO, "%s: %s", url, msg);
    } else if (status != 200) {
        char said[300];
        server_said(b.data ? b.data : "", b.len, said, sizeof said);
        rc = nd_error(ND_EIO, "%s: HTTP %ld%s", url, status, said);
    } else {
        rc = nd_hf_parse_listing(b.data, b.len, url, files, count);
    }
    free(b.data);
    return rc;
}

#endif
