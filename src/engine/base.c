/* The built-in base model, as upstream's engine has one: `Needle(tools)`
 * with no weights file answers with the base. Ours is the nano base
 * (models/needle-nano.pkl built to needle-nano.cact), looked up beside the
 * library or program, then in the installed data directory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/selfpath.h"
#include "core/status.h"
#include "needle.h"

#define BASE_FILE "needle-nano.cact"

#ifndef NEEDLE_DATADIR
#define NEEDLE_DATADIR "/usr/local/share/needle"
#endif

int needle_default_weights_path(char *buf, size_t n)
{
    char dir[3072], cand[3][4096];
    int nc = 0;
    const char *env = getenv("NEEDLE_BASE_WEIGHTS");
    if (env && *env) {
        /* an explicit choice is never second-guessed */
        if (access(env, R_OK)) {
            nd_error(ND_EIO, "NEEDLE_BASE_WEIGHTS=%s: cannot read the file", env);
            return NEEDLE_EIO;
        }
        snprintf(buf, n, "%s", env);
        return strlen(env) < n ? NEEDLE_OK : NEEDLE_EARG;
    }
    nd_image_dir(dir, sizeof dir);
    if (dir[0]) {
        snprintf(cand[nc++], sizeof cand[0], "%s/%s", dir, BASE_FILE);
        snprintf(cand[nc++], sizeof cand[0], "%s/../share/needle/%s", dir, BASE_FILE);
    }
    snprintf(cand[nc++], sizeof cand[0], "%s/%s", NEEDLE_DATADIR, BASE_FILE);
    char tried[3 * 4096 + 8] = "";
    for (int i = 0; i < nc; i++) {
        if (!access(cand[i], R_OK)) {
            snprintf(buf, n, "%s", cand[i]);
            return strlen(cand[i]) < n ? NEEDLE_OK : NEEDLE_EARG;
        }
        size_t k = strlen(tried);
        snprintf(tried + k, sizeof tried - k, "%s%s", i ? ", " : "", cand[i]);
    }
    nd_error(ND_EIO,
             "no built-in base model: none of %.3000s exists (set NEEDLE_BASE_WEIGHTS to a .cact, "
             "or load one; the nano base is built from models/needle-nano.pkl)",
             tried);
    return NEEDLE_EIO;
}

needle_model *needle_model_load_default(void)
{
    char path[4096];
    if (needle_default_weights_path(path, sizeof path))
        return NULL;
    return needle_model_load(path);
}
