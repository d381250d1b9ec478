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

static nd_backend vk_table;
static int vk_opened = -2; /* device index once open */
static char vk_detail[400];

/* Every entry filled? (a missing op is a build mistake: say which) */
#define OP(name)                                                                                   \
    {                                                                                              \
#name, offsetof(nd_backend, name)                                                          \
    }
static const struct {
    const char *name;
    size_t off;
} vk_op_slots[] = {OP(matmul),
                   OP(rmsnorm),
                   OP(embed),
                   OP(engram_hash),
                   OP(engram_gather),
                   OP(engram_taps),
                   OP(engram_gate),
                   OP(hyper_coeffs),
                   OP(lanes_combine),
                   OP(lanes_update),
                   OP(lanes_broadcast),
                   OP(lanes_mean),
                   OP(rope),
                   OP(attention),
                   OP(gate_sigmoid),
                   OP(residual_scaled),
                   OP(hadamard_mlp),
                   OP(gather_rows),
                   OP(scatter_add_rows),
                   OP(cross_entropy),
                   OP(cross_entropy_backward),
                   OP(rmsnorm_backward),
                   OP(embed_backward),
                   OP(engram_gather_backward),
                   OP(engram_taps_backward),
                   OP(engram_gate_backward),
                   OP(hyper_coeffs_backward),
                   OP(lanes_combine_backward),
                   OP(lanes_update_backward),
                   OP(lanes_broadcast_backward),
                   OP(lanes_mean_backward),
                   OP(rope_backward),
                   OP(attention_backward),
                   OP(gate_sigmoid_backward),
                   OP(residual_scaled_backward),
                   OP(hadamard_mlp_backward),
                   OP(copy2d),
                   OP(add)};
#undef OP

static const char *missing_op(const nd_backend *t)
{
    for (size_t i = 0; i < sizeof vk_op_slots / sizeof *vk_op_slots; i++) {
        void (*fn)(void);
        memcpy(&fn, (const char *)t + vk_op_slots[i].off, sizeof fn);
        if (!fn)
            return vk_op_slots[i].name;
    }
    return NULL;
}

__attribute__((visibility("default"))) const nd_backend *nd_plugin_open(int abi, int index,
                                                                        int allow_software,
                                                                        int threads, int *no_device,
                                                                        char *err, size_t errlen)
{
    (void)threads;
    *no_device = 0;
    if (abi != ND_PLUGIN_ABI) {
        snprintf(err, errlen, "plugin ABI %d, program ABI %d: rebuild both together", ND_PLUGIN_ABI,
                 abi);
        return NULL;
    }
    if (vk_opened != -2) {
        if (index >= 0 && index != vk_opened) {
            snprintf(err, errlen, "the Vulkan backend is already open on device %d", vk_opened);
            return NULL;
        }
        return &vk_table;
    }
    int dev = vk_open(index, allow_software, no_device, err, errlen);
    if (dev < 0)
        return NULL;
    memset(&vk_table, 0, sizeof vk_table);
    vk_table.name = "vulkan";
    vk_table.threads = 1;
    vk_table.device = 1;
    snprintf(vk_detail, sizeof vk_detail, "%s, float32", vk_device_description());
    vk_table.detail = vk_detail;
    vk_table.alloc = vkb_alloc;
    vk_table.free = vkb_free;
    vk_table.sync = vkb_sync;
    vk_ops_core_register(&vk_table);
    vk_ops_engram_register(&vk_table);
    vk_ops_lanes_register(&vk_table);
    vk_ops_attention_register(&vk_table);
    const char *miss = missing_op(&vk_table);
    if (miss && !getenv("NEEDLE_VULKAN_PARTIAL")) {
        snprintf(err, errlen, "the Vulkan backend lacks the op %s", miss);
        return NULL;
    }
    vk_opened = dev;
    return &vk_table;
}
