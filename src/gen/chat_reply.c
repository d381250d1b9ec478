/* Chat-completions reply bodies and redaction (chat_reply.h). */
#include "gen/chat_reply.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "text/pyjson.h"

/* Bytes of s[0..n) that agree with the start of key[0..kn). */
static size_t common_prefix(const char *s, size_t n, const char *key, size_t kn)
{
    size_t m = n < kn ? n : kn, i = 0;
    while (i < m && s[i] == key[i])
        i++;
    return i;
}

static int lower_eq(const char *s, const char *word, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (c != word[i])
            return 0;
    }
    return 1;
}

static int is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Length of a UTF-8 sequence from its lead byte (1 for anything else). */
static size_t utf8_len(unsigned char c)
{
    return c >= 0xF0 && c < 0xF8 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
}

size_t nd_redact_into(char *dst, size_t dst_n, const char *src, size_t n, const char *key,
                      size_t max)
{
    if (!dst_n)
        return 0;
    if (max > dst_n - 1)
        max = dst_n - 1;
    size_t kn = key ? strlen(key) : 0;
    size_t need = kn < 4 ? kn : 4; /* a piece this long counts as the key */
    size_t i = 0, o = 0;
    int cut = 0;
    /* o <= i throughout: every replacement is no longer than what it
     * replaces, so dst == src works */
#define EMIT(c)                                                                                    \
    do {                                                                                           \
        if (o < max)                                                                               \
            dst[o++] = (c);                                                                        \
        else                                                                                       \
            cut = 1;                                                                               \
    } while (0)
    while (i < n && !cut) {
        size_t l = kn ? common_prefix(src + i, n - i, key, kn) : 0;
        if (kn && l >= need) {
            for (size_t s = 0; s < (l < 3 ? l : 3); s++)
                EMIT('*');
            i += l;
            continue;
        }
        if (n - i > 7 && lower_eq(src + i, "bearer", 6) && is_space((unsigned char)src[i + 6])) {
            size_t j = i + 6;
            while (j < n && is_space((unsigned char)src[j]))
                j++;
            size_t t = j;
            while (t < n && !is_space((unsigned char)src[t]) && src[t] != '"' && src[t] != '\'')
                t++;
            if (t > j) {
                /* "Bearer" as written, one space, then stars */
                for (size_t s = 0; s < 6; s++)
                    EMIT(src[i + s]);
                EMIT(' ');
                for (size_t s = 0; s < (t - j < 3 ? t - j : 3); s++)
                    EMIT('*');
                i = t;
                continue;
            }
        }
        unsigned char c = (unsigned char)src[i++];
        EMIT(c < 0x20 || c == 0x7f ? ' ' : (char)c);
    }
#undef EMIT
    if (i < n || cut) {
        /* cut: drop a UTF-8 sequence left incomplete at the end */
        size_t b = o;
        while (b > 0 && ((unsigned char)dst[b - 1] & 0xC0) == 0x80 && o - b < 3)
            b--;
        if (b > 0 && (unsigned char)dst[b - 1] >= 0xC0 &&
            utf8_len((unsigned char)dst[b - 1]) > o - b + 1)
            o = b - 1;
    }
    dst[o] = 0;
    return o;
}

void nd_redact(char *s, const char *key)
{
    size_t n = strlen(s);
    nd_redact_into(s, n + 1, s, n, key, n);
}

/* err = why the body is not JSON: the parser stopped at byte `at` (0-based)
 * saying `what` (pyjson's "column C: problem", whose column counts from the
 * start of the body). Said as line and column, with the text up to that
 * byte quoted. The quote is cut from the body redacted as a whole, so it
 * never starts inside a key it leaves out. */
static void say_not_json(const char *body, size_t len, size_t at, const char *what, const char *key,
                         char *err, size_t err_n)
{
    size_t line = 1, line_start = 0;
    if (at > len)
        at = len;
    for (size_t i = 0; i < at; i++)
        if (body[i] == '\n') {
            line++;
            line_start = i + 1;
        }
    const char *colon = strncmp(what, "column ", 7) == 0 ? strstr(what, ": ") : NULL;
    if (colon)
        what = colon + 2;
    char problem[128], near[80] = "";
    nd_redact_into(problem, sizeof problem, what, strlen(what), key, 100);
    /* the byte itself when ASCII: before it the body is valid UTF-8 (pyjson
     * checks that first), so the quote stays whole characters */
    size_t end = at < len && (unsigned char)body[at] < 0x80 ? at + 1 : at;
    char *red = end ? malloc(end + 1) : NULL;
    if (red) {
        size_t n = nd_redact_into(red, end + 1, body, end, key, end);
        size_t from = n > 40 ? n - 40 : 0;
        while (from < n && ((unsigned char)red[from] & 0xC0) == 0x80)
            from++; /* not inside a UTF-8 sequence */
        snprintf(near, sizeof near, " near '%s'", red + from);
        free(red);
    }
    snprintf(err, err_n, "the reply is not JSON (line %zu column %zu: %s%s)", line,
             at - line_start + 1, problem, near);
}

int nd_chat_parse_reply(const char *body, size_t len, const char *key, char **content,
                        size_t *content_len, char *err, size_t err_n)
{
    *content = NULL;
    *content_len = 0;
    if (err_n)
        err[0] = 0;
    if (!body) {
        body = "";
        len = 0;
    }
    nd_pj_doc *doc;
    size_t col = 0;
    int rc = nd_pj_parse(body, len, &doc, &col);
    if (rc == ND_ENOMEM) {
        snprintf(err, err_n, "out of memory");
        return -1;
    }
    if (rc) {
        say_not_json(body, len, col ? col - 1 : 0, nd_last_error(), key, err, err_n);
        return 0;
    }
    const nd_pj *root = nd_pj_root(doc);
    const nd_pj *choices = nd_pj_get(root, "choices");
    const nd_pj *choice =
        choices && choices->type == ND_PJ_ARRAY && choices->len ? choices->items[0] : NULL;
    const nd_pj *text = nd_pj_get(nd_pj_get(choice, "message"), "content");
    const nd_pj *error = nd_pj_get(root, "error");
    char quoted[208];
    int ok = 0;
    if (text && text->type == ND_PJ_STRING) {
        if (memchr(text->str, 0, text->len)) {
            /* the content is text for the example parser: no NULs in it */
            snprintf(err, err_n, "choices[0].message.content holds a \\u0000 character");
        } else if (!(*content = malloc(text->len + 1))) {
            nd_pj_free(doc);
            snprintf(err, err_n, "out of memory");
            return -1;
        } else {
            memcpy(*content, text->str, text->len);
            (*content)[text->len] = 0;
            *content_len = text->len;
            ok = 1;
        }
    } else if (error) {
        /* {"error": {"message": "..."}}, or {"error": "..."} */
        const nd_pj *msg = error->type == ND_PJ_STRING ? error : nd_pj_get(error, "message");
        if (msg && msg->type == ND_PJ_STRING)
            nd_redact_into(quoted, sizeof quoted, msg->str, msg->len, key, 200);
        else
            snprintf(quoted, sizeof quoted, "(no message)");
        snprintf(err, err_n, "the service answered an error: %s", quoted);
    } else {
        snprintf(err, err_n, "the reply has no choices[0].message.content string");
    }
    nd_pj_free(doc);
    return ok;
}
