#pragma once
typedef void *cublasHandle_t;
typedef int cublasStatus_t;
enum { CUBLAS_STATUS_SUCCESS = 0 };
typedef int cublasMath_t;
enum { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 };
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
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
