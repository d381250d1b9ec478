#include "io/token_file.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/status.h"

static int grow(void **p, size_t *cap, size_t need, size_t elt)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 256;
    while (nc < need)
        nc *= 2;
    void *q = realloc(*p, nc * elt);
    if (!q)
        return -1;
    *p = q;
    *cap = nc;
    return 0;
}

int token_file_read(const char *path, int vocab, token_seqs *out)
{
    memset(out, 0, sizeof *out);
    unsigned char *buf;
    size_t len;
    int rc = nd_read_file(path, 0, &buf, &len);
    if (rc)
        return rc;
    size_t n_ids = 0, cap_ids = 0, cap_seq = 0, cap_line = 0;
    const char *p = (const char *)buf, *end = p + len;
    int line = 1;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            eol = end;
        size_t before = n_ids;
        const char *q = p;
        while (q < eol) {
            while (q < eol && isspace((unsigned char)*q))
                q++;
            if (q >= eol)
                break;
            if (!isdigit((unsigned char)*q)) {
                rc = nd_error(ND_EFORMAT, "%s:%d: expected a token id, found '%c'", path, line,
                              isprint((unsigned char)*q) ? *q : '?');
                goto fail;
            }
            long long v = 0;
            while (q < eol && isdigit((unsigned char)*q)) {
                v = v * 10 + (*q - '0');
                if (v >= vocab) {
                    while (q < eol && isdigit((unsigned char)*q))
                        q++;
                    rc = nd_error(ND_EFORMAT, "%s:%d: token id outside the vocabulary [0, %d)",
                                  path, line, vocab);
                    goto fail;
                }
                q++;
            }
            if (q < eol && !isspace((unsigned char)*q)) {
                rc = nd_error(ND_EFORMAT, "%s:%d: malformed token id", path, line);
                goto fail;
            }
            if (grow((void **)&out->ids, &cap_ids, n_ids + 1, sizeof *out->ids))
                goto oom;
            out->ids[n_ids++] = (int32_t)v;
        }
        if (n_ids > before) {
            if (grow((void **)&out->start, &cap_seq, (size_t)out->count + 2, sizeof *out->start) ||
                grow((void **)&out->line, &cap_line, (size_t)out->count + 1, sizeof *out->line))
                goto oom;
            out->start[out->count] = before;
            out->line[out->count] = line;
            out->count++;
            out->start[out->count] = n_ids;
        }
        p = eol + 1;
        line++;
    }
    free(buf);
    if (!out->count) {
        token_seqs_free(out);
        return nd_error(ND_EFORMAT, "%s: no token sequences", path);
    }
    return ND_OK;
oom:
    rc = nd_error(ND_ENOMEM, "%s: out of memory", path);
fail:
    free(buf);
    token_seqs_free(out);
    return rc;
}

void token_seqs_free(token_seqs *s)
{
    free(s->ids);
    free(s->start);
    free(s->line);
    memset(s, 0, sizeof *s);
}
