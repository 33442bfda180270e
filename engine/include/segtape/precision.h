// The arithmetic of a tape's matrix products: TapeOptions::precision
// (docs/precision.md says what bf16 rounds and what stays float32).
#pragma once
#include <bit>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace segtape {

enum class Precision : uint8_t {
  F32,   // float32 throughout
  Bf16,  // matrix products on bfloat16 operands, rounded to bfloat16; the rest float32
};

const char* precision_name(Precision p);                       // "f32", "bf16"
std::optional<Precision> parse_precision(std::string_view s);  // the names above; nullopt otherwise
// Why precision p cannot run on a CUDA GPU of compute capability
// major.minor named `gpu` ("" where it can): bf16 needs bfloat16 tensor
// cores (8.0, Ampere, or later). The CUDA backend refuses such a tape with
// this message, which names what to use instead.
std::string precision_unsupported(Precision p, int major, int minor, const std::string& gpu);

// x rounded to the nearest bfloat16 (float32's sign and exponent, 7 stored
// bits of mantissa), ties to even, returned as the float32 of that value:
// beyond bfloat16's largest finite value x becomes an infinity of its sign; a
// NaN stays a NaN (quiet). Subnormals round like every other value.
constexpr float bf16_round(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::bit_cast<float>(u | 0x00400000u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::bit_cast<float>(u & 0xffff0000u);
}

}  // namespace segtape
