#include "train/recommend.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "io/checkpoint.h"

static const struct {
    const char *key, *flag;
    int integer;
    double lo, hi; /* lr: (0, 1]; the rest: [lo, hi] */
} settings[ND_REC_N] = {
    [ND_REC_LR] = {"lr", "--lr", 0, 0, 1},
    [ND_REC_LORA_RANK] = {"lora_rank", "--lora-rank", 1, 1, 4096},
    [ND_REC_LORA_ALPHA] = {"lora_alpha", "--lora-alpha", 0, 0, 1e6},
    [ND_REC_EPOCHS] = {"epochs", "--epochs", 1, 1, 1000000},
    [ND_REC_BATCH_SIZE] = {"batch_size", "--batch-size", 1, 1, 65536},
};

const char *nd_recommend_key(int which)
{
    return settings[which].key;
}

const char *nd_recommend_flag(int which)
{
    return settings[which].flag;
}

static const char known[] = "lr, lora_rank, lora_alpha, epochs, batch_size";

/* a value in range for setting i, else a message in why */
static int valid_value(int i, double v, char *why, size_t n)
{
    if (!isfinite(v)) {
        snprintf(why, n, "not a finite number");
        return 0;
    }
    if (settings[i].integer) {
        if (v != floor(v) || v < settings[i].lo || v > settings[i].hi) {
            snprintf(why, n, "expected an integer in [%g, %g]", settings[i].lo, settings[i].hi);
            return 0;
        }
    } else if (!(v > settings[i].lo && v <= settings[i].hi)) {
        snprintf(why, n, "expected a number in (%g, %g]", settings[i].lo, settings[i].hi);
        return 0;
    }
    return 1;
}

static int find_key(const char *k, size_t len)
{
    for (int i = 0; i < ND_REC_N; i++)
        if (strlen(settings[i].key) == len && !strncmp(settings[i].key, k, len))
            return i;
    return -1;
}

int nd_recommend_parse(const char *spec, nd_recommend *r)
{
    memset(r, 0, sizeof *r);
    if (!spec || !*spec)
        return nd_error(ND_EARG, "--recommend: empty (expected KEY=VALUE,... with keys %s)", known);
    const char *p = spec;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (!eq)
            return nd_error(ND_EARG, "--recommend: '%.*s' is not KEY=VALUE (keys: %s)", (int)len, p,
                            known);
        int i = find_key(p, (size_t)(eq - p));
        if (i < 0)
            return nd_error(ND_EARG, "--recommend: unknown setting '%.*s' (known: %s)",
                            (int)(eq - p), p, known);
        if (r->has[i])
            return nd_error(ND_EARG, "--recommend: %s given twice", settings[i].key);
        char num[64], *stop;
        size_t vlen = len - (size_t)(eq + 1 - p);
        if (vlen == 0 || vlen >= sizeof num)
            return nd_error(ND_EARG, "--recommend %s: expected a number after '='",
                            settings[i].key);
        memcpy(num, eq + 1, vlen);
        num[vlen] = 0;
        errno = 0;
        double v = strtod(num, &stop);
        char why[96];
        if (*stop || errno)
            return nd_error(ND_EARG, "--recommend %s=%s: not a number", settings[i].key, num);
        if (!valid_value(i, v, why, sizeof why))
            return nd_error(ND_EARG, "--recommend %s=%s: %s", settings[i].key, num, why);
        r->has[i] = 1;
        r->value[i] = v;
        if (!end)
            break;
        p = end + 1;
    }
    return ND_OK;
}

int nd_recommend_from_tree(const pv *root, const char *what, nd_recommend *r)
{
    memset(r, 0, sizeof *r);
    const pv *rec = root && root->kind == PV_DICT ? pv_dict_get(root, ND_RECOMMEND_KEY) : NULL;
    if (!rec)
        return ND_OK;
    if (rec->kind != PV_DICT)
        return nd_error(ND_EFORMAT, "%s: %s is a %s, expected a dict", what, ND_RECOMMEND_KEY,
                        pv_kind_name(rec->kind));
    for (size_t k = 0; k < rec->u.dict.n; k++) {
        const pv *key = rec->u.dict.keys[k], *val = rec->u.dict.vals[k];
        int i = key->kind == PV_STR ? find_key(key->u.str.s, key->u.str.len) : -1;
        if (i < 0)
            return nd_error(ND_EFORMAT, "%s: %s: unknown setting %s (known: %s)", what,
                            ND_RECOMMEND_KEY, key->kind == PV_STR ? key->u.str.s : "(not a str)",
                            known);
        double v = val->kind == PV_INT ? (double)val->u.i : val->kind == PV_FLOAT ? val->u.f : NAN;
        char why[96];
        int ok = 0;
        if (val->kind == PV_INT || val->kind == PV_FLOAT)
            ok = valid_value(i, v, why, sizeof why);
        else
            snprintf(why, sizeof why, "a %s, not a number", pv_kind_name(val->kind));
        if (!ok)
            return nd_error(ND_EFORMAT, "%s: %s.%s: %s", what, ND_RECOMMEND_KEY, settings[i].key,
                            why);
        r->has[i] = 1;
        r->value[i] = v;
    }
    return ND_OK;
}

int nd_recommend_read(const char *path, nd_recommend *r)
{
    memset(r, 0, sizeof *r);
    pv *root = NULL;
    int rc = ckpt_file_load(path, &root);
    if (!rc)
        rc = nd_recommend_from_tree(root, path, r);
    pv_decref(root);
    return rc;
}

pv *nd_recommend_to_pv(const nd_recommend *r)
{
    pv *d = pv_dict();
    for (int i = 0; d && i < ND_REC_N; i++) {
        if (!r->has[i])
            continue;
        pv *v = settings[i].integer ? pv_int((int64_t)r->value[i]) : pv_float(r->value[i]);
        if (!v || pv_dict_set(d, settings[i].key, v)) {
            pv_decref(d);
            return NULL;
        }
    }
    return d;
}

int nd_recommend_count(const nd_recommend *r)
{
    int n = 0;
    for (int i = 0; i < ND_REC_N; i++)
        n += r->has[i] != 0;
    return n;
}
