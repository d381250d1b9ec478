#version 450
#include "common.glsl"
// C[M,N] = alpha * op(A) @ op(B) + beta * C, row-major. 64x64 tiles of C per
// workgroup, 16-deep slices of K through shared memory, 4x4 outputs per
// invocation. beta == 0 never reads C (it may hold NaN).
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer Args {
    F32 A; F32 B; F32 C;
    int ta, tb, M, N, K, lda, ldb, ldc;
    float alpha, beta;
};
layout(push_constant) uniform PC { Args a; };

shared float As[16][65];
shared float Bs[16][65];

void main() {
    int M = a.M, N = a.N, K = a.K;
    int row0 = int(gl_WorkGroupID.y) * 64, col0 = int(gl_WorkGroupID.x) * 64;
    int tid = int(gl_LocalInvocationID.x);
    int tr = tid / 16, tc = tid % 16; // 16x16 invocations, each 4x4 outputs
    float acc[4][4];
    for (int i = 0; i < 4; i++) for (int j = 0; j < 4; j++) acc[i][j] = 0.0;
    for (int k0 = 0; k0 < K; k0 += 16) {
        // load a 64x16 slice of op(A) and a 16x64 slice of op(B): 1024 each, 4 per invocation
        for (int e = tid; e < 1024; e += 256) {
            int m = e / 16, k = e % 16; // As[k][m] = op(A)[row0+m][k0+k]
            int gm = row0 + m, gk = k0 + k;
            float va = 0.0;
            if (gm < M && gk < K) va = a.ta != 0 ? a.A.v[gk * a.lda + gm] : a.A.v[gm * a.lda + gk];
            As[k][m] = va;
            int kk = e / 64, n = e % 64; // Bs[kk][n] = op(B)[k0+kk][col0+n]
            int gk2 = k0 + kk, gn = col0 + n;
            float vb = 0.0;
            if (gk2 < K && gn < N) vb = a.tb != 0 ? a.B.v[gn * a.ldb + gk2] : a.B.v[gk2 * a.ldb + gn];
            Bs[kk][n] = vb;
        }
        barrier();
        for (int k = 0; k < 16; k++) {
            float av[4], bv[4];
            for (int i = 0; i < 4; i++) av[i] = As[k][tr * 4 + i];
            for (int j = 0; j < 4; j++) bv[j] = Bs[k][tc * 4 + j];
            for (int i = 0; i < 4; i++) for (int j = 0; j < 4; j++) acc[i][j] = fma(av[i], bv[j], acc[i][j]);
        }
        barrier();
    }
    for (int i = 0; i < 4; i++) {
        int gm = row0 + tr * 4 + i;
        if (gm >= M) continue;
        for (int j = 0; j < 4; j++) {
            int gn = col0 + tc * 4 + j;
            if (gn >= N) continue;
            int idx = gm * a.ldc + gn;
            float r = a.alpha * acc[i][j];
            if (a.beta != 0.0) r += a.beta * a.C.v[idx];
            a.C.v[idx] = r;
        }
    }
}
