#version 450
#include "common.glsl"
#include "lanes_math.glsl"
// hada3_mix (backend/ops.def): one invocation per (row r, feature m),
// grid-stride. v = src[soff[m] + r*srs] (0 where soff[m] < 0 or src is
// absent), h = (scale[m]*g)*v + bias[m], dst[doff[m] + r*drs] = silu ? silu(h)
// : h, nothing where doff[m] < 0. The float operations follow cpu_hada3.c.
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dst; I32 doff; F32 src; I32 soff; F32 scale; F32 p; F32 cu; F32 bias; // src, p, cu, bias: 0 when absent
    int drs, srs, rank, silu, N, cols;
};
layout(push_constant) uniform PC { Args a; };
#include "hada3_math.glsl"
void main() {
    uint cols = uint(a.cols), total = uint(a.N) * cols;
    bool has_src = uint64_t(a.src) != 0, has_bias = uint64_t(a.bias) != 0;
    for (uint i = GRID_ID; i < total; i += GRID_STRIDE) {
        uint r = i / cols, m = i - r * cols;
        int dof = a.doff.v[m];
        if (dof < 0) continue;
        int sof = a.soff.v[m];
        float v = has_src && sof >= 0 ? a.src.v[uint(sof) + r * uint(a.srs)] : 0.0;
        precise float sg = a.scale.v[m] * hada3_gain(cols, r, m);
        precise float h = v * sg;
        if (has_bias) h = h + a.bias.v[m];
        if (a.silu != 0) h = h * san_sigmoid(h);
        a.dst.v[uint(dof) + r * uint(a.drs)] = h;
    }
}
