// No fused GRU kernels while a scope lasts (SEGTAPE_FUSED_GRU=0): a
// trainer made then runs the recurrence of steps known ahead step by step,
// also on a GPU where the fused sequence would run (with
// TrainConfig::force_sequence it runs one gru_sequence anyway, composed of
// cells). The variable is put back as it was when the scope ends, whatever
// it throws. Trainers read it when they are made.
#pragma once
#include <stdlib.h>

#include <optional>
#include <string>

namespace segtape::test {

class NoFusedGru {
 public:
  NoFusedGru() : fused_(get("SEGTAPE_FUSED_GRU")) { ::setenv("SEGTAPE_FUSED_GRU", "0", 1); }
  ~NoFusedGru() { put("SEGTAPE_FUSED_GRU", fused_); }
  NoFusedGru(const NoFusedGru&) = delete;
  NoFusedGru& operator=(const NoFusedGru&) = delete;

 private:
  static std::optional<std::string> get(const char* name) {
    const char* v = ::getenv(name);
    return v ? std::optional<std::string>(v) : std::nullopt;
  }
  static void put(const char* name, const std::optional<std::string>& v) {
    if (v) ::setenv(name, v->c_str(), 1);
    else ::unsetenv(name);
  }
  std::optional<std::string> fused_;
};

}  // namespace segtape::test
