#version 450
#include "common.glsl"
// RoPE in place on x [N, heads*hd], row r at position pos[r]: the pair
// (i, i + hd/2) rotates by +angle (forward) or -angle (backward: the
// transpose). cos/sin are [max position + 1, hd/2].
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 x; F32 cos_t; F32 sin_t; I32 lay;
    int N, n_seg, heads, hd, backward;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint half_ = uint(a.hd / 2), per_row = uint(a.heads) * half_;
    uint total = uint(a.N) * per_row;
    uint pos_at = uint(3 * a.n_seg + a.N); // layout block: seg[3*n_seg], row_seg[N], pos[N]
    for (uint i = GRID_ID; i < total; i += GRID_STRIDE) {
        uint r = i / per_row, rem = i % per_row;
        uint h = rem / half_, j = rem % half_;
        uint t = uint(a.lay.v[pos_at + r]);
        float c = a.cos_t.v[t * half_ + j], s = a.sin_t.v[t * half_ + j];
        uint base = (r * uint(a.heads) + h) * uint(a.hd) + j;
        float x1 = a.x.v[base], x2 = a.x.v[base + half_];
        if (a.backward == 0) {
            a.x.v[base] = x1 * c - x2 * s;
            a.x.v[base + half_] = x2 * c + x1 * s;
        } else {
            a.x.v[base] = x1 * c + x2 * s;
            a.x.v[base + half_] = x2 * c - x1 * s;
        }
    }
}
