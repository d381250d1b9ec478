/* The Vulkan backend's ops (one file per group of ops, each with its
 * shaders in shaders/); vk_backend.c fills the table from backend/ops.def. */
#ifndef ND_VK_OPS_H
#define ND_VK_OPS_H

#include <stdint.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "backend/vulkan/vk_runtime.h"

/* int32 sizes in the argument blocks: larger arrays are refused loudly */
static inline int32_t vk_i32(long v)
{
    if (v < 0 || v > INT32_MAX)
        abort();
    return (int32_t)v;
}

/* The ops, one per entry of backend/ops.def (semantics there), vk_<name>
 * in the file of its group: vk_ops_core.c (matmul, copy2d, add, rmsnorm,
 * gate_sigmoid), vk_ops_engram.c (embed, engram_*, gather/scatter rows,
 * cross-entropy, and their backwards), vk_ops_lanes.c (hyper-connections,
 * lanes, residual, Hadamard MLP, norm/gate backwards), vk_ops_attention.c
 * (rope and attention, attention_ext, forward and backward), vk_ops_hada3.c
 * (Needle 3's hada3_mix and softmax_rows, forward and backward), vk_ops_v3.c
 * (Needle 3's gate_heads and qkv_taps, forward and backward). */
#define ND_OP(name, kind, ...) void vk_##name(const nd_backend *be, ND_OP_PARAMS(__VA_ARGS__));
#include "backend/ops.def"
#undef ND_OP

/* Shared by the groups (vk_ops_lanes.c): device scratch of at least
 * `bytes`, one buffer for every op (ask before staging any input: growing
 * it syncs); and the second stage of the deterministic row reductions,
 * dst[k] += scale * sum_t part[k*T + t] for k < K (dst NULL: nothing). */
float *vk_scratch(size_t bytes);
void vk_colsum(float *dst, const float *part, int T, int K, float scale);

#endif
