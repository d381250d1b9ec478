#version 450
#include "common.glsl"
// dscale partials: workgroup (column tile x, row block y) writes
// part[col*B + y] = sum over its rows of dy*x*rstd (4 row lanes, each in row
// order, then added in lane order); lanes_colsum sums the blocks in order.
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 part; F32 dy; F32 x; F32 rstd; int rows, dim, rows_per_block, blocks;
};
layout(push_constant) uniform PC { Args a; };
shared float red[256];
void main() {
    uint t = gl_LocalInvocationID.x, lane = t / 64u, dim = uint(a.dim);
    uint col = gl_WorkGroupID.x * 64u + t % 64u, b = gl_WorkGroupID.y;
    uint r0 = b * uint(a.rows_per_block), r1 = min(uint(a.rows), r0 + uint(a.rows_per_block));
    float s = 0.0;
    if (col < dim)
        for (uint r = r0 + lane; r < r1; r += 4u) {
            precise float v = a.dy.v[r * dim + col] * a.x.v[r * dim + col] * a.rstd.v[r];
            s += v;
        }
    red[t] = s;
    barrier();
    if (lane == 0u && col < dim)
        a.part.v[col * uint(a.blocks) + b] = ((red[t] + red[t + 64u]) + red[t + 128u]) + red[t + 192u];
}
