// No fused GRU kernels while a scope lasts (kernels::Options::fused_gru
// off): a trainer made then runs the recurrence of steps known ahead step by
// step, also on a GPU where the fused sequence would run (with
// TrainConfig::force_sequence it runs one gru_sequence anyway, composed of
// cells). The kernel switches are put back as they were when the scope ends,
// whatever it throws. Trainers read them when they are made.
#pragma once
#include "segtape/kernels.h"

namespace segtape::test {

class NoFusedGru {
 public:
  NoFusedGru() : kernels_(kernels::options()) {
    kernels::Options k = kernels_;
    k.fused_gru = false;
    kernels::set_options(k);
  }
  ~NoFusedGru() { kernels::set_options(kernels_); }
  NoFusedGru(const NoFusedGru&) = delete;
  NoFusedGru& operator=(const NoFusedGru&) = delete;

 private:
  kernels::Options kernels_;
};

}  // namespace segtape::test
