/* The base checkpoint when a command is given none: upstream's
 * checkpoints/needle2.pkl when it is here; else the nano base installed
 * with the program (needle-nano.pkl and its tokenizer.model, looked up as
 * the built-in .cact is: src/engine/base.c), said in the first lines; else
 * needle2 again, which the caller then downloads as upstream does. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "engine/base.h"
#include "io/pickle.h"

#define NANO_CHECKPOINT "needle-nano.pkl"

/* why the nano base was not found, for the error when needle2 fails too */
static char nano_missing[1024];
static const char *base_flag = "--checkpoint PATH";

const char *cli_default_base(FILE *say, const char *flag, char *buf, size_t n)
{
    nano_missing[0] = 0;
    base_flag = flag;
    if (access(CLI_NEEDLE2_CHECKPOINT, F_OK) == 0) {
        snprintf(buf, n, "%s", CLI_NEEDLE2_CHECKPOINT);
        return buf;
    }
    if (nd_base_file_path(NANO_CHECKPOINT, "NEEDLE_BASE_CHECKPOINT", buf, n) == ND_OK) {
        fprintf(say, "  %-9s %s  the built-in nano base (%s is not here)\n", "base", buf,
                CLI_NEEDLE2_CHECKPOINT);
        fprintf(say,
                "  %-9s the real needle2: `needle download "
                "Cactus-Compute/needle2/checkpoints/needle2.pkl`, or %s\n",
                "", flag);
        fflush(say);
        return buf;
    }
    snprintf(nano_missing, sizeof nano_missing, "%s", nd_last_error());
    snprintf(buf, n, "%s", CLI_NEEDLE2_CHECKPOINT);
    return buf;
}

void cli_default_base_hint(void)
{
    if (nano_missing[0])
        fprintf(stderr,
                "needle: no nano base to fall back on either (%s): pass %s, or install "
                "needle (make install) or set NEEDLE_BASE_CHECKPOINT\n",
                nano_missing, base_flag);
}

int cli_adapter_base(const char *adapter, char *buf, size_t n)
{
    buf[0] = 0;
    pv *ad = NULL;
    if (ckpt_file_load(adapter, &ad))
        return cli_fail(NULL);
    const pv *st = ad->kind == PV_DICT ? pv_dict_get(ad, "needle_c_state") : NULL;
    const pv *base = st && st->kind == PV_DICT ? pv_dict_get(st, "base_checkpoint") : NULL;
    if (base && base->kind == PV_STR)
        snprintf(buf, n, "%s", base->u.str.s);
    pv_decref(ad);
    return 0;
}
