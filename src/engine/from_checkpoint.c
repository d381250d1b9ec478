/* Checkpoint (+ adapter) -> float needle_model. The engine's loader reads
 * archives, so the merged model is exported to an archive in memory for
 * what only an archive carries in engine form (tokenizer blob, probe heads,
 * kv window, header geometry); its quantised matrices are then replaced by
 * the float weights, so nothing the model runs with is quantised. */
#include "engine/from_checkpoint.h"

#include <stdlib.h>

#include "core/status.h"
#include "engine/engine.h"
#include "io/cact.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/cq.h"
#include "model/lora_merge.h"
#include "text/tokenizer.h"

static int tokenizer_blob(const char *path, unsigned char **blob, size_t *len)
{
    nd_tokenizer *t;
    int rc = nd_tokenizer_load(path, &t);
    if (rc)
        return nd_error_prefix(rc, "tokenizer");
    rc = nd_tokenizer_write_blob(t, blob, len);
    nd_tokenizer_free(t);
    return rc;
}

needle_model *nd_model_from_checkpoint(const char *ckpt, const char *lora, const char *tokenizer)
{
    if (!ckpt || !tokenizer) {
        nd_error(ND_EARG, "nd_model_from_checkpoint: a checkpoint and a tokenizer are required");
        return NULL;
    }
    san_model m;
    pv *root = NULL;
    unsigned char *blob = NULL, *arch = NULL;
    size_t blob_len = 0, arch_len = 0;
    needle_model *M = NULL;
    if (ckpt_load(ckpt, &m, &root))
        return NULL;
    const pv *params = pv_dict_get(root, "params");
    int rc = ND_OK;
    if (lora) {
        lora_merge_info li;
        if ((rc = lora_merge_file(&m, params, lora, &li)))
            goto done;
    }
    if ((rc = san_model_check_finite(&m, lora ? lora : ckpt))) {
        if (lora)
            nd_error_prefix(rc, "after merging the adapter into %s", ckpt);
        goto done;
    }
    if ((rc = tokenizer_blob(tokenizer, &blob, &blob_len)))
        goto done;
    cact_write_opts o = {0};
    o.bits = 4; /* any width: the matrices are replaced by the float weights */
    o.group = CQ_GROUP;
    o.kv_window = san_effective_kv_window(&m.cfg);
    o.tokenizer = blob;
    o.tokenizer_len = blob_len;
    cact_write_info info;
    if ((rc = cact_write_mem(&m, params, &o, &arch, &arch_len, &info))) {
        nd_error_prefix(rc, "%s with tokenizer %s", ckpt, tokenizer);
        goto done;
    }
    M = nd_model_load_float_weights(arch, arch_len, &m);
    if (!M)
        nd_error_prefix(ND_EFORMAT, "%s", ckpt);
done:
    free(arch);
    free(blob);
    pv_decref(root);
    san_model_free(&m);
    return M;
}
