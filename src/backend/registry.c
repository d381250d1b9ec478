/* Backend selection: the CPU backend is built in; GPU backends are
 * plugins found next to the program (or NEEDLE_PLUGIN_DIR, or lib/needle/
 * of an installed tree) and loaded on
 * first use, so one binary runs with or without a GPU runtime. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/plugin.h"
#include "core/selfpath.h"
#include "core/status.h"

#ifndef NEEDLE_INSTALL_LIBDIR
#define NEEDLE_INSTALL_LIBDIR "lib"
#endif

/* dlopen libneedle_<kind>.so; NULL + message when absent. */
static void *plugin_load(const char *kind, char *why, size_t n)
{
    char file[64], path[4096], dir[3072];
    snprintf(file, sizeof file, "libneedle_%s.so", kind);
    const char *env = getenv("NEEDLE_PLUGIN_DIR");
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
    const nd_backend *be =
        open_fn(ND_PLUGIN_ABI, index, allow_sw, threads, no_device, why, sizeof why);
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
    const char *force = getenv("NEEDLE_GPU_PROBE");
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

/* The float compute paths (training, eval, bench) come here: the backend is
 * readied now so a missing library is a clear error before any work. */
const nd_backend *nd_backend_get(const char *name, int threads)
{
    const nd_backend *be = select_backend(name, threads);
    if (be && be->prepare && be->prepare(be) != ND_OK)
        return NULL;
    return be;
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
        const char *sw = getenv("NEEDLE_VULKAN_SOFTWARE");
        int allow_sw = sw && *sw && strcmp(sw, "0");
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
    return buf;
}
