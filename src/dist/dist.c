/* MPI loaded at run time (dist/dist.h). */
#define _POSIX_C_SOURCE 200809L
#include "dist/dist.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "dist/dist_internal.h"

/* The launcher's world size, or 0 when no MPI launcher started us. */
static int launcher_size(void)
{
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v)
            return atoi(v);
    }
    return 0;
}

static void *sym(nd_dist *d, const char *name, int *missing)
{
    void *p = dlsym(d->lib, name);
    if (!p && !*missing) {
        *missing = 1;
        nd_error(ND_EUNSUPPORTED, "%s: no %s", d->impl, name);
    }
    return p;
}

#define LOAD(field, name) *(void **)(&d->field) = sym(d, name, &missing)

static int load(nd_dist *d)
{
    /* RTLD_GLOBAL: Open MPI's components resolve their symbols in libmpi */
    const char *names[] = {"libmpi.so.40", "libmpi.so.12", "libmpi.so", "libmpich.so.12",
                           "libmpich.so"};
    const char *err = "", *libname = "";
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !d->lib; i++) {
        d->lib = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
        if (d->lib)
            libname = names[i];
        else if (i == 0)
            err = dlerror();
    }
    snprintf(d->impl, sizeof d->impl, "%s", libname);
    if (!d->lib)
        return nd_error(ND_EUNSUPPORTED,
                        "started by an MPI launcher with %d ranks, but no MPI library loads "
                        "(libmpi.so.40, libmpi.so.12, libmpi.so, libmpich.so: %s); install Open "
                        "MPI (Debian: openmpi-bin libopenmpi-dev) or MPICH, or put its lib "
                        "directory on LD_LIBRARY_PATH",
                        launcher_size(), err);
    int missing = 0;
    d->o_world = dlsym(d->lib, "ompi_mpi_comm_world");
    d->ompi = d->o_world != NULL;
    LOAD(init, "MPI_Init");
    LOAD(finalize, "MPI_Finalize");
    if (d->ompi) {
        d->o_float = sym(d, "ompi_mpi_float", &missing);
        d->o_byte = sym(d, "ompi_mpi_byte", &missing);
        LOAD(o_rank, "MPI_Comm_rank");
        LOAD(o_size, "MPI_Comm_size");
        LOAD(o_alltoallv, "MPI_Alltoallv");
        LOAD(o_allgatherv, "MPI_Allgatherv");
        LOAD(o_allgather, "MPI_Allgather");
        LOAD(o_abort, "MPI_Abort");
    } else {
        LOAD(m_rank, "MPI_Comm_rank");
        LOAD(m_size, "MPI_Comm_size");
        LOAD(m_alltoallv, "MPI_Alltoallv");
        LOAD(m_allgatherv, "MPI_Allgatherv");
        LOAD(m_allgather, "MPI_Allgather");
        LOAD(m_abort, "MPI_Abort");
    }
    if (missing)
        return ND_EUNSUPPORTED;
    snprintf(d->impl, sizeof d->impl, "%s (%s)", d->ompi ? "Open MPI" : "MPICH", libname);
    return ND_OK;
}

int nd_dist_open(nd_dist **out)
{
    *out = NULL;
    int n = launcher_size();
    if (n <= 1)
        return ND_OK;
    nd_dist *d = calloc(1, sizeof *d);
    if (!d)
        return nd_error(ND_ENOMEM, "out of memory");
    int rc = load(d);
    if (!rc && d->init(NULL, NULL))
        rc = nd_error(ND_EIO, "MPI_Init failed");
    if (!rc) {
        int e = d->ompi ? d->o_rank(d->o_world, &d->rank) || d->o_size(d->o_world, &d->size)
                        : d->m_rank(MPICH_COMM_WORLD, &d->rank) ||
                              d->m_size(MPICH_COMM_WORLD, &d->size);
        if (e)
            rc = nd_error(ND_EIO, "MPI_Comm_rank/size failed");
    }
    size_t nn = d->size > 0 ? (size_t)d->size : 1;
    if (!rc) {
        d->counts = calloc(nn, sizeof(int));
        d->displs = calloc(nn, sizeof(int));
        d->rcounts = calloc(nn, sizeof(int));
        d->rdispls = calloc(nn, sizeof(int));
        if (!d->counts || !d->displs || !d->rcounts || !d->rdispls)
            rc = nd_error(ND_ENOMEM, "out of memory");
    }
    if (rc) {
        nd_dist_close(d);
        return rc;
    }
    *out = d;
    return ND_OK;
}

int nd_dist_rank(const nd_dist *d)
{
    return d ? d->rank : 0;
}
int nd_dist_size(const nd_dist *d)
{
    return d ? d->size : 1;
}
const char *nd_dist_impl(const nd_dist *d)
{
    return d ? d->impl : "none";
}

int nd_dist_sum(nd_dist *d, float *buf, size_t n)
{
    int N = d->size, me = d->rank;
    if (n > (size_t)0x7fffffff)
        return nd_error(ND_ELIMIT, "%zu floats to sum in one exchange (2^31 at most)", n);
    /* slice j: [n*j/N, n*(j+1)/N) */
    for (int j = 0; j < N; j++) {
        size_t a = n * (size_t)j / (size_t)N, b = n * (size_t)(j + 1) / (size_t)N;
        d->counts[j] = (int)(b - a);
        d->displs[j] = (int)a;
    }
    size_t mine = (size_t)d->counts[me], need = mine * (size_t)N + mine;
    if (need > d->scratch_n) {
        float *s = realloc(d->scratch, sizeof *s * (need ? need : 1));
        if (!s)
            return nd_error(ND_ENOMEM, "out of memory for the gradient exchange");
        d->scratch = s;
        d->scratch_n = need;
    }
    for (int i = 0; i < N; i++) {
        d->rcounts[i] = (int)mine;
        d->rdispls[i] = (int)mine * i;
    }
    float *got = d->scratch, *sum = d->scratch + mine * (size_t)N;
    int e = d->ompi ? d->o_alltoallv(buf, d->counts, d->displs, d->o_float, got, d->rcounts,
                                     d->rdispls, d->o_float, d->o_world)
                    : d->m_alltoallv(buf, d->counts, d->displs, MPICH_FLOAT, got, d->rcounts,
                                     d->rdispls, MPICH_FLOAT, MPICH_COMM_WORLD);
    if (e)
        return nd_error(ND_EIO, "MPI_Alltoallv failed (%d)", e);
    /* rank order, whatever order the messages came in */
    for (size_t k = 0; k < mine; k++) {
        float s = got[k];
        for (int i = 1; i < N; i++)
            s += got[mine * (size_t)i + k];
        sum[k] = s;
    }
    e = d->ompi ? d->o_allgatherv(sum, (int)mine, d->o_float, buf, d->counts, d->displs, d->o_float,
                                  d->o_world)
                : d->m_allgatherv(sum, (int)mine, MPICH_FLOAT, buf, d->counts, d->displs,
                                  MPICH_FLOAT, MPICH_COMM_WORLD);
    if (e)
        return nd_error(ND_EIO, "MPI_Allgatherv failed (%d)", e);
    return ND_OK;
}

int nd_dist_gather_u64(nd_dist *d, const uint64_t *mine, int k, uint64_t *all)
{
    int bytes = k * (int)sizeof(uint64_t);
    int e = d->ompi
                ? d->o_allgather(mine, bytes, d->o_byte, all, bytes, d->o_byte, d->o_world)
                : d->m_allgather(mine, bytes, MPICH_BYTE, all, bytes, MPICH_BYTE, MPICH_COMM_WORLD);
    return e ? nd_error(ND_EIO, "MPI_Allgather failed (%d)", e) : ND_OK;
}

void nd_dist_set_shared(nd_dist *d, int shared)
{
    if (d)
        d->shared = shared;
}

int nd_dist_shared(const nd_dist *d)
{
    return d ? d->shared : 0;
}

void nd_dist_abort(nd_dist *d, int code)
{
    if (!d || !d->lib)
        return;
    fflush(stdout);
    fflush(stderr);
    if (d->ompi)
        d->o_abort(d->o_world, code);
    else
        d->m_abort(MPICH_COMM_WORLD, code);
}

void nd_dist_close(nd_dist *d)
{
    if (!d)
        return;
    nd_dist_nccl_close(d); /* before MPI goes */
    if (d->lib && d->finalize && d->size > 0)
        d->finalize();
    /* libmpi stays loaded: its components and atexit handlers refer to it */
    free(d->scratch);
    free(d->counts);
    free(d->displs);
    free(d->rcounts);
    free(d->rdispls);
    free(d);
}
