/* Shared pieces of the CUDA backend plugin: the context behind the op
 * table, staging of host inputs, scratch memory, the device copy of a
 * layout, and float helpers that match the CPU reference kernels
 * (src/backend/cpu/cpu_kernels.h).
 *
 * Every op is issued on one stream, in order, and returns at once. Inputs
 * that are plain host memory are copied into a pinned host staging ring
 * when the op is issued (the host may reuse its buffer right after), and
 * from there by an explicit copy on the stream (cudaMemcpyAsync) into the
 * ring's device twin, plain device memory (cudaMalloc) that the kernels
 * read; both are recycled only after a sync, so a staged copy lives until
 * every op issued before the sync has run. Kernels never read host memory
 * through a mapping. */
#ifndef ND_CUDA_COMMON_CUH
#define ND_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "backend/backend.h"
/* san_expf / san_logf: the CPU's polynomials, so device and CPU agree to
 * an ulp or two rather than to expf's error */
#define ND_FASTMATH_FN static __host__ __device__ __forceinline__
#include "core/fastmath.h"
#include "model/constants.h"
}

#define CUDA_MAX_LAYOUTS 4 /* layouts cached per sync interval */
#define CUDA_MAX_ORDERS 16 /* engram orders read at issue time */
#define CUDA_MAX_LANES 8   /* hyper-connection lanes (n) */
#define CUDA_MAX_ENGRAM_ORDER 8

/* Rows per attention work block (queries in the forward and dq kernels,
 * keys in the dk/dv kernel): 4 warps x 4 rows. */
#define ATT_WARPS 4
#define ATT_ROWS 4
#define ATT_BLOCK (ATT_WARPS * ATT_ROWS)
#define ATT_TILE 32 /* keys (or queries) per shared-memory tile: one per lane */
#define ATT_MAX_HD 128

/* The layout as the kernels see it, plus what the host derives from it
 * once per upload: each segment's children, and the attention work blocks
 * (segment, first row offset) of ATT_BLOCK rows. */
typedef struct {
    long N;
    int n_seg, n_blk;
    const nd_segment *seg;
    const int32_t *row_seg, *pos;
    const int32_t *child_off; /* [n_seg + 1] */
    const int32_t *child;     /* children of s: child[child_off[s] .. child_off[s+1]) */
    const int32_t *blk_seg, *blk_t0;
} dev_layout;

typedef struct {
    int valid;
    long N;
    int n_seg;
    size_t cap;     /* bytes of host copy */
    void *host;     /* seg, row_seg, pos as given */
    dev_layout dev; /* pointers into the staging ring */
} layout_cache_entry;

typedef struct {
    nd_backend table; /* its ctx is this context */
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    /* staging ring: pinned host memory the host fills, and its device twin
     * (cudaMalloc, same offsets) the stream copies it into */
    char *ring_host, *ring_dev;
    size_t ring_cap, ring_used;
    /* rings outgrown since the last sync (host, device pairs): copies and
     * kernels issued before may still use them */
    char **retired;
    int n_retired, cap_retired;
    /* scratch device memory for one op at a time (ops run in stream order) */
    void *scratch;
    size_t scratch_cap;
    layout_cache_entry layouts[CUDA_MAX_LAYOUTS];
    int layout_next;
    char detail[320];
    int precision; /* GEMMs: 0 float32, 1 TF32 tensor cores, 2 bf16 tensor cores */
} cuda_ctx;

/* abort with the failing call: the op table has no error path */
void cuda_fail(const char *what, cudaError_t err, const char *file, int line);
#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess)                                                                   \
            cuda_fail(#call, err_, __FILE__, __LINE__);                                            \
    } while (0)
/* after a launch: configuration errors show up here, not in the launch */
#define CUDA_LAUNCHED() CUDA_CHECK(cudaGetLastError())

/* Start an op: the context, with the current device set for this thread
 * (syncs first, recycling the staging ring, when the ring is half full). */
cuda_ctx *cuda_op_begin(const nd_backend *be);
/* A device-readable copy of input p when it is plain host memory, else p
 * itself (alloc memory). NULL stays NULL. A full ring is replaced by a
 * bigger one; the old one is freed at the next sync. */
const void *cuda_stage(cuda_ctx *C, const void *p, size_t bytes);
#define STAGE(C, p, count) ((decltype(p))cuda_stage((C), (p), sizeof(*(p)) * (size_t)(count)))
/* Whether p is plain host memory (not from alloc): such inputs are staged. */
int cuda_is_host(const void *p);
/* Scratch device memory, valid until the next op begins. */
void *cuda_scratch(cuda_ctx *C, size_t bytes);
/* The layout uploaded (or found in the cache of this sync interval). */
dev_layout cuda_layout(cuda_ctx *C, const nd_layout *L);

static inline unsigned cuda_blocks(long n, int threads)
{
    long b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b);
}

/* Deterministic column sums over rows: partials[chunk][col] are summed in
 * chunk order into dst (+=). Row chunks depend only on the row count. */
#define CUDA_ROW_CHUNK 64
#define CUDA_MAX_CHUNKS 512
static inline int cuda_row_chunks(long rows)
{
    long c = (rows + CUDA_ROW_CHUNK - 1) / CUDA_ROW_CHUNK;
    return (int)(c < 1 ? 1 : (c > CUDA_MAX_CHUNKS ? CUDA_MAX_CHUNKS : c));
}
/* dst[i] += sum_p partials[p * stride + off + i] for i < n (dst NULL: nothing) */
void cuda_reduce_partials(cuda_ctx *C, float *dst, const double *partials, int chunks, int stride,
                          int off, int n);

/* dst[rows[i]] += src[i] * scale for i < n (rows of d floats), each
 * element summing its sources in order i as the CPU does: one thread per
 * (destination, column) over the sources grouped by destination when rows
 * is host memory (the usual case: token ids, target rows), else one
 * thread per column walking all n rows. */
void cuda_scatter_rows(cuda_ctx *C, float *dst, const float *src, const int32_t *rows, long n,
                       int d, float scale);

/* ---- device helpers ---- */

__host__ __device__ __forceinline__ float dev_sigmoid(float x)
{
    return 1.0f / (1.0f + san_expf(-x));
}

/* nd_layout_back on the device copy */
__device__ __forceinline__ long dev_layout_back(const dev_layout &L, long r, int k)
{
    const nd_segment s = L.seg[L.row_seg[r]];
    long off = r - s.start;
    if (off >= k)
        return r - k;
    if (s.parent < 0)
        return -1;
    const nd_segment p = L.seg[s.parent];
    long j = (long)p.len - (k - off);
    return j >= 0 ? p.start + j : -1;
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024), the same
 * tree every time; every thread gets the result. `sh` holds 32 floats;
 * the block must not be using it. */
__device__ __forceinline__ float block_sum(float v, float *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(t);
}
__device__ __forceinline__ double block_sum_d(double v, double *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    double t = lane < nw ? sh[lane] : 0.0;
    return warp_sum_d(t);
}
__device__ __forceinline__ float block_max(float v, float *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : -3.402823466e38f;
    return warp_max(t);
}

/* ---- the ops, one per entry of backend/ops.def (semantics there) ----
 * cuda_<name> in cuda_ops.cu, cuda_backward.cu, cuda_mix.cu,
 * cuda_attention.cu, cuda_hada3.cu and (matmul) cuda_backend.cu */
#define ND_OP(name, kind, ...) void cuda_##name(const nd_backend *be, ND_OP_PARAMS(__VA_ARGS__));
#include "backend/ops.def"
#undef ND_OP

#endif
