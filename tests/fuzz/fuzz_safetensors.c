/* libFuzzer target: bytes as a safetensors file. st_parse must refuse
 * anything malformed without crashing, leaking or reading outside the
 * buffer; what it accepts must have every tensor inside the data buffer
 * (the tensors tiling it exactly). A file that also makes a needle tree
 * (checkpoint or adapter) must write back (st_tree_dumps), parse again and
 * give an equal tree, which written again gives the same bytes (header
 * padded to 8 bytes). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    st_file f;
    if (st_parse(data, size, "fuzz", &f) != 0)
        return 0;
    uint64_t covered = 0;
    size_t data_len = size - 8 - (size_t)f.header_len;
    for (size_t i = 0; i < f.n; i++) {
        const st_tensor *t = &f.t[i];
        if (t->end > data_len || t->end - t->begin != t->nbytes ||
            (const uint8_t *)t->data != data + 8 + f.header_len + t->begin)
            abort();
        covered += t->nbytes;
        if (t->dtype == ST_F32 || t->dtype == ST_F16 || t->dtype == ST_BF16 || t->dtype == ST_F64) {
            float *w = malloc((size_t)t->numel * sizeof *w + 1);
            if (w && st_to_f32(t, w) != 0)
                abort();
            free(w);
        }
    }
    if (covered != data_len)
        abort();
    pv *tree = NULL;
    if (st_tree_from_file(&f, "fuzz", &tree) == 0) {
        san_model m;
        if (ckpt_from_tree(tree, "fuzz", &m) == 0)
            san_model_free(&m);
        unsigned char *buf = NULL, *buf2 = NULL;
        size_t len = 0, len2 = 0;
        if (st_tree_dumps(tree, &buf, &len) == 0) {
            st_file g;
            pv *again = NULL;
            if (st_parse(buf, len, "fuzz-rt", &g) != 0 ||
                st_tree_from_file(&g, "fuzz-rt", &again) != 0 || !pv_equal(tree, again))
                abort(); /* what was written must read back the same */
            /* and writing it again gives the same bytes */
            if (st_tree_dumps(again, &buf2, &len2) != 0 || len2 != len ||
                memcmp(buf, buf2, len) != 0 || (g.header_len + 8) % 8 != 0)
                abort();
            pv_decref(again);
            st_close(&g);
        }
        free(buf);
        free(buf2);
        pv_decref(tree);
    }
    st_close(&f);
    return 0;
}
