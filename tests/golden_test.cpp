// Behaviour kept: every algorithm x history pair the trainer runs, on the CPU
// and on the host-emulated device, trains a few hundred steps, saves its
// checkpoint and evaluates; the checkpoint's SHA-256 and the digest of what
// each update reported (losses, returns, PPO's diagnostics, the evaluation's
// score) must be the ones recorded in tests/golden/checkpoints.txt. A change
// that moves a single bit of any parameter, moment, counter, rng, env state
// or carried state fails here.
//
// The figures are the arithmetic of one machine class: OpenBLAS's kernels
// are pinned (OPENBLAS_CORETYPE=SkylakeX, set by the test itself) and
// segtape's own kernels are the AVX-512 ones, so the file holds the figures
// of an AVX-512 x86-64 CPU and segtape's release build (not the sanitizer
// build). Elsewhere the test skips, saying so. To record the figures
// anew (a deliberate change of arithmetic, stated in the commit):
//   SEGTAPE_GOLDEN_RECORD=1 build/tests/golden_test   (writes tests/golden/checkpoints.txt)
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>

#include "segtape/agent/trainer.h"
#include "segtape/blas.h"
#include "segtape/emulation.h"

#include "process.h"

using namespace segtape;
using namespace segtape::agent;
namespace fs = std::filesystem;

namespace {

struct Case {
  std::string name;
  bool emulated = false;  // on the host-emulated device (--device cuda)
  std::function<void(TrainConfig&)> set;
  bool sequence = false;  // the recurrence of known steps as one gru_sequence (TrainConfig::force_sequence)
};

TrainConfig base(const std::string& env, const std::string& history) {
  TrainConfig c;
  c.env = env;
  c.history = History::parse(history);
  c.steps = 192;
  c.batch = 8;
  c.hidden = 16;
  c.embed = 8;
  c.seed = 3;
  c.env_options.lag = 4;
  c.env_options.corridor = 4;
  c.env_options.turns = 3;
  c.env_options.cities = 4;
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  const char* histories[] = {"tbptt:16", "detach", "window:4", "full", "nograd-history", "exact:8/32", "overlap:8/32/16"};
  for (bool emulated : {false, true}) {
    const std::string dev = emulated ? "emulated_" : "cpu_";
    for (const char* h : histories) {
      const std::string hs = h;
      if (emulated && hs == "full") continue;  // (CPU only: one growing arena)
      std::string id = hs.substr(0, hs.find(':'));
      if (id == "nograd-history") id = "nograd";
      // supervised (recall), A2C (tmaze)
      v.push_back({dev + "supervised_" + id, emulated, [hs](TrainConfig& c) { c = base("recall", hs); }});
      v.push_back({dev + "a2c_" + id, emulated, [hs](TrainConfig& c) {
                     c = base("tmaze", hs);
                     c.steps = 160;
                   }});
    }
    for (const char* h : {"tbptt:8", "detach", "exact:8/16", "overlap:8/16/8"}) {
      const std::string hs = h;
      const std::string id = hs.substr(0, hs.find(':'));
      v.push_back({dev + "ppo_" + id, emulated, [hs](TrainConfig& c) {
                     c = base("tmaze", hs);
                     c.algo = Algo::Ppo;
                     c.rollout = 32, c.epochs = 2, c.minibatches = 2, c.steps = 128;
                   }});
    }
    v.push_back({dev + "ppo_recall_tbptt", emulated, [](TrainConfig& c) {
                   c = base("recall", "tbptt:8");
                   c.algo = Algo::Ppo, c.gamma = 0;
                   c.rollout = 32, c.epochs = 2, c.minibatches = 4, c.steps = 128;
                 }});
    v.push_back({dev + "ppo_tbptt_sequence", emulated,
                 [](TrainConfig& c) {
                   c = base("tmaze", "tbptt:8");
                   c.algo = Algo::Ppo;
                   c.rollout = 32, c.epochs = 2, c.minibatches = 2, c.steps = 128;
                 },
                 true});
    v.push_back({dev + "supervised_dialogue_tbptt", emulated, [](TrainConfig& c) { c = base("dialogue", "tbptt:8"); }});
    v.push_back({dev + "supervised_sparse_exact", emulated, [](TrainConfig& c) {
                   c = base("recall", "exact:4/16");
                   c.env_options.sparse = true, c.env_options.lag = 8, c.update_bias = 3;
                 }});
    v.push_back({dev + "supervised_shards_tbptt", emulated, [](TrainConfig& c) {
                   c = base("recall", "tbptt:8");
                   c.env_shards = 2;
                 }});
  }
  // The emulated device's graph segments: eagerly (graph_replay off) and as
  // one gru_sequence per segment.
  v.push_back({"emulated_supervised_tbptt_eager", true, [](TrainConfig& c) {
                 c = base("recall", "tbptt:16");
                 c.graph_replay = false;
               }});
  v.push_back({"emulated_supervised_tbptt_sequence", true, [](TrainConfig& c) { c = base("recall", "tbptt:16"); }, true});
  return v;
}

fs::path golden_file() { return fs::path(SEGTAPE_SOURCE_DIR) / "tests" / "golden" / "checkpoints.txt"; }

std::string sha256(const fs::path& file) {
  const test::Process p = test::run_shell("sha256sum '" + file.string() + "'");
  if (!p.exited || p.code != 0 || p.output.size() < 64) return "sha256sum failed: " + p.output;
  return p.output.substr(0, 64);
}

// The machine class the figures belong to, and the build's (a sanitizer
// build compiles at another optimisation level: other contractions into FMAs).
std::string fingerprint() {
  std::string isa = "generic";
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) isa = "avx512";
  else if (__builtin_cpu_supports("avx2")) isa = "avx2";
#endif
  std::string build;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  build = " sanitizer build";
#endif
  return isa + " openblas=" + blas_kernels() + build;
}

std::map<std::string, std::string> recorded(std::string& print) {
  std::map<std::string, std::string> m;
  std::ifstream in(golden_file());
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# machine: ", 0) == 0) print = line.substr(11);
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.find(' ');
    m[line.substr(0, sp)] = line.substr(sp + 1);
  }
  return m;
}

// Trains the case, saves, evaluates: "<checkpoint sha256> <results sha256>".
std::string run_case(const Case& k) {
  TrainConfig c;
  k.set(c);
  if (k.emulated) c.device = "cuda";
  emulation::emulate_cuda_on_host(k.emulated);
  c.force_sequence = k.sequence;
  const fs::path dir = fs::temp_directory_path() / ("segtape_golden_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string results;
  {
    Trainer tr(c);
    char line[256];
    while (!tr.done()) {
      const UpdateResult r = tr.run_segment();
      std::snprintf(line, sizeof line, "%ld %a %ld %a %ld %a %a\n", long(r.steps), r.loss_sum, long(r.loss_steps), r.return_sum,
                    long(r.episodes), r.metric("approx_kl"), r.metric("clip_fraction"));
      results += line;
    }
    // (which paths ran: the device's graph segments, the recurrence as one gru_sequence)
    std::snprintf(line, sizeof line, "paths graph %d graph_sequence %d ppo_sequence %d\n", int(tr.graph_segments()),
                  int(tr.graph_sequence()), int(tr.ppo_sequence()));
    results += line;
    tr.save(dir / "ck.safetensors");
    std::snprintf(line, sizeof line, "eval %a\n", tr.evaluate(48, 11));
    results += line;
  }
  emulation::emulate_cuda_on_host(false);
  std::ofstream(dir / "results.txt") << results;
  const std::string out = sha256(dir / "ck.safetensors") + " " + sha256(dir / "results.txt");
  fs::remove_all(dir);
  return out;
}

// The segtape command's: its checkpoint, whose metadata also holds the open
// log interval's sums and segment peak (what metrics.csv's next row is made of).
struct CliCase {
  std::string name, args;
};

std::vector<CliCase> cli_cases() {
  const std::string small = " --steps 256 --batch 8 --hidden 16 --embed 8 --seed 5 --log-every 64 --checkpoint-every 128";
  return {{"cli_supervised_tbptt", "--env recall --lag 4 --history tbptt:16" + small},
          {"cli_supervised_exact", "--env recall --lag 4 --history exact:8/32" + small},
          {"cli_a2c_window", "--env tmaze --corridor 4 --history window:4" + small},
          {"cli_ppo_tbptt", "--env tmaze --corridor 4 --algo ppo --rollout 32 --epochs 2 --minibatches 2 --history tbptt:8" + small}};
}

std::string run_cli_case(const CliCase& k) {
  const fs::path dir = fs::temp_directory_path() / ("segtape_golden_cli_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const test::Process p = test::run_shell(std::string(SEGTAPE_BIN) + " train " + k.args + " --out '" + dir.string() + "' 2>&1");
  if (!p.exited || p.code != 0) return "segtape train failed: " + p.output;
  const std::string out = sha256(dir / "checkpoint.safetensors");
  fs::remove_all(dir);
  return out;
}

class Golden : public testing::TestWithParam<Case> {};

// What the file records for `name`, or why there is nothing to compare
// (a skip); in record mode, `got` is written for it.
void compare(const std::string& name, const std::string& got) {
  const struct {
    const std::string& name;
  } k{name};
  if (std::getenv("SEGTAPE_GOLDEN_RECORD")) {  // (one process per case under ctest: append, then sort)
    static std::mutex m;
    const std::lock_guard<std::mutex> lock(m);
    std::string print;
    std::map<std::string, std::string> all = recorded(print);
    all[k.name] = got;
    std::ofstream out(golden_file());
    out << "# tests/golden_test.cpp: <case> <checkpoint sha256> <sha256 of what its updates reported>\n";
    out << "# machine: " << fingerprint() << "\n";
    for (const auto& [name, v] : all) out << name << " " << v << "\n";
    GTEST_SKIP() << "recorded " << k.name << ": " << got;
  }
  std::string print;
  const std::map<std::string, std::string> want = recorded(print);
  if (print != fingerprint())
    GTEST_SKIP() << "the golden figures are of a '" << print << "' machine; this is '" << fingerprint()
                 << "' (other kernels, other rounding): nothing to compare";
  const auto it = want.find(k.name);
  ASSERT_NE(it, want.end()) << k.name << " has no recorded figures in " << golden_file();
  EXPECT_EQ(got, it->second) << k.name << ": the checkpoint or the updates' reports differ from the recorded run";
}

TEST_P(Golden, CheckpointAndResultsAreTheRecordedOnes) { compare(GetParam().name, run_case(GetParam())); }

class GoldenCli : public testing::TestWithParam<CliCase> {};

TEST_P(GoldenCli, CheckpointIsTheRecordedOne) { compare(GetParam().name, run_cli_case(GetParam())); }

INSTANTIATE_TEST_SUITE_P(Commands, GoldenCli, testing::ValuesIn(cli_cases()),
                         [](const testing::TestParamInfo<CliCase>& i) { return i.param.name; });

INSTANTIATE_TEST_SUITE_P(AllPairs, Golden, testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace

// OpenBLAS reads OPENBLAS_CORETYPE when it loads: on an AVX-512 CPU the test
// starts itself again with the SkylakeX kernels pinned (what the figures were
// recorded with, and what the segtape program takes where OpenBLAS does not
// know the CPU), whatever OpenBLAS would pick on this CPU.
int main(int argc, char** argv) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (!std::getenv("OPENBLAS_CORETYPE") && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
    execv("/proc/self/exe", argv);
  }
#endif
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
