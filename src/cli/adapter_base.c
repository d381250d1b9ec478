/* `needle build CKPT --lora ADAPTER` with an adapter trained on the nano
 * base: say so, with the command that builds it, before CKPT is fetched
 * (needle2.pkl is often not here, and the download would only lead to a
 * shape error). */
#define _DEFAULT_SOURCE
#define _POSIX_C_SOURCE 200809L
#include "cli/adapter_base.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "engine/base.h"
#include "io/checkpoint.h"
#include "io/pickle.h"

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

#define NANO_FILE "needle-nano.pkl"

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* same file: same real path (a file that does not exist: same text) */
static int same_file(const char *a, const char *b)
{
    char ra[PATH_MAX], rb[PATH_MAX];
    const char *x = realpath(a, ra) ? ra : a, *y = realpath(b, rb) ? rb : b;
    return !strcmp(x, y);
}

/* the geometry a pickle checkpoint's config names (d_model, num_layers,
 * vocab_size, num_heads); 0 when read */
static int geometry(const char *path, int64_t g[4])
{
    static const char *const keys[4] = {"d_model", "num_layers", "vocab_size", "num_heads"};
    pv *root = NULL;
    if (access(path, R_OK) || ckpt_path_is_safetensors(path) || ckpt_file_load(path, &root))
        return -1;
    const pv *cfg = root->kind == PV_DICT ? pv_dict_get(root, "config") : NULL;
    int rc = cfg && cfg->kind == PV_DICT ? 0 : -1;
    for (int i = 0; i < 4 && !rc; i++) {
        const pv *v = pv_dict_get(cfg, keys[i]);
        if (v && v->kind == PV_INT)
            g[i] = v->u.i;
        else
            rc = -1;
    }
    pv_decref(root);
    return rc;
}

int cli_check_adapter_base(const char *ckpt, const char *adapter)
{
    char rec[4096];
    if (!ckpt || !adapter)
        return 0;
    if (cli_adapter_base(adapter, rec, sizeof rec))
        return 1; /* unreadable: the error is printed */
    if (!rec[0] || strcmp(base_name(rec), NANO_FILE) || !strcmp(base_name(ckpt), NANO_FILE) ||
        same_file(ckpt, rec))
        return 0;
    /* the nano base: where it was when trained, else where it is installed */
    char nano[4096];
    const char *use = rec;
    if (access(rec, R_OK) &&
        nd_base_file_path(NANO_FILE, "NEEDLE_BASE_CHECKPOINT", nano, sizeof nano) == 0)
        use = nano;
    /* a checkpoint here of the nano geometry (a copy, a full fine-tune of
     * it): the adapter fits; only one that differs or must be fetched is
     * refused */
    int64_t gc[4], gn[4];
    if (!access(ckpt, R_OK) &&
        (geometry(use, gn) || (!geometry(ckpt, gc) && !memcmp(gc, gn, sizeof gc))))
        return 0;
    fprintf(stderr,
            "needle build: %s was trained on the built-in nano base (%s), not on %s: its LoRA "
            "weights fit the nano model only. Build it with:\n"
            "  needle build %s --lora %s\n"
            "(or `needle build --lora %s`, which takes the base the adapter records)\n",
            adapter, rec, ckpt, use, adapter, adapter);
    if (use == rec && access(rec, R_OK))
        fprintf(stderr,
                "needle build: %s cannot be read now; the nano base comes with needle "
                "(NEEDLE_BASE_CHECKPOINT names another copy)\n",
                rec);
    return 1;
}
