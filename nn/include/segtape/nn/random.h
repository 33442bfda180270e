// Rng: the seeded, portable generator behind parameter initialisation.
//
// A counter-based splitmix64: draw i is mix(seed + i * golden). The whole
// state is two integers (seed, counter), so it saves into a checkpoint as one
// I64 tensor and restores exactly. The uniform and normal conversions are our
// own (not std::uniform_real_distribution / std::normal_distribution, whose
// output differs between standard libraries): the same seed gives the same
// model on every run, compiler and machine.
#pragma once
#include <cstdint>

namespace segtape::nn {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : words_{seed, 0} {}

  // splitmix64 (Steele, Lea, Flood 2014): passes BigCrush, one add and a mix per draw.
  uint64_t next_u64() {
    uint64_t z = words_[0] + ++words_[1] * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // [0, 1) from the top 53 bits: every value is exactly representable.
  double uniform() { return double(next_u64() >> 11) * 0x1.0p-53; }
  // [lo, hi)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // N(mean, std) by Box-Muller. The second value of the pair is dropped so
  // that the state stays (seed, counter) with no cached spare.
  double normal(double mean = 0, double std = 1);

  struct State {
    uint64_t seed = 0;
    uint64_t counter = 0;  // u64 draws made so far
    bool operator==(const State&) const = default;
  };
  State state() const { return {words_[0], words_[1]}; }
  void set_state(State s) { words_[0] = s.seed, words_[1] = s.counter; }
  // The state's two words (seed, counter) where the Rng keeps them: what a
  // checkpoint entry reads and writes in place (nn::entry(name, Rng&)).
  uint64_t* words() { return words_; }

 private:
  uint64_t words_[2];  // seed, counter (u64 draws made so far)
};

}  // namespace segtape::nn
