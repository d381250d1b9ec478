/* libFuzzer target: a server's answer to the repository listing request
 * (src/net/hf_listing.c), the JSON that becomes file names under --dir.
 * Whatever is accepted must be a safe relative path; whatever is escaped
 * for the terminal must hold no control byte. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "net/hf_listing.h"

/* an oracle written apart from nd_hf_name_check: the properties a name
 * under --dir must have, checked byte by byte */
static void check_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 1024 || s[0] == '/')
        abort();
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f || c == '\\')
            abort();
        /* no C1 control: U+0080..U+009F is C2 80..C2 9F */
        if (c == 0xC2 && i + 1 < n && (unsigned char)s[i + 1] <= 0x9F)
            abort();
        /* bytes that never occur in UTF-8 */
        if (c == 0xC0 || c == 0xC1 || c >= 0xF5)
            abort();
    }
    const char *seg = s;
    for (;;) {
        const char *slash = strchr(seg, '/');
        size_t k = slash ? (size_t)(slash - seg) : strlen(seg);
        if (k == 0 || (k == 1 && seg[0] == '.') || (k == 2 && seg[0] == '.' && seg[1] == '.'))
            abort();
        if (!slash)
            break;
        seg = slash + 1;
    }
}

static void check_escaped(const char *e, size_t cap)
{
    size_t n = strlen(e);
    if (n >= cap)
        abort();
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)e[i];
        if (c < 0x20 || c == 0x7f || (c == 0xC2 && i + 1 < n && (unsigned char)e[i + 1] <= 0x9F))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char **files;
    int count;
    int rc = nd_hf_parse_listing((const char *)data, size, "fuzz", &files, &count);
    if (rc == ND_OK) {
        if (count < 0 || files[count] != NULL)
            abort();
        for (int i = 0; i < count; i++) {
            check_name(files[i]);
            if (nd_hf_name_check(files[i], strlen(files[i])))
                abort();
            free(files[i]);
        }
        free(files);
    } else {
        if (files || count || !nd_last_error()[0])
            abort();
        /* the message quotes the server's name escaped */
        check_escaped(nd_last_error(), strlen(nd_last_error()) + 1);
    }
    /* the raw answer escaped, at a few output sizes (truncation included) */
    static const size_t caps[] = {4, 5, 17, 256, 4096};
    char out[4096];
    for (size_t i = 0; i < sizeof caps / sizeof *caps; i++) {
        memset(out, 'Z', sizeof out);
        nd_hf_escape((const char *)data, size, out, caps[i]);
        check_escaped(out, caps[i]);
    }
    /* the name check on the raw bytes: what passes must pass the oracle */
    if (size <= 1024 && !nd_hf_name_check((const char *)data, size)) {
        char name[1025];
        memcpy(name, data, size);
        name[size] = 0;
        check_name(name);
    }
    return 0;
}
