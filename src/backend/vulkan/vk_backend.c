/* The Vulkan backend plugin: its op table and the entry point the
 * registry (src/backend/registry.c) calls after dlopen. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
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

/* ---- Needle 3 ops this backend does not implement yet ----
 * vk_supports() declines them, so nd_backend_get runs the CPU's on the
 * same memory; these entries only fill the table and are never reached
 * through it (a direct call is a bug and stops the program rather than
 * compute something wrong). */
static int vk_declined(enum nd_op op)
{
    return op == ND_OP_attention_ext || op == ND_OP_attention_ext_backward ||
           op == ND_OP_qkv_taps || op == ND_OP_qkv_taps_backward || op == ND_OP_gate_heads ||
           op == ND_OP_gate_heads_backward || op == ND_OP_engram_hash_seeded;
}

static int vk_supports(const nd_backend *be, enum nd_op op)
{
    (void)be;
    return !vk_declined(op);
}

static void vk_declined_call(const char *op)
{
    fprintf(stderr, "needle: vulkan backend: %s is declined (runs on the CPU); called directly\n",
            op);
    abort();
}

void vk_attention_ext(const nd_backend *be, float *out, float *lse, const float *q, const float *k,
                      const float *v, const nd_layout *L, int H, int G, int hd, int vd, int window)
{
    (void)be;
    (void)out;
    (void)lse;
    (void)q;
    (void)k;
    (void)v;
    (void)L;
    (void)H;
    (void)G;
    (void)hd;
    (void)vd;
    (void)window;
    vk_declined_call("attention_ext");
}

void vk_qkv_taps(const nd_backend *be, float *y, const float *x, const float *taps,
                 const nd_layout *L, int width, int ntaps, int window)
{
    (void)be;
    (void)y;
    (void)x;
    (void)taps;
    (void)L;
    (void)width;
    (void)ntaps;
    (void)window;
    vk_declined_call("qkv_taps");
}

void vk_gate_heads(const nd_backend *be, float *o, const float *att, const float *g, long N, int H,
                   int hd)
{
    (void)be;
    (void)o;
    (void)att;
    (void)g;
    (void)N;
    (void)H;
    (void)hd;
    vk_declined_call("gate_heads");
}

void vk_engram_hash_seeded(const nd_backend *be, int32_t *idx, const int32_t *tok,
                           const nd_layout *L, const int *orders, int n_orders, int heads,
                           int slots, int stride)
{
    (void)be;
    (void)idx;
    (void)tok;
    (void)L;
    (void)orders;
    (void)n_orders;
    (void)heads;
    (void)slots;
    (void)stride;
    vk_declined_call("engram_hash_seeded");
}

void vk_attention_ext_backward(const nd_backend *be, float *dq, float *dk, float *dv,
                               const float *dout, const float *q, const float *k, const float *v,
                               const float *out, const float *lse, const nd_layout *L, int H, int G,
                               int hd, int vd, int window)
{
    (void)be;
    (void)dq;
    (void)dk;
    (void)dv;
    (void)dout;
    (void)q;
    (void)k;
    (void)v;
    (void)out;
    (void)lse;
    (void)L;
    (void)H;
    (void)G;
    (void)hd;
    (void)vd;
    (void)window;
    vk_declined_call("attention_ext_backward");
}

void vk_qkv_taps_backward(const nd_backend *be, float *dx, float *dtaps, const float *dy,
                          const float *x, const float *taps, const nd_layout *L, int width,
                          int ntaps, int window)
{
    (void)be;
    (void)dx;
    (void)dtaps;
    (void)dy;
    (void)x;
    (void)taps;
    (void)L;
    (void)width;
    (void)ntaps;
    (void)window;
    vk_declined_call("qkv_taps_backward");
}

void vk_gate_heads_backward(const nd_backend *be, float *datt, float *dg, const float *dout,
                            const float *att, const float *g, long N, int H, int hd)
{
    (void)be;
    (void)datt;
    (void)dg;
    (void)dout;
    (void)att;
    (void)g;
    (void)N;
    (void)H;
    (void)hd;
    vk_declined_call("gate_heads_backward");
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
    struct vk_state *S = &vk_state;
    if (S->opened != -2) {
        if (index >= 0 && index != S->opened) {
            snprintf(err, errlen, "the Vulkan backend is already open on device %d", S->opened);
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
    vk_table.ctx = S;
    snprintf(S->detail, sizeof S->detail, "%s, float32", vk_device_description());
    vk_table.detail = S->detail;
    vk_table.alloc = vkb_alloc;
    vk_table.free = vkb_free;
    vk_table.sync = vkb_sync;
    vk_table.supports = vk_supports;
#define ND_OP(name, kind, ...) vk_table.name = vk_##name;
#include "backend/ops.def"
#undef ND_OP
    S->opened = dev;
    return &vk_table;
}
