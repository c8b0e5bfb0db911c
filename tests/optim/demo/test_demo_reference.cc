// tandem's DeMo library (optim/demo/demo.h) against tests/fixtures/demo_reference.safetensors,
// made by an independent numpy implementation written from the brief
// (tools/make_demo_fixture.py): 3 in-process ranks, 3 steps with a changing learning rate
// and weight decay, tensors whose chunk is not 64 (96 x 80), several 64 x 64 blocks, a prime
// length below the chunk and a bias cut into two chunks; and against
// tests/fixtures/demo_reference_clamped.safetensors (the same script, --clamped): tensors whose
// block is smaller than compression_topk, which send their whole block, as the reference does.
//
// What must hold, and how closely (the reference computes its transforms in float64 and
// rounds once; tandem in float32 with fixed-order FMAs):
//   - the coefficients each rank sends: the same indices in the same order, exactly, in
//     every block (no near-tie happens in this data: the test would say where);
//   - their values: within 2e-6 of the largest sent; the momentum within 2e-6 of the larger
//     of its own largest magnitude and the largest value sent (what the error feedback
//     cancelled);
//   - the parameters: bit for bit wherever the decoded update is farther than 1e-5 of its
//     largest magnitude from 0 (elsewhere a rounding may flip the sign of u);
//   - every rank's parameters: bit for bit the same.
// Then the chunk rule, DCT round trips, and the errors for tensors DeMo cannot compress.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "support/test_util.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/comm/local_group.h"
#include "tandem/core/error.h"
#include "tandem/core/half.h"
#include "tandem/core/thread_pool.h"
#include "tandem/optim/demo/demo.h"

namespace tandem {
namespace {

std::vector<std::string> split(const std::string& text, char by) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, by);) parts.push_back(part);
  return parts;
}

float max_abs(const std::vector<float>& x) {
  float m = 0.0f;
  for (float v : x) m = std::max(m, std::fabs(v));
  return m;
}

struct FixtureTensor {
  std::string name;
  std::vector<int64_t> shape;
};

// Checks tandem's DemoTensor against the fixture `file` (tests/fixtures/) as the header says;
// returns the number of its tensors whose topk was clamped to their block.
int expect_the_fixtures_results(const std::string& file) {
  const SafetensorsFile fixture =
      SafetensorsFile::read(testing::source_dir() / "tests" / "fixtures" / file);
  const std::map<std::string, std::string>& meta = fixture.metadata();
  const int ranks = std::stoi(meta.at("ranks")), steps = std::stoi(meta.at("steps"));
  // The learning rates and the weight decay as the reference holds them: doubles.
  std::vector<double> lrs;
  for (const std::string& lr : split(meta.at("lrs"), ',')) lrs.push_back(std::stod(lr));
  EXPECT_EQ(static_cast<int>(lrs.size()), steps);
  if (static_cast<int>(lrs.size()) != steps) return 0;
  DemoHyper hyper;
  hyper.compression_decay = std::stof(meta.at("compression_decay"));
  hyper.compression_topk = std::stoll(meta.at("compression_topk"));
  hyper.compression_chunk = std::stoll(meta.at("compression_chunk"));
  hyper.weight_decay = std::stod(meta.at("weight_decay"));
  std::vector<FixtureTensor> tensors;
  for (const std::string& entry : split(meta.at("tensors"), ',')) {
    const std::vector<std::string> name_shape = split(entry, ':');
    FixtureTensor t{name_shape.at(0), {}};
    for (const std::string& d : split(name_shape.at(1), 'x')) t.shape.push_back(std::stoll(d));
    tensors.push_back(t);
  }
  int clamped = 0;
  for (const FixtureTensor& tensor : tensors) {
    SCOPED_TRACE(tensor.name);
    const DemoTensor rule(tensor.name, tensor.shape, hyper);
    const int64_t n = rule.blocks().num_elements(), k = rule.topk();
    clamped += k < hyper.compression_topk;
    const int64_t blocks = rule.blocks().count();
    // results[rank][step]
    std::vector<std::vector<std::vector<float>>> params(ranks), deltas(ranks), us(ranks);
    std::vector<std::vector<DemoMessage>> sent(ranks);
    run_local_ranks(ranks, [&](Communicator& comm) {
      const int r = comm.rank();
      std::vector<float> p = fixture.read_f32(tensor.name + ".p0", tensor.shape);
      std::vector<float> delta(n, 0.0f), u(n);
      for (int t = 0; t < steps; t++) {
        const std::vector<float> grad =
            fixture.read_f32(cat(tensor.name, ".grad.r", r, ".t", t), tensor.shape);
        std::vector<DemoMessage> mine;
        const std::vector<float*> u_out = {u.data()};
        demo_step({&rule}, {DemoArrays{p.data(), delta.data(), grad.data()}}, lrs[t], comm, &mine,
                  &u_out);
        params[r].push_back(p);
        deltas[r].push_back(delta);
        us[r].push_back(u);
        sent[r].push_back(mine.at(0));
      }
    });
    for (int t = 0; t < steps; t++) {
      SCOPED_TRACE(cat("step ", t));
      const std::vector<float> p_ref = fixture.read_f32(cat(tensor.name, ".p.t", t), tensor.shape);
      const std::vector<float> u_ref = fixture.read_f32(cat(tensor.name, ".u.t", t), tensor.shape);
      const float u_scale = max_abs(u_ref);
      int64_t compared = 0, different = 0;
      for (int64_t i = 0; i < n; i++) {
        if (std::fabs(u_ref[i]) <= 1e-5f * u_scale) continue;
        compared++;
        different += std::memcmp(&params[0][t][i], &p_ref[i], sizeof(float)) != 0;
      }
      EXPECT_EQ(different, 0) << "of " << compared << " parameters whose update is clear";
      EXPECT_GT(compared, n * 9 / 10);
      for (int r = 0; r < ranks; r++) {
        SCOPED_TRACE(cat("rank ", r));
        EXPECT_EQ(std::memcmp(params[r][t].data(), params[0][t].data(), n * sizeof(float)), 0)
            << "the ranks' parameters differ";
        const std::vector<int32_t> index_ref =
            fixture.read_i32(cat(tensor.name, ".index.r", r, ".t", t), {blocks, k});
        const std::vector<float> value_ref =
            fixture.read_f32(cat(tensor.name, ".value.r", r, ".t", t), {blocks, k});
        const std::vector<float> delta_ref =
            fixture.read_f32(cat(tensor.name, ".delta.r", r, ".t", t), tensor.shape);
        // The momentum left after the error feedback can be far smaller than what was
        // cancelled (32 of bias_37's 37 coefficients are sent): its error is measured
        // against the larger of the two.
        const float delta_scale = std::max(max_abs(delta_ref), max_abs(value_ref));
        float worst = 0.0f;
        for (int64_t i = 0; i < n; i++)
          worst = std::max(worst, std::fabs(deltas[r][t][i] - delta_ref[i]));
        EXPECT_LE(worst, 2e-6f * delta_scale) << "momentum";
        const DemoMessage& got = sent[r][t];
        EXPECT_EQ(got.indices.size(), index_ref.size());
        if (got.indices.size() != index_ref.size()) return clamped;
        for (int64_t b = 0; b < blocks; b++) {
          const auto first = index_ref.begin() + b * k;
          EXPECT_TRUE(std::equal(first, first + k, got.indices.begin() + b * k))
              << "block " << b << ": other coefficients sent";
        }
        const float value_scale = max_abs(value_ref);
        float worst_value = 0.0f;
        for (size_t j = 0; j < value_ref.size(); j++)
          worst_value = std::max(worst_value, std::fabs(got.values[j] - value_ref[j]));
        EXPECT_LE(worst_value, 2e-6f * value_scale) << "sent values";
      }
    }
  }
  return clamped;
}

TEST(DemoReference, MatchesTheIndependentNumpyImplementation) {
  EXPECT_EQ(expect_the_fixtures_results("demo_reference.safetensors"), 0);
}

// A tensor whose DCT block holds fewer coefficients than compression_topk sends its whole
// block, as the reference clamps topk per tensor (bloc97/DeMo demo.py,
// CompressDCT._clamp_topk): the fixture's tensors at topk 32 are a bias of 7 (one block of
// 7), a prime length above the chunk (67 blocks of 1), a 5 x 6 matrix (one block of 30)
// and, unclamped beside them, a 64 x 64 one.
TEST(DemoReference, ATopkAboveABlockIsClampedToItPerTensorAsTheReferenceDoes) {
  EXPECT_EQ(expect_the_fixtures_results("demo_reference_clamped.safetensors"), 3);
  DemoHyper hyper;
  EXPECT_EQ(DemoTensor("bias", {7}, hyper).topk(), 7);
  EXPECT_EQ(DemoTensor("bias", {67}, hyper).topk(), 1);
  EXPECT_EQ(DemoTensor("w", {5, 6}, hyper).topk(), 30);
  EXPECT_EQ(DemoTensor("w", {64, 64}, hyper).topk(), 32);
}

// Step 1's factor is the double 1 - lr * weight_decay rounded once, from the double lr the
// schedule gives: at lr 0.0485 and weight decay 0.1 float arithmetic gives another float.
TEST(DemoReference, TheDecayFactorIsRoundedOnceFromDoubles) {
  DemoHyper hyper;
  hyper.weight_decay = 0.1;
  const DemoTensor tensor("w", {64, 64}, hyper);
  for (const double lr : {0.0485, 0.0406, 0.02, 1e-4}) {
    SCOPED_TRACE(lr);
    EXPECT_EQ(tensor.decay_factor(lr), static_cast<float>(1.0 - lr * 0.1));
  }
  const float in_float = 1.0f - static_cast<float>(0.0485) * static_cast<float>(0.1);
  EXPECT_NE(tensor.decay_factor(0.0485), in_float) << "the case no longer tells the two apart";
  hyper.weight_decay = 0.0;
  EXPECT_EQ(DemoTensor("w", {64, 64}, hyper).decay_factor(0.0485), 1.0f);
}

TEST(DemoTransform, ChunksAreTheLargestDivisorsUpToTheChunk) {
  const std::pair<int64_t, int64_t> cases[] = {{64, 64},   {50304, 64}, {50280, 60}, {96, 48},
                                               {80, 40},   {100, 50},   {37, 37},    {67, 1},
                                               {3072, 64}, {768, 64},   {50257, 29}, {1, 1}};
  for (const auto& [n, chunk] : cases) EXPECT_EQ(demo_chunk(n, 64), chunk) << n;
}

TEST(DemoTransform, TheInverseUndoesTheForwardOnEveryBlock) {
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{96, 80}, {37}, {100}, {128, 64}}) {
    const DemoBlocks blocks(shape, 64);
    std::vector<float> x(blocks.num_elements()), back(blocks.num_elements());
    for (size_t i = 0; i < x.size(); i++) x[i] = std::sin(0.37f * static_cast<float>(i)) + 0.1f;
    std::vector<float> z(blocks.block_size());
    for (int64_t b = 0; b < blocks.count(); b++) {
      blocks.forward(x.data(), b, z.data());
      blocks.inverse(z.data(), b, back.data());
    }
    for (size_t i = 0; i < x.size(); i++) EXPECT_NEAR(back[i], x[i], 2e-6f) << i;
  }
}

// The SIMD targets compute combine_rows's exact sequence: the same bits as the scalar
// code, forward and inverse, for blocks narrower and wider than a vector, block heights
// that leave every remainder of the kernels' 6-row bands (48, 64, 30, 35, 45, 26 rows;
// 1-D), and with zeros (skipped terms) in the coefficients.
TEST(DemoTransform, EverySimdTargetGivesTheScalarBits) {
  std::vector<SimdTarget> targets;
  for (SimdTarget target : {SimdTarget::kAvx2, SimdTarget::kAvx512}) {
    if (cpu_supports(target)) {
      targets.push_back(target);
    } else {
      std::printf("[ note ] this CPU has no %s: that kernel is not checked here\n",
                  std::string(simd_target_name(target)).c_str());
    }
  }
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {96, 80}, {37}, {100}, {128, 64}, {30, 7}, {35, 72}, {45, 24}, {26, 16}}) {
    const DemoBlocks scalar(shape, 64, "w", SimdTarget::kScalar);
    std::vector<float> x(scalar.num_elements());
    for (size_t i = 0; i < x.size(); i++)
      x[i] = i % 5 == 0 ? 0.0f : std::sin(1.3f * static_cast<float>(i)) * 3.0f;
    std::vector<float> want_z(scalar.count() * scalar.block_size()), want_x(x.size());
    for (int64_t b = 0; b < scalar.count(); b++) {
      float* z = want_z.data() + b * scalar.block_size();
      scalar.forward(x.data(), b, z);
      z[1] = 0.0f;  // a sparse coefficient block for the inverse
      scalar.inverse(z, b, want_x.data());
    }
    for (SimdTarget target : targets) {
      const DemoBlocks blocks(shape, 64, "w", target);
      std::vector<float> z(want_z.size()), back(x.size());
      for (int64_t b = 0; b < blocks.count(); b++) {
        float* zb = z.data() + b * blocks.block_size();
        blocks.forward(x.data(), b, zb);
        zb[1] = 0.0f;
        blocks.inverse(zb, b, back.data());
      }
      EXPECT_EQ(std::memcmp(z.data(), want_z.data(), z.size() * sizeof(float)), 0)
          << simd_target_name(target) << " forward, " << shape[0];
      EXPECT_EQ(std::memcmp(back.data(), want_x.data(), back.size() * sizeof(float)), 0)
          << simd_target_name(target) << " inverse, " << shape[0];
    }
  }
}

// The inverse of a sparse Z (as the error feedback and the decode see it: a few nonzeros,
// most rows of the block empty) against its definition written out here: each sum from +0
// in ascending index with one fma per term, skipping the terms whose Z (first stage) or Y
// (second stage) is 0. Every target, the row-compacting kernels included, gives its bits;
// so does a block whose every coefficient is 0 (all +0).
TEST(DemoTransform, TheInverseOfASparseBlockIsItsDefinition) {
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{128, 64}, {96, 80}, {37}, {45, 24}}) {
    std::vector<SimdTarget> targets = {SimdTarget::kScalar};
    for (SimdTarget target : {SimdTarget::kAvx2, SimdTarget::kAvx512})
      if (cpu_supports(target)) targets.push_back(target);
    const DemoBlocks geometry(shape, 64, "w", SimdTarget::kScalar);
    const int64_t cm = geometry.block_rows(), cn = geometry.block_cols(), bs = cm * cn;
    const std::vector<float> c_m = dct_matrix(cm), c_n = dct_matrix(cn);
    for (int64_t nonzeros : {int64_t{0}, int64_t{1}, int64_t{7}, std::min<int64_t>(32, bs)}) {
      std::vector<float> z(static_cast<size_t>(bs), 0.0f);
      for (int64_t j = 0; j < nonzeros; j++)
        z[static_cast<size_t>((j * 1237 + 5) % bs)] = std::sin(0.7f * static_cast<float>(j + 1));
      std::vector<float> y(static_cast<size_t>(bs)), want(static_cast<size_t>(bs));
      for (int64_t k = 0; k < cm; k++)
        for (int64_t b = 0; b < cn; b++) {
          float acc = 0.0f;
          for (int64_t l = 0; l < cn; l++)
            if (z[k * cn + l] != 0.0f) acc = std::fma(z[k * cn + l], c_n[l * cn + b], acc);
          y[k * cn + b] = acc;
        }
      for (int64_t a = 0; a < cm; a++)
        for (int64_t b = 0; b < cn; b++) {
          float acc = 0.0f;
          for (int64_t k = 0; k < cm; k++)
            if (y[k * cn + b] != 0.0f) acc = std::fma(c_m[k * cm + a], y[k * cn + b], acc);
          want[a * cn + b] = acc;
        }
      for (SimdTarget target : targets) {
        const DemoBlocks blocks(shape, 64, "w", target);
        std::vector<float> out(static_cast<size_t>(blocks.num_elements()), 9.0f);
        blocks.inverse(z.data(), 0, out.data());  // block 0 starts at element 0
        for (int64_t a = 0; a < cm; a++)
          EXPECT_EQ(std::memcmp(out.data() + a * blocks.cols(), want.data() + a * cn,
                                static_cast<size_t>(cn) * sizeof(float)),
                    0)
              << simd_target_name(target) << ", " << shape[0] << ", " << nonzeros
              << " nonzeros, row " << a;
      }
    }
  }
}

// Top-k sends the k largest |Z| of each block, largest first, equal magnitudes lower index
// first: here against std::partial_sort under that order. Block 0's momentum is +0 and -0,
// so every |Z| ties at 0 and the lowest 40 indices go in order; the other blocks hold a
// handful of magnitudes of both signs.
TEST(DemoTensor, TopkSendsTheLargestMagnitudesLowerIndexFirstOnTies) {
  const std::vector<int64_t> shape = {128, 128};  // 4 blocks of 64 x 64
  const int64_t n = 128 * 128;
  DemoHyper hyper;
  hyper.compression_topk = 40;
  const DemoTensor rule("w", shape, hyper);
  const DemoBlocks& blocks = rule.blocks();
  std::vector<float> p(n, 0.0f), delta(n), grad(n, 0.0f);
  for (int64_t i = 0; i < n; i++) {
    const int64_t level = (i * 7919) % 13;
    const bool in_block_0 = i / 128 < 64 && i % 128 < 64;
    delta[i] = level == 0 || in_block_0 ? (i % 2 ? -0.0f : 0.0f)
                                        : (i % 3 ? 1.0f : -1.0f) * static_cast<float>(level % 4);
  }
  std::vector<float> momentum = delta;  // what the transform sees: beta * delta, exactly
  for (float& d : momentum) d = std::fma(rule.compression_decay(), d, 0.0f);
  DemoMessage sent;
  rule.compress(DemoArrays{p.data(), delta.data(), grad.data()}, 0.0, sent);
  std::vector<float> z(static_cast<size_t>(blocks.block_size()));
  int ties_crossed = 0;
  for (int64_t b = 0; b < blocks.count(); b++) {
    blocks.forward(momentum.data(), b, z.data());
    std::vector<int32_t> order(z.size());
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + rule.topk(), order.end(),
                      [&](int32_t x, int32_t y) {
                        const float ax = std::fabs(z[x]), ay = std::fabs(z[y]);
                        return ax > ay || (ax == ay && x < y);
                      });
    for (int64_t j = 0; j < rule.topk(); j++) {
      ASSERT_EQ(sent.indices[b * rule.topk() + j], order[j]) << "block " << b << ", place " << j;
      if (j > 0 && std::fabs(z[order[j]]) == std::fabs(z[order[j - 1]])) ties_crossed++;
    }
  }
  EXPECT_GT(ties_crossed, 0) << "the data was meant to put equal magnitudes among those sent";
}

TEST(DemoWire, IndicesTakeTheFewestBitsAndFp32ValuesAreLossless) {
  EXPECT_EQ(demo_index_bits(4096), 12);
  EXPECT_EQ(demo_index_bits(37), 6);
  EXPECT_EQ(demo_index_bits(64), 6);
  EXPECT_EQ(demo_index_bits(65), 7);
  EXPECT_EQ(demo_index_bits(1), 0);
  // A 64 x 64 block at topk 32: 32 x 12 bits + 32 x 4 bytes, against the reference's 384
  // (int64 + fp32); bf16 values 112; signs 52.
  EXPECT_EQ(DemoWire(1, 4096, 32, DemoValueFormat::kFp32).bytes(), 176u);
  EXPECT_EQ(DemoWire(1, 4096, 32, DemoValueFormat::kBf16).bytes(), 112u);
  EXPECT_EQ(DemoWire(1, 4096, 32, DemoValueFormat::kSign).bytes(), 52u);
  EXPECT_EQ(DemoWire(3, 37, 5, DemoValueFormat::kSign).bytes(), 12u + 2u);  // 90 bits, 15 bits
  for (const auto& [blocks, size, k] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{4, 4096, 32}, {3, 37, 5}, {7, 1, 1}}) {
    DemoMessage message;
    for (int64_t j = 0; j < blocks * k; j++) {
      message.indices.push_back(static_cast<int32_t>((j * 7919 + 13) % size));
      message.values.push_back(
          std::ldexp(static_cast<float>(j % 11) - 5.3f, -static_cast<int>(j % 9)));
    }
    for (DemoValueFormat format :
         {DemoValueFormat::kFp32, DemoValueFormat::kBf16, DemoValueFormat::kSign}) {
      SCOPED_TRACE(cat(blocks, " blocks of ", size, ", ", demo_value_format_name(format)));
      const DemoWire wire(blocks, size, k, format);
      std::vector<uint8_t> bytes(wire.bytes(), 0xAB);
      wire.encode(message, bytes.data());
      DemoMessage back;
      wire.decode(bytes.data(), back);
      EXPECT_EQ(back.indices, message.indices);
      for (size_t j = 0; j < message.values.size(); j++) {
        const float v = message.values[j];
        const float want = format == DemoValueFormat::kFp32   ? v
                           : format == DemoValueFormat::kBf16 ? bf16_to_float(float_to_bf16(v))
                                                              : (v < 0.0f ? -1.0f : 1.0f);
        EXPECT_EQ(back.values[j], want) << j;
      }
    }
  }
  EXPECT_EQ(enum_from_name(kDemoValueFormatNames, "SIGN"), DemoValueFormat::kSign);
  EXPECT_EQ(enum_from_name(kDemoValueFormatNames, "int8"), std::nullopt);
}

// Lossy value formats: every rank still decodes the same messages to the same parameters,
// and the parameters differ from the lossless run's (the format is in effect).
TEST(DemoTensor, LossyValueFormatsKeepEveryRankIdentical) {
  const std::vector<int64_t> shape = {96, 80};
  const int64_t n = 96 * 80;
  std::vector<std::vector<float>> by_format;
  for (DemoValueFormat format :
       {DemoValueFormat::kFp32, DemoValueFormat::kBf16, DemoValueFormat::kSign}) {
    DemoHyper hyper;
    hyper.compression_values = format;
    const DemoTensor rule("w", shape, hyper);
    std::vector<std::vector<float>> params(3);
    run_local_ranks(3, [&](Communicator& comm) {
      std::vector<float> p(n, 0.5f), delta(n, 0.0f), grad(n);
      for (int step = 0; step < 3; step++) {
        for (int64_t i = 0; i < n; i++)
          grad[i] = std::sin(0.01f * static_cast<float>(i * (comm.rank() + 1) + step));
        demo_step({&rule}, {DemoArrays{p.data(), delta.data(), grad.data()}}, 0.01f, comm);
      }
      params[comm.rank()] = p;
    });
    for (int r = 1; r < 3; r++) EXPECT_EQ(params[r], params[0]) << "rank " << r;
    by_format.push_back(params[0]);
  }
  EXPECT_NE(by_format[0], by_format[2]);  // signs decode to other updates
}

// Threads share the elements and the blocks; each is computed the same way whatever the
// split, so any number of threads gives the bits of one.
TEST(DemoTensor, AnyNumberOfThreadsGivesTheSameBits) {
  const std::vector<int64_t> shape = {192, 160};  // 4 x 4 blocks of 48 x 40
  const int64_t n = 192 * 160;
  DemoHyper hyper;
  hyper.weight_decay = 0.1f;
  const DemoTensor rule("w", shape, hyper);
  std::vector<std::vector<float>> params, deltas;
  for (int threads : {0, 1, 2, 3}) {  // 0: no pool
    std::unique_ptr<ThreadPool> pool =
        threads > 0 ? std::make_unique<ThreadPool>(threads, false) : nullptr;
    std::vector<float> p(n), delta(n, 0.0f), grad(n);
    for (int64_t i = 0; i < n; i++) p[i] = std::cos(0.1f * static_cast<float>(i));
    run_local_ranks(1, [&](Communicator& comm) {
      for (int step = 0; step < 2; step++) {
        for (int64_t i = 0; i < n; i++)
          grad[i] = std::sin(0.003f * static_cast<float>(i * i % 997 + step));
        demo_step({&rule}, {DemoArrays{p.data(), delta.data(), grad.data()}}, 0.01f, comm, nullptr,
                  nullptr, pool.get());
      }
    });
    params.push_back(p);
    deltas.push_back(delta);
  }
  for (size_t k = 1; k < params.size(); k++) {
    EXPECT_EQ(std::memcmp(params[k].data(), params[0].data(), n * sizeof(float)), 0) << k;
    EXPECT_EQ(std::memcmp(deltas[k].data(), deltas[0].data(), n * sizeof(float)), 0) << k;
  }
}

TEST(DemoTensor, TensorsItCannotCompressAreOneLineErrorsNamingThem) {
  DemoHyper hyper;
  EXPECT_CONTAINS(testing::error_of([&] {
                    DemoTensor("conv.weight", {8, 8, 3}, hyper);
                  }),
                  "conv.weight has 3 dimensions");
  EXPECT_CONTAINS(testing::error_of([&] { DemoTensor("scale", {}, hyper); }),
                  "scale has 0 dimensions");
  hyper.compression_topk = 0;
  EXPECT_CONTAINS(testing::error_of([&] { DemoTensor("bias", {37}, hyper); }),
                  "compression_topk = 0 for bias: must be at least 1");
  hyper.compression_topk = 40;  // above the block of 37: clamped to it, not refused
  EXPECT_EQ(DemoTensor("bias", {37}, hyper).topk(), 37);
  hyper.compression_topk = 32;
  hyper.compression_chunk = 0;
  EXPECT_CONTAINS(testing::error_of([&] {
                    DemoTensor("w", {64, 64}, hyper);
                  }),
                  "compression_chunk = 0 must be at least 1");
}

}  // namespace
}  // namespace tandem
