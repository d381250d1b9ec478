#version 450
#include "common.glsl"
#include "engram_layout.glsl"
// idx[r, k]: the n-gram hash of table k over the previous tokens of row r's
// sequence (san_engram_index_hist; 0 before the sequence start).
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    I32 idx; I32 tok; I32 lay; I32 orders;
    int N, n_seg, n_orders, heads, slots, omax; // omax: longest order, at most 8
    int stride; // seed index of table k = (order oi, head h): oi*stride + h (+1 below)
};
layout(push_constant) uniform PC { Args a; };
const uint SEED = 0x9E3779B9u, PRIME = 0x01000193u;
void main() {
    int K = a.n_orders * a.heads;
    for (uint r = GRID_ID; r < uint(a.N); r += GRID_STRIDE) {
        uint hist[8];
        for (int j = 0; j < 8; j++) {
            int b = j < a.omax ? lay_back(I32(a.lay), a.n_seg, int(r), j) : -1;
            hist[j] = b >= 0 ? uint(a.tok.v[b]) : 0u;
        }
        for (int k = 0; k < K; k++) {
            int o = min(a.orders.v[k / a.heads], a.omax);
            int seed_k = (k / a.heads) * a.stride + k % a.heads;
            uint acc = SEED * uint(seed_k + 1);
            for (int j = 0; j < o; j++) acc = (acc ^ hist[j]) * PRIME;
            acc ^= acc >> 15;
            a.idx.v[r * uint(K) + uint(k)] = int(acc % uint(a.slots));
        }
    }
}
