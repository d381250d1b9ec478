/* Fuzz the Python-compatible JSON parser and serialiser: whatever parses
 * must serialise, and the serialisation must parse back to the same text;
 * the ensure_ascii=False form must parse back to the same value (unless it
 * holds a lone surrogate, which is not UTF-8). Both templates render. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/pyjson.h"
#include "text/render.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nd_pj_doc *d, *d2;
    if (nd_pj_parse((const char *)data, size, &d, NULL))
        return 0;
    nd_buf a = {0}, b = {0}, p = {0}, t = {0};
    if (nd_pj_dump(nd_pj_root(d), 1, &a) == 0 && nd_pj_parse(a.p, a.n, &d2, NULL) == 0) {
        if (nd_pj_dump(nd_pj_root(d2), 1, &b) != 0 || a.n != b.n || memcmp(a.p, b.p, a.n))
            abort(); /* dumps(loads(dumps(x))) must be a fixed point */
        nd_pj_free(d2);
    }
    nd_render_example(nd_pj_root(d), &p, &t);
    nd_buf r = {0}, c = {0};
    if (a.n && nd_pj_dump_ex(nd_pj_root(d), 1, 0, &r) == 0) {
        if (nd_pj_parse(r.p, r.n, &d2, NULL) == 0) {
            if (nd_pj_dump(nd_pj_root(d2), 1, &c) != 0 || a.n != c.n || memcmp(a.p, c.p, a.n))
                abort(); /* loads(dumps(x, ensure_ascii=False)) == x */
            nd_pj_free(d2);
        } else {
            int lone = 0;
            for (size_t i = 0; i + 1 < r.n; i++)
                lone |= (unsigned char)r.p[i] == 0xED && (unsigned char)r.p[i + 1] >= 0xA0;
            if (!lone)
                abort();
        }
    }
    nd_buf_free(&r);
    nd_buf_free(&c);
    p.n = t.n = 0;
    nd_render_example_gen(nd_pj_root(d), 3, &p, &t);
    nd_buf_free(&a);
    nd_buf_free(&b);
    nd_buf_free(&p);
    nd_buf_free(&t);
    nd_pj_free(d);
    return 0;
}
