/* AMX tile configuration shared by the int8 GEMM (qmat_x86.c) and the
 * prefill attention (attention_x86.c): every kernel here uses palette 1
 * with its first `tiles` registers as full 16 x 64-byte tiles. x86-64 only;
 * callers check nd_amx_usable() first. */
#ifndef ND_AMX_H
#define ND_AMX_H
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} nd_amx_config;

/* tmm0 .. tmm(tiles-1) as 16 rows x 64 bytes; the kernel that calls this
 * ends with _tile_release() */
__attribute__((target("amx-tile"))) static inline void nd_amx_tiles(int tiles)
{
    nd_amx_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < tiles; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}
#endif
#endif
