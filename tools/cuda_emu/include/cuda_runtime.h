/* A CPU stand-in for the CUDA runtime, enough to run the needle plugin's
 * kernels on the host: each block's threads are coroutines (setjmp/longjmp
 * after a makecontext bootstrap), __syncthreads and the warp shuffles are
 * rendezvous points. Only for checking index math; very slow. */
#pragma once
#include <math.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#define CUDART_VERSION 13000
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100
};
typedef void *cudaStream_t;
enum {
    cudaStreamNonBlocking = 1,
    cudaHostAllocMapped = 2,
    cudaHostAllocPortable = 1,
    cudaMemAttachGlobal = 1
};
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDefault = 4
};
enum cudaMemoryType {
    cudaMemoryTypeUnregistered = 0,
    cudaMemoryTypeHost = 1,
    cudaMemoryTypeDevice = 2,
    cudaMemoryTypeManaged = 3
};
struct cudaPointerAttributes {
    cudaMemoryType type;
    int device;
    void *devicePointer, *hostPointer;
};
enum cudaMemLocationType { cudaMemLocationTypeDevice = 1 };
struct cudaMemLocation {
    cudaMemLocationType type;
    int id;
};
enum cudaMemoryAdvise { cudaMemAdviseSetPreferredLocation = 3 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
struct cudaDeviceProp {
    char name[256];
    int major, minor, managedMemory;
    size_t totalGlobalMem;
};

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

namespace emu
{
extern dim3 threadIdx_, blockIdx_, blockDim_, gridDim_;
void sync_block();
double warp_xchg(double v, int src_lane, int mode); /* mode 0: from lane src, 1: xor src */
int warp_any(int pred);
void *dyn_shared();
void launch_impl(dim3 grid, dim3 block, size_t shmem, void (*body)(void *), void *ctx);
/* Work on the stream runs when the host synchronises (or frees memory), as
 * on a GPU: an op that read host memory after issue, or a host read
 * without a sync, sees what a real device would. */
void enqueue(std::function<void()> work);
void drain();
std::map<uintptr_t, std::pair<size_t, cudaMemoryType>> &allocs();
/* cudaMalloc memory is a mapping of its own that only the emulated device
 * may touch: readable and writable while stream work runs (drain), no
 * access otherwise, so host code that dereferences a device pointer dies
 * at once with a message (as it would on a GPU) instead of passing. */
void *device_alloc(size_t n);
void device_free(void *p, size_t n);
size_t &allocated();

struct launcher {
    dim3 g, b;
    size_t sh;
    launcher(dim3 g_, dim3 b_, size_t sh_ = 0, cudaStream_t = 0) : g(g_), b(b_), sh(sh_) {}
    template <typename F, typename... A> void run(F kernel, A... args)
    {
        /* arguments by value at issue, as a launch does */
        struct ctx_t {
            F k;
            std::tuple<A...> a;
        };
        auto c = std::make_shared<ctx_t>(ctx_t{kernel, std::tuple<A...>(args...)});
        dim3 g_ = g, b_ = b;
        size_t sh_ = sh;
        enqueue([c, g_, b_, sh_]() {
            launch_impl(
                g_, b_, sh_,
                [](void *p) {
                    ctx_t *cc = (ctx_t *)p;
                    std::apply(cc->k, cc->a);
                },
                c.get());
        });
    }
};
} // namespace emu
#include <tuple>
#define threadIdx emu::threadIdx_
#define blockIdx emu::blockIdx_
#define blockDim emu::blockDim_
#define gridDim emu::gridDim_

static inline void __syncthreads()
{
    emu::sync_block();
}
static inline float __shfl_sync(unsigned, float v, int l)
{
    return (float)emu::warp_xchg(v, l, 0);
}
static inline float __shfl_xor_sync(unsigned, float v, int l)
{
    return (float)emu::warp_xchg(v, l, 1);
}
static inline double __shfl_xor_sync(unsigned, double v, int l)
{
    return emu::warp_xchg(v, l, 1);
}
static inline int __any_sync(unsigned, int p)
{
    return emu::warp_any(p);
}
static inline int min(int a, int b)
{
    return a < b ? a : b;
}

static inline const char *cudaGetErrorString(cudaError_t)
{
    return "emulated error";
}
static inline cudaError_t cudaGetLastError()
{
    return 0;
}
static inline cudaError_t cudaSetDevice(int)
{
    return 0;
}
static inline cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return 0;
}
static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int)
{
    memset(p, 0, sizeof *p);
    strcpy(p->name, "CPU emulation");
    p->major = 9;
    p->managedMemory = 1;
    p->totalGlobalMem = (size_t)8 << 30;
    return 0;
}
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, int)
{
    *s = (void *)1;
    return 0;
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t)
{
    return 0;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t)
{
    emu::drain();
    return 0;
}
static inline void *emu_alloc(size_t n, cudaMemoryType t)
{
    void *p = t == cudaMemoryTypeDevice ? emu::device_alloc(n) : malloc(n);
    if (t != cudaMemoryTypeDevice)
        memset(p, 0x7f, n); /* garbage, not zeros: alloc must zero it itself */
    emu::allocs()[(uintptr_t)p] = {n, t};
    emu::allocated() += n;
    return p;
}
static inline cudaError_t emu_free(void *p)
{
    emu::drain(); /* cudaFree waits for the device */
    auto it = emu::allocs().find((uintptr_t)p);
    if (it == emu::allocs().end()) {
        fprintf(stderr, "emu: cudaFree of %p, which no allocation returned\n", p);
        abort();
    }
    size_t n = it->second.first;
    cudaMemoryType t = it->second.second;
    emu::allocs().erase(it);
    emu::allocated() -= n;
    if (t == cudaMemoryTypeDevice)
        emu::device_free(p, n);
    else
        free(p);
    return 0;
}
/* the kind of memory p points into (Unregistered: plain host memory) */
static inline cudaMemoryType emu_kind(const void *p)
{
    auto &m = emu::allocs();
    auto it = m.upper_bound((uintptr_t)p);
    if (it != m.begin()) {
        --it;
        if ((uintptr_t)p < it->first + it->second.first)
            return it->second.second;
    }
    return cudaMemoryTypeUnregistered;
}
/* a copy's direction must match where its pointers lie, as on a GPU
 * without unified addressing of plain memory */
static inline void emu_check_copy(void *dst, const void *src, int kind)
{
    cudaMemoryType d = emu_kind(dst), s = emu_kind(src);
    int dev_d = d == cudaMemoryTypeDevice || d == cudaMemoryTypeManaged;
    int dev_s = s == cudaMemoryTypeDevice || s == cudaMemoryTypeManaged;
    int ok =
        kind == cudaMemcpyDefault ||
        (kind == cudaMemcpyHostToDevice && dev_d && s != cudaMemoryTypeDevice) ||
        (kind == cudaMemcpyDeviceToHost && dev_s && d != cudaMemoryTypeDevice) ||
        (kind == 3 && dev_d && dev_s) ||
        (kind == cudaMemcpyHostToHost && d != cudaMemoryTypeDevice && s != cudaMemoryTypeDevice);
    if (!ok) {
        fprintf(stderr, "emu: cudaMemcpy kind %d from %p (memory type %d) to %p (type %d)\n", kind,
                src, (int)s, dst, (int)d);
        abort();
    }
}
static inline cudaError_t cudaMallocManaged(void **p, size_t n, int)
{
    *p = emu_alloc(n, cudaMemoryTypeManaged);
    return 0;
}
static inline cudaError_t cudaMalloc(void **p, size_t n)
{
    *p = emu_alloc(n, cudaMemoryTypeDevice);
    return 0;
}
static inline cudaError_t cudaHostAlloc(void **p, size_t n, int)
{
    *p = emu_alloc(n, cudaMemoryTypeHost);
    return 0;
}
static inline cudaError_t cudaHostGetDevicePointer(void **d, void *h, int)
{
    *d = h;
    return 0;
}
static inline cudaError_t cudaFree(void *p)
{
    return emu_free(p);
}
static inline cudaError_t cudaFreeHost(void *p)
{
    return emu_free(p);
}
static inline cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p)
{
    memset(a, 0, sizeof *a);
    a->type = emu_kind(p);
    return 0;
}
static inline cudaError_t cudaDeviceSynchronize()
{
    emu::drain();
    return 0;
}
static inline cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total)
{
    *total = (size_t)8 << 30;
    *free_b = *total > emu::allocated() ? *total - emu::allocated() : 0;
    return 0;
}
static inline cudaError_t cudaMemAdvise(const void *, size_t, cudaMemoryAdvise, cudaMemLocation)
{
    return 0;
}
static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t)
{
    emu::enqueue([=]() { memset(p, v, n); });
    return 0;
}
static inline cudaError_t cudaMemcpy2DAsync(void *dst, size_t dp, const void *src, size_t sp,
                                            size_t w, size_t h, cudaMemcpyKind, cudaStream_t)
{
    emu::enqueue([=]() {
        for (size_t r = 0; r < h; r++)
            memcpy((char *)dst + r * dp, (const char *)src + r * sp, w);
    });
    return 0;
}
template <typename K> static inline cudaError_t cudaFuncSetAttribute(K, cudaFuncAttribute, int)
{
    return 0;
}
enum { cudaMemcpyDeviceToDevice = 3 };
/* queued like a kernel: a host source must stay unchanged until the
 * stream runs it, as with a real asynchronous copy */
static inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind,
                                          cudaStream_t)
{
    emu_check_copy(dst, src, kind);
    emu::enqueue([=]() { memcpy(dst, src, n); });
    return 0;
}
static inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind)
{
    emu_check_copy(dst, src, kind);
    emu::enqueue([=]() { memcpy(dst, src, n); });
    emu::drain();
    return 0;
}
