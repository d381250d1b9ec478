/* The MPI world behind dist/dist.h, shared by dist.c (MPI) and nccl.c
 * (NCCL on GPU memory). */
#ifndef ND_DIST_INTERNAL_H
#define ND_DIST_INTERNAL_H

#include "backend/backend.h"
#include "dist/dist.h"

typedef struct nd_nccl nd_nccl;

/* The two ABIs: Open MPI's handles are pointers to objects the library
 * exports, MPICH's are int constants from its mpi.h. */
typedef void *ompi_h;
typedef int mpich_h;
#define MPICH_COMM_WORLD 0x44000000
#define MPICH_FLOAT 0x4c00040a
#define MPICH_BYTE 0x4c00010d

struct nd_dist {
    void *lib;
    int ompi; /* 1: Open MPI, 0: MPICH */
    int rank, size, shared;
    char impl[160];
    /* handles as the library wants them */
    ompi_h o_world, o_float, o_byte;
    int (*init)(int *, char ***);
    int (*finalize)(void);
    int (*o_rank)(ompi_h, int *), (*m_rank)(mpich_h, int *);
    int (*o_size)(ompi_h, int *), (*m_size)(mpich_h, int *);
    int (*o_alltoallv)(const void *, const int *, const int *, ompi_h, void *, const int *,
                       const int *, ompi_h, ompi_h);
    int (*m_alltoallv)(const void *, const int *, const int *, mpich_h, void *, const int *,
                       const int *, mpich_h, mpich_h);
    int (*o_allgatherv)(const void *, int, ompi_h, void *, const int *, const int *, ompi_h,
                        ompi_h);
    int (*m_allgatherv)(const void *, int, mpich_h, void *, const int *, const int *, mpich_h,
                        mpich_h);
    int (*o_allgather)(const void *, int, ompi_h, void *, int, ompi_h, ompi_h);
    int (*m_allgather)(const void *, int, mpich_h, void *, int, mpich_h, mpich_h);
    int (*o_abort)(ompi_h, int), (*m_abort)(mpich_h, int);
    /* nd_dist_sum's scratch */
    float *scratch;
    size_t scratch_n;
    int *counts, *displs, *rcounts, *rdispls;
    /* the GPU path (nccl.c): NULL when the gradients are summed by MPI */
    nd_nccl *nccl;
    const nd_backend *nccl_be;
    char device_why[200]; /* why not NCCL, for the distributed line */
};

/* ncclCommDestroy; nothing when NCCL is not in use */
void nd_dist_nccl_close(nd_dist *d);

#endif
