/* Chat-completions reply bodies and redaction (chat_reply.h). */
#include "gen/chat_reply.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int nd_chat_parse_reply(const char *body, size_t len, const char *key, char **content,
                        size_t *content_len, char *err, size_t err_n)
{
    *content = NULL;
    *content_len = 0;
    if (err_n)
        err[0] = 0;
    char quoted[208];
    json_error_t je;
    json_t *root = json_loadb(body ? body : "", body ? len : 0, 0, &je);
    if (!root) {
        nd_redact_into(quoted, sizeof quoted, je.text, strlen(je.text), key, 160);
        snprintf(err, err_n, "the reply is not JSON (line %d column %d: %s)", je.line, je.column,
                 quoted);
        return 0;
    }
    json_t *choice = json_array_get(json_object_get(root, "choices"), 0);
    json_t *text = json_object_get(json_object_get(choice, "message"), "content");
    json_t *error = json_object_get(root, "error");
    int ok = 0;
    if (json_is_string(text)) {
        size_t n = json_string_length(text);
        *content = malloc(n + 1);
        if (!*content) {
            json_decref(root);
            snprintf(err, err_n, "out of memory");
            return -1;
        }
        memcpy(*content, json_string_value(text), n);
        (*content)[n] = 0;
        *content_len = n;
        ok = 1;
    } else if (error) {
        /* {"error": {"message": "..."}}, or {"error": "..."} */
        json_t *msg = json_is_string(error) ? error : json_object_get(error, "message");
        if (json_is_string(msg))
            nd_redact_into(quoted, sizeof quoted, json_string_value(msg), json_string_length(msg),
                           key, 200);
        else
            snprintf(quoted, sizeof quoted, "(no message)");
        snprintf(err, err_n, "the service answered an error: %s", quoted);
    } else {
        snprintf(err, err_n, "the reply has no choices[0].message.content string");
    }
    json_decref(root);
    return ok;
}
