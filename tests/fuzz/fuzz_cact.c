/* libFuzzer target: cact_parse must refuse anything malformed cleanly;
 * whatever it accepts must dequantise (within a size budget) without
 * touching memory outside the buffer. A Needle 3 archive (tag 0x05E12A84)
 * also goes through the engine's v3 loader: the quantised view, and for
 * small inputs the dequantise-everything path. */
#include <stdint.h>
#include <stdlib.h>

#include "engine/model_internal.h"
#include "io/cact.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cact_file f;
    if (cact_parse(data, size, &f) != 0)
        return 0;
    /* Work budget per input, in multiply-adds: CQ dequantisation builds a
     * group x group Hadamard matrix and rotates every group of every row
     * with it (group^2 each), so even the 8 KB seed archives cost ~3M per
     * input and one with group 4096 ~10^8; under ASan and coverage that
     * held the campaign at ~300 inputs/s. Dequantising what fits in 2^17
     * still reaches every dequantiser path (seed tensors fit one or two at
     * a time) while the parser and directory checks see every input. */
    uint64_t budget = 1u << 17;
    for (uint32_t i = 0; i < f.hdr.num_tensors; i++) {
        const cact_tensor *t = &f.t[i];
        uint64_t n = cact_numel(t), work = n;
        if (t->dtype == CACT_CQ) {
            uint64_t g = t->group, groups = (uint64_t)t->shape[0] * ((t->shape[1] + g - 1) / g);
            work = g * g * (1 + groups);
        }
        if (t->dtype == CACT_RAW || work > budget)
            continue;
        budget -= work;
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
    if (f.generation == 3) {
        san_model m;
        nd_qweights3 q;
        if (nd_cact3_to_qmodel(&f, &m, &q) == 0) {
            san_model_free(&m);
            nd_qweights3_free(&q);
        }
        if (size <= (1u << 16) && nd_cact3_to_model(&f, &m) == 0)
            san_model_free(&m);
    }
    cact_free(&f);
    return 0;
}
