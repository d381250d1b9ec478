/* The Vulkan backend's op table, filled group by group (one file per group
 * of ops, each with its shaders in shaders/). */
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

/* matmul, copy2d, add, rmsnorm, gate_sigmoid (vk_ops_core.c) */
void vk_ops_core_register(nd_backend *t);
/* embed, engram_*, gather/scatter rows, cross-entropy, and their backwards */
void vk_ops_engram_register(nd_backend *t);
/* hyper-connections, lanes, residual, Hadamard MLP, norm/gate backwards */
void vk_ops_lanes_register(nd_backend *t);
/* rope and attention, forward and backward */
void vk_ops_attention_register(nd_backend *t);

#endif
