// Matmuls through OpenBLAS; weights are stored [OC, C] (out, in) as in torch.nn.Linear.
#include <cblas.h>

#include "tandem/compute/cpu/cpu_kernels.h"

namespace tandem::cpu {

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
  // out[N,OC] = inp[N,C] @ weight[OC,C]^T
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out,
              OC);
  if (bias == nullptr) return;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    float* row = out + static_cast<size_t>(n) * OC;
    for (int o = 0; o < OC; o++) row[o] += bias[o];
  }
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
  // dinp[N,C] = dout[N,OC] @ weight[OC,C]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f,
              dinp, C);
  // dweight[OC,C] += dout[N,OC]^T @ inp[N,C]
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
              dweight, C);
  if (dbias != nullptr) column_sums_accumulate(dbias, dout, N, OC);
}

}  // namespace tandem::cpu
