#version 450
#include "common.glsl"
// lanes_update backward (Xo = M X + hpost y), one workgroup per row:
// dhpost[i] = <G_i, y>, dM[i,j] = <G_i, X_j> (fixed trees, 8 dots at a time),
// dy = sum_i hpost_i G_i, dX_j = sum_i M_ij G_i, with G = dXo. dX may alias
// dXo: every column is read (into gcol) by the invocation that writes it,
// before it writes it. n <= 64.
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dX; F32 dM; F32 dhpost; F32 dy; F32 dXo; F32 M; F32 X; F32 hpost; F32 y; int N, n, d;
};
layout(push_constant) uniform PC { Args a; };
shared float red[8][64];
void main() {
    uint t = gl_LocalInvocationID.x, n = uint(a.n), d = uint(a.d), nq = n + n * n;
    for (uint r = gl_WorkGroupID.x; r < uint(a.N); r += gl_NumWorkGroups.x) {
        uint xo = r * n * d, mo = r * n * n;
        for (uint q0 = 0; q0 < nq; q0 += 8u) {
            float acc[8];
            for (uint k = 0; k < 8u; k++) acc[k] = 0.0;
            for (uint c = t; c < d; c += 64u)
                for (uint k = 0; k < 8u; k++) {
                    uint q = q0 + k;
                    if (q >= nq) break;
                    if (q < n) acc[k] += a.dXo.v[xo + q * d + c] * a.y.v[r * d + c];
                    else {
                        uint i = (q - n) / n, j = (q - n) % n;
                        acc[k] += a.dXo.v[xo + i * d + c] * a.X.v[xo + j * d + c];
                    }
                }
            for (uint k = 0; k < 8u; k++) red[k][t] = acc[k];
            barrier();
            for (uint w = 32u; w > 0u; w >>= 1) {
                if (t < w)
                    for (uint k = 0; k < 8u; k++) red[k][t] += red[k][t + w];
                barrier();
            }
            if (t < 8u && q0 + t < nq) {
                uint q = q0 + t;
                if (q < n) a.dhpost.v[r * n + q] = red[t][0];
                else a.dM.v[mo + q - n] = red[t][0];
            }
            barrier();
        }
        for (uint c = t; c < d; c += 64u) {
            float gcol[64];
            precise float s = 0.0;
            for (uint i = 0; i < n; i++) {
                gcol[i] = a.dXo.v[xo + i * d + c];
                s += a.hpost.v[r * n + i] * gcol[i];
            }
            a.dy.v[r * d + c] = s;
            for (uint j = 0; j < n; j++) {
                precise float o = 0.0;
                for (uint i = 0; i < n; i++) o += a.M.v[mo + i * n + j] * gcol[i];
                a.dX.v[xo + j * d + c] = o;
            }
        }
    }
}
