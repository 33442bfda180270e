// The agent loop on the device (agent/device/device_loop.h): PPO's rollout
// of T steps over B streams of a device env, then GAE, timed as a user runs
// it (nothing counted inside the timed region), on a CUDA tape or the CPU.
//   build/bench/device_loop_bench [--device cuda|cpu] [--env recall|tmaze] [--batch 4096] [--hidden 128]
//                                 [--rollout 128] [--segment 32] [--iterations 10] [--graphs on|off]
// Prints one line: transitions (env steps of one stream) per second of
// rollout + GAE, median and range over the timed iterations (after two
// warm-up ones), the rollout's segment peak, the persistent bytes, and the
// device and system allocations made after the warm-up (0: memory fixed).
// bench/device_check.sh runs it on a lent GPU at issue 51's B = 4096, H = 128.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "device/device_loop.h"
#include "segtape/error.h"

int main(int argc, char** argv) {
  using namespace segtape;
  std::string device = "cuda", env = "recall", graphs = "on";
  int64_t B = 4096, H = 128, T = 128, K = 32, iterations = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--device") device = v;
    else if (a == "--env") env = v;
    else if (a == "--graphs") graphs = v;
    else if (a == "--batch") B = std::atoll(v.c_str());
    else if (a == "--hidden") H = std::atoll(v.c_str());
    else if (a == "--rollout") T = std::atoll(v.c_str());
    else if (a == "--segment") K = std::atoll(v.c_str());
    else if (a == "--iterations") iterations = std::atoll(v.c_str());
    else {
      std::fprintf(stderr, "device_loop_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  try {
    TapeOptions o;
    o.graph_replay = device == "cuda" && graphs == "on";
    o.segment_budget = size_t(1) << 30;
    o.device_persistent = size_t(1) << 30;
    Tape tape(device == "cuda" ? Device::cuda() : Device::cpu(), o);
    agent::EnvOptions eo;
    agent::device::DeviceEnv denv(tape, env, B, 1, eo);
    nn::Rng init(1);
    const agent::Policy policy(tape, init, denv.spec(), agent::PolicyShape{32, H, 0, true});
    agent::device::DeviceRollout rollout(tape, policy, denv, T, K, 7);
    const Tensor h = tape.persistent({B, H});
    std::vector<double> rates;
    uint64_t allocations_after_warmup = 0;
    for (int64_t i = 0; i < iterations + 2; ++i) {
      if (i == 2) allocations_after_warmup = tape.stats().device_allocations + tape.stats().system_allocations;
      const auto t0 = std::chrono::steady_clock::now();
      rollout.run(h);
      rollout.advantages(0.99, 0.95);
      tape.synchronize();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (i >= 2) rates.push_back(double(T * B) / s);
    }
    std::sort(rates.begin(), rates.end());
    const TapeStats st = tape.stats();
    std::printf("device_loop_bench %s %s B=%lld H=%lld T=%lld K=%lld graphs=%s: %.0f transitions/s (median of %zu; %.0f to %.0f), "
                "segment peak %zu bytes, persistent %zu bytes, graphs captured %llu replayed %llu, "
                "%llu allocations after the warm-up\n",
                tape.device().str().c_str(), env.c_str(), (long long)B, (long long)H, (long long)T, (long long)K,
                o.graph_replay ? "on" : "off", rates[rates.size() / 2], rates.size(), rates.front(), rates.back(),
                rollout.segment_peak, st.persistent_bytes, (unsigned long long)st.graph_captures, (unsigned long long)st.graph_replays,
                (unsigned long long)(st.device_allocations + st.system_allocations - allocations_after_warmup));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "device_loop_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
