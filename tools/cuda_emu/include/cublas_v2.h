#pragma once
typedef void *cublasHandle_t;
typedef int cublasStatus_t;
enum { CUBLAS_STATUS_SUCCESS = 0 };
typedef int cublasMath_t;
enum { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 };
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0 } cudaDataType;
typedef enum {
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77
} cublasComputeType_t;
enum { CUBLAS_GEMM_DEFAULT = -1 };
/* what the tensor cores read: the input rounded to nearest-even at
 * `keep` mantissa bits (TF32 10, bfloat16 7) */
static inline float emu_round_mantissa(float x, int keep)
{
    unsigned u;
    __builtin_memcpy(&u, &x, 4);
    unsigned drop = 23 - keep, half = 1u << (drop - 1), lsb = (u >> drop) & 1u;
    if ((u & 0x7f800000u) != 0x7f800000u)
        u = (u + half - 1 + lsb) & ~((1u << drop) - 1);
    __builtin_memcpy(&x, &u, 4);
    return x;
}
static inline cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = (void *)1;
    return 0;
}
static inline cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t)
{
    return 0;
}
static inline cublasStatus_t cublasSetMathMode(cublasHandle_t, int)
{
    return 0;
}
/* column-major reference SGEMM, queued on the stream (alpha, beta read now) */
static inline cublasStatus_t cublasSgemm(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb,
                                         int m, int n, int k, const float *alpha_p, const float *A,
                                         int lda, const float *B, int ldb, const float *beta_p,
                                         float *C, int ldc)
{
    float alpha = *alpha_p, beta = *beta_p;
    emu::enqueue([=]() {
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double s = 0;
                for (int p = 0; p < k; p++) {
                    float a = ta == CUBLAS_OP_N ? A[i + (size_t)p * lda] : A[p + (size_t)i * lda];
                    float b = tb == CUBLAS_OP_N ? B[p + (size_t)j * ldb] : B[j + (size_t)p * ldb];
                    s += (double)a * b;
                }
                float *c = &C[i + (size_t)j * ldc];
                *c = beta == 0.0f ? alpha * (float)s : alpha * (float)s + beta * *c;
            }
    });
    return 0;
}

/* cublasGemmEx with float32 storage: inputs rounded as the compute type's
 * tensor cores read them, sums in float32 or better */
static inline cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void *alpha_p, const void *Av, cudaDataType,
                                          int lda, const void *Bv, cudaDataType, int ldb,
                                          const void *beta_p, void *Cv, cudaDataType, int ldc,
                                          cublasComputeType_t ct, int)
{
    float alpha = *(const float *)alpha_p, beta = *(const float *)beta_p;
    const float *A = (const float *)Av, *B = (const float *)Bv;
    float *C = (float *)Cv;
    int keep = ct == CUBLAS_COMPUTE_32F_FAST_16BF ? 7 : ct == CUBLAS_COMPUTE_32F_FAST_TF32 ? 10 : 23;
    emu::enqueue([=]() {
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double s = 0;
                for (int p = 0; p < k; p++) {
                    float a = ta == CUBLAS_OP_N ? A[i + (size_t)p * lda] : A[p + (size_t)i * lda];
                    float b = tb == CUBLAS_OP_N ? B[p + (size_t)j * ldb] : B[j + (size_t)p * ldb];
                    if (keep < 23) {
                        a = emu_round_mantissa(a, keep);
                        b = emu_round_mantissa(b, keep);
                    }
                    s += (double)a * b;
                }
                float *c = &C[i + (size_t)j * ldc];
                *c = beta == 0.0f ? alpha * (float)s : alpha * (float)s + beta * *c;
            }
    });
    return 0;
}
