// Deterministic random numbers whose whole state can be saved in a checkpoint.
#pragma once

#include <array>
#include <cstdint>

namespace tandem {

// xoshiro256** (Blackman & Vigna): small, fast, and its state is four integers, so a
// checkpoint can store it and a resumed run draws the same numbers. The standard
// library's distributions are implementation-defined, so the conversions to floats
// and normals are written out here to give the same numbers on every platform.
class Rng {
 public:
  using State = std::array<uint64_t, 4>;

  explicit Rng(uint64_t seed);

  uint64_t next_u64();
  // Uniform in [0, 1) with 24 random bits.
  float uniform();
  // Standard normal (Box-Muller on two uniforms in double precision).
  float normal();

  const State& state() const { return state_; }
  void set_state(const State& state) { state_ = state; }

 private:
  State state_{};
};

}  // namespace tandem
