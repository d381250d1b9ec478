/* libFuzzer target: a chat-completions reply body as it comes off the
 * network, through gen/chat_reply.c (choices[0].message.content, or why
 * not) and on into gen/examples.c. Whatever comes back: a kept example is
 * one JSON object that renders, and no message -- nor the body itself put
 * through nd_redact_into at any cut -- holds 4 or more bytes of the key's
 * start. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gen/chat_reply.h"
#include "gen/examples.h"
#include "text/render.h"

static const char key[] = "sk-fuzz-Q7wE-0123456789";

static const char tools_json[] =
    "[{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"type\":\"string\"},\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]}},"
    "\"required\":[\"city\"]}},"
    "{\"name\":\"set_timer\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"minutes\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":180}},"
    "\"required\":[\"minutes\"]}}]";

/* abort if s holds a run of 4+ bytes that starts like the key, or a
 * control byte */
static void check_clean(const char *s)
{
    size_t kn = strlen(key);
    for (const char *p = s; *p; p++) {
        size_t l = 0;
        while (l < kn && p[l] == key[l])
            l++;
        if (l >= 4 || (unsigned char)*p < 0x20 || *p == 0x7f)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *body = (const char *)data;

    /* redaction of the raw body, cut at a size taken from the input */
    char line[256];
    size_t max = size ? data[0] % sizeof line : 0;
    size_t n = nd_redact_into(line, sizeof line, body, size, key, max);
    if (n > max || line[n] || strlen(line) != n)
        abort();
    check_clean(line);
    /* in place over a NUL-terminated copy: never longer than it was */
    char *copy = malloc(size + 1);
    if (!copy)
        return 0;
    memcpy(copy, body, size);
    copy[size] = 0;
    size_t before = strlen(copy);
    nd_redact(copy, key);
    if (strlen(copy) > before)
        abort();
    check_clean(copy);
    free(copy);

    char *content = NULL, err[320];
    size_t len = 0;
    int ok = nd_chat_parse_reply(body, size, key, &content, &len, err, sizeof err);
    if (ok < 0)
        return 0; /* out of memory */
    if (!ok) {
        if (content || !err[0] || strlen(err) >= sizeof err)
            abort();
        check_clean(err);
        return 0;
    }
    if (!content || content[len])
        abort();

    nd_pj_doc *tools;
    if (nd_pj_parse(tools_json, sizeof tools_json - 1, &tools, NULL))
        abort();
    nd_gen_set *s;
    if (nd_gen_set_new(nd_pj_root(tools), &s))
        abort();
    nd_gen_add_reply(s, content, len, 0);
    const nd_gen_counts *c = nd_gen_get_counts(s);
    if (c->replies != 1 || c->kept != nd_gen_size(s) ||
        c->kept + c->invalid + c->duplicate != c->offered)
        abort();
    /* an unparsable reply offers nothing and is explained */
    if (c->unparsable ? c->offered || !nd_gen_first_unparsable(s)[0]
                      : nd_gen_first_unparsable(s)[0] != 0)
        abort();
    /* what is printed about an unparsable reply: clean once redacted */
    char why[256];
    strcpy(why, nd_gen_first_unparsable(s));
    nd_redact(why, key);
    check_clean(why);
    for (size_t i = 0; i < nd_gen_size(s); i++) {
        size_t ln;
        const char *l = nd_gen_line(s, i, &ln);
        nd_pj_doc *d;
        nd_buf p = {0}, t = {0};
        if (nd_pj_parse(l, ln, &d, NULL) || nd_render_example(nd_pj_root(d), &p, &t))
            abort();
        nd_buf_free(&p);
        nd_buf_free(&t);
        nd_pj_free(d);
    }
    nd_gen_set_free(s);
    nd_pj_free(tools);
    free(content);
    return 0;
}
