/* The tuning switches (tuning.h): read from the environment here only. */
#include "core/tuning.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

/* An installed struct is never changed or freed: installing another
 * publishes a new copy, and the old ones stay on this list (reachable) so a
 * thread still reading one is safe. Copies are made only when the contents
 * change, so a process holds a handful at most. */
typedef struct snapshot {
    nd_tuning t;
    struct snapshot *older;
} snapshot;

static const nd_tuning unset; /* all switches unset */
static const nd_tuning *current = &unset;
static snapshot *installed;
static int pinned;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static int copy_var(const char *name, char *dst, size_t n)
{
    const char *v = getenv(name);
    dst[0] = 0;
    if (!v)
        return ND_OK;
    if (strlen(v) >= n)
        return nd_error(ND_EARG, "%s: the value is longer than %zu bytes", name, n - 1);
    memcpy(dst, v, strlen(v) + 1);
    return ND_OK;
}

/* set at all (even empty) */
static int is_set(const char *name)
{
    return getenv(name) != NULL;
}

/* set, not empty, not "0" */
static int is_on(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0");
}

int nd_tuning_from_env(nd_tuning *t)
{
    memset(t, 0, sizeof *t);
    t->no_vbmi = is_set("NEEDLE_NO_VBMI");
    t->float_path = is_on("NEEDLE_FLOAT");
    const char *dt = getenv("NEEDLE_DECODE_THREADS");
    t->decode_one_thread = dt && !strcmp(dt, "0");
    t->fwht_ref = is_set("NEEDLE_FWHT_REF");
    t->vulkan_software = is_on("NEEDLE_VULKAN_SOFTWARE");
    t->cuda_tf32 = is_on("NEEDLE_CUDA_TF32");
    t->vulkan_validate = is_on("NEEDLE_VULKAN_VALIDATE");
    struct {
        const char *name;
        char *dst;
        size_t n;
    } vars[] = {
        {"NEEDLE_QKERNEL", t->qkernel, sizeof t->qkernel},
        {"NEEDLE_ATT", t->att, sizeof t->att},
        {"NEEDLE_KV_WINDOW", t->kv_window, sizeof t->kv_window},
        {"NEEDLE_PREFIX_CACHE", t->prefix_cache, sizeof t->prefix_cache},
        {"NEEDLE_COPY_PRIOR", t->copy_prior, sizeof t->copy_prior},
        {"NEEDLE_CHOICE_PRIOR", t->choice_prior, sizeof t->choice_prior},
        {"NEEDLE_PLUGIN_DIR", t->plugin_dir, sizeof t->plugin_dir},
        {"NEEDLE_GPU_PROBE", t->gpu_probe, sizeof t->gpu_probe},
        {"NEEDLE_BACKEND_DECLINE", t->backend_decline, sizeof t->backend_decline},
        {"NEEDLE_ACT_BUDGET_MB", t->act_budget_mb, sizeof t->act_budget_mb},
        {"NEEDLE_LANE_EVERY", t->lane_every, sizeof t->lane_every},
        {"NEEDLE_LOGIT_ROWS", t->logit_rows, sizeof t->logit_rows},
        {"NEEDLE_HF_STALL_S", t->hf_stall_s, sizeof t->hf_stall_s},
        {"NEEDLE_NCCL", t->nccl, sizeof t->nccl},
        {"NEEDLE_CUDA_PRECISION", t->cuda_precision, sizeof t->cuda_precision},
    };
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        int rc = copy_var(vars[i].name, vars[i].dst, vars[i].n);
        if (rc) {
            memset(t, 0, sizeof *t);
            return rc;
        }
    }
    return ND_OK;
}

const nd_tuning *nd_tuning_get(void)
{
    return __atomic_load_n(&current, __ATOMIC_ACQUIRE);
}

/* under mu */
static int install(const nd_tuning *t)
{
    if (!memcmp(current, t, sizeof *t))
        return ND_OK;
    snapshot *s = malloc(sizeof *s);
    if (!s)
        return nd_error(ND_ENOMEM, "out of memory");
    memcpy(&s->t, t, sizeof *t);
    s->older = installed;
    installed = s;
    __atomic_store_n(&current, &s->t, __ATOMIC_RELEASE);
    return ND_OK;
}

int nd_tuning_use(const nd_tuning *t)
{
    pthread_mutex_lock(&mu);
    int rc = install(t);
    if (!rc)
        pinned = 1;
    pthread_mutex_unlock(&mu);
    return rc;
}

int nd_tuning_refresh(void)
{
    nd_tuning *t = malloc(sizeof *t); /* 10 KB: not on a caller's stack */
    if (!t)
        return nd_error(ND_ENOMEM, "out of memory");
    pthread_mutex_lock(&mu);
    int rc = ND_OK;
    if (!pinned) {
        rc = nd_tuning_from_env(t);
        if (!rc)
            rc = install(t);
    }
    pthread_mutex_unlock(&mu);
    free(t);
    return rc;
}
