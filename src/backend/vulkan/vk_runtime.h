/* The Vulkan backend's runtime: one device, one queue, memory the host can
 * map, and a recorder that turns op calls into compute dispatches.
 *
 * Shaders reach memory through buffer device addresses (Vulkan 1.2
 * bufferDeviceAddress): an op packs the addresses of its arrays and its
 * scalars into an argument block in the staging ring, and the dispatch's
 * push constant is that block's address. So every op is one pointer-sized
 * push constant, no descriptor sets, and no 128 MB descriptor range limit.
 *
 * Dispatches are recorded into one command buffer and run when the host
 * syncs (or the ring fills). A barrier goes in only when a dispatch reads
 * or writes memory that an earlier dispatch since the last barrier wrote,
 * or writes memory one of them read. */
#ifndef ND_VK_RUNTIME_H
#define ND_VK_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "backend/layout.h"

/* index of a shader in the embedded table (vk_shader_table.c, generated) */
typedef struct {
    const char *name;
    const uint32_t *code;
    size_t size;
} vk_shader_src;
extern const vk_shader_src vk_shader_srcs[];
extern const int vk_shader_count;

/* Open the device (index < 0: best hardware device; software devices only
 * when allow_software). 0, or -1 with a message in err; *no_device when
 * only the device is missing. */
int vk_open(int index, int allow_software, int validate, int *no_device, char *err, size_t errlen);
const char *vk_device_description(void);
uint32_t vk_subgroup_size(void);
uint32_t vk_max_shared_bytes(void);

void *vk_alloc(size_t bytes);
void vk_free(void *p);
/* Run everything recorded and wait. */
void vk_sync(void);

/* Device address of n bytes at p for reading: memory from vk_alloc is used
 * in place; anything else is copied into the staging ring now. */
uint64_t vk_in(const void *p, size_t bytes);
/* Like vk_in but p may be NULL (returns 0). */
uint64_t vk_in_opt(const void *p, size_t bytes);
/* Device address of n bytes at p for writing (or read-modify-write): p
 * must come from vk_alloc; anything else is a caller bug (abort). */
uint64_t vk_out(void *p, size_t bytes);
uint64_t vk_out_opt(void *p, size_t bytes);
/* A layout staged for the shaders: seg[n_seg] (start, len, parent),
 * row_seg[N], pos[N], as int32 in one block. Reused while unchanged. */
uint64_t vk_layout(const nd_layout *L);

/* Record one dispatch of shader `name` with an argument block (copied into
 * the ring) and a grid of workgroups. Names are looked up once. */
void vk_dispatch(const char *name, const void *args, size_t args_bytes, uint32_t gx, uint32_t gy,
                 uint32_t gz);

/* Workgroups to cover n items with groups of `per` (grid x capped at 65535:
 * shaders loop over gl_NumWorkGroups). */
uint32_t vk_groups(long n, long per);

#endif
