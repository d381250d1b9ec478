/* Fuzz the Python-compatible JSON parser and serialiser: whatever parses
 * must serialise, and the serialisation must parse back to the same text. */
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
    nd_buf_free(&a);
    nd_buf_free(&b);
    nd_buf_free(&p);
    nd_buf_free(&t);
    nd_pj_free(d);
    return 0;
}
