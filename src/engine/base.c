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
#include "engine/base.h"
#include "needle.h"

#define BASE_FILE "needle-nano.cact"

#ifndef NEEDLE_DATADIR
#define NEEDLE_DATADIR "/usr/local/share/needle"
#endif

int nd_base_file_path(const char *file, const char *env_name, char *buf, size_t n)
{
    char dir[3072], cand[3][4096];
    int nc = 0;
    const char *env = env_name ? getenv(env_name) : NULL;
    if (env && *env) {
        /* an explicit choice is never second-guessed */
        if (access(env, R_OK))
            return nd_error(ND_EIO, "%s=%s: cannot read the file", env_name, env);
        snprintf(buf, n, "%s", env);
        return strlen(env) < n ? ND_OK : nd_error(ND_EARG, "%s: path too long", env_name);
    }
    nd_image_dir(dir, sizeof dir);
    if (dir[0]) {
        snprintf(cand[nc++], sizeof cand[0], "%s/%s", dir, file);
        snprintf(cand[nc++], sizeof cand[0], "%s/../share/needle/%s", dir, file);
    }
    snprintf(cand[nc++], sizeof cand[0], "%s/%s", NEEDLE_DATADIR, file);
    char tried[3 * 4096 + 8] = "";
    for (int i = 0; i < nc; i++) {
        if (!access(cand[i], R_OK)) {
            snprintf(buf, n, "%s", cand[i]);
            return strlen(cand[i]) < n ? ND_OK : nd_error(ND_EARG, "%s: path too long", cand[i]);
        }
        size_t k = strlen(tried);
        snprintf(tried + k, sizeof tried - k, "%s%s", i ? ", " : "", cand[i]);
    }
    return nd_error(ND_EIO, "none of %.3000s exists", tried);
}

int needle_default_weights_path(char *buf, size_t n)
{
    int rc = nd_base_file_path(BASE_FILE, "NEEDLE_BASE_WEIGHTS", buf, n);
    const char *env = getenv("NEEDLE_BASE_WEIGHTS");
    if (rc == ND_EIO && !(env && *env))
        nd_error_prefix(rc, "no built-in base model (a .cact in NEEDLE_BASE_WEIGHTS, or load one; "
                            "the nano base is built from models/needle-nano.pkl)");
    return rc;
}

needle_model *needle_model_load_default(void)
{
    char path[4096];
    if (needle_default_weights_path(path, sizeof path))
        return NULL;
    return needle_model_load(path);
}
