/* The emulator's guard on device memory (check.sh builds and runs this):
 * stream work may read and write cudaMalloc memory, host code may not.
 * Exit 0 after the allowed accesses; the host read at the end must abort
 * the process with the emulator's message (check.sh expects both). */
#include "cuda_runtime.h"

__global__ void k_fill(float *p, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = (float)i;
}

int main(int argc, char **argv)
{
    const int n = 64;
    float *d = NULL, host[64];
    cudaMalloc((void **)&d, sizeof(float) * n);
    emu::launcher(dim3(1), dim3(64)).run(k_fill, d, n);
    cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost);
    cudaDeviceSynchronize();
    if (host[63] != 63.0f) {
        fprintf(stderr, "poison_check: the copy back gave %g\n", host[63]);
        return 1;
    }
    if (argc > 1 && !strcmp(argv[1], "touch")) {
        volatile float x = d[1]; /* a host dereference of a device pointer */
        fprintf(stderr, "poison_check: the host read device memory (%g) unhindered\n", x);
        return 1;
    }
    printf("poison_check: device memory through copies only: ok\n");
    cudaFree(d);
    return 0;
}
