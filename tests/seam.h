// The Trainer's choice of gru_sequence for steps known ahead (agent/ppo.h,
// recurrence_as_sequence), made one way while a scope lasts: on, with
// SEGTAPE_GRU_SEQUENCE=1 (the test seam: the sequence also where it would
// not fuse, on the CPU and the host-emulated device); off, with
// kernels::Options::fused_gru off (no fused kernels, so no sequence either,
// also on a GPU where they would run). The variable and the kernel switches
// are put back as they were when the scope ends, whatever it throws.
// Trainers read them when they are made.
#pragma once
#include <stdlib.h>

#include <optional>
#include <string>

#include "segtape/kernels.h"

namespace segtape::test {

class GruSequenceSeam {
 public:
  explicit GruSequenceSeam(bool on) : seq_(get("SEGTAPE_GRU_SEQUENCE")), kernels_(kernels::options()) {
    if (on) {
      ::setenv("SEGTAPE_GRU_SEQUENCE", "1", 1);
    } else {
      ::unsetenv("SEGTAPE_GRU_SEQUENCE");
      kernels::Options k = kernels_;
      k.fused_gru = false;
      kernels::set_options(k);
    }
  }
  ~GruSequenceSeam() {
    put("SEGTAPE_GRU_SEQUENCE", seq_);
    kernels::set_options(kernels_);
  }
  GruSequenceSeam(const GruSequenceSeam&) = delete;
  GruSequenceSeam& operator=(const GruSequenceSeam&) = delete;

 private:
  static std::optional<std::string> get(const char* name) {
    const char* v = ::getenv(name);
    return v ? std::optional<std::string>(v) : std::nullopt;
  }
  static void put(const char* name, const std::optional<std::string>& v) {
    if (v) ::setenv(name, v->c_str(), 1);
    else ::unsetenv(name);
  }
  std::optional<std::string> seq_;
  kernels::Options kernels_;
};

}  // namespace segtape::test
