/* JSONL reading: a streaming line reader (bounded memory per line) and the
 * dataset loader that renders each example. */
#include "io/jsonl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "text/pyjson.h"
#include "text/render.h"

#define DEFAULT_MAX_LINE ((size_t)16 << 20)
#define READ_CHUNK ((size_t)1 << 16)

struct nd_lines {
    FILE *f;
    const char *mem; /* in_mem: reading these bytes instead of f */
    int in_mem;
    size_t mem_len, mem_pos;
    size_t chunk; /* most bytes one read adds */
    char *path;
    char *buf;
    size_t start, end, cap; /* unread bytes are buf[start, end) */
    size_t max_line, lineno;
    int eof, skipping, pending_cr;
};

static nd_lines *lines_new(const char *name, size_t max_line)
{
    nd_lines *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->max_line = max_line ? max_line : DEFAULT_MAX_LINE;
    r->chunk = (size_t)-1;
    r->path = malloc(strlen(name) + 1);
    r->cap = READ_CHUNK * 2;
    r->buf = malloc(r->cap);
    if (!r->path || !r->buf) {
        nd_lines_close(r);
        return NULL;
    }
    strcpy(r->path, name);
    return r;
}

int nd_lines_open(const char *path, size_t max_line, nd_lines **out)
{
    *out = NULL;
    nd_lines *r = lines_new(path, max_line);
    if (!r)
        return nd_error(ND_ENOMEM, "out of memory");
    if (!(r->f = fopen(path, "rb"))) {
        int e = errno;
        nd_lines_close(r);
        return nd_error(ND_EIO, "%s: cannot open: %s", path, strerror(e));
    }
    *out = r;
    return 0;
}

int nd_lines_open_mem(const void *data, size_t n, const char *name, size_t max_line, size_t chunk,
                      nd_lines **out)
{
    *out = NULL;
    nd_lines *r = lines_new(name, max_line);
    if (!r)
        return nd_error(ND_ENOMEM, "out of memory");
    r->mem = data;
    r->mem_len = data ? n : 0;
    r->in_mem = 1;
    if (r->mem_len + 1 < r->cap) { /* a small input gets a small buffer */
        char *b = realloc(r->buf, r->mem_len + 1);
        if (b) {
            r->buf = b;
            r->cap = r->mem_len + 1;
        }
    }
    if (chunk)
        r->chunk = chunk;
    *out = r;
    return 0;
}

void nd_lines_close(nd_lines *r)
{
    if (!r)
        return;
    if (r->f)
        fclose(r->f);
    free(r->path);
    free(r->buf);
    free(r);
}

/* Read more bytes after buf[end]; compacts and grows (up to the line limit
 * plus one chunk) as needed. */
static int fill(nd_lines *r)
{
    if (r->start) {
        memmove(r->buf, r->buf + r->start, r->end - r->start);
        r->end -= r->start;
        r->start = 0;
    }
    /* room for a chunk, or for what is left of an in-memory input */
    size_t room = READ_CHUNK;
    if (r->in_mem && r->mem_len - r->mem_pos < room)
        room = r->mem_len - r->mem_pos + 1;
    if (r->cap - r->end < room) {
        size_t cap = r->cap * 2;
        char *b = realloc(r->buf, cap);
        if (!b)
            return nd_error(ND_ENOMEM, "%s: out of memory reading line %zu", r->path,
                            r->lineno + 1);
        r->buf = b;
        r->cap = cap;
    }
    size_t want = r->cap - r->end < r->chunk ? r->cap - r->end : r->chunk, got;
    if (r->in_mem) {
        got = r->mem_len - r->mem_pos < want ? r->mem_len - r->mem_pos : want;
        if (got)
            memcpy(r->buf + r->end, r->mem + r->mem_pos, got);
        r->mem_pos += got;
    } else {
        got = fread(r->buf + r->end, 1, want, r->f);
    }
    if (got == 0) {
        if (r->f && ferror(r->f))
            return nd_error(ND_EIO, "%s: read error: %s", r->path, strerror(errno));
        r->eof = 1;
    }
    r->end += got;
    return 0;
}

static int too_long(nd_lines *r)
{
    return nd_error(ND_ELIMIT, "%s:%zu: line is longer than %zu bytes", r->path, r->lineno,
                    r->max_line);
}

int nd_lines_next(nd_lines *r, const char **line, size_t *len, size_t *lineno)
{
    size_t scan = r->start; /* bytes before scan hold no terminator */
    for (;;) {
        /* A "\r" that ended the previous line may be followed by "\n". */
        if (r->pending_cr && r->start < r->end) {
            if (r->buf[r->start] == '\n')
                r->start++;
            r->pending_cr = 0;
            scan = r->start;
        }
        size_t i = scan;
        while (i < r->end && r->buf[i] != '\n' && r->buf[i] != '\r')
            i++;
        if (i < r->end || (r->eof && r->start < r->end)) {
            size_t s = r->start;
            r->start = i < r->end ? i + 1 : r->end;
            if (i < r->end && r->buf[i] == '\r') {
                if (i + 1 < r->end)
                    r->start += r->buf[i + 1] == '\n';
                else
                    r->pending_cr = 1;
            }
            if (r->skipping) { /* the tail of an over-long line, already reported */
                r->skipping = 0;
                scan = r->start;
                continue;
            }
            r->lineno++;
            if (i - s > r->max_line)
                return too_long(r);
            *line = r->buf + s;
            *len = i - s;
            *lineno = r->lineno;
            return 1;
        }
        if (r->eof)
            return 0;
        if (r->end - r->start > r->max_line) {
            /* Report once, then discard the rest of the line as it arrives. */
            r->start = r->end;
            if (!r->skipping) {
                r->skipping = 1;
                r->lineno++;
                return too_long(r);
            }
        }
        scan = r->end - r->start;
        int rc = fill(r);
        if (rc)
            return rc;
        scan += r->start;
    }
}

/* Python's str.strip(): Unicode whitespace (str.isspace) at both ends. */
static size_t ws_len(const unsigned char *s, size_t n, int at_end)
{
    if (!n)
        return 0;
    if (!at_end) {
        unsigned c = s[0];
        if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F))
            return 1;
    } else {
        unsigned c = s[n - 1];
        if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F))
            return 1;
    }
    /* every other Unicode space starts with one of these bytes */
    unsigned lead = at_end ? (n >= 3 ? s[n - 3] : 0) : s[0];
    unsigned lead2 = at_end ? (n >= 2 ? s[n - 2] : 0) : s[0];
    if (lead != 0xE1 && lead != 0xE2 && lead != 0xE3 && lead2 != 0xC2)
        return 0;
    static const char *const uni[] = {
        "\xC2\x85",     "\xC2\xA0",     "\xE1\x9A\x80", "\xE2\x80\x80", "\xE2\x80\x81",
        "\xE2\x80\x82", "\xE2\x80\x83", "\xE2\x80\x84", "\xE2\x80\x85", "\xE2\x80\x86",
        "\xE2\x80\x87", "\xE2\x80\x88", "\xE2\x80\x89", "\xE2\x80\x8A", "\xE2\x80\xA8",
        "\xE2\x80\xA9", "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80"};
    for (size_t k = 0; k < sizeof uni / sizeof *uni; k++) {
        size_t l = strlen(uni[k]);
        if (n >= l && !memcmp(at_end ? s + n - l : s, uni[k], l))
            return l;
    }
    return 0;
}

void nd_dataset_free(nd_dataset *d)
{
    for (size_t i = 0; i < d->n; i++) {
        free(d->ex[i].prompt);
        free(d->ex[i].target);
    }
    free(d->ex);
    memset(d, 0, sizeof *d);
}

/* Parse and render one stripped line. Returns 1 if it has no "query". */
static int load_line(const char *s, size_t n, int generation, nd_example *ex)
{
    nd_pj_doc *doc;
    int rc = nd_pj_parse(s, n, &doc, NULL);
    if (rc)
        return nd_error_prefix(rc, "invalid JSON");
    const nd_pj *root = nd_pj_root(doc);
    if (root->type == ND_PJ_OBJECT && !nd_pj_get(root, "query")) {
        nd_pj_free(doc);
        return 1;
    }
    nd_buf p = {0}, t = {0};
    rc = nd_render_example_gen(root, generation, &p, &t);
    nd_pj_free(doc);
    if (rc) {
        nd_buf_free(&p);
        nd_buf_free(&t);
        return rc;
    }
    ex->prompt = p.p;
    ex->prompt_len = p.n;
    ex->target = t.p;
    ex->target_len = t.n;
    return 0;
}

/* Reads every line of r (closed here) into out. */
static int load_lines(nd_lines *r, const char *path, const nd_jsonl_opts *opts, nd_dataset *out)
{
    int rc = ND_OK;
    if ((out->generation = nd_render_generation(opts->generation)) < 0) {
        nd_lines_close(r);
        return nd_error(ND_EARG, "unknown model generation %d (2 or 3)", opts->generation);
    }
    size_t cap = 0;
    for (;;) {
        const char *line;
        size_t len, lineno;
        int got = nd_lines_next(r, &line, &len, &lineno);
        if (got == 0)
            break;
        if (got == ND_ELIMIT && opts->skip_bad) {
            if (!out->bad++)
                snprintf(out->first_bad, sizeof out->first_bad, "%s", nd_last_error());
            out->lines++;
            continue;
        }
        if (got < 0) {
            rc = got;
            break;
        }
        out->lines++;
        const unsigned char *u = (const unsigned char *)line;
        size_t k;
        while ((k = ws_len(u, len, 0)) != 0)
            u += k, len -= k;
        while ((k = ws_len(u, len, 1)) != 0)
            len -= k;
        if (!len) {
            out->blank++;
            continue;
        }
        if (out->n == cap) {
            size_t nc = cap ? cap * 2 : 256;
            nd_example *ne = realloc(out->ex, nc * sizeof *ne);
            if (!ne) {
                rc = nd_error(ND_ENOMEM, "out of memory for %zu examples", nc);
                break;
            }
            out->ex = ne;
            cap = nc;
        }
        nd_example *ex = &out->ex[out->n];
        memset(ex, 0, sizeof *ex);
        ex->line = lineno;
        int lr = load_line((const char *)u, len, out->generation, ex);
        if (lr == 1) {
            out->no_query++;
        } else if (lr == 0) {
            out->n++;
        } else {
            nd_error_prefix(lr, "%s:%zu", path, lineno);
            if (!opts->skip_bad) {
                rc = lr;
                break;
            }
            if (!out->bad++)
                snprintf(out->first_bad, sizeof out->first_bad, "%s", nd_last_error());
        }
    }
    nd_lines_close(r);
    if (rc)
        nd_dataset_free(out);
    return rc;
}

int nd_jsonl_load(const char *path, const nd_jsonl_opts *opts, nd_dataset *out)
{
    nd_jsonl_opts def = {0};
    if (!opts)
        opts = &def;
    memset(out, 0, sizeof *out);
    nd_lines *r;
    int rc = nd_lines_open(path, opts->max_line, &r);
    if (rc)
        return rc;
    return load_lines(r, path, opts, out);
}

int nd_jsonl_load_mem(const void *data, size_t n, const char *name, const nd_jsonl_opts *opts,
                      nd_dataset *out)
{
    nd_jsonl_opts def = {0};
    if (!opts)
        opts = &def;
    memset(out, 0, sizeof *out);
    nd_lines *r;
    int rc = nd_lines_open_mem(data, n, name, opts->max_line, opts->read_chunk, &r);
    if (rc)
        return rc;
    return load_lines(r, name, opts, out);
}
