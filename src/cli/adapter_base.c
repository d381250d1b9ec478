/* `needle build CKPT --lora ADAPTER` with an adapter trained on the nano
 * base: say so, with the command that builds it, before CKPT is fetched
 * (needle2.pkl is often not here, and the download would only lead to a
 * shape error). */
#define _DEFAULT_SOURCE
#define _POSIX_C_SOURCE 200809L
#include "cli/adapter_base.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "engine/base.h"

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
