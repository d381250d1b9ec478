/* Backend selection: the CPU backend is built in; GPU backends are
 * plugins found next to the program (or NEEDLE_PLUGIN_DIR, or lib/needle/
 * of an installed tree) and loaded on
 * first use, so one binary runs with or without a GPU runtime. Ops a
 * backend declines (its supports(), or NEEDLE_BACKEND_DECLINE) run on the
 * CPU. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/plugin.h"
#include "core/selfpath.h"
#include "core/status.h"
#include "core/tuning.h"

#ifndef NEEDLE_INSTALL_LIBDIR
#define NEEDLE_INSTALL_LIBDIR "lib"
#endif

/* dlopen libneedle_<kind>.so; NULL + message when absent. */
static void *plugin_load(const char *kind, char *why, size_t n)
{
    char file[64], path[4096], dir[3072];
    snprintf(file, sizeof file, "libneedle_%s.so", kind);
    const char *env = nd_tuning_get()->plugin_dir;
    /* NEEDLE_PLUGIN_DIR, beside this image (a build tree), then the
     * installed layout: PREFIX/lib/needle/ seen from PREFIX/bin/needle and
     * from PREFIX/lib/libneedle.so */
    char installed[2][3200];
    const char *dirs[4] = {env && *env ? env : NULL, NULL, NULL, NULL};
    nd_image_dir(dir, sizeof dir);
    if (dir[0]) {
        dirs[1] = dir;
        snprintf(installed[0], sizeof installed[0], "%s/../%s/needle", dir, NEEDLE_INSTALL_LIBDIR);
        snprintf(installed[1], sizeof installed[1], "%s/needle", dir);
        dirs[2] = installed[0];
        dirs[3] = installed[1];
    }
    why[0] = 0;
    for (int i = 0; i < 4; i++) {
        if (!dirs[i])
            continue;
        snprintf(path, sizeof path, "%s/%s", dirs[i], file);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
        const char *e = dlerror();
        /* a plugin that exists but cannot load (missing libcuda/libvulkan)
         * is worth naming; a missing file only when nothing else was found */
        if (e && (!why[0] || (!strstr(e, "No such file") && !strstr(e, "Not a directory"))))
            snprintf(why, n, "%s", e);
    }
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL); /* LD_LIBRARY_PATH, rpath */
    if (h)
        return h;
    if (!why[0]) {
        const char *e = dlerror();
        snprintf(why, n, "%s", e ? e : "not found");
    }
    return NULL;
}

static const nd_backend *plugin_open(const char *kind, int index, int allow_sw, int threads,
                                     int quiet, int *no_device)
{
    static void *handles[2]; /* never closed: a plugin and what it loads stay mapped */
    int slot = !strcmp(kind, "cuda") ? 0 : 1;
    char why[1024];
    *no_device = 0;
    if (!handles[slot]) {
        handles[slot] = plugin_load(kind, why, sizeof why);
        if (!handles[slot]) {
            *no_device = 1;
            if (!quiet)
                nd_error(ND_EUNSUPPORTED,
                         "backend '%s' is not available: its plugin libneedle_%s.so could not be "
                         "loaded (%s)",
                         kind, kind, why);
            return NULL;
        }
    }
    nd_plugin_open_fn open_fn = (nd_plugin_open_fn)dlsym(handles[slot], ND_PLUGIN_SYMBOL);
    if (!open_fn) {
        if (!quiet)
            nd_error(ND_EUNSUPPORTED, "libneedle_%s.so has no %s", kind, ND_PLUGIN_SYMBOL);
        return NULL;
    }
    const nd_tuning *tu = nd_tuning_get();
    nd_plugin_opts opts = {0, tu->vulkan_validate};
    if (!strcmp(tu->cuda_precision, "bf16"))
        opts.precision = 2;
    else if (!strcmp(tu->cuda_precision, "tf32") || tu->cuda_tf32)
        opts.precision = 1;
    const nd_backend *be =
        open_fn(ND_PLUGIN_ABI, index, allow_sw, threads, no_device, why, sizeof why, &opts);
    if (!be && !quiet)
        nd_error(*no_device ? ND_EUNSUPPORTED : ND_EIO, "backend '%s': %s", kind, why);
    return be;
}

static const nd_backend *select_backend(const char *name, int threads);

/* Could "auto" find a hardware GPU of this kind here? Loading a GPU runtime
 * only to learn there is none costs a CPU-only command most of its start-up
 * (the Vulkan loader opens every installed driver; Mesa's map LLVM: ~250 MB
 * and 0.1 s for `needle eval` on a tiny checkpoint), so on Linux a plugin is
 * probed only when the kernel shows a device it could drive: an NVIDIA
 * driver node (CUDA and NVIDIA's Vulkan driver), WSL2's GPU node, or, for
 * Vulkan, a DRM render node. NEEDLE_GPU_PROBE=1 probes regardless (a GPU
 * exposed some other way), =0 never (auto is then the CPU). */
static int gpu_could_exist(const char *kind)
{
    const char *force = nd_tuning_get()->gpu_probe;
    if (force && *force)
        return strcmp(force, "0") != 0;
#ifdef __linux__
    if (!access("/dev/nvidiactl", F_OK) || !access("/dev/nvidia0", F_OK) ||
        !access("/dev/dxg", F_OK))
        return 1;
    if (strcmp(kind, "vulkan"))
        return 0;
    DIR *d = opendir("/dev/dri");
    if (!d)
        return 0;
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d)))
        found = !strncmp(e->d_name, "renderD", 7);
    closedir(d);
    return found;
#else
    (void)kind;
    return 1; /* no cheap test elsewhere: ask the runtime */
#endif
}

/* ---- declined ops run on the CPU ----
 * A declined op's entry becomes a wrapper that waits for the backend's
 * issued ops (nd_backend_sync) and runs the CPU backend's op on the same
 * memory: only for backends whose alloc memory the host can reach
 * (be->host_mem: the CPU, Vulkan; backend.h), and the CPU op has
 * finished when it returns, so later device ops see its outputs. The
 * table keeps answering supports() as the backend does, so tests and
 * progress lines can tell which ops are not the backend's own. */

static const nd_backend *fb_cpu; /* set (prepared) before any wrapper is installed */

#define ND_OP(name, kind, ...)                                                                     \
    static void fb_##name(const nd_backend *be, ND_OP_PARAMS(__VA_ARGS__))                         \
    {                                                                                              \
        nd_backend_sync(be);                                                                       \
        fb_cpu->name(fb_cpu, ND_OP_ARGS(__VA_ARGS__));                                             \
    }
#include "backend/ops.def"
#undef ND_OP

typedef struct {
    nd_backend table; /* what callers get: the backend's, declined ops replaced */
    const nd_backend *native;
    unsigned char declined[ND_OP_COUNT];
} fb_table;

enum { FB_MAX = 16 };
static fb_table fb_tables[FB_MAX];
static int fb_n;
static pthread_mutex_t fb_lock = PTHREAD_MUTEX_INITIALIZER;

static int fb_supports(const nd_backend *be, enum nd_op op)
{
    for (int i = 0; i < FB_MAX; i++) /* entries are never removed: no lock needed to find one */
        if (be == &fb_tables[i].table)
            return !fb_tables[i].declined[op];
    return 1; /* not reached: only the tables below have this entry */
}

/* NEEDLE_BACKEND_DECLINE=op[,op...]: decline these ops on any backend (they
 * run on the CPU), e.g. to tell a device op's fault from the rest of a run.
 * ND_OK, or ND_EARG naming an unknown op. */
static int env_declined(unsigned char *declined)
{
    memset(declined, 0, ND_OP_COUNT);
    const char *s = nd_tuning_get()->backend_decline;
    while (s && *s) {
        size_t n = strcspn(s, ",");
        char op[64];
        snprintf(op, sizeof op, "%.*s", (int)(n < sizeof op ? n : sizeof op - 1), s);
        enum nd_op k = nd_op_from_name(op);
        if (n && k == ND_OP_COUNT)
            return nd_error(ND_EARG,
                            "NEEDLE_BACKEND_DECLINE: '%.*s' is not a backend op (backend/ops.def "
                            "lists them, e.g. matmul, attention_backward)",
                            (int)n, s);
        if (n)
            declined[k] = 1;
        s += n + (s[n] == ',');
    }
    return ND_OK;
}

/* be itself when it runs every op; else the table with its declined ops
 * on the CPU (one per backend and set of declined ops); NULL + error. */
static const nd_backend *with_fallback(const nd_backend *be)
{
    unsigned char declined[ND_OP_COUNT];
    if (env_declined(declined) != ND_OK)
        return NULL;
    int n = 0, first = -1;
    for (int op = 0; op < (int)ND_OP_COUNT; op++) {
        declined[op] |= !nd_backend_supports(be, (enum nd_op)op);
        n += declined[op];
        if (declined[op] && first < 0)
            first = op;
    }
    if (!n)
        return be;
    if (!be->host_mem) { /* the CPU cannot reach its memory */
        nd_error(ND_EUNSUPPORTED,
                 "backend '%s' declines %s (its supports() or NEEDLE_BACKEND_DECLINE), which "
                 "cannot run on the CPU: its memory is device memory",
                 be->name, nd_op_name((enum nd_op)first));
        return NULL;
    }
    const nd_backend *cpu = nd_backend_cpu(0);
    if (cpu->prepare && cpu->prepare(cpu) != ND_OK) {
        nd_error_prefix(ND_EUNSUPPORTED, "backend '%s' declines %s, which would run on the CPU",
                        be->name, nd_op_name((enum nd_op)first));
        return NULL;
    }
    pthread_mutex_lock(&fb_lock);
    fb_cpu = cpu;
    fb_table *t = NULL;
    for (int i = 0; i < fb_n && !t; i++)
        if (fb_tables[i].native == be && !memcmp(fb_tables[i].declined, declined, ND_OP_COUNT))
            t = &fb_tables[i];
    if (!t && fb_n < FB_MAX) {
        t = &fb_tables[fb_n];
        t->native = be;
        memcpy(t->declined, declined, ND_OP_COUNT);
        nd_backend *w = &t->table;
        *w = *be;
#define ND_OP(name, kind, ...)                                                                     \
    if (declined[ND_OP_##name])                                                                    \
        w->name = fb_##name;
#include "backend/ops.def"
#undef ND_OP
        w->supports = fb_supports;
        fb_n++;
    }
    if (t) { /* the CPU's thread count and BLAS name may have changed since */
        t->table.threads = be->threads;
        t->table.detail = be->detail;
    }
    pthread_mutex_unlock(&fb_lock);
    if (!t)
        nd_error(ND_ELIMIT, "backend '%s': too many sets of declined ops in one process", be->name);
    return t ? &t->table : NULL;
}

/* The float compute paths (training, eval, bench) come here: the backend is
 * readied now so a missing library is a clear error before any work. */
const nd_backend *nd_backend_get(const char *name, int threads)
{
    const nd_backend *be = select_backend(name, threads);
    if (be && be->prepare && be->prepare(be) != ND_OK)
        return NULL;
    return be ? with_fallback(be) : NULL;
}

static const nd_backend *select_backend(const char *name, int threads)
{
    if (!name || !strcmp(name, "cpu"))
        return nd_backend_cpu(threads);
    int no_device;
    if (!strcmp(name, "auto")) {
#if defined(__APPLE__) && defined(__aarch64__)
        /* Apple Silicon: Accelerate runs GEMMs on the matrix coprocessor and
         * shares memory with the GPU; the Vulkan (MoltenVK) GPU path is used
         * only when asked for (--device vulkan) */
        return nd_backend_cpu(threads);
#endif
        const nd_backend *be = NULL;
        if (gpu_could_exist("cuda"))
            be = plugin_open("cuda", -1, 0, threads, 1, &no_device);
        if (!be && gpu_could_exist("vulkan"))
            be = plugin_open("vulkan", -1, 0, threads, 1, &no_device);
        return be ? be : nd_backend_cpu(threads);
    }
    const char *kinds[] = {"cuda", "vulkan"};
    for (int k = 0; k < 2; k++) {
        size_t n = strlen(kinds[k]);
        if (strncmp(name, kinds[k], n) || (name[n] && name[n] != ':'))
            continue;
        int index = -1;
        if (name[n] == ':') {
            char *end;
            long v = strtol(name + n + 1, &end, 10);
            if (end == name + n + 1 || *end || v < 0 || v > 1000) {
                nd_error(ND_EARG, "device '%s': expected %s or %s:N with N a device index", name,
                         kinds[k], kinds[k]);
                return NULL;
            }
            index = (int)v;
        }
        int allow_sw = nd_tuning_get()->vulkan_software;
        return plugin_open(kinds[k], index, allow_sw, threads, 0, &no_device);
    }
    nd_error(ND_EARG, "unknown device '%s' (expected auto, cpu, cuda[:N] or vulkan[:N])", name);
    return NULL;
}

const char *nd_backend_line(const nd_backend *be, char *buf, size_t n)
{
    if (be->device)
        snprintf(buf, n, "%s  %s", be->name, be->detail);
    else
        snprintf(buf, n, "%s  float32  (%d threads, %s)", be->name, be->threads, be->detail);
    /* ops the backend declines (they run on the CPU) */
    for (int op = 0, k = 0; op < (int)ND_OP_COUNT; op++)
        if (!nd_backend_supports(be, (enum nd_op)op)) {
            size_t len = strlen(buf);
            snprintf(buf + len, n - len, "%s%s",
                     k++ ? ", " : "; on the CPU: ", nd_op_name((enum nd_op)op));
        }
    return buf;
}
