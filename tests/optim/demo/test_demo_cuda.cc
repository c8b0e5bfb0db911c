// DeMo's CUDA kernels (optim/demo/demo_cuda.h) against the CPU's DemoTensor (optim/demo/demo.h) on
// a GPU (skipped, with the reason printed, where there is none; CI runs them on the emulated GPU):
// on three ranks over several steps with a changing learning rate, for tensors whose blocks are
// full, non-square, 1-D, of a prime length and smaller than the top-k (which is then clamped to the
// block, demo_topk), with fp32 and bf16 gradients and a 16-bit working copy, the messages (indices
// and values), each rank's momentum, the decoded update and the parameters are the CPU's bits. A
// step of all-zero gradients checks the ties: every |Z| equal, the lowest indices sent.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "support/gpu_test.h"
#include "support/test_util.h"
#include "tandem/core/half.h"
#include "tandem/core/rng.h"
#include "tandem/device/cuda/cuda_device.h"
#include "tandem/optim/demo/demo.h"
#include "tandem/optim/demo/demo_device_kernel.h"
#include "tandem/optim/demo/demo_transform.h"

namespace tandem {
namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The first index where two float arrays differ in bits (for the failure message).
std::string first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size() && i < b.size(); i++)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return cat("element ", i, ": ", a[i], " vs ", b[i]);
  return a.size() == b.size() ? "none" : "sizes differ";
}

class DemoCudaTest : public testing::GpuTest {
 protected:
  void launch(const DeviceKernel& kernel) {
    device_->launch_async(kernel, *stream_);
    stream_->synchronize();
  }
};

struct Shape {
  std::vector<int64_t> dims;
  int64_t topk;
};

TEST_F(DemoCudaTest, EveryStepIsTheCpusBitsOnThreeRanks) {
  // The last two: blocks smaller than the top-k (7, and 67's blocks of 1), sent whole.
  const std::vector<Shape> shapes = {{{128, 64}, 32}, {{96, 80}, 16}, {{37}, 8}, {{100}, 32},
                                     {{8, 130}, 5},   {{67, 3}, 3},   {{7}, 32}, {{67}, 32}};
  const int world = 3;
  const float lrs[] = {3e-3f, 1e-3f, 2e-3f, 5e-4f};
  for (bool bf16 : {false, true}) {
    for (const Shape& shape : shapes) {
      const DemoHyper hyper{.compression_decay = 0.999f,
                            .compression_topk = shape.topk,
                            .compression_chunk = 64,
                            .weight_decay = 0.1f};
      const DemoTensor tensor("w", shape.dims, hyper, SimdTarget::kScalar);
      const DemoBlocks& blocks = tensor.blocks();
      const auto n = static_cast<size_t>(blocks.num_elements());
      const auto sent = static_cast<size_t>(blocks.count() * tensor.topk());
      const std::string what = cat("shape ", blocks.rows(), "x", blocks.cols(), ", bf16 ", bf16);
      Rng rng(n * 7 + bf16);
      // CPU: params the same on every rank, each rank its own delta.
      const std::vector<float> initial = testing::randn(n, rng.next_u64(), 0.02f);
      std::vector<std::vector<float>> cpu_params(world, initial),
          cpu_delta(world, std::vector<float>(n));
      // GPU: the same arrays in device memory, and the DCT matrices.
      const DeviceAllocation c_m = upload(dct_matrix(blocks.block_rows()));
      const DeviceAllocation c_n = upload(dct_matrix(blocks.block_cols()));
      const DemoCudaBlocks gpu_blocks{.rows = blocks.rows(),
                                      .cols = blocks.cols(),
                                      .block_rows = blocks.block_rows(),
                                      .block_cols = blocks.block_cols(),
                                      .c_m = static_cast<const float*>(c_m.data()),
                                      .c_n = static_cast<const float*>(c_n.data())};
      std::vector<DeviceAllocation> gpu_params, gpu_delta, gpu_indices, gpu_values;
      for (int r = 0; r < world; r++) {
        gpu_params.push_back(upload(initial));
        gpu_delta.push_back(upload(std::vector<float>(n, 0.0f)));
        gpu_indices.push_back(device_->allocate(MemorySpace::kDevice, sent * sizeof(int32_t)));
        gpu_values.push_back(device_->allocate(MemorySpace::kDevice, sent * sizeof(float)));
      }
      const DeviceAllocation scratch =
          device_->allocate(MemorySpace::kDevice, demo_cuda_scratch_floats(gpu_blocks) * 4);
      const DeviceAllocation u = device_->allocate(MemorySpace::kDevice, n * sizeof(float));
      const DeviceAllocation params16 = device_->allocate(MemorySpace::kDevice, n * 2);

      for (int step = 0; step < 4; step++) {
        const float lr = lrs[step];
        std::vector<DemoMessage> cpu_sent(world);
        std::vector<std::vector<int32_t>> all_indices;
        std::vector<std::vector<float>> all_values;
        for (int r = 0; r < world; r++) {
          // Step 2's gradients are all zero (only the momentum moves); ties of |Z| are
          // TiesGoToTheLowerIndex's case.
          std::vector<float> grad = testing::randn(n, rng.next_u64(), step == 2 ? 0.0f : 1.0f);
          std::vector<uint16_t> grad16(n);
          for (size_t i = 0; i < n; i++) {
            grad16[i] = float_to_bf16(grad[i]);
            if (bf16) grad[i] = bf16_to_float(grad16[i]);
          }
          tensor.compress({cpu_params[r].data(), cpu_delta[r].data(), grad.data()}, lr, cpu_sent[r],
                          nullptr, 0.5f);
          const DeviceAllocation g = bf16 ? upload(grad16) : upload(grad);
          const DemoCudaCompress args{.params = static_cast<float*>(gpu_params[r].data()),
                                      .delta = static_cast<float*>(gpu_delta[r].data()),
                                      .grads = g.data(),
                                      .grad_dtype = bf16 ? GradDType::kBF16 : GradDType::kF32,
                                      .decay = tensor.decay_factor(lr),
                                      .beta = hyper.compression_decay,
                                      .lr = lr,
                                      .grad_scale = 0.5f,
                                      .topk = tensor.topk(),
                                      .scratch = static_cast<float*>(scratch.data()),
                                      .indices = static_cast<int32_t*>(gpu_indices[r].data()),
                                      .values = static_cast<float*>(gpu_values[r].data())};
          launch(demo_compress_kernel(gpu_blocks, args));
          all_indices.push_back(download<int32_t>(gpu_indices[r], sent));
          all_values.push_back(download<float>(gpu_values[r], sent));
          const std::string at = cat(what, ", step ", step, ", rank ", r);
          ASSERT_EQ(all_indices[r], cpu_sent[r].indices) << at;
          ASSERT_TRUE(same_bits(all_values[r], cpu_sent[r].values)) << at;
          const std::vector<float> delta = download<float>(gpu_delta[r], n);
          ASSERT_TRUE(same_bits(delta, cpu_delta[r]))
              << at << ": delta differs at " << first_difference(delta, cpu_delta[r]);
        }
        // Every rank's message, ranks in order, as the exchange delivers them.
        std::vector<int32_t> indices;
        std::vector<float> values;
        std::vector<const DemoMessage*> by_rank;
        for (int r = 0; r < world; r++) {
          indices.insert(indices.end(), all_indices[r].begin(), all_indices[r].end());
          values.insert(values.end(), all_values[r].begin(), all_values[r].end());
          by_rank.push_back(&cpu_sent[r]);
        }
        const DeviceAllocation d_indices = upload(indices), d_values = upload(values);
        for (int r = 0; r < world; r++) {
          std::vector<float> cpu_u(n);
          tensor.apply(by_rank, lr, cpu_params[r].data(), cpu_u.data());
          const WorkingDType working = step % 2 == 0 ? WorkingDType::kBF16 : WorkingDType::kF16;
          const DemoCudaApply args{.indices = static_cast<int32_t*>(d_indices.data()),
                                   .values = static_cast<float*>(d_values.data()),
                                   .world = world,
                                   .topk = tensor.topk(),
                                   .lr = lr,
                                   .params = static_cast<float*>(gpu_params[r].data()),
                                   .params16 = params16.data(),
                                   .params16_dtype = working,
                                   .scratch = static_cast<float*>(scratch.data()),
                                   .u = static_cast<float*>(u.data())};
          launch(demo_apply_kernel(gpu_blocks, args));
          const std::string at = cat(what, ", step ", step, ", rank ", r);
          const std::vector<float> gpu_u = download<float>(u, n);
          ASSERT_TRUE(same_bits(gpu_u, cpu_u))
              << at << ": u differs at " << first_difference(gpu_u, cpu_u);
          const std::vector<float> p = download<float>(gpu_params[r], n);
          ASSERT_TRUE(same_bits(p, cpu_params[r])) << at;
          const std::vector<uint16_t> p16 = download<uint16_t>(params16, n);
          for (size_t i = 0; i < n; i++)
            ASSERT_EQ(p16[i],
                      working == WorkingDType::kF16 ? float_to_fp16(p[i]) : float_to_bf16(p[i]))
                << at << ", element " << i;
        }
      }
    }
  }
}

// All-zero momentum: every |Z| is 0, so top-k sends the lowest indices, in order, with
// zero values, and the update leaves the parameters alone (sign(0) = 0).
TEST_F(DemoCudaTest, TiesGoToTheLowerIndex) {
  const DemoHyper hyper{.compression_topk = 6};
  const DemoTensor tensor("zeros", {40, 24}, hyper, SimdTarget::kScalar);
  const DemoBlocks& blocks = tensor.blocks();
  const auto n = static_cast<size_t>(blocks.num_elements());
  const auto sent = static_cast<size_t>(blocks.count() * tensor.topk());
  const DeviceAllocation c_m = upload(dct_matrix(blocks.block_rows()));
  const DeviceAllocation c_n = upload(dct_matrix(blocks.block_cols()));
  const DemoCudaBlocks gpu_blocks{blocks.rows(),
                                  blocks.cols(),
                                  blocks.block_rows(),
                                  blocks.block_cols(),
                                  static_cast<const float*>(c_m.data()),
                                  static_cast<const float*>(c_n.data())};
  const std::vector<float> ones(n, 1.0f);
  const DeviceAllocation params = upload(ones), delta = upload(std::vector<float>(n, 0.0f)),
                         grads = upload(std::vector<float>(n, 0.0f));
  const DeviceAllocation scratch =
      device_->allocate(MemorySpace::kDevice, demo_cuda_scratch_floats(gpu_blocks) * 4);
  const DeviceAllocation indices = device_->allocate(MemorySpace::kDevice, sent * 4);
  const DeviceAllocation values = device_->allocate(MemorySpace::kDevice, sent * 4);
  launch(demo_compress_kernel(gpu_blocks, {.params = static_cast<float*>(params.data()),
                                           .delta = static_cast<float*>(delta.data()),
                                           .grads = grads.data(),
                                           .lr = 1e-3f,
                                           .topk = tensor.topk(),
                                           .scratch = static_cast<float*>(scratch.data()),
                                           .indices = static_cast<int32_t*>(indices.data()),
                                           .values = static_cast<float*>(values.data())}));
  const std::vector<int32_t> got = download<int32_t>(indices, sent);
  for (size_t b = 0; b < static_cast<size_t>(blocks.count()); b++)
    for (size_t j = 0; j < 6; j++) ASSERT_EQ(got[b * 6 + j], static_cast<int32_t>(j)) << b;
  launch(demo_apply_kernel(gpu_blocks, {.indices = static_cast<int32_t*>(indices.data()),
                                        .values = static_cast<float*>(values.data()),
                                        .topk = tensor.topk(),
                                        .lr = 1e-3f,
                                        .params = static_cast<float*>(params.data()),
                                        .scratch = static_cast<float*>(scratch.data())}));
  EXPECT_EQ(download<float>(params, n), ones);
}

}  // namespace
}  // namespace tandem
