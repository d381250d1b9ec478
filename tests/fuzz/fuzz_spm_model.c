/* Fuzz the .model protobuf parser, tokenizer construction (from .model and
 * as a .cact blob) and a short encode/decode with whatever loads. */
#include <stdint.h>
#include <stdlib.h>

#include "io/spm_model.h"
#include "text/tokenizer.h"

static void exercise(const nd_tokenizer *t, const uint8_t *data, size_t size)
{
    nd_idvec ids = {0};
    size_t n = size < 256 ? size : 256; /* some hostile text: the input's tail */
    if (nd_tokenizer_encode(t, (const char *)data + size - n, n, &ids) == 0) {
        char *text;
        size_t len;
        if (nd_tokenizer_decode(t, ids.v, ids.n, &text, &len) == 0)
            free(text);
        unsigned char *blob;
        if (nd_tokenizer_write_blob(t, &blob, &len) == 0)
            free(blob);
    }
    nd_idvec_free(&ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nd_spm_model m;
    nd_tokenizer *t;
    if (nd_spm_model_parse(data, size, &m) == 0) {
        if (nd_tokenizer_from_spm(&m, &t) == 0) {
            exercise(t, data, size);
            nd_tokenizer_free(t);
        }
        nd_spm_model_free(&m);
    }
    if (nd_tokenizer_from_blob(data, size, &t) == 0) {
        exercise(t, data, size);
        nd_tokenizer_free(t);
    }
    return 0;
}
