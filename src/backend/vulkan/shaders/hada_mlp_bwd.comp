#version 450
#include "common.glsl"
#include "lanes_math.glsl"
// Hadamard MLP backward. Workgroup b of B takes rows [b*RB, (b+1)*RB) in
// order, one at a time, the transforms in shared memory (the scaled Walsh
// matrix is symmetric: each transpose is the transform itself). dz is set;
// when part is not 0, element i's contributions to dd1, dd2, dd3 (summed
// over the block's rows in order by the invocation that owns i) go to
// part[(q*hn + i)*B + b], q = 0, 1, 2; lanes_colsum adds the blocks.
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dz; F32 part; F32 dy; F32 z; F32 h1; F32 d1; F32 d2; F32 d3;
    int N, d, hn, rows_per_block, blocks; float scale;
};
layout(push_constant) uniform PC { Args a; };
shared float hada[4096];
void main() {
    uint t = gl_LocalInvocationID.x, d = uint(a.d), hn = uint(a.hn), B = uint(a.blocks);
    uint b = gl_WorkGroupID.x;
    bool want = uint64_t(a.part) != 0;
    uint r0 = b * uint(a.rows_per_block), r1 = min(uint(a.N), r0 + uint(a.rows_per_block));
    if (want)
        for (uint i = t; i < hn; i += 256u)
            for (uint q = 0; q < 3u; q++) a.part.v[(q * hn + i) * B + b] = 0.0;
    for (uint r = r0; r < r1; r++) {
        // W = fwht(silu(d2*h1)), for dd3 = sum dy * W[:d]
        if (want) {
            for (uint i = t; i < hn; i += 256u) {
                precise float sv = a.d2.v[i] * a.h1.v[r * hn + i];
                precise float w = sv * san_sigmoid(sv);
                hada[i] = w;
            }
            barrier();
            FWHT(hada, hn, a.scale, t, 256u)
            for (uint i = t; i < d; i += 256u)
                a.part.v[(2u * hn + i) * B + b] += a.dy.v[r * d + i] * hada[i];
            barrier();
        }
        for (uint i = t; i < hn; i += 256u) hada[i] = i < d ? a.dy.v[r * d + i] * a.d3.v[i] : 0.0;
        barrier();
        FWHT(hada, hn, a.scale, t, 256u)
        // silu'(s) = sg*(1 + s*(1-sg))
        for (uint i = t; i < hn; i += 256u) {
            float h = a.h1.v[r * hn + i];
            precise float sv = a.d2.v[i] * h;
            float sg = san_sigmoid(sv);
            precise float gm = hada[i] * (sg * (1.0 + sv * (1.0 - sg)));
            if (want) a.part.v[(hn + i) * B + b] += gm * h;
            hada[i] = gm * a.d2.v[i];
        }
        barrier();
        FWHT(hada, hn, a.scale, t, 256u)
        for (uint i = t; i < d; i += 256u) {
            float gi = hada[i];
            if (want) a.part.v[i * B + b] += gi * a.z.v[r * d + i];
            a.dz.v[r * d + i] = gi * a.d1.v[i];
        }
        barrier();
    }
}
