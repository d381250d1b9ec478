/* Data-parallel training across processes: MPI, loaded at run time.
 *
 * `mpirun -np N needle finetune ...` starts N copies; each finds its rank
 * here. libmpi is dlopen'ed only when the process was started by an MPI
 * launcher (Open MPI's or MPICH's environment), so the same binary runs
 * without MPI installed, and the library links nothing new. Open MPI and
 * MPICH are both understood (their handles differ: pointers to exported
 * objects vs integer constants). */
#ifndef ND_DIST_H
#define ND_DIST_H

#include <stddef.h>
#include <stdint.h>

typedef struct nd_dist nd_dist;
typedef struct nd_backend nd_backend;

/* The world this process belongs to. *out = NULL (and ND_OK) when not
 * started by an MPI launcher or started as a single rank; an error when
 * started as one of several ranks but libmpi cannot be loaded. */
int nd_dist_open(nd_dist **out);
int nd_dist_rank(const nd_dist *d);
int nd_dist_size(const nd_dist *d);
/* "Open MPI" / "MPICH" and the library loaded */
const char *nd_dist_impl(const nd_dist *d);
/* Sum buf[0..n) over the ranks, in place, in rank order (rank 0's value,
 * plus rank 1's, ...): every rank gets the same bits, whatever the
 * network's order. One exchange: each rank sums one slice of the buffer
 * (all-to-all), then the slices are gathered (all-gather). */
int nd_dist_sum(nd_dist *d, float *buf, size_t n);
/* The GPU path: with the CUDA backend, the gradient sum runs on device
 * memory through NCCL (libnccl.so.2 loaded at run time, one process per
 * GPU, rank 0's ncclUniqueId sent to the others over MPI). Collective:
 * every rank calls it; NCCL is used only when it loads on every rank
 * (NEEDLE_NCCL=0 turns it off; NEEDLE_NCCL=PATH loads that file).
 * Nothing (ND_OK) for other backends or without NCCL. */
int nd_dist_device_open(nd_dist *d, const nd_backend *be);
/* "NCCL 2.x.y" when the GPU path is on, else NULL */
const char *nd_dist_device_impl(const nd_dist *d);
/* why the GPU path is off with a CUDA backend ("no libnccl ..."), or NULL */
const char *nd_dist_device_why(const nd_dist *d);
/* Sum buf[0..n), the backend's memory, over the ranks in place: NCCL on
 * the device (its summation order, see docs/training.md; every rank gets
 * the same bits), synced before it returns; nd_dist_sum without NCCL. */
int nd_dist_sum_device(nd_dist *d, float *buf, size_t n);
/* Every rank's k 64-bit values: all[rank * k + i]. */
int nd_dist_gather_u64(nd_dist *d, const uint64_t *mine, int k, uint64_t *all);
/* End every rank of the job now (after a rank-local failure that the
 * others cannot know of: they would wait for it forever). */
void nd_dist_abort(nd_dist *d, int code);
/* The last error is known to every rank, which need not end the job:
 * 1 = reached together (a mismatch found by the start check, a stop; rank
 * 0 reports it), 2 = this rank's own, which the others were told of (it
 * reports it); 0 = this rank's alone (the job must be ended). */
void nd_dist_set_shared(nd_dist *d, int shared);
int nd_dist_shared(const nd_dist *d);
/* MPI_Finalize; NULL is fine. */
void nd_dist_close(nd_dist *d);

#endif
