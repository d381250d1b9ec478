#version 450
#include "common.glsl"
#include "lanes_math.glsl"
// hyper_coeffs backward. Invocation t of T handles rows t, t+T, ...: dpre,
// dpost, dres per row, and its own partial sums of the parameter gradients
// in part[k*T + t] (k: a_pre, a_post, a_res, b_pre[n], b_post[n], b_res[nn]),
// summed over t in order by lanes_colsum. The Sinkhorn backward recomputes
// the forward keeping each half-round's softmax in this invocation's slice
// of work (element e at e*T + t: E[2*rounds*nn], Z[nn], g[nn]), then walks
// the half-rounds back: y = x - lse(x) has dx = dy - exp(y) * sum(dy).
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 dpre; F32 dpost; F32 dres; F32 dhpre; F32 dhpost; F32 dM; F32 pre; F32 post; F32 res;
    F32 hpre; F32 hpost; F32 b_res; F32 work; F32 part;
    float a_pre, a_post, a_res; int N, n, T, rounds;
};
layout(push_constant) uniform PC { Args a; };
void main() {
    uint t = GRID_ID, T = uint(a.T);
    if (t >= T) return;
    int n = a.n;
    uint nn = uint(n * n), nst = uint(2 * a.rounds);
    uint K = 3u + 2u * uint(n) + nn, o_bpre = 3u, o_bpost = 3u + uint(n), o_bres = 3u + 2u * uint(n);
    F32 work = a.work;
    uint zo = nst * nn * T + t, go = zo + nn * T;
    for (uint k = 0; k < K; k++) a.part.v[k * T + t] = 0.0;
    for (uint r = t; r < uint(a.N); r += T) {
        for (int i = 0; i < n; i++) {
            uint e = r * uint(n) + uint(i);
            float h = a.hpre.v[e];
            precise float dz = a.dhpre.v[e] * h * (1.0 - h);
            a.dpre.v[e] = a.a_pre * dz;
            a.part.v[0 * T + t] += dz * a.pre.v[e];
            a.part.v[(o_bpre + uint(i)) * T + t] += dz;
            h = a.hpost.v[e];
            dz = a.dhpost.v[e] * h * (1.0 - 0.5 * h);
            a.dpost.v[e] = a.a_post * dz;
            a.part.v[1 * T + t] += dz * a.post.v[e];
            a.part.v[(o_bpost + uint(i)) * T + t] += dz;
        }
        uint ro = r * nn;
        for (uint i = 0; i < nn; i++) {
            precise float z = a.a_res * a.res.v[ro + i] + a.b_res.v[i];
            a.work.v[zo + i * T] = z;
        }
        for (uint st = 0; st < nst; st++)
            sinkhorn_halfstep(work, zo, T, work, st * nn * T + t, T, n, (st & 1u) == 0u);
        for (uint i = 0; i < nn; i++) {
            precise float g = a.dM.v[ro + i] * san_expf(a.work.v[zo + i * T]);
            a.work.v[go + i * T] = g;
        }
        for (int st = int(nst) - 1; st >= 0; st--) {
            bool rowstep = (st & 1) == 0;
            uint eo = uint(st) * nn * T + t, stp = rowstep ? 1u : uint(n);
            for (int ai = 0; ai < n; ai++) {
                uint base = rowstep ? uint(ai * n) : uint(ai);
                precise float sum = 0.0;
                for (int b = 0; b < n; b++) sum += a.work.v[go + (base + uint(b) * stp) * T];
                for (int b = 0; b < n; b++) {
                    uint i = base + uint(b) * stp;
                    precise float g = a.work.v[go + i * T] - a.work.v[eo + i * T] * sum;
                    a.work.v[go + i * T] = g;
                }
            }
        }
        for (uint i = 0; i < nn; i++) {
            float g = a.work.v[go + i * T];
            a.dres.v[ro + i] = a.a_res * g;
            a.part.v[2 * T + t] += g * a.res.v[ro + i];
            a.part.v[(o_bres + i) * T + t] += g;
        }
    }
}
