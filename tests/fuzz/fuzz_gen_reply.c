/* libFuzzer target: a chat model's reply through gen/examples.c. Anything
 * may come back; whatever is kept must be one JSON object that renders. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gen/examples.h"
#include "text/render.h"

static const char tools_json[] =
    "[{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"type\":\"string\"},\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]}},"
    "\"required\":[\"city\"]}},"
    "{\"name\":\"set_timer\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"minutes\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":180}},"
    "\"required\":[\"minutes\"]}}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nd_pj_doc *tools;
    if (nd_pj_parse(tools_json, sizeof tools_json - 1, &tools, NULL))
        abort();
    nd_gen_set *s;
    if (nd_gen_set_new(nd_pj_root(tools), &s))
        abort();
    nd_gen_add_reply(s, (const char *)data, size, 0);
    const nd_gen_counts *c = nd_gen_get_counts(s);
    if (c->kept != nd_gen_size(s) || c->kept + c->invalid + c->duplicate != c->offered)
        abort();
    for (size_t i = 0; i < nd_gen_size(s); i++) {
        size_t n;
        const char *line = nd_gen_line(s, i, &n);
        nd_pj_doc *d;
        nd_buf p = {0}, t = {0};
        if (nd_pj_parse(line, n, &d, NULL) || nd_render_example(nd_pj_root(d), &p, &t))
            abort();
        nd_buf_free(&p);
        nd_buf_free(&t);
        nd_pj_free(d);
    }
    nd_gen_set_free(s);
    nd_pj_free(tools);
    return 0;
}
