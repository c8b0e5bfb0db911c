// The emulated GPU with its streams run out of order (tests/cuda_emulation/
// emulated_streams.h): queued work runs only in the order CUDA promises (within a stream,
// and across streams through events), either as late as possible (kLazy) or interleaved at
// random (kRandom). A missing cross-stream event then gives wrong results here, as it may
// on a GPU, instead of passing by luck as with the default synchronous streams.
//
// Built only against tandem_lib_emulated_gpu (emulated_tests.cmake): it drives the
// emulator's stream order, which a real GPU does not have.
#include <cuda_runtime.h>  // the stub: the emulated GPU
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "tandem/train/trainer.h"

namespace tandem {
namespace {

using cuda_emulation::StreamOrder;

// Restores the default order however a test ends.
struct StreamOrderScope {
  StreamOrderScope(StreamOrder order, uint64_t seed) {
    cuda_emulation::set_stream_order(order, seed);
  }
  ~StreamOrderScope() { cuda_emulation::set_stream_order(StreamOrder::kImmediate); }
};

struct Buffers {
  static constexpr size_t kBytes = 4096;
  cudaStream_t writer = nullptr, reader = nullptr;
  cudaEvent_t written = nullptr;
  void *source = nullptr, *copy = nullptr;
  Buffers() {
    EXPECT_EQ(cudaStreamCreateWithFlags(&writer, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaEventCreateWithFlags(&written, cudaEventDisableTiming), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&source, kBytes), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&copy, kBytes), cudaSuccess);
  }
  ~Buffers() {
    cudaFree(copy);
    cudaFree(source);
    cudaEventDestroy(written);
    cudaStreamDestroy(reader);
    cudaStreamDestroy(writer);
  }
  // One stream writes 0x01 bytes, another copies them, with or without the event between
  // them; returns whether the copy saw the write.
  bool reader_sees_the_write(bool with_event) {
    EXPECT_EQ(cudaMemsetAsync(source, 0x01, kBytes, writer), cudaSuccess);
    if (with_event) {
      EXPECT_EQ(cudaEventRecord(written, writer), cudaSuccess);
      EXPECT_EQ(cudaStreamWaitEvent(reader, written, 0), cudaSuccess);
    }
    EXPECT_EQ(cudaMemcpyAsync(copy, source, kBytes, cudaMemcpyDeviceToDevice, reader), cudaSuccess);
    std::vector<unsigned char> host(kBytes);
    // Into pageable memory: returns once the copy is done.
    EXPECT_EQ(cudaMemcpyAsync(host.data(), copy, kBytes, cudaMemcpyDeviceToHost, reader),
              cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    // Back to "never written" for the next round.
    EXPECT_EQ(cudaMemsetAsync(source, 0xff, kBytes, writer), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(writer), cudaSuccess);
    for (unsigned char byte : host)
      if (byte != 0x01) return false;
    return true;
  }
};

TEST(StreamOrderEmulated, LazyOrderExposesAMissingEvent) {
  StreamOrderScope scope(StreamOrder::kLazy, 1);
  Buffers b;
  EXPECT_FALSE(b.reader_sees_the_write(false)) << "the unordered write ran before the read";
  EXPECT_TRUE(b.reader_sees_the_write(true));
}

TEST(StreamOrderEmulated, RandomOrderKeepsEventsAndInterleavesTheRest) {
  int lucky = 0;
  for (uint64_t seed = 1; seed <= 16; seed++) {
    StreamOrderScope scope(StreamOrder::kRandom, seed);
    Buffers b;
    EXPECT_TRUE(b.reader_sees_the_write(true)) << "seed " << seed;
    lucky += b.reader_sees_the_write(false);
  }
  // Without the event each order is a coin toss: some seeds must lose it.
  EXPECT_LT(lucky, 16);
}

TEST(StreamOrderEmulated, CopiesFromPageableMemoryReadTheSourceWhenQueued) {
  StreamOrderScope scope(StreamOrder::kLazy, 1);
  Buffers b;
  std::vector<unsigned char> host(Buffers::kBytes, 0x07);
  ASSERT_EQ(cudaMemcpyAsync(b.source, host.data(), host.size(), cudaMemcpyHostToDevice, b.writer),
            cudaSuccess);
  std::fill(host.begin(), host.end(), 0x00);  // allowed once the call has returned
  ASSERT_EQ(cudaMemcpyAsync(host.data(), b.source, host.size(), cudaMemcpyDeviceToHost, b.writer),
            cudaSuccess);
  for (unsigned char byte : host) ASSERT_EQ(byte, 0x07);
}

TEST(StreamOrderEmulated, EventQueryMakesProgressForAPollingHost) {
  StreamOrderScope scope(StreamOrder::kLazy, 1);
  Buffers b;
  ASSERT_EQ(cudaMemsetAsync(b.source, 0x02, Buffers::kBytes, b.writer), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(b.written, b.writer), cudaSuccess);
  int polls = 0;
  while (cudaEventQuery(b.written) == cudaErrorNotReady) ASSERT_LT(++polls, 100);
  EXPECT_EQ(static_cast<unsigned char*>(b.source)[Buffers::kBytes - 1], 0x02);
}

// Training on the emulated GPU: the model's stream, the update engine's three streams and
// its load stream run out of order, the update running on behind the next forward
// (overlap_forward: the forward's kernels wait for each block's parameters by events alone).
// Every order must give the bits of the synchronous run that waits for the whole update.
std::string digest_of_run(const std::filesystem::path& dir, const char* schedule, bool bf16,
                          StreamOrder order, uint64_t seed, std::vector<float>* losses,
                          bool overlap_forward = true, bool recompute_on_host = false) {
  StreamOrderScope scope(order, seed);
  nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / "run");
  std::filesystem::remove_all(dir / "run");
  json["train"]["steps"] = 3;
  json["device"] = {{"type", "cuda"}};
  json["bf16"] = {{"enabled", bf16}};
  json["zero_optimization"] = {{"sub_group_size", 1000}};
  json["offload_optimizer"] = {{"schedule", schedule}, {"overlap_forward", overlap_forward}};
  // Three layers, so that activation_checkpointing's first output comes back from the host.
  json["model"]["n_layer"] = 3;
  if (recompute_on_host)
    json["activation_checkpointing"] = {{"interval", 1}, {"cpu_checkpointing", true}};
  TrainOptions quiet;
  quiet.show_progress = false;
  const TrainResult result = train(parse_train_config(json), quiet);
  losses->clear();
  for (const StepRecord& step : result.steps) losses->push_back(step.loss);
  return result.state_digest;
}

// `recompute_on_host`: the out-of-order runs recompute every layer from outputs kept in host
// memory (activation_checkpointing.cpu_checkpointing), their copies ordered by events alone.
void expect_every_order_gives_the_same_bits(const char* schedule, bool bf16,
                                            bool recompute_on_host = false) {
  testing::ScratchDir dir(std::string("stream_order_") + schedule + (bf16 ? "_bf16" : ""));
  testing::write_small_corpus(dir / "data.txt");
  std::vector<float> expected_losses, losses;
  const std::string expected = digest_of_run(dir.path(), schedule, bf16, StreamOrder::kImmediate, 1,
                                             &expected_losses, false);
  ASSERT_EQ(expected_losses.size(), 3u);
  const std::string what = std::string(schedule) + (bf16 ? " (bf16)" : " (fp32)");
  EXPECT_EQ(digest_of_run(dir.path(), schedule, bf16, StreamOrder::kImmediate, 1, &losses, true,
                          recompute_on_host),
            expected)
      << what << ", in order, overlapped";
  EXPECT_EQ(losses, expected_losses) << what << ", in order, overlapped";
  EXPECT_EQ(digest_of_run(dir.path(), schedule, bf16, StreamOrder::kLazy, 1, &losses, true,
                          recompute_on_host),
            expected)
      << what << ", lazy order";
  EXPECT_EQ(losses, expected_losses) << what << ", lazy order";
  for (uint64_t seed : {1, 2, 3}) {
    EXPECT_EQ(digest_of_run(dir.path(), schedule, bf16, StreamOrder::kRandom, seed, &losses, true,
                            recompute_on_host),
              expected)
        << what << ", random order, seed " << seed;
    EXPECT_EQ(losses, expected_losses) << what << ", random order, seed " << seed;
  }
}

TEST(StreamOrderEmulated, TrainingGivesTheSameBitsInEveryStreamOrder) {
  expect_every_order_gives_the_same_bits("interleave", true);
  expect_every_order_gives_the_same_bits("cpu", false, true);
}

}  // namespace
}  // namespace tandem
