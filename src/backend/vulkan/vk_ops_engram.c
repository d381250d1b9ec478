#include "backend/vulkan/vk_ops.h"

void vk_ops_engram_register(nd_backend *t)
{
    (void)t;
}
