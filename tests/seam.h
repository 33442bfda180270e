// SEGTAPE_GRU_SEQUENCE=1 (agent/ppo.h, recurrence_as_sequence) while a scope
// lasts, or unset, and unset when it ends, whatever the scope throws: the
// test seam that makes the Trainer take gru_sequence where it would not fuse
// (the CPU, the host-emulated device). Trainers read it when they are made.
#pragma once
#include <stdlib.h>

namespace segtape::test {

struct GruSequenceSeam {
  explicit GruSequenceSeam(bool on) { on ? (void)::setenv("SEGTAPE_GRU_SEQUENCE", "1", 1) : (void)::unsetenv("SEGTAPE_GRU_SEQUENCE"); }
  ~GruSequenceSeam() { ::unsetenv("SEGTAPE_GRU_SEQUENCE"); }
  GruSequenceSeam(const GruSequenceSeam&) = delete;
  GruSequenceSeam& operator=(const GruSequenceSeam&) = delete;
};

}  // namespace segtape::test
