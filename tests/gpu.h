// The CUDA test suites' GPU check (cuda_test.cpp, cuda_nn_test.cpp): a test
// that needs a GPU starts with REQUIRE_GPU(), which skips it, saying why,
// when no CUDA tape can be made (no GPU, or a build without the backend). On
// the host-emulated device (segtape/emulation.h) a CUDA tape can be made.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "segtape/emulation.h"
#include "segtape/tape.h"

namespace segtape::test {

// Small device pools: the tests need little, and they make many tapes.
inline TapeOptions small_device_pools() {
  TapeOptions o;
  o.segment_budget = size_t(16) << 20;
  o.device_persistent = size_t(16) << 20;
  o.device_carry = size_t(1) << 20;
  o.device_workspace = size_t(8) << 20;
  return o;
}

// Whether this binary runs the suite on the host-emulated device (built with
// SEGTAPE_TEST_EMULATED_DEVICE); it then turns the emulation on at start-up.
#ifdef SEGTAPE_TEST_EMULATED_DEVICE
inline const bool kEmulated = [] {
  emulation::emulate_cuda_on_host(true);
  return true;
}();
#else
inline constexpr bool kEmulated = false;
#endif

// Empty when a CUDA tape can be made; else why not (the skip message).
inline const std::string& gpu_missing() {
  static const std::string why = [] {
    try {
      Tape probe(Device::cuda(), small_device_pools());
      return std::string();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  }();
  return why;
}

}  // namespace segtape::test

#define REQUIRE_GPU()                                                                               \
  do {                                                                                              \
    if (!::segtape::test::gpu_missing().empty())                                                    \
      GTEST_SKIP() << "no usable GPU: " << ::segtape::test::gpu_missing();                          \
  } while (0)
