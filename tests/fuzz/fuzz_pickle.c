/* libFuzzer target: pickle_loads must never crash, leak or hang; whatever it
 * accepts must be writable, and the writer's output must load back and
 * serialise to the same bytes (a DAG-safe stand-in for deep equality). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/pickle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pv *v = NULL;
    if (pickle_loads(data, size, "fuzz", &v) != 0)
        return 0;
    unsigned char *a = NULL, *b = NULL;
    size_t alen = 0, blen = 0;
    if (pickle_dumps(v, &a, &alen) != 0)
        abort();
    pv *w = NULL;
    if (pickle_loads(a, alen, "fuzz-rt", &w) != 0)
        abort();
    if (pickle_dumps(w, &b, &blen) != 0 || alen != blen || memcmp(a, b, alen) != 0)
        abort();
    /* full structural comparison only where the tree is small enough that
     * shared-subtree fan-out cannot make it exponential */
    if (size < 512 && !pv_equal(v, w))
        abort();
    free(a);
    free(b);
    pv_decref(v);
    pv_decref(w);
    return 0;
}
