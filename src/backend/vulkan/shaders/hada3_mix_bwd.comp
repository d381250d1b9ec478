#version 450
#include "common.glsl"
#include "lanes_math.glsl"
// hada3_mix_backward (backend/ops.def). Invocation x = feature m, workgroup
// y = row block b: rows [b*RB, (b+1)*RB) in order. With e = ddst * act'(h):
// dsrc = (e*scale)*g and dcond = (e*scale)*v are set; the block's sums of
// (e*g)*v and e go to part[m*B + b] and part[(cols + m)*B + b] (when
// want_scale / want_bias), which lanes_colsum adds in block order: a fixed
// reduction, no atomics.
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dsrc; F32 dcond; F32 part; F32 ddst; I32 doff; F32 src; I32 soff; F32 scale; F32 p; F32 cu;
    F32 bias; // dsrc, dcond, part, src, p, cu, bias: 0 when absent
    int drs, srs, rank, silu, N, cols, rows_per_block, blocks, want_scale, want_bias;
};
layout(push_constant) uniform PC { Args a; };
#include "hada3_math.glsl"
void main() {
    uint m = gl_GlobalInvocationID.x, cols = uint(a.cols), B = uint(a.blocks), b = gl_WorkGroupID.y;
    if (m >= cols) return;
    uint r0 = b * uint(a.rows_per_block), r1 = min(uint(a.N), r0 + uint(a.rows_per_block));
    bool has_src = uint64_t(a.src) != 0, has_dsrc = uint64_t(a.dsrc) != 0;
    bool has_dcond = uint64_t(a.dcond) != 0;
    int dof = a.doff.v[m], sof = a.soff.v[m];
    float sc = a.scale.v[m], bias = uint64_t(a.bias) != 0 ? a.bias.v[m] : 0.0;
    precise float ss = 0.0, sb = 0.0;
    for (uint r = r0; r < r1; r++) {
        float e = dof >= 0 ? a.ddst.v[uint(dof) + r * uint(a.drs)] : 0.0;
        float v = has_src && sof >= 0 ? a.src.v[uint(sof) + r * uint(a.srs)] : 0.0;
        float g = hada3_gain(cols, r, m);
        if (a.silu != 0) { // silu'(h) = s*(1 + h*(1 - s))
            precise float h = sc * g * v + bias;
            float s = san_sigmoid(h);
            precise float ds = s * (1.0 + h * (1.0 - s));
            e = e * ds;
        }
        precise float es = e * sc;
        if (has_dsrc && sof >= 0) {
            precise float t = es * g;
            a.dsrc.v[uint(sof) + r * uint(a.srs)] = t;
        }
        if (has_dcond) {
            precise float t = es * v;
            a.dcond.v[r * cols + m] = t;
        }
        precise float eg = e * g;
        ss += eg * v;
        sb += e;
    }
    if (a.want_scale != 0) a.part.v[m * B + b] = ss;
    if (a.want_bias != 0) a.part.v[(cols + m) * B + b] = sb;
}
