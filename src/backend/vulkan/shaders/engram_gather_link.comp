#version 450
#include "common.glsl"
#include "engram_layout.glsl"
// For the backward's scatter into table k (grid y): link the rows that hit
// the same table row, in row order. lead[k*N + r] = 1 when r is the first
// live row with its index, next[k*N + r] = the next live row with the same
// index (N at the end). Rows whose forward gave zeros take no part.
// Each workgroup holds 256 rows and compares them against all rows, tile by
// tile, through shared memory.
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    I32 lead; I32 next; I32 idx; I32 lay; I32 orders;
    int N, n_seg, K, heads;
};
layout(push_constant) uniform PC { Args a; };
shared int tile[256];
int key_of(uint r, uint k, int first) {
    if (r >= uint(a.N) || lay_pos(I32(a.lay), a.n_seg, a.N, int(r)) < first) return -1;
    return a.idx.v[r * uint(a.K) + k];
}
void main() {
    uint k = gl_WorkGroupID.y, t = gl_LocalInvocationID.x, N = uint(a.N);
    int first = a.orders.v[k / uint(a.heads)] - 1;
    for (uint blk = gl_WorkGroupID.x; blk * 256u < N; blk += gl_NumWorkGroups.x) {
        uint r = blk * 256u + t;
        int key = key_of(r, k, first);
        bool prev = false;
        uint nxt = N;
        for (uint r0 = 0; r0 < N; r0 += 256u) {
            barrier();
            tile[t] = key_of(r0 + t, k, first);
            barrier();
            if (key >= 0)
                for (uint j = 0; j < 256u; j++) {
                    uint q = r0 + j;
                    if (tile[j] != key || q == r) continue;
                    if (q < r) prev = true;
                    else if (nxt == N) nxt = q;
                }
        }
        if (r < N) {
            a.lead.v[k * N + r] = key >= 0 && !prev ? 1 : 0;
            a.next.v[k * N + r] = int(nxt);
        }
    }
}
