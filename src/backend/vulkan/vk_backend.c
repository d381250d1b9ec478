/* The Vulkan backend plugin: its op table and the entry point the
 * registry (src/backend/registry.c) calls after dlopen. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "backend/plugin.h"
#include "backend/vulkan/vk_ops.h"

static void *vkb_alloc(const nd_backend *be, size_t bytes)
{
    (void)be;
    return vk_alloc(bytes);
}

static void vkb_free(const nd_backend *be, void *p)
{
    (void)be;
    vk_free(p);
}

static void vkb_sync(const nd_backend *be)
{
    (void)be;
    vk_sync();
}

/* The plugin's state (the table's ctx). The runtime (vk_runtime.c)
 * drives one device per process, so there is one table and one state. */
struct vk_state {
    int opened; /* the device index once open; -2 before */
    char detail[400];
};
static struct vk_state vk_state = {-2, ""};
static nd_backend vk_table;

__attribute__((visibility("default"))) const nd_backend *
nd_plugin_open(int abi, int index, int allow_software, int threads, int *no_device, char *err,
               size_t errlen, const nd_plugin_opts *opts)
{
    (void)threads;
    *no_device = 0;
    if (abi != ND_PLUGIN_ABI) {
        snprintf(err, errlen, "plugin ABI %d, program ABI %d: rebuild both together", ND_PLUGIN_ABI,
                 abi);
        return NULL;
    }
    struct vk_state *S = &vk_state;
    if (S->opened != -2) {
        if (index >= 0 && index != S->opened) {
            snprintf(err, errlen, "the Vulkan backend is already open on device %d", S->opened);
            return NULL;
        }
        return &vk_table;
    }
    int dev = vk_open(index, allow_software, opts && opts->validate, no_device, err, errlen);
    if (dev < 0)
        return NULL;
    memset(&vk_table, 0, sizeof vk_table);
    vk_table.name = "vulkan";
    vk_table.threads = 1;
    vk_table.device = 1;
    vk_table.ctx = S;
    snprintf(S->detail, sizeof S->detail, "%s, float32", vk_device_description());
    vk_table.detail = S->detail;
    vk_table.alloc = vkb_alloc;
    vk_table.free = vkb_free;
    vk_table.sync = vkb_sync;
    vk_table.host_mem = 1; /* host-visible: upload and download are a sync and a memcpy */
#define ND_OP(name, kind, ...) vk_table.name = vk_##name;
#include "backend/ops.def"
#undef ND_OP
    S->opened = dev;
    return &vk_table;
}
