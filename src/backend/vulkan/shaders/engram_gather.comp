#version 450
#include "common.glsl"
#include "engram_layout.glsl"
// e[r] = concat_k tables[k][idx[r, k]] (zero rows while pos[r] < order_k - 1)
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 e; F32 tables; I32 idx; I32 lay; I32 orders;
    int N, n_seg, K, heads, slots, sub;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint sub = uint(a.sub), K = uint(a.K), total = uint(a.N) * K * sub;
    for (uint i = GRID_ID; i < total; i += GRID_STRIDE) {
        uint c = i % sub, rk = i / sub, r = rk / K, k = rk % K;
        float x = 0.0;
        if (lay_pos(I32(a.lay), a.n_seg, a.N, int(r)) >= a.orders.v[k / uint(a.heads)] - 1)
            x = a.tables.v[(k * uint(a.slots) + uint(a.idx.v[rk])) * sub + c];
        a.e.v[i] = x;
    }
}
