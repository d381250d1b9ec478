/* libFuzzer target: a pickle as a LoRA adapter for a small fixed model,
 * through both readers: san_lora_from_tree (eval --lora, finetune
 * --resume) and lora_merge (build --lora). Neither may crash or leak; an
 * adapter that loads must save and load back to the same numbers; a merge
 * that is refused must leave the model untouched. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "io/pickle.h"
#include "model/lora.h"
#include "model/lora_merge.h"

static san_model model;
static float *pristine;
static pv *params16; /* the five kernels stored as float16 */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    san_config c;
    san_config_preset(&c, "tiny");
    c.vocab_size = 16;
    c.d_model = c.attn_dim = 4;
    c.num_heads = c.num_kv_heads = c.num_layers = 1;
    c.max_seq_len = 2;
    c.engram_slots = 1;
    c.engram_heads = 1;
    c.mhc_lanes = 1;
    c.engram_layers[0] = 0;
    if (san_model_create(&model, &c) != 0) {
        fprintf(stderr, "fuzz_lora: cannot build the model\n");
        abort();
    }
    san_model_init_random(&model, 1);
    pristine = malloc(model.numel * sizeof(float));
    memcpy(pristine, model.mem, model.numel * sizeof(float));
    params16 = pv_dict();
    for (int t = 0; t < LORA_NTARGETS; t++) {
        const san_tensor *ten = san_model_find(&model, san_lora_target_name(t));
        uint16_t *z = calloc(ten->numel, sizeof *z);
        ckpt_tree_set(params16, ten->name, pv_ndarray(ND_F16, ten->ndim, ten->shape, z));
        free(z);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pv *root = NULL;
    if (pickle_loads(data, size, "fuzz", &root) != 0)
        return 0;
    san_lora lo;
    if (san_lora_from_tree(&lo, &model, root, "fuzz") == 0) {
        pv *out = san_lora_to_pv(&lo);
        unsigned char *buf = NULL;
        size_t len = 0;
        pv *again = NULL;
        san_lora lo2;
        if (!out || pickle_dumps(out, &buf, &len) != 0 ||
            pickle_loads(buf, len, "fuzz-rt", &again) != 0 ||
            san_lora_from_tree(&lo2, &model, again, "fuzz-rt") != 0)
            abort(); /* what loads must save and load again */
        if (lo2.numel != lo.numel || lo2.rank != lo.rank ||
            memcmp(lo2.mem, lo.mem, lo.numel * sizeof(float)) != 0)
            abort();
        san_lora_free(&lo2);
        pv_decref(again);
        free(buf);
        pv_decref(out);
        san_lora_free(&lo);
    }
    lora_merge_info info;
    if (lora_merge(&model, size & 1 ? params16 : NULL, root, "fuzz", &info) != 0 &&
        memcmp(model.mem, pristine, model.numel * sizeof(float)) != 0)
        abort(); /* a refused adapter must leave the model as it was */
    memcpy(model.mem, pristine, model.numel * sizeof(float));
    pv_decref(root);
    return 0;
}
