/* CUDA backend plugin: runtime, memory, staging of host inputs, layout
 * uploads, the cuBLAS matmul and the op table (nd_plugin_open).
 *
 * Self-contained: it sees backend.h, layout.h and plugin.h only and links
 * the CUDA runtime statically, so libneedle_cuda.so loads on a machine
 * without a driver and then reports "no CUDA device". */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

extern "C" {
#include "backend/plugin.h"
}

#ifndef RING_MIN_BYTES /* tools/cuda_emu builds a tiny one to exercise regrowth */
#define RING_MIN_BYTES ((size_t)64 << 20)
#endif
#define RING_ALIGN 256

void cuda_fail(const char *what, cudaError_t err, const char *file, int line)
{
    fprintf(stderr, "needle cuda: %s failed at %s:%d: %s\n", what, file, line,
            cudaGetErrorString(err));
    abort();
}

static void blas_check(cublasStatus_t st, const char *what)
{
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "needle cuda: %s failed: cuBLAS status %d\n", what, (int)st);
        abort();
    }
}

static cuda_ctx *ctx_of(const nd_backend *be)
{
    return (cuda_ctx *)be->ctx;
}

/* ---- sync and the staging ring ---- */

static void ring_alloc(cuda_ctx *C, size_t bytes)
{
    void *h = NULL, *d = NULL;
    /* pinned, so the copies below are DMA transfers; not mapped: the
     * kernels read the device twin only */
    CUDA_CHECK(cudaHostAlloc(&h, bytes, cudaHostAllocPortable));
    CUDA_CHECK(cudaMalloc(&d, bytes));
    C->ring_host = (char *)h;
    C->ring_dev = (char *)d;
    C->ring_cap = bytes;
    C->ring_used = 0;
}

static void cuda_sync(const nd_backend *be)
{
    cuda_ctx *C = ctx_of(be);
    CUDA_CHECK(cudaSetDevice(C->device));
    /* the whole device, not only this stream: a NCCL all-reduce issued on
     * the gradients by src/dist runs on a stream of its own */
    CUDA_CHECK(cudaDeviceSynchronize());
    /* nothing reads the staged copies any more: recycle the ring */
    for (int i = 0; i < C->n_retired; i += 2) {
        CUDA_CHECK(cudaFreeHost(C->retired[i]));
        CUDA_CHECK(cudaFree(C->retired[i + 1]));
    }
    C->n_retired = 0;
    C->ring_used = 0;
    for (int i = 0; i < CUDA_MAX_LAYOUTS; i++) /* staged layouts lived there */
        C->layouts[i].valid = 0;
}

cuda_ctx *cuda_op_begin(const nd_backend *be)
{
    cuda_ctx *C = ctx_of(be);
    static __thread int current = -1; /* this thread's device: saves a call per op */
    if (current != C->device) {
        CUDA_CHECK(cudaSetDevice(C->device));
        current = C->device;
    }
    /* a ring half full: wait for the issued ops and start it over, before
     * this op stages anything (its copies must survive until it runs) */
    if (C->ring_used > C->ring_cap / 2)
        cuda_sync(be);
    return C;
}

int cuda_is_host(const void *p)
{
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear it: an unknown pointer is host memory */
        return 1;
    }
    return a.type == cudaMemoryTypeUnregistered || a.type == cudaMemoryTypeHost;
}

/* `bytes` of the ring: the host address to fill, the device address to read */
static void *ring_take(cuda_ctx *C, size_t bytes, char **host)
{
    if (C->ring_used + bytes > C->ring_cap) {
        /* full in the middle of an op: earlier copies of this op are in the
         * old ring, so it stays allocated until the next sync */
        if (C->n_retired + 2 > C->cap_retired) {
            int cap = C->cap_retired ? 2 * C->cap_retired : 8;
            char **r = (char **)realloc(C->retired, sizeof *r * (size_t)cap);
            if (!r) {
                fprintf(stderr, "needle cuda: out of host memory\n");
                abort();
            }
            C->retired = r;
            C->cap_retired = cap;
        }
        C->retired[C->n_retired++] = C->ring_host;
        C->retired[C->n_retired++] = C->ring_dev;
        size_t cap = 2 * C->ring_cap;
        while (cap < 2 * bytes)
            cap *= 2;
        ring_alloc(C, cap);
    }
    size_t off = C->ring_used;
    C->ring_used = (off + bytes + RING_ALIGN - 1) / RING_ALIGN * RING_ALIGN;
    *host = C->ring_host + off;
    return C->ring_dev + off;
}

/* bytes of the ring, filled from src on the host, then copied to the
 * device on the stream (after every op issued before, before every op
 * issued after): the device address */
static void *ring_upload(cuda_ctx *C, const void *src, size_t bytes)
{
    char *h;
    void *d = ring_take(C, bytes, &h);
    memcpy(h, src, bytes);
    CUDA_CHECK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, C->stream));
    return d;
}

const void *cuda_stage(cuda_ctx *C, const void *p, size_t bytes)
{
    if (!p || !bytes || !cuda_is_host(p))
        return p;
    return ring_upload(C, p, bytes);
}

void *cuda_scratch(cuda_ctx *C, size_t bytes)
{
    if (bytes > C->scratch_cap) {
        /* earlier ops may still use the old block: cudaFree waits for them */
        if (C->scratch)
            CUDA_CHECK(cudaFree(C->scratch));
        size_t cap = bytes > 2 * C->scratch_cap ? bytes : 2 * C->scratch_cap;
        CUDA_CHECK(cudaMalloc(&C->scratch, cap));
        C->scratch_cap = cap;
    }
    return C->scratch;
}

/* ---- layouts ---- */

static int layout_blocks(const nd_layout *L)
{
    int n = 0;
    for (int s = 0; s < L->n_seg; s++)
        n += (L->seg[s].len + ATT_BLOCK - 1) / ATT_BLOCK;
    return n;
}

static size_t layout_host_bytes(const nd_layout *L)
{
    return sizeof(nd_segment) * (size_t)L->n_seg + sizeof(int32_t) * 2 * (size_t)L->N;
}

static int layout_matches(const layout_cache_entry *e, const nd_layout *L)
{
    if (!e->valid || e->N != L->N || e->n_seg != L->n_seg)
        return 0;
    const char *h = (const char *)e->host;
    size_t sb = sizeof(nd_segment) * (size_t)L->n_seg, rb = sizeof(int32_t) * (size_t)L->N;
    return !memcmp(h, L->seg, sb) && !memcmp(h + sb, L->row_seg, rb) &&
           !memcmp(h + sb + rb, L->pos, rb);
}

/* Copy n items into the ring; returns the device address. */
static const void *ring_put(cuda_ctx *C, const void *src, size_t bytes)
{
    if (bytes)
        return ring_upload(C, src, bytes);
    char *h;
    return ring_take(C, 1, &h);
}

dev_layout cuda_layout(cuda_ctx *C, const nd_layout *L)
{
    for (int i = 0; i < CUDA_MAX_LAYOUTS; i++)
        if (layout_matches(&C->layouts[i], L))
            return C->layouts[i].dev;
    layout_cache_entry *e = &C->layouts[C->layout_next];
    C->layout_next = (C->layout_next + 1) % CUDA_MAX_LAYOUTS;
    size_t hb = layout_host_bytes(L);
    if (hb > e->cap) {
        free(e->host);
        e->host = malloc(hb ? hb : 1);
        if (!e->host) {
            fprintf(stderr, "needle cuda: out of host memory for a layout\n");
            abort();
        }
        e->cap = hb;
    }
    size_t sb = sizeof(nd_segment) * (size_t)L->n_seg, rb = sizeof(int32_t) * (size_t)L->N;
    memcpy(e->host, L->seg, sb);
    memcpy((char *)e->host + sb, L->row_seg, rb);
    memcpy((char *)e->host + sb + rb, L->pos, rb);

    int ns = L->n_seg, nb = layout_blocks(L);
    /* children in segment order (CSR), and the attention blocks */
    int32_t *tmp = (int32_t *)malloc(sizeof(int32_t) * (2 * (size_t)ns + 1 + 2 * (size_t)nb) + 4);
    if (!tmp) {
        fprintf(stderr, "needle cuda: out of host memory for a layout\n");
        abort();
    }
    int32_t *coff = tmp, *child = coff + ns + 1, *bseg = child + ns, *bt0 = bseg + nb;
    for (int s = 0; s <= ns; s++)
        coff[s] = 0;
    for (int s = 0; s < ns; s++)
        if (L->seg[s].parent >= 0)
            coff[L->seg[s].parent + 1]++;
    for (int s = 0; s < ns; s++)
        coff[s + 1] += coff[s];
    {
        int *fill = (int *)calloc((size_t)ns + 1, sizeof(int));
        if (!fill)
            abort();
        for (int s = 0; s < ns; s++) {
            int p = L->seg[s].parent;
            if (p >= 0)
                child[coff[p] + fill[p]++] = s;
        }
        free(fill);
    }
    int b = 0;
    for (int s = 0; s < ns; s++)
        for (int t0 = 0; t0 < L->seg[s].len; t0 += ATT_BLOCK) {
            bseg[b] = s;
            bt0[b] = t0;
            b++;
        }
    dev_layout d;
    d.N = L->N;
    d.n_seg = ns;
    d.n_blk = nb;
    d.seg = (const nd_segment *)ring_put(C, L->seg, sb);
    d.row_seg = (const int32_t *)ring_put(C, L->row_seg, rb);
    d.pos = (const int32_t *)ring_put(C, L->pos, rb);
    d.child_off = (const int32_t *)ring_put(C, coff, sizeof(int32_t) * ((size_t)ns + 1));
    d.child = (const int32_t *)ring_put(C, child, sizeof(int32_t) * (size_t)ns);
    d.blk_seg = (const int32_t *)ring_put(C, bseg, sizeof(int32_t) * (size_t)nb);
    d.blk_t0 = (const int32_t *)ring_put(C, bt0, sizeof(int32_t) * (size_t)nb);
    free(tmp);
    e->valid = 1;
    e->N = L->N;
    e->n_seg = ns;
    e->dev = d;
    return d;
}

/* ---- deterministic partial sums ---- */

__global__ void k_reduce_partials(float *dst, const double *partials, int chunks, int stride,
                                  int off, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    double s = 0;
    for (int p = 0; p < chunks; p++)
        s += partials[(size_t)p * stride + off + i];
    dst[i] += (float)s;
}

void cuda_reduce_partials(cuda_ctx *C, float *dst, const double *partials, int chunks, int stride,
                          int off, int n)
{
    if (!dst || n <= 0)
        return;
    k_reduce_partials<<<cuda_blocks(n, 256), 256, 0, C->stream>>>(dst, partials, chunks, stride,
                                                                  off, n);
    CUDA_LAUNCHED();
}

/* ---- memory ---- */

static void *cuda_alloc(const nd_backend *be, size_t bytes)
{
    cuda_ctx *C = cuda_op_begin(be);
    void *p = NULL;
    /* Plain device memory: the host reaches alloc memory only through the
     * copies below (host_mem 0; the contract in backend.h), and NCCL sums
     * the gradients in it. Never more than the card has free: NULL here is
     * a clean "out of cuda memory" for the caller. */
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
        if (bytes > free_b)
            return NULL;
    } else
        (void)cudaGetLastError();
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return NULL;
    }
    CUDA_CHECK(e);
    /* zeroed before anything can read it */
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes ? bytes : 1, C->stream));
    CUDA_CHECK(cudaStreamSynchronize(C->stream));
    return p;
}

static void cuda_free(const nd_backend *be, void *p)
{
    if (!p)
        return;
    cuda_op_begin(be);
    CUDA_CHECK(cudaFree(p)); /* waits for the device to finish with it */
}

/* Host -> device through the staging ring, a quarter ring at a time so a
 * big upload (the weights) never grows it: each piece is copied into the
 * pinned host ring and from there by a DMA copy on the stream straight to
 * dst, after the ops issued before (the ring's device twin is not used). */
static void cuda_upload(const nd_backend *be, void *dst, const void *src, size_t bytes)
{
    const char *s = (const char *)src;
    char *d = (char *)dst;
    while (bytes) {
        cuda_ctx *C = cuda_op_begin(be); /* recycles a half-full ring */
        size_t piece = C->ring_cap / 4;
        if (piece > bytes)
            piece = bytes;
        char *h;
        (void)ring_take(C, piece, &h);
        memcpy(h, s, piece);
        CUDA_CHECK(cudaMemcpyAsync(d, h, piece, cudaMemcpyHostToDevice, C->stream));
        s += piece;
        d += piece;
        bytes -= piece;
    }
}

/* Device -> host: every issued op finishes (a sync), then each piece goes
 * to the pinned ring by the stream and from there to dst. */
static void cuda_download(const nd_backend *be, void *dst, const void *src, size_t bytes)
{
    cuda_sync(be);
    cuda_ctx *C = ctx_of(be);
    const char *s = (const char *)src;
    char *d = (char *)dst;
    while (bytes) {
        size_t piece = C->ring_cap < bytes ? C->ring_cap : bytes;
        CUDA_CHECK(cudaMemcpyAsync(C->ring_host, s, piece, cudaMemcpyDeviceToHost, C->stream));
        CUDA_CHECK(cudaStreamSynchronize(C->stream));
        memcpy(d, C->ring_host, piece);
        s += piece;
        d += piece;
        bytes -= piece;
    }
}

static void cuda_zero(const nd_backend *be, void *dst, size_t bytes)
{
    cuda_ctx *C = cuda_op_begin(be);
    CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, C->stream));
}

/* ---- matmul ---- */

__global__ void k_scale(float *C, int ldc, int M, int N, float beta)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)M * N)
        return;
    long r = i / N, c = i % N;
    C[r * ldc + c] *= beta;
}

void cuda_matmul(const nd_backend *be, int ta, int tb, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta, float *Cm, int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) {
        cuda_ctx *C = cuda_op_begin(be);
        k_scale<<<cuda_blocks((long)M * N, 256), 256, 0, C->stream>>>(Cm, ldc, M, N, beta);
        CUDA_LAUNCHED();
        return;
    }
    /* the extent of op(A) [M,K] and op(B) [K,N] in their row-major storage */
    size_t a_bytes = sizeof(float) * ((size_t)((ta ? K : M) - 1) * lda + (ta ? M : K));
    size_t b_bytes = sizeof(float) * ((size_t)((tb ? N : K) - 1) * ldb + (tb ? K : N));
    cuda_ctx *C = cuda_op_begin(be);
    const float *dA = (const float *)cuda_stage(C, A, a_bytes);
    const float *dB = (const float *)cuda_stage(C, B, b_bytes);
    /* row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the
     * same buffers read as their transposes, so B comes first */
    cublasOperation_t opA = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opB = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (!C->precision) {
        blas_check(
            cublasSgemm(C->blas, opB, opA, N, M, K, &alpha, dB, ldb, dA, lda, &beta, Cm, ldc),
            "cublasSgemm");
        return;
    }
    cublasComputeType_t ct =
        C->precision == 2 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F_FAST_TF32;
    blas_check(cublasGemmEx(C->blas, opB, opA, N, M, K, &alpha, dB, CUDA_R_32F, ldb, dA, CUDA_R_32F,
                            lda, &beta, Cm, CUDA_R_32F, ldc, ct, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

/* ---- the table ---- */

static void fill_table(nd_backend *t)
{
    t->name = "cuda";
    t->device = 1;
    t->sync = cuda_sync;
    t->alloc = cuda_alloc;
    t->free = cuda_free;
    t->host_mem = 0;
    t->upload = cuda_upload;
    t->download = cuda_download;
    t->zero = cuda_zero;
#define ND_OP(name, kind, ...) t->name = cuda_##name;
#include "backend/ops.def"
#undef ND_OP
}

#define MAX_DEVICES 64
static cuda_ctx *contexts[MAX_DEVICES];
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;

/* Set up device `dev`; NULL + message on failure. */
static cuda_ctx *ctx_create(int dev, int threads, int precision, char *err, size_t errlen)
{
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, dev);
    if (e == cudaSuccess)
        e = cudaSetDevice(dev);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "CUDA device %d: %s", dev, cudaGetErrorString(e));
        return NULL;
    }
    if (prop.major < 8) {
        snprintf(err, errlen,
                 "CUDA device %d (%s) has compute capability %d.%d; needle's plugin "
                 "is built for 8.0 and newer",
                 dev, prop.name, prop.major, prop.minor);
        return NULL;
    }
    cuda_ctx *C = (cuda_ctx *)calloc(1, sizeof *C);
    if (!C) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    C->device = dev;
    e = cudaStreamCreateWithFlags(&C->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "CUDA stream on device %d: %s", dev, cudaGetErrorString(e));
        free(C);
        return NULL;
    }
    if (cublasCreate(&C->blas) != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "cuBLAS could not start on device %d", dev);
        cudaStreamDestroy(C->stream);
        free(C);
        return NULL;
    }
    cublasSetStream(C->blas, C->stream);
    /* float32 as the CPU computes it unless asked for (`--precision`, the
     * program's nd_plugin_opts): tensor-core GEMMs that round their inputs
     * to TF32 (10-bit mantissa) or bfloat16 (7-bit), float32 sums */
    C->precision = precision == 2 || precision == 1 ? precision : 0;
    cublasSetMathMode(C->blas, CUBLAS_DEFAULT_MATH);
    ring_alloc(C, RING_MIN_BYTES);
    fill_table(&C->table);
    C->table.ctx = C;
    C->table.threads = threads > 0 ? threads : 1;
    snprintf(C->detail, sizeof C->detail, "%s (%.0f GB), %s", prop.name,
             (double)prop.totalGlobalMem / 1e9,
             C->precision == 2   ? "float32 (bf16 matmuls)"
             : C->precision == 1 ? "float32 (TF32 matmuls)"
                                 : "float32");
    C->table.detail = C->detail;
    return C;
}

/* the runtime says "insufficient driver" also when there is none at all */
static int driver_present(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h)
        dlclose(h);
    return h != NULL;
}

/* Under an MPI launcher (`mpirun -np N needle finetune --device cuda`),
 * this process's rank among those on its machine: one process per GPU,
 * "cuda" meaning device local-rank (modulo the count). 0 otherwise. */
static int launcher_local_rank(void)
{
    const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK",
                          "SLURM_LOCALID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) {
            int r = atoi(v);
            return r > 0 ? r : 0;
        }
    }
    return 0;
}

extern "C" __attribute__((visibility("default"))) const nd_backend *
nd_plugin_open(int abi, int index, int allow_software, int threads, int *no_device, char *err,
               size_t errlen, const nd_plugin_opts *opts)
{
    (void)allow_software; /* CUDA has no software devices */
    *no_device = 0;
    if (abi != ND_PLUGIN_ABI) {
        snprintf(err, errlen, "plugin ABI %d, program ABI %d: rebuild libneedle_cuda.so",
                 ND_PLUGIN_ABI, abi);
        return NULL;
    }
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0) {
        *no_device = 1;
        if (e == cudaErrorInsufficientDriver && !driver_present())
            snprintf(err, errlen, "no CUDA device (no NVIDIA driver: libcuda.so.1 not found)");
        else if (e != cudaSuccess && e != cudaErrorNoDevice)
            snprintf(err, errlen, "no CUDA device (%s)", cudaGetErrorString(e));
        else
            snprintf(err, errlen, "no CUDA device");
        (void)cudaGetLastError();
        return NULL;
    }
    int dev = index < 0 ? launcher_local_rank() % count : index;
    if (dev >= count || dev >= MAX_DEVICES) {
        *no_device = 1;
        snprintf(err, errlen, "no CUDA device %d (%d present)", dev, count);
        return NULL;
    }
    pthread_mutex_lock(&open_lock);
    if (!contexts[dev])
        contexts[dev] = ctx_create(dev, threads, opts ? opts->precision : 0, err, errlen);
    cuda_ctx *C = contexts[dev];
    pthread_mutex_unlock(&open_lock);
    return C ? &C->table : NULL;
}
