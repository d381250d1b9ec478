/* libFuzzer target: cact_parse must refuse anything malformed cleanly;
 * whatever it accepts must dequantise (within a size budget) without
 * touching memory outside the buffer. */
#include <stdint.h>
#include <stdlib.h>

#include "io/cact.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cact_file f;
    if (cact_parse(data, size, &f) != 0)
        return 0;
    uint64_t budget = 1u << 22; /* floats */
    for (uint32_t i = 0; i < f.hdr.num_tensors; i++) {
        const cact_tensor *t = &f.t[i];
        uint64_t n = cact_numel(t);
        if (t->dtype == CACT_RAW || n > budget)
            continue;
        budget -= n;
        float *w;
        size_t got;
        if (cact_dequant(&f, (int)i, &w, &got) == 0) {
            if (got != n)
                abort();
            free(w);
        }
    }
    if (f.hdr.num_tensors && cact_find(&f, f.t[0].name) != 0)
        abort();
    cact_free(&f);
    return 0;
}
