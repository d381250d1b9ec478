/* A stand-in libnccl.so.2 for tests on a machine without GPUs (with the
 * CUDA plugin built on the emulator, tools/cuda_emu): the few calls
 * src/dist/nccl.c makes, with the all-reduce done by the process's own MPI
 * (MPI_Allreduce, found in the libmpi src/dist loaded).
 *
 * What it checks, honestly: that needle loads NCCL at run time; that rank
 * 0's ncclUniqueId reaches every rank (each rank compares the id it was
 * given with rank 0's actual one, which carries rank 0's pid and a random
 * tag) and that ranks and size match MPI's; that the gradient buffer goes
 * through ncclAllReduce (float, sum, in place) once a step, and that the
 * trainer applies what comes back; that the buffer is device memory, as
 * NCCL needs (cudaMalloc memory, which the emulator keeps closed to host
 * code): host memory is refused with invalid_argument and a message, as
 * real NCCL fails on it (tools/cuda_emu/nccl_strict.c checks that).
 * FAKE_NCCL_LOG=FILE: each rank appends "rank R size N calls C floats F"
 * at ncclCommDestroy. What it does not check: anything of NCCL itself
 * (its rings and trees, its streams, GPU memory): tools/gpu_mpi_check.sh
 * runs the real one on GPUs. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    char internal[128];
} ncclUniqueId;

enum { ok = 0, system_error = 2, internal_error = 3, invalid_argument = 4, invalid_usage = 5 };

struct comm {
    int rank, size;
    long calls;
    size_t floats;
};

static ncclUniqueId made; /* the id this process handed out (rank 0) */

/* the process's MPI, Open MPI or MPICH */
static void *ompi_world, *ompi_float, *ompi_byte, *ompi_sum;
static int (*p_rank)(void *, int *), (*p_size)(void *, int *);
static int (*p_allgather)(const void *, int, void *, void *, int, void *, void *);
static int (*p_allreduce)(const void *, void *, int, void *, void *, void *);
static int (*m_rank)(int, int *), (*m_size)(int, int *);
static int (*m_allgather)(const void *, int, int, void *, int, int, int);
static int (*m_allreduce)(const void *, void *, int, int, int, int);

static int find_mpi(void)
{
    ompi_world = dlsym(RTLD_DEFAULT, "ompi_mpi_comm_world");
    if (ompi_world) {
        ompi_float = dlsym(RTLD_DEFAULT, "ompi_mpi_float");
        ompi_byte = dlsym(RTLD_DEFAULT, "ompi_mpi_byte");
        ompi_sum = dlsym(RTLD_DEFAULT, "ompi_mpi_op_sum");
        *(void **)&p_rank = dlsym(RTLD_DEFAULT, "MPI_Comm_rank");
        *(void **)&p_size = dlsym(RTLD_DEFAULT, "MPI_Comm_size");
        *(void **)&p_allgather = dlsym(RTLD_DEFAULT, "MPI_Allgather");
        *(void **)&p_allreduce = dlsym(RTLD_DEFAULT, "MPI_Allreduce");
        return ompi_float && ompi_byte && ompi_sum && p_rank && p_size && p_allgather &&
               p_allreduce;
    }
    *(void **)&m_rank = dlsym(RTLD_DEFAULT, "MPI_Comm_rank");
    *(void **)&m_size = dlsym(RTLD_DEFAULT, "MPI_Comm_size");
    *(void **)&m_allgather = dlsym(RTLD_DEFAULT, "MPI_Allgather");
    *(void **)&m_allreduce = dlsym(RTLD_DEFAULT, "MPI_Allreduce");
    return m_rank && m_size && m_allgather && m_allreduce;
}
#define MPICH_WORLD 0x44000000
#define MPICH_FLOAT 0x4c00040a
#define MPICH_BYTE 0x4c00010d
#define MPICH_SUM 0x58000003

int ncclGetVersion(int *v)
{
    *v = 0; /* "NCCL 0.0.0": no real NCCL */
    return ok;
}

const char *ncclGetErrorString(int e)
{
    return e == invalid_argument ? "fake NCCL: invalid argument"
           : e == invalid_usage  ? "fake NCCL: invalid usage"
                                 : "fake NCCL: error";
}

int ncclGetUniqueId(ncclUniqueId *id)
{
    memset(&made, 0, sizeof made);
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    snprintf(made.internal, sizeof made.internal, "fake-nccl pid %ld tag %d", (long)getpid(),
             rand());
    *id = made;
    return ok;
}

int ncclCommInitRank(void **out, int n, ncclUniqueId id, int rank)
{
    *out = NULL;
    if (!find_mpi()) {
        fprintf(stderr, "fake NCCL: no MPI in this process\n");
        return system_error;
    }
    int me = -1, size = -1;
    if (ompi_world) {
        p_rank(ompi_world, &me);
        p_size(ompi_world, &size);
    } else {
        m_rank(MPICH_WORLD, &me);
        m_size(MPICH_WORLD, &size);
    }
    if (me != rank || size != n) {
        fprintf(stderr, "fake NCCL: rank %d of %d, but MPI says %d of %d\n", rank, n, me, size);
        return invalid_argument;
    }
    /* rank 0 sends the id it made; every rank compares what it was given */
    ncclUniqueId *all = calloc((size_t)n, sizeof *all);
    if (!all)
        return system_error;
    ncclUniqueId mine = rank == 0 ? made : id;
    int e = ompi_world ? p_allgather(&mine, 128, ompi_byte, all, 128, ompi_byte, ompi_world)
                       : m_allgather(&mine, 128, MPICH_BYTE, all, 128, MPICH_BYTE, MPICH_WORLD);
    int bad =
        e || strncmp(all[0].internal, "fake-nccl pid ", 14) || memcmp(&id, &all[0], sizeof id);
    free(all);
    if (bad) {
        fprintf(stderr, "fake NCCL: rank %d was not given rank 0's unique id\n", rank);
        return invalid_usage;
    }
    struct comm *c = calloc(1, sizeof *c);
    if (!c)
        return system_error;
    c->rank = rank;
    c->size = n;
    *out = c;
    return ok;
}

/* Whether [lo, hi) is all device memory as the emulator keeps it: mapped,
 * and closed to the host (no access) in /proc/self/maps. Host memory
 * (malloc, the stack, pinned host memory) is readable there. */
static int device_pages(uintptr_t lo, uintptr_t hi)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return 0;
    char line[512];
    uintptr_t at = lo;
    int ok_so_far = 1;
    while (ok_so_far && at < hi && fgets(line, sizeof line, f)) {
        unsigned long a, b;
        char perm[5];
        if (sscanf(line, "%lx-%lx %4s", &a, &b, perm) != 3 || b <= at)
            continue;
        if (a > at) /* a hole: unmapped */
            break;
        ok_so_far = !strncmp(perm, "---", 3);
        at = b;
    }
    fclose(f);
    return ok_so_far && at >= hi;
}

int ncclAllReduce(const void *send, void *recv, size_t count, int type, int op, void *comm,
                  void *stream)
{
    (void)stream;
    struct comm *c = comm;
    if (!c || type != 7 || op != 0) {
        fprintf(stderr, "fake NCCL: only float sums (type %d, op %d)\n", type, op);
        return invalid_argument;
    }
    /* NCCL sums device memory; under the emulator that is cudaMalloc
     * memory, closed to host code (PROT_NONE) outside its stream work.
     * Host memory here is the caller's bug, as with real NCCL: refused.
     * NCCL itself runs on the device: open the pages for the sum, close
     * them after. */
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)recv & ~(uintptr_t)(pg - 1);
    uintptr_t hi =
        ((uintptr_t)recv + count * sizeof(float) + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
    if (send != recv) {
        fprintf(stderr, "fake NCCL: only in-place sums (send %p, recv %p)\n", send, recv);
        return invalid_argument;
    }
    if (count && !device_pages(lo, hi)) {
        fprintf(stderr,
                "fake NCCL: ncclAllReduce of %zu floats at %p: not device memory (the host "
                "can address it); NCCL needs cudaMalloc memory\n",
                count, recv);
        return invalid_argument;
    }
    if (count && mprotect((void *)lo, hi - lo, PROT_READ | PROT_WRITE))
        return system_error;
    for (size_t at = 0; at < count;) {
        int k = count - at > INT_MAX ? INT_MAX : (int)(count - at);
        float *r = (float *)recv + at;
        const void *s = ompi_world ? (void *)1 : (void *)-1; /* MPI_IN_PLACE */
        int e = ompi_world ? p_allreduce(s, r, k, ompi_float, ompi_sum, ompi_world)
                           : m_allreduce(s, r, k, MPICH_FLOAT, MPICH_SUM, MPICH_WORLD);
        if (e)
            return internal_error;
        at += (size_t)k;
    }
    if (count && mprotect((void *)lo, hi - lo, PROT_NONE))
        return system_error;
    c->calls++;
    c->floats = count;
    return ok;
}

int ncclCommDestroy(void *comm)
{
    struct comm *c = comm;
    const char *log = getenv("FAKE_NCCL_LOG");
    FILE *f = log && *log ? fopen(log, "a") : NULL;
    if (f) {
        fprintf(f, "rank %d size %d calls %ld floats %zu\n", c->rank, c->size, c->calls, c->floats);
        fclose(f);
    }
    free(c);
    return ok;
}
