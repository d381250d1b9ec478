/* The narrow op interface the model is written against.
 *
 * Every op works on flat float32 arrays; the model code (src/model/san.c)
 * is only a sequence of these calls, so a GPU backend (CUDA, Vulkan)
 * implements this table and nothing else changes. The ops are listed, with
 * their parameters and meaning, once, in backend/ops.def. Shapes are
 * row-major; N is the number of token rows. Ops that depend on positions
 * take an nd_layout (backend/layout.h): which rows form which sequence,
 * and which sequences continue a shared prefix.
 *
 * Memory rule (every backend):
 * - An op's outputs (non-const pointers) must lie in memory from alloc.
 * - Its inputs may lie in alloc memory or be plain host memory: a device
 *   backend copies host inputs when the op is issued (fine for token ids,
 *   targets and index lists; big reused data such as weights belongs in
 *   alloc memory, see san_model_to_backend). The layout is host data.
 * - The host reaches alloc memory only through nd_backend_upload,
 *   nd_backend_download and nd_backend_zero (below), which keep issue order
 *   with the ops: alloc memory may be device memory the host cannot address
 *   (CUDA: cudaMalloc). Where be->host_mem is set (the CPU, Vulkan's
 *   host-visible memory) the host may also read and write it directly after
 *   nd_backend_sync(), which is how the CPU path stays zero-copy: ops run on
 *   the host and finish before they return.
 * - A device backend may run ops asynchronously, in issue order. Scalar
 *   arguments are read at issue time, by the host: a weight passed as one
 *   comes from the model's host copy (san_weight_host in model/params.h). */
#ifndef ND_BACKEND_H
#define ND_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/layout.h"

typedef struct nd_backend nd_backend;

/* ---- the op list (backend/ops.def) and what is expanded from it ----
 * An entry's parameters are (type, name) pairs. ND_OP_PARAMS(...) gives
 * the declarations ("int ta, int tb, ..."), ND_OP_ARGS(...) the names
 * ("ta, tb, ..."); ND_OP_MAP(m, sep, ...) applies m(type, name) to each
 * pair, separated by sep() (ND_OP_COMMA or ND_OP_NOSEP). Up to 24
 * parameters. */
#define ND_OP_COMMA() ,
#define ND_OP_NOSEP()
#define ND_OP_CAT(a, b) ND_OP_CAT_(a, b)
#define ND_OP_CAT_(a, b) a##b
#define ND_OP_NARGS(...)                                                                           \
    ND_OP_NARGS_(__VA_ARGS__, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, \
                 6, 5, 4, 3, 2, 1)
#define ND_OP_NARGS_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17,   \
                     _18, _19, _20, _21, _22, _23, _24, n, ...)                                    \
    n
#define ND_OP_MAP(m, sep, ...) ND_OP_CAT(ND_OP_MAP_, ND_OP_NARGS(__VA_ARGS__))(m, sep, __VA_ARGS__)
#define ND_OP_MAP_1(m, s, p) m p
#define ND_OP_MAP_2(m, s, p, ...) m p s() ND_OP_MAP_1(m, s, __VA_ARGS__)
#define ND_OP_MAP_3(m, s, p, ...) m p s() ND_OP_MAP_2(m, s, __VA_ARGS__)
#define ND_OP_MAP_4(m, s, p, ...) m p s() ND_OP_MAP_3(m, s, __VA_ARGS__)
#define ND_OP_MAP_5(m, s, p, ...) m p s() ND_OP_MAP_4(m, s, __VA_ARGS__)
#define ND_OP_MAP_6(m, s, p, ...) m p s() ND_OP_MAP_5(m, s, __VA_ARGS__)
#define ND_OP_MAP_7(m, s, p, ...) m p s() ND_OP_MAP_6(m, s, __VA_ARGS__)
#define ND_OP_MAP_8(m, s, p, ...) m p s() ND_OP_MAP_7(m, s, __VA_ARGS__)
#define ND_OP_MAP_9(m, s, p, ...) m p s() ND_OP_MAP_8(m, s, __VA_ARGS__)
#define ND_OP_MAP_10(m, s, p, ...) m p s() ND_OP_MAP_9(m, s, __VA_ARGS__)
#define ND_OP_MAP_11(m, s, p, ...) m p s() ND_OP_MAP_10(m, s, __VA_ARGS__)
#define ND_OP_MAP_12(m, s, p, ...) m p s() ND_OP_MAP_11(m, s, __VA_ARGS__)
#define ND_OP_MAP_13(m, s, p, ...) m p s() ND_OP_MAP_12(m, s, __VA_ARGS__)
#define ND_OP_MAP_14(m, s, p, ...) m p s() ND_OP_MAP_13(m, s, __VA_ARGS__)
#define ND_OP_MAP_15(m, s, p, ...) m p s() ND_OP_MAP_14(m, s, __VA_ARGS__)
#define ND_OP_MAP_16(m, s, p, ...) m p s() ND_OP_MAP_15(m, s, __VA_ARGS__)
#define ND_OP_MAP_17(m, s, p, ...) m p s() ND_OP_MAP_16(m, s, __VA_ARGS__)
#define ND_OP_MAP_18(m, s, p, ...) m p s() ND_OP_MAP_17(m, s, __VA_ARGS__)
#define ND_OP_MAP_19(m, s, p, ...) m p s() ND_OP_MAP_18(m, s, __VA_ARGS__)
#define ND_OP_MAP_20(m, s, p, ...) m p s() ND_OP_MAP_19(m, s, __VA_ARGS__)
#define ND_OP_MAP_21(m, s, p, ...) m p s() ND_OP_MAP_20(m, s, __VA_ARGS__)
#define ND_OP_MAP_22(m, s, p, ...) m p s() ND_OP_MAP_21(m, s, __VA_ARGS__)
#define ND_OP_MAP_23(m, s, p, ...) m p s() ND_OP_MAP_22(m, s, __VA_ARGS__)
#define ND_OP_MAP_24(m, s, p, ...) m p s() ND_OP_MAP_23(m, s, __VA_ARGS__)
#define ND_OP_DECL_(type, name) type name
#define ND_OP_NAME_(type, name) name
#define ND_OP_PARAMS(...) ND_OP_MAP(ND_OP_DECL_, ND_OP_COMMA, __VA_ARGS__)
#define ND_OP_ARGS(...) ND_OP_MAP(ND_OP_NAME_, ND_OP_COMMA, __VA_ARGS__)

/* One value per op, in list order: for supports(), diagnostics and tables. */
enum nd_op {
#define ND_OP(name, kind, ...) ND_OP_##name,
#include "backend/ops.def"
#undef ND_OP
    ND_OP_COUNT
};

enum nd_op_kind { ND_OP_KIND_FORWARD, ND_OP_KIND_BACKWARD, ND_OP_KIND_COMMON };

struct nd_backend {
    const char *name;
    int threads;
    const char *detail; /* for progress lines, e.g. "OpenBLAS SkylakeX"; may be "" */
    int device;         /* 0: ops run on the host and finish before they return (CPU) */
    /* the backend's own state (a device context, ...): ops reach it through
     * be->ctx, so a copy of the table (a wrapper, the registry's CPU
     * fallback) works on the same backend */
    void *ctx;

    /* ready the float compute paths (nd_backend_get calls it; CPU: load
     * the BLAS and name it in detail); ND_OK or an error; NULL: nothing */
    int (*prepare)(const nd_backend *be);

    /* wait until every issued op has finished (NULL: nothing to wait for) */
    void (*sync)(const nd_backend *be);

    void *(*alloc)(const nd_backend *be, size_t bytes); /* zeroed */
    void (*free)(const nd_backend *be, void *p);
    /* 1: alloc memory is host memory or host-visible (readable and writable
     * by the host after a sync); 0: device memory, reached only by the
     * copies below */
    int host_mem;
    /* Copies between the host and alloc memory, in issue order with the
     * ops (callers use the nd_backend_* wrappers below; NULL: sync, then
     * memcpy, for backends with host_mem). upload: src (host) may be reused
     * on return. download: waits for every op issued before (as a sync
     * does) and has finished on return. zero: bytes of dst set to 0. */
    void (*upload)(const nd_backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(const nd_backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(const nd_backend *be, void *dst, size_t bytes);

    /* whether the backend runs `op` itself (NULL: every op it has an entry
     * for). nd_backend_get runs a declined op on the CPU (after a sync;
     * alloc memory is host-accessible) and keeps this answer, so tests and
     * diagnostics can tell; a backend declines what its device cannot do. */
    int (*supports)(const nd_backend *be, enum nd_op op);

    /* the ops, one member per entry of backend/ops.def (documented there):
     * void (*name)(const nd_backend *be, params...) */
#define ND_OP(name, kind, ...) void (*name)(const nd_backend *be, ND_OP_PARAMS(__VA_ARGS__));
#include "backend/ops.def"
#undef ND_OP
};

static inline const char *nd_op_name(enum nd_op op)
{
    static const char *const names[ND_OP_COUNT] = {
#define ND_OP(name, kind, ...) #name,
#include "backend/ops.def"
#undef ND_OP
    };
    return (unsigned)op < (unsigned)ND_OP_COUNT ? names[op] : "?";
}

static inline enum nd_op_kind nd_op_kind_of(enum nd_op op)
{
    static const enum nd_op_kind kinds[ND_OP_COUNT] = {
#define ND_OP(name, kind, ...) ND_OP_KIND_##kind,
#include "backend/ops.def"
#undef ND_OP
    };
    return kinds[op];
}

/* The op named `name`, or ND_OP_COUNT. */
static inline enum nd_op nd_op_from_name(const char *name)
{
    for (int i = 0; i < (int)ND_OP_COUNT; i++)
        if (!strcmp(nd_op_name((enum nd_op)i), name))
            return (enum nd_op)i;
    return ND_OP_COUNT;
}

/* Where op's entry lies in struct nd_backend. */
static inline size_t nd_op_offset(enum nd_op op)
{
    static const size_t offs[ND_OP_COUNT] = {
#define ND_OP(name, kind, ...) offsetof(nd_backend, name),
#include "backend/ops.def"
#undef ND_OP
    };
    return offs[op];
}

/* Whether the table has an entry for op (a NULL entry: a partial table). */
static inline int nd_backend_has(const nd_backend *be, enum nd_op op)
{
    void (*fn)(void);
    memcpy(&fn, (const char *)be + nd_op_offset(op), sizeof fn);
    return fn != NULL;
}

/* Whether be runs op itself: it has an entry and does not decline it. */
static inline int nd_backend_supports(const nd_backend *be, enum nd_op op)
{
    return nd_backend_has(be, op) && (!be->supports || be->supports(be, op));
}

static inline void nd_backend_sync(const nd_backend *be)
{
    if (be->sync)
        be->sync(be);
}

/* bytes from the host (src) into alloc memory (dst), after the ops issued
 * before it and before those issued after; src may be reused on return.
 * dst == src (host memory used in place): nothing to copy. */
static inline void nd_backend_upload(const nd_backend *be, void *dst, const void *src, size_t bytes)
{
    if (!bytes || dst == src)
        return;
    if (be->upload) {
        be->upload(be, dst, src, bytes);
        return;
    }
    nd_backend_sync(be); /* issued ops may still read dst */
    memcpy(dst, src, bytes);
}

/* bytes of alloc memory (src) to the host (dst) once every op issued
 * before has finished; done on return. dst == src: a sync only. */
static inline void nd_backend_download(const nd_backend *be, void *dst, const void *src,
                                       size_t bytes)
{
    if (be->download) {
        if (bytes && dst != src)
            be->download(be, dst, src, bytes);
        else
            nd_backend_sync(be);
        return;
    }
    nd_backend_sync(be);
    if (bytes && dst != src)
        memcpy(dst, src, bytes);
}

/* bytes of alloc memory set to zero, in issue order */
static inline void nd_backend_zero(const nd_backend *be, void *dst, size_t bytes)
{
    if (!bytes)
        return;
    if (be->zero) {
        be->zero(be, dst, bytes);
        return;
    }
    nd_backend_sync(be);
    memset(dst, 0, bytes);
}

/* Host access to `bytes` of alloc memory p for host code (a quantiser, a
 * check): where the host can reach it (host_mem), p itself after a sync,
 * no copy; else a host copy (malloc, and a download when `read`: without
 * it the copy's contents are undefined, for code that overwrites them all),
 * NULL when out of host memory. nd_backend_unmap ends it: the copy goes
 * back (write != 0) and is freed. */
static inline void *nd_backend_map(const nd_backend *be, void *p, size_t bytes, int read)
{
    if (be->host_mem) {
        nd_backend_sync(be);
        return p;
    }
    void *h = malloc(bytes ? bytes : 1);
    if (h && read)
        nd_backend_download(be, h, p, bytes);
    return h;
}

static inline void nd_backend_unmap(const nd_backend *be, void *p, void *host, size_t bytes,
                                    int write)
{
    if (!host || host == p)
        return;
    if (write)
        nd_backend_upload(be, p, host, bytes);
    free(host);
}

/* The CPU backend (cblas + OpenMP). threads <= 0: all cores. */
const nd_backend *nd_backend_cpu(int threads);

/* Pick a backend by name: "cpu"; "cuda" / "cuda:N"; "vulkan" / "vulkan:N"
 * (N: the device index; a software Vulkan device such as lavapipe only when
 * named by index or NEEDLE_VULKAN_SOFTWARE=1); "auto": CUDA when a device
 * is present, else a Vulkan GPU, else the CPU (on Apple Silicon always the
 * CPU with Accelerate; its GPU only as "vulkan"). GPU backends are plugins
 * (libneedle_cuda.so, libneedle_vulkan.so) loaded at run time from the
 * directory of the program or library, or NEEDLE_PLUGIN_DIR. NULL + error
 * when the named backend is unavailable. */
const nd_backend *nd_backend_get(const char *name, int threads);

/* "cpu  float32  (2 threads, OpenBLAS Haswell)" or "vulkan  <device>, float32"
 * for progress lines; returns buf. */
const char *nd_backend_line(const nd_backend *be, char *buf, size_t n);

#endif
