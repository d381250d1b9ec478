/* Little-endian byte helpers shared by the .cact writer (cact.c) and
 * reader (cact_read.c). */
#ifndef ND_IO_CACT_BYTES_H
#define ND_IO_CACT_BYTES_H

#include <stdint.h>
#include <string.h>

static inline uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t get_u64(const unsigned char *p)
{
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

static inline float get_f32(const unsigned char *p)
{
    uint32_t u = get_u32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
