/* fake_nccl.c must refuse host memory as real NCCL would (check.sh builds
 * and runs this against the stand-in libnccl): an all-reduce of malloc'd
 * floats is invalid_argument with a message naming it, not a silent sum.
 * Usage: nccl_strict LIBNCCL. Exit 0 when refused, 1 otherwise. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: nccl_strict LIBNCCL\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    int (*all_reduce)(const void *, void *, size_t, int, int, void *, void *);
    if (!lib || !(*(void **)&all_reduce = dlsym(lib, "ncclAllReduce"))) {
        fprintf(stderr, "nccl_strict: %s\n", dlerror());
        return 2;
    }
    /* a communicator as ncclCommInitRank makes one (rank 0 of 1); the
     * refusal comes before any MPI call */
    void *comm = calloc(1, 64);
    float *host = calloc(1024, sizeof *host);
    if (!comm || !host)
        return 2;
    int e = all_reduce(host, host, 1024, 7 /* float */, 0 /* sum */, comm, NULL);
    free(host);
    free(comm);
    if (e != 4) {
        fprintf(stderr,
                "nccl_strict: an all-reduce of host memory returned %d, not "
                "invalid_argument (4)\n",
                e);
        return 1;
    }
    printf("nccl_strict: host memory refused\n");
    return 0;
}
