#version 450
#include "common.glsl"
// dtables[k][idx[r, k]] += de[r, k]: the first row of each chain (from
// engram_gather_link) owns its table row and adds the chain's rows in row
// order, as the CPU does, without atomics.
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dtables; F32 de; I32 idx; I32 lead; I32 next;
    int N, K, slots, sub;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint sub = uint(a.sub), K = uint(a.K), N = uint(a.N), total = K * N * sub;
    for (uint i = GRID_ID; i < total; i += GRID_STRIDE) {
        uint c = i % sub, kr = i / sub, k = kr / N, r = kr % N;
        if (a.lead.v[kr] == 0) continue;
        uint dst = (k * uint(a.slots) + uint(a.idx.v[r * K + k])) * sub + c;
        float acc = a.dtables.v[dst];
        for (uint q = r; q < N; q = uint(a.next.v[k * N + q]))
            acc += a.de.v[(q * K + k) * sub + c];
        a.dtables.v[dst] = acc;
    }
}
