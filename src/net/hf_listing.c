/* Repository listings and server text made safe (see hf_listing.h). */
#define _POSIX_C_SOURCE 200809L
#include "net/hf_listing.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

/* The length (2..4) of the valid, shortest-form UTF-8 sequence of a code
 * point at s[0..n) and the code point, or 0 (also for ASCII). */
static size_t utf8_seq(const unsigned char *s, size_t n, uint32_t *cp)
{
    size_t len;
    uint32_t c, min;
    if (s[0] >= 0xC2 && s[0] <= 0xDF) {
        len = 2, c = s[0] & 0x1Fu, min = 0x80;
    } else if (s[0] >= 0xE0 && s[0] <= 0xEF) {
        len = 3, c = s[0] & 0x0Fu, min = 0x800;
    } else if (s[0] >= 0xF0 && s[0] <= 0xF4) {
        len = 4, c = s[0] & 0x07u, min = 0x10000;
    } else {
        return 0;
    }
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        c = c << 6 | (s[i] & 0x3Fu);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
        return 0;
    *cp = c;
    return len;
}

/* C1 controls (U+009B is a CSI on some terminals) and the bidirectional
 * embeddings, overrides and isolates that can make a name read as another */
static int invisible_control(uint32_t c)
{
    return (c >= 0x80 && c <= 0x9F) || (c >= 0x202A && c <= 0x202E) ||
           (c >= 0x2066 && c <= 0x2069) || c == 0x200E || c == 0x200F;
}

const char *nd_hf_name_check(const char *name, size_t n)
{
    const unsigned char *s = (const unsigned char *)name;
    if (n == 0)
        return "an empty name";
    if (n > 1024)
        return "longer than 1024 bytes";
    if (s[0] == '/')
        return "an absolute path";
    size_t seg = 0; /* start of the current segment */
    for (size_t i = 0; i <= n; i++) {
        if (i == n || s[i] == '/') {
            size_t k = i - seg;
            if (k == 0)
                return "an empty path segment";
            if (k > 255)
                return "a path segment over 255 bytes";
            if ((k == 1 && s[seg] == '.') || (k == 2 && s[seg] == '.' && s[seg + 1] == '.'))
                return "a '.' or '..' path segment";
            seg = i + 1;
            continue;
        }
        if (s[i] == 0)
            return "a NUL byte";
        if (s[i] < 0x20 || s[i] == 0x7f)
            return "a control byte";
        if (s[i] == '\\')
            return "a backslash";
        if (s[i] < 0x80)
            continue;
        uint32_t c;
        size_t len = utf8_seq(s + i, n - i, &c);
        if (!len)
            return "invalid UTF-8";
        if (invisible_control(c))
            return "a control or bidirectional-override character";
        i += len - 1;
    }
    return NULL;
}

char *nd_hf_escape(const char *str, size_t n, char *out, size_t cap)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char piece[8];
        size_t len = 1;
        uint32_t c = 0;
        if (s[i] == '\\') {
            memcpy(piece, "\\\\", 3);
        } else if (s[i] >= 0x20 && s[i] < 0x7f) {
            piece[0] = (char)s[i], piece[1] = 0;
        } else if (s[i] >= 0x80 && (len = utf8_seq(s + i, n - i, &c)) && !invisible_control(c)) {
            memcpy(piece, s + i, len);
            piece[len] = 0;
        } else {
            len = 1;
            snprintf(piece, sizeof piece, "\\x%02x", s[i]);
        }
        size_t pl = strlen(piece);
        if (k + pl + 4 > cap) { /* room for "..." and the NUL */
            memcpy(out + k, "...", 4);
            return out;
        }
        memcpy(out + k, piece, pl);
        k += pl;
        i += len - 1;
    }
    out[k] = 0;
    return out;
}

int nd_hf_parse_listing(const char *data, size_t len, const char *what, char ***files, int *count)
{
    *files = NULL;
    *count = 0;
    json_error_t je;
    json_t *root = json_loadb(data ? data : "", len, JSON_ALLOW_NUL, &je);
    json_t *sib = root ? json_object_get(root, "siblings") : NULL;
    if (!json_is_array(sib)) {
        json_decref(root);
        return nd_error(ND_EFORMAT, "%s: not a repository listing (no siblings array)", what);
    }
    size_t n = json_array_size(sib);
    if (n > 10000000) {
        json_decref(root);
        return nd_error(ND_EFORMAT, "%s: a listing of %zu files is beyond what is accepted", what,
                        n);
    }
    char **out = calloc(n + 1, sizeof *out);
    int rc = out ? ND_OK : nd_error(ND_ENOMEM, "%s: out of memory for %zu names", what, n);
    size_t i = 0;
    for (; !rc && i < n; i++) {
        json_t *name = json_object_get(json_array_get(sib, i), "rfilename");
        if (!json_is_string(name)) {
            rc = nd_error(ND_EFORMAT, "%s: entry %zu of the listing has no file name (rfilename)",
                          what, i);
            break;
        }
        const char *s = json_string_value(name);
        size_t sl = json_string_length(name);
        const char *why = nd_hf_name_check(s, sl);
        if (why) {
            char esc[512];
            rc = nd_error(ND_EFORMAT,
                          "%s: the server sent an unsafe file name \"%s\" (entry %zu: %s); "
                          "nothing was downloaded",
                          what, nd_hf_escape(s, sl, esc, sizeof esc), i, why);
            break;
        }
        if (!(out[i] = strdup(s)))
            rc = nd_error(ND_ENOMEM, "%s: out of memory", what);
    }
    json_decref(root);
    if (rc) {
        for (size_t j = 0; out && j < n; j++)
            free(out[j]);
        free(out);
        return rc;
    }
    *files = out;
    *count = (int)n;
    return ND_OK;
}
