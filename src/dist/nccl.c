/* NCCL loaded at run time: the gradient sum on GPU memory (dist/dist.h). */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tuning.h"
#include "dist/dist.h"
#include "dist/dist_internal.h"

/* nccl.h's ABI (stable since NCCL 2.0): a 128-byte id, enums as ints */
#define NCCL_ID_BYTES 128
#define NCCL_FLOAT 7
#define NCCL_SUM 0
typedef struct {
    char internal[NCCL_ID_BYTES];
} nccl_id;

struct nd_nccl {
    void *lib;
    void *comm;
    char impl[96];
    int (*get_version)(int *);
    int (*get_unique_id)(nccl_id *);
    int (*comm_init_rank)(void **, int, nccl_id, int);
    int (*all_reduce)(const void *, void *, size_t, int, int, void *, void *);
    int (*comm_destroy)(void *);
    const char *(*error_string)(int);
};

static const char *nccl_err(const nd_nccl *x, int e)
{
    return x->error_string ? x->error_string(e) : "error";
}

/* libnccl (NEEDLE_NCCL names another file, e.g. a test's stand-in; "0"
 * turns NCCL off): 0, or -1 with why */
static int nccl_load(nd_nccl *x, char *why, size_t whylen)
{
    const char *env = nd_tuning_get()->nccl;
    const char *names[] = {env && *env ? env : "libnccl.so.2", "libnccl.so"};
    const char *err = "";
    for (int i = 0; i < (env && *env ? 1 : 2) && !x->lib; i++) {
        x->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!x->lib && i == 0)
            err = dlerror();
    }
    if (!x->lib) {
        snprintf(why, whylen, "no libnccl (%s)", err ? err : "");
        return -1;
    }
    *(void **)&x->get_version = dlsym(x->lib, "ncclGetVersion");
    *(void **)&x->get_unique_id = dlsym(x->lib, "ncclGetUniqueId");
    *(void **)&x->comm_init_rank = dlsym(x->lib, "ncclCommInitRank");
    *(void **)&x->all_reduce = dlsym(x->lib, "ncclAllReduce");
    *(void **)&x->comm_destroy = dlsym(x->lib, "ncclCommDestroy");
    *(void **)&x->error_string = dlsym(x->lib, "ncclGetErrorString");
    if (!x->get_version || !x->get_unique_id || !x->comm_init_rank || !x->all_reduce ||
        !x->comm_destroy) {
        snprintf(why, whylen, "libnccl lacks ncclAllReduce or ncclCommInitRank");
        return -1;
    }
    int v = 0;
    x->get_version(&v);
    /* NCCL_VERSION(X,Y,Z): X*1000+Y*100+Z before 2.9, X*10000+Y*100+Z since */
    int major = v >= 10000 ? v / 10000 : v / 1000,
        minor = v >= 10000 ? v / 100 % 100 : v / 100 % 10;
    snprintf(x->impl, sizeof x->impl, "NCCL %d.%d.%d", major, minor, v % 100);
    return 0;
}

int nd_dist_device_open(nd_dist *d, const nd_backend *be)
{
    if (!d || d->nccl || !be || !be->device || strcmp(be->name, "cuda"))
        return ND_OK;
    const char *env = nd_tuning_get()->nccl;
    char why[200] = "";
    nd_nccl *x = calloc(1, sizeof *x);
    if (!x)
        return nd_error(ND_ENOMEM, "out of memory");
    int ok = 0;
    if (env && !strcmp(env, "0"))
        snprintf(why, sizeof why, "NEEDLE_NCCL=0");
    else
        ok = !nccl_load(x, why, sizeof why);
    /* every rank or none: a rank without NCCL would never join the others' */
    uint64_t mine = (uint64_t)ok, *all = calloc((size_t)d->size, sizeof *all);
    if (!all) {
        free(x);
        return nd_error(ND_ENOMEM, "out of memory");
    }
    int rc = nd_dist_gather_u64(d, &mine, 1, all);
    int first_without = -1;
    for (int i = 0; !rc && i < d->size; i++)
        if (!all[i] && first_without < 0)
            first_without = i;
    free(all);
    if (rc || first_without >= 0) {
        if (!rc && first_without != d->rank)
            snprintf(why, sizeof why, "rank %d has no NCCL", first_without);
        snprintf(d->device_why, sizeof d->device_why, "%s", why);
        free(x); /* libnccl stays loaded: unloading a CUDA library is asking for trouble */
        return rc;
    }
    /* rank 0's id to every rank, over MPI */
    nccl_id id;
    memset(&id, 0, sizeof id);
    int e = d->rank == 0 ? x->get_unique_id(&id) : 0;
    uint64_t flag = (uint64_t)(e != 0), *flags = calloc((size_t)d->size, sizeof *flags);
    uint64_t *ids = calloc((size_t)d->size * (NCCL_ID_BYTES / 8), sizeof *ids);
    if (!flags || !ids) {
        free(flags);
        free(ids);
        free(x);
        return nd_error(ND_ENOMEM, "out of memory");
    }
    if (!(rc = nd_dist_gather_u64(d, &flag, 1, flags)) && flags[0])
        rc = nd_error(ND_EIO, "ncclGetUniqueId failed on rank 0 (%s)", nccl_err(x, (int)flags[0]));
    if (!rc) {
        uint64_t words[NCCL_ID_BYTES / 8];
        memcpy(words, &id, sizeof id);
        rc = nd_dist_gather_u64(d, words, NCCL_ID_BYTES / 8, ids);
        memcpy(&id, ids, sizeof id); /* rank 0's */
    }
    free(flags);
    free(ids);
    if (rc) {
        free(x);
        return rc;
    }
    /* on this thread's current device: the CUDA plugin's (device = local rank) */
    if ((e = x->comm_init_rank(&x->comm, d->size, id, d->rank))) {
        rc = nd_error(ND_EIO, "rank %d: ncclCommInitRank failed: %s", d->rank, nccl_err(x, e));
        free(x);
        return rc;
    }
    d->nccl = x;
    d->nccl_be = be;
    return ND_OK;
}

const char *nd_dist_device_impl(const nd_dist *d)
{
    return d && d->nccl ? d->nccl->impl : NULL;
}

const char *nd_dist_device_why(const nd_dist *d)
{
    return d && d->device_why[0] ? d->device_why : NULL;
}

int nd_dist_sum_device(nd_dist *d, float *buf, size_t n)
{
    if (!d->nccl)
        return nd_dist_sum(d, buf, n);
    nd_nccl *x = d->nccl;
    /* the device is idle (the step's ops were synced); in place, on NCCL's
     * default stream; the backend's sync waits for the whole device */
    int e = x->all_reduce(buf, buf, n, NCCL_FLOAT, NCCL_SUM, x->comm, NULL);
    if (e)
        return nd_error(ND_EIO, "rank %d: ncclAllReduce of %zu floats failed: %s", d->rank, n,
                        nccl_err(x, e));
    nd_backend_sync(d->nccl_be);
    return ND_OK;
}

void nd_dist_nccl_close(nd_dist *d)
{
    if (!d->nccl)
        return;
    if (d->nccl->comm)
        d->nccl->comm_destroy(d->nccl->comm);
    free(d->nccl);
    d->nccl = NULL;
}
