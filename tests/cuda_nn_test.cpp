// The nn stack, the agent and the retention lab on CUDA against the CPU
// (label `cuda`). Without a GPU every test that needs one skips, with the
// reason Tape(Device::cuda()) gave; the no-GPU tests run instead.
//
//  - layers initialise to the same values on both devices (host draw, copy);
//  - SGD (momentum, dampening, Nesterov, weight decay), Adam and AdamW with
//    clip_grad_norm: five steps on CUDA equal the CPU's within float rounding;
//  - training-state checkpoints written on one device load on the other;
//  - an LSTM with dropout between its layers trains as on the CPU;
//  - the agent Trainer (`segtape train --device cuda`): the same losses as on
//    the CPU, a fixed arena high-water and no device allocation after the
//    first segment; its checkpoint evaluates on the CPU;
//  - the retention lab's segtape side on CUDA: a pitfall grows, a fix is flat.
//
// Built twice: as cuda_nn_test (label `cuda`, the real backend) and as
// emulated_device_test (label `emulated`, SEGTAPE_TEST_EMULATED_DEVICE):
// there Device::cuda() is the host-emulated device of segtape/emulation.h, so
// every test runs on any machine and checks the device code paths (no host
// access to device memory, copies, updates, device pools, no allocation
// after setup); its numbers equal the CPU's, which the tolerances allow.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <cmath>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "segtape/agent/retention.h"
#include "segtape/agent/trainer.h"
#include "segtape/nn/checkpoint.h"
#include "segtape/nn/dist.h"
#include "segtape/nn/layers.h"
#include "segtape/nn/optim.h"
#include "segtape/ops.h"
#include "segtape/replay.h"
#include "segtape/emulation.h"

#include "gpu.h"
#include "seam.h"

using namespace segtape;
namespace fs = std::filesystem;

namespace {

using test::gpu_missing;
using test::kEmulated;
using test::small_device_pools;

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("segtape-cuda-nn-" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d / name;
}

// Every parameter of a module, as host values, in named order.
std::vector<std::vector<float>> host_params(const nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (const auto& [name, p] : m.named_parameters()) out.push_back(p.to_host<float>());
  return out;
}

void expect_close(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b, double rel,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t t = 0; t < a.size(); ++t) {
    ASSERT_EQ(a[t].size(), b[t].size()) << what;
    for (size_t i = 0; i < a[t].size(); ++i)
      ASSERT_NEAR(a[t][i], b[t][i], rel * std::max(1.0, std::fabs(double(b[t][i])))) << what << ": tensor " << t << " [" << i << "]";
  }
}

// Embedding -> GRUCell -> Linear, cross-entropy: the agent's shape, small.
struct Net : nn::Module {
  nn::Embedding enc;
  nn::GRUCell cell;
  nn::Linear head;
  Net(Tape& t, nn::Rng& rng)
      : nn::Module(t), enc(t, rng, 10, 6), cell(t, rng, 6, 12), head(t, rng, 12, 10) {
    register_module("enc", enc);
    register_module("cell", cell);
    register_module("head", head);
  }
};

constexpr int64_t kB = 4, kSteps = 6;

// One update of Net on fixed data (step `it`): a segment of kSteps, backward,
// clip, step, zero_grad. Returns the loss and the clipped norm.
std::pair<double, double> iterate(Tape& tape, Net& net, nn::Optimizer& opt, int it) {
  Segment seg = tape.segment();
  Tensor h = tape.zeros({kB, 12}), loss;
  for (int64_t t = 0; t < kSteps; ++t) {
    std::vector<int64_t> x(kB), y(kB);
    for (int64_t b = 0; b < kB; ++b) x[size_t(b)] = (it * 7 + t * 3 + b) % 10, y[size_t(b)] = (it + t * 5 + b * 3) % 10;
    h = net.cell(net.enc(tape.from(std::span<const int64_t>(x), {kB})), h);
    Tensor l = cross_entropy(net.head(h), tape.from(std::span<const int64_t>(y), {kB}));
    loss = t ? add(loss, l) : l;
  }
  const double value = loss.item();
  seg.backward(loss);
  const double norm = nn::clip_grad_norm(net, 0.5);
  opt.step();
  opt.zero_grad();
  return {value, norm};
}

agent::TrainConfig recall_config(const std::string& device) {
  agent::TrainConfig c;
  c.env = "recall";
  c.history = agent::History::parse("tbptt:8");
  c.steps = 96;
  c.batch = 8;
  c.hidden = 32;
  c.embed = 16;
  c.env_options.lag = 3;
  c.env_options.vocab = 8;
  c.budget = size_t(8) << 20;
  c.device = device;
  return c;
}

}  // namespace

// ------------------------------------------------------------------ nn

TEST(CudaNn, LayersInitialiseToTheCpuValues) {
  REQUIRE_GPU();
  Tape cpu(Device::cpu(), small_device_pools()), gpu(Device::cuda(), small_device_pools());
  nn::Rng r1(7), r2(7);
  Net a(cpu, r1), b(gpu, r2);
  nn::GRU ga(cpu, r1, 5, 9, 2), gb(gpu, r2, 5, 9, 2);
  EXPECT_EQ(host_params(b), host_params(a));  // drawn on the host, copied: bit for bit
  EXPECT_EQ(host_params(gb), host_params(ga));
}

TEST(CudaNn, OptimizerStepsWithClippingMatchTheCpu) {
  REQUIRE_GPU();
  struct Config {
    const char* what;
    std::function<std::unique_ptr<nn::Optimizer>(const nn::Module&)> make;
  };
  const std::vector<Config> configs = {
      {"SGD momentum nesterov wd", [](const nn::Module& m) {
         return std::make_unique<nn::SGD>(m, nn::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
       }},
      {"SGD momentum dampening", [](const nn::Module& m) {
         return std::make_unique<nn::SGD>(m, nn::SGDOptions{.lr = 0.1, .momentum = 0.8, .dampening = 0.3});
       }},
      {"Adam wd", [](const nn::Module& m) { return std::make_unique<nn::Adam>(m, nn::AdamOptions{.lr = 1e-2, .weight_decay = 1e-2}); }},
      {"AdamW", [](const nn::Module& m) { return std::make_unique<nn::AdamW>(m, nn::AdamWOptions{.lr = 1e-2, .weight_decay = 1e-2}); }},
      // The step count on the device (capturable): the same updates.
      {"Adam wd capturable", [](const nn::Module& m) {
         return std::make_unique<nn::Adam>(m, nn::AdamOptions{.lr = 1e-2, .weight_decay = 1e-2, .capturable = true});
       }},
      {"AdamW capturable", [](const nn::Module& m) {
         return std::make_unique<nn::AdamW>(m, nn::AdamWOptions{.lr = 1e-2, .weight_decay = 1e-2, .capturable = true});
       }},
  };
  for (const Config& c : configs) {
    SCOPED_TRACE(c.what);
    Tape cpu(Device::cpu(), small_device_pools()), gpu(Device::cuda(), small_device_pools());
    nn::Rng r1(3), r2(3);
    Net a(cpu, r1), b(gpu, r2);
    auto oa = c.make(a), ob = c.make(b);
    for (int it = 0; it < 5; ++it) {
      const auto [la, na] = iterate(cpu, a, *oa, it);
      const auto [lb, nb] = iterate(gpu, b, *ob, it);
      EXPECT_NEAR(lb, la, 1e-4 * std::max(1.0, std::fabs(la))) << "loss, iteration " << it;
      EXPECT_NEAR(nb, na, 1e-4 * std::max(1.0, na)) << "gradient norm, iteration " << it;
    }
    expect_close(host_params(b), host_params(a), 1e-4, std::string(c.what) + " parameters");
    std::vector<std::vector<float>> sa, sb;
    for (const auto& [n, t] : oa->state()) sa.push_back(t.to_host<float>());
    for (const auto& [n, t] : ob->state()) sb.push_back(t.to_host<float>());
    expect_close(sb, sa, 1e-4, std::string(c.what) + " optimizer state");
  }
}

TEST(CudaNn, TrainingStateCheckpointsMoveBetweenDevices) {
  REQUIRE_GPU();
  Tape cpu(Device::cpu(), small_device_pools()), gpu(Device::cuda(), small_device_pools());
  nn::Rng r1(11), r2(99);
  Net a(cpu, r1), b(gpu, r2);  // different initial values
  nn::Adam oa(a, {}), ob(b, {});
  for (int it = 0; it < 3; ++it) iterate(gpu, b, ob, it);
  const fs::path f = scratch("gpu-state.safetensors");
  nn::save_training_state(f, b, ob, r2, 3);
  nn::load_training_state(f, a, oa, r1);  // CUDA -> CPU
  EXPECT_EQ(host_params(a), host_params(b));
  EXPECT_EQ(oa.step_count(), 3);
  // and back: one more identical step on each stays together
  const fs::path g = scratch("cpu-state.safetensors");
  nn::save_training_state(g, a, oa, r1, 3);
  nn::load_training_state(g, b, ob, r2);  // CPU -> CUDA
  iterate(cpu, a, oa, 3);
  iterate(gpu, b, ob, 3);
  expect_close(host_params(b), host_params(a), 1e-4, "after one more step");
  fs::remove_all(f.parent_path());
}

// nn::LSTM with dropout between its layers (the same masks given on both
// devices) and a Dropout after it: Adam steps on the device equal the CPU's
// within float rounding, and the device takes no allocation after the first.
TEST(CudaNn, LstmWithDropoutTrainsAsOnTheCpu) {
  REQUIRE_GPU();
  constexpr int64_t T = 5, B = 2, I = 3, H = 6, L = 2;
  Tape cpu(Device::cpu(), small_device_pools()), gpu(Device::cuda(), small_device_pools());
  nn::Rng r1(5), r2(5);
  nn::LSTM a(cpu, r1, I, H, L, true, DType::F32, 0.3, 1), b(gpu, r2, I, H, L, true, DType::F32, 0.3, 1);
  nn::Dropout da(cpu, 0.2), db(gpu, 0.2);
  nn::Adam oa(a, {.lr = 1e-2}), ob(b, {.lr = 1e-2});
  std::vector<float> x(size_t(T * B * I)), m(size_t((L - 1) * T * B * H)), d(size_t(T * B * H));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(double(i)));
  auto step = [&](Tape& tape, nn::LSTM& net, nn::Dropout& drop, nn::Adam& opt) {
    Segment seg = tape.segment();
    const nn::LSTM::Output o = net(tape.from(x, {T, B, I}), {}, {}, tape.from(m, {L - 1, T, B, H}));
    Tensor loss = add(mean(mul(drop.apply(o.output, tape.from(d, {T, B, H})), o.output)), mean(o.c_n));
    const double v = loss.item();
    seg.backward(loss);
    opt.step();
    opt.zero_grad();
    return v;
  };
  uint64_t device_allocations = 0;
  for (int it = 0; it < 4; ++it) {
    a.dropout_masks(m);  // drawn once, given to both
    da.mask(d);
    const double la = step(cpu, a, da, oa), lb = step(gpu, b, db, ob);
    EXPECT_NEAR(lb, la, 1e-4 * std::max(1.0, std::fabs(la))) << "loss, iteration " << it;
    if (it == 1) device_allocations = memory::device_allocations();
  }
  EXPECT_EQ(memory::device_allocations(), device_allocations);
  expect_close(host_params(b), host_params(a), 1e-4, "LSTM parameters after 4 Adam steps");
}

// ------------------------------------------------------------------ agent

TEST(CudaAgent, TrainerMatchesTheCpuWithFixedDeviceMemory) {
  REQUIRE_GPU();
  agent::Trainer cpu(recall_config("cpu")), gpu(recall_config("cuda"));
  size_t peak = 0;
  uint64_t allocs = 0;
  for (int s = 0; !gpu.done(); ++s) {
    const agent::UpdateResult rc = cpu.run_segment(), rg = gpu.run_segment();
    ASSERT_EQ(rg.steps, rc.steps);
    EXPECT_NEAR(rg.loss_sum, rc.loss_sum, 1e-3 * std::max(1.0, std::fabs(rc.loss_sum))) << "segment " << s;
    // Segment 0 has fewer losses (no target before step lag): from segment 1
    // on every segment records the same ops and reaches the same high-water.
    const size_t p = gpu.tape().stats().last_segment_peak;
    if (s == 0) allocs = memory::device_allocations();
    if (s == 1) peak = p;
    if (s >= 1) {
      EXPECT_EQ(p, peak) << "arena high-water of segment " << s;
    }
    EXPECT_EQ(memory::device_allocations(), allocs) << "device allocation in segment " << s;
  }
  const fs::path f = scratch("trainer.safetensors");
  gpu.save(f);
  agent::TrainConfig back = agent::Trainer::read_config(f);
  EXPECT_EQ(back.device, "cuda");
  back.device = "cpu";  // `segtape eval --device cpu` of a GPU run
  agent::Trainer evaluator(back);
  evaluator.load(f);
  EXPECT_NEAR(evaluator.evaluate(64, 5), gpu.evaluate(64, 5), 0.05);
  fs::remove_all(f.parent_path());
}

// A language model (--task lm) on the device: its chunks' head once over the
// chunk in blocks, whose logits reach the host in one copy per block for the
// greedy actions (agent/algo/lm.cpp), and its validation at the epoch's end.
// Two layers of LSTM with dropout; the same losses, validation loss,
// accuracy and parameters as on the CPU (bit for bit on the emulated
// device, whose ops are the CPU's; within float rounding on a GPU), no
// device allocation after the first chunk.
TEST(CudaAgent, ALanguageModelMatchesTheCpuWithFixedDeviceMemory) {
  REQUIRE_GPU();
  const double tol = kEmulated ? 0.0 : 1e-4;
  auto config = [](const char* device) {
    agent::TrainConfig c;
    c.env = "lm";
    c.algo = agent::Algo::Lm;
    c.env_options.data = std::string(SEGTAPE_SOURCE_DIR) + "/tests/data/shakespeare-20k.txt";
    c.history = agent::History::parse("tbptt:16");
    c.cell = "lstm", c.layers = 2, c.dropout = 0.3;
    c.batch = 32, c.hidden = 32, c.embed = 16;
    c.steps = 561 + 32;  // (an epoch: 18,000 training characters in 32 streams, less one)
    c.budget = size_t(16) << 20;
    c.device = device;
    return c;
  };
  agent::Trainer cpu(config("cpu")), gpu(config("cuda"));
  uint64_t allocs = 0;
  int valid = 0;
  for (int s = 0; !gpu.done(); ++s) {
    const agent::UpdateResult rc = cpu.run_segment(), rg = gpu.run_segment();
    ASSERT_EQ(rg.steps, rc.steps);
    EXPECT_NEAR(rg.loss_sum, rc.loss_sum, tol * std::max(1.0, std::fabs(rc.loss_sum))) << "chunk " << s;
    EXPECT_NEAR(rg.metric("valid_loss"), rc.metric("valid_loss"), tol * 5) << "chunk " << s;
    valid += rc.metric("valid_loss") > 0;
    if (s == 0) allocs = memory::device_allocations();
    EXPECT_EQ(memory::device_allocations(), allocs) << "device allocation in chunk " << s;
  }
  EXPECT_EQ(valid, 1) << "the epoch's end";
  EXPECT_NEAR(gpu.env().score(), cpu.env().score(), kEmulated ? 0.0 : 0.01) << "accuracy";
  expect_close(host_params(gpu.policy()), host_params(cpu.policy()), kEmulated ? 0.0 : 1e-3, "parameters after the run");
}

// An open-loop env whose steps differ in how many streams have a target:
// at step t stream b has one (the token it shows, t + b mod 3) where
// t mod 24 < 16 and (t + b) mod 3 != 0, so with 8 streams a step has 5 or 6
// targets, and steps 16 to 23 of every 24 have none (with K = 8, every
// third segment has no loss and takes no update).
class SomeTargets final : public agent::Env {
 public:
  SomeTargets(int64_t batch, uint64_t seed) : Env(batch, seed) {
    spec_ = {"some-targets", 3, 0, 3, true, "accuracy", true};
    s_.assign(1, 0);  // the step
  }
  const agent::EnvSpec& spec() const override { return spec_; }
  void observe(std::span<int64_t> tokens, std::span<float>) const override {
    for (int64_t b = 0; b < batch_; ++b) tokens[size_t(b)] = (s_[0] + b) % 3;
  }
  void targets(std::span<int64_t> y) const override {
    for (int64_t b = 0; b < batch_; ++b) y[size_t(b)] = target(b);
  }
  void step(std::span<const int64_t> a, std::span<float> reward, std::span<uint8_t> done) override {
    for (int64_t b = 0; b < batch_; ++b)
      if (target(b) != agent::kNoTarget) ++score_den_, score_num_ += a[size_t(b)] == target(b);
    ++s_[0];
    std::fill(reward.begin(), reward.end(), 0.0f);
    std::fill(done.begin(), done.end(), uint8_t(0));
  }

 private:
  int64_t target(int64_t b) const {
    const int64_t t = s_[0];
    return t % 24 < 16 && (t + b) % 3 != 0 ? (t + b) % 3 : agent::kNoTarget;
  }
  std::vector<int64_t>& state_ints() override { return s_; }
  bool valid_state(std::span<const int64_t> v) const override { return v.size() == 1 && v[0] >= 0; }
  agent::EnvSpec spec_;
  std::vector<int64_t> s_;
};

// The trainer's segments as CUDA graphs (TrainConfig::graph_replay, on by
// default where a run allows it): supervised open-loop envs with tbptt. Each
// run goes eager on the device, as graphs on the device, and on the CPU, with
// an evaluation and a checkpoint load in the middle (both between graph
// segments): the same losses, scores and parameters (bit for bit on the
// emulated device, whose ops are the CPU's; within float rounding on a GPU),
// no device allocation after the first segment, and graphs that really
// replay (TapeStats: the captures and replays counted below follow from the
// schedule). Twice: with the graph segments' recurrence step by step (the
// eager ops: the same arena high-water as eager; the seam off,
// kernels::Options::fused_gru off, also on a GPU) and as one gru_sequence with keep
// (TrainConfig::force_sequence; on a GPU, fused), the head then over all the
// segment's rows at once and the loss as one cross-entropy where every step
// with a target has as many (within float rounding of eager: 1e-5 on the
// emulated device): one high-water in every replayed segment. Dense recall
// repeats one pattern from its second segment on (the first has no target
// before step lag); sparse recall (a target every 4th step) too; in a
// sequence only the count of targets per target step is an op, so both
// repeat from the first segment on (one replay more); dialogue with 4 turns
// resets every stream at steps 3 and 7 of every segment (the resets inside
// the graphs); with 5 turns the resets move through the segments, so step
// by step no pattern repeats and every segment runs eagerly, while in a
// sequence only a reset at the last step is an op (segments 4, 9 and 14
// differ); some-targets (above) has 5 or 6 targets per step, so a sequence
// takes each step's mean on its rows, and every third segment has no
// target: that pattern runs eagerly between the graphs (captures at 3 and
// 4, replays at 6 and 7; after the load, at 12 and 13, a replay at 15); a
// run's shorter last segment runs eagerly. A pattern is adopted when two
// segments in a row have it: eager, then the warm-up, two captures and
// replays; the load at segment 9 discards the graphs (Adam's count, set on
// the host, reaches the device in a call no graph holds).
TEST(CudaAgent, TrainerSegmentsReplayAsGraphsWithTheEagerResults) {
  REQUIRE_GPU();
  const double cpu_tol = kEmulated ? 0.0 : 1e-4;
  const fs::path f = scratch("graph.safetensors");
  struct Case {
    const char* env;
    bool sparse;
    int64_t steps, turns;
    std::pair<uint64_t, uint64_t> steps_graphs, sequence_graphs;  // {captures, replays}
  };
  if (!agent::env_registered("some-targets"))
    agent::register_env("some-targets", [](int64_t batch, uint64_t seed, const agent::EnvOptions&) -> std::unique_ptr<agent::Env> {
      return std::make_unique<SomeTargets>(batch, seed);
    });
  for (const bool force_sequence : {false, true})
  for (const Case& k : {Case{"recall", false, 124, 5, {4, 6}, {4, 7}}, Case{"recall", true, 128, 5, {4, 7}, {4, 8}},
                        Case{"dialogue", false, 128, 4, {4, 8}, {4, 8}}, Case{"dialogue", false, 128, 5, {0, 0}, {4, 5}},
                        Case{"some-targets", false, 128, 5, {4, 3}, {4, 3}}}) {
    SCOPED_TRACE(k.env + std::string(k.sparse ? " sparse" : "") + (k.env == std::string("dialogue") ? " turns " + std::to_string(k.turns) : "") +
                 (force_sequence ? ", force_sequence" : ""));
    std::optional<test::NoFusedGru> seam;
    if (!force_sequence) seam.emplace();
    auto config = [&](const char* device, bool graph) {
      agent::TrainConfig c = recall_config(device);
      c.env = k.env;
      c.env_options.sparse = k.sparse;
      c.env_options.lag = k.sparse ? 4 : 3;
      c.env_options.turns = k.turns;
      c.env_options.embed_dim = 6;
      c.steps = k.steps;
      c.graph_replay = graph;
      c.force_sequence = force_sequence;
      return c;
    };
    agent::Trainer cpu(config("cpu", true)), eager(config("cuda", false)), graph(config("cuda", true));
    seam.reset();
    EXPECT_FALSE(cpu.graph_segments());
    EXPECT_FALSE(eager.graph_segments());
    ASSERT_TRUE(graph.graph_segments());
    const bool sequence = graph.graph_sequence();
    ASSERT_EQ(sequence, force_sequence);
    // Graph and eager on the device: bit for bit step by step; in one sequence
    // the head's one product over the segment's rows, the loss's one weighted
    // sum (and on a GPU the fused recurrence) round differently.
    const double seq_tol = kEmulated ? 1e-5 : 1e-4, dev_tol = sequence ? seq_tol : 0.0, tol = sequence ? seq_tol : cpu_tol;
    uint64_t allocs = 0, replays = 0;
    size_t replayed_peak = 0;
    for (int s = 0; !graph.done(); ++s) {
      if (s == 9) {  // mid-run: an evaluation and a checkpoint's load, between graph segments
        const double e = cpu.evaluate(24, 5);
        EXPECT_NEAR(graph.evaluate(24, 5), e, tol);
        EXPECT_NEAR(eager.evaluate(24, 5), e, tol);
        cpu.save(f);
        for (agent::Trainer* t : {&cpu, &eager, &graph}) t->load(f);
      }
      const agent::UpdateResult rc = cpu.run_segment(), re = eager.run_segment(), rg = graph.run_segment();
      ASSERT_EQ(rg.steps, rc.steps);
      ASSERT_EQ(rg.loss_steps, rc.loss_steps) << "segment " << s;
      EXPECT_NEAR(rg.loss_sum, re.loss_sum, dev_tol * std::max(1.0, std::fabs(re.loss_sum))) << "segment " << s;
      EXPECT_NEAR(rg.loss_sum, rc.loss_sum, tol * std::max(1.0, std::fabs(rc.loss_sum))) << "segment " << s;
      EXPECT_EQ(graph.env().score_counts(), eager.env().score_counts()) << "segment " << s;
      const TapeStats gs = graph.tape().stats();
      if (!sequence) {
        EXPECT_EQ(gs.last_segment_peak, eager.tape().stats().last_segment_peak) << "segment " << s;
      }
      if (gs.graph_replays > replays) {  // a replayed segment
        if (!replayed_peak) replayed_peak = gs.last_segment_peak;
        EXPECT_EQ(gs.last_segment_peak, replayed_peak) << "segment " << s;
        replays = gs.graph_replays;
      }
      if (s == 0) allocs = memory::device_allocations();
      EXPECT_EQ(memory::device_allocations(), allocs) << "device allocation in segment " << s;
      const std::vector<float> hg = graph.state().to_host<float>(), he = eager.state().to_host<float>();
      for (size_t j = 0; j < hg.size(); ++j) ASSERT_NEAR(hg[j], he[j], dev_tol) << "segment " << s << ", state element " << j;
    }
    EXPECT_EQ(graph.env().score_counts(), cpu.env().score_counts());
    const TapeStats st = graph.tape().stats();
    EXPECT_EQ(std::pair(st.graph_captures, st.graph_replays), sequence ? k.sequence_graphs : k.steps_graphs);
    EXPECT_EQ(eager.tape().stats().graph_replays + eager.tape().stats().graph_captures, 0u);
    const auto a = cpu.policy().named_parameters(), b = graph.policy().named_parameters(), c = eager.policy().named_parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      const std::vector<float> x = a[i].second.to_host<float>(), y = b[i].second.to_host<float>(), z = c[i].second.to_host<float>();
      for (size_t j = 0; j < x.size(); ++j) {
        ASSERT_NEAR(y[j], z[j], dev_tol * std::max(1.0f, std::fabs(z[j]))) << a[i].first << ": graph and eager on the device";
        ASSERT_NEAR(y[j], x[j], tol * std::max(1.0f, std::fabs(x[j]))) << a[i].first;
      }
    }
  }
  fs::remove_all(f.parent_path());
}

// An env that says open_loop but, from step 48 on, shows the action it was
// given: the trainer takes a graph segment's steps ahead on a copy with
// placeholder actions, so the real env, stepped with the model's, shows
// something else. Refused with EnvContractError naming the env and
// open_loop, in a replayed segment (its pattern, a target every step, is
// adopted at segment 1: segments 2 and 3 captured, 4 on replayed); the
// segment's update stands: the step is its end, the parameters changed, and
// the trainer stays usable (an evaluation runs).
class ShowsTheAction final : public agent::Env {
 public:
  ShowsTheAction(int64_t batch, uint64_t seed) : Env(batch, seed) {
    spec_ = {"shows-the-action", 3, 0, 3, true, "accuracy", true};
    s_.assign(size_t(2 * batch), 0);  // per stream: step, the token shown
  }
  const agent::EnvSpec& spec() const override { return spec_; }
  void observe(std::span<int64_t> tokens, std::span<float>) const override {
    for (int64_t b = 0; b < batch_; ++b) tokens[size_t(b)] = s_[size_t(2 * b + 1)];
  }
  void targets(std::span<int64_t> y) const override { std::fill(y.begin(), y.end(), 1); }
  void step(std::span<const int64_t> a, std::span<float> reward, std::span<uint8_t> done) override {
    for (int64_t b = 0; b < batch_; ++b) {
      ++score_den_, score_num_ += a[size_t(b)] == 1;
      const int64_t t = ++s_[size_t(2 * b)];
      s_[size_t(2 * b + 1)] = t >= 48 ? a[size_t(b)] : t % 3;
    }
    std::fill(reward.begin(), reward.end(), 0.0f);
    std::fill(done.begin(), done.end(), uint8_t(0));
  }

 private:
  std::vector<int64_t>& state_ints() override { return s_; }
  bool valid_state(std::span<const int64_t> v) const override {
    return std::all_of(v.begin(), v.end(), [](int64_t x) { return x >= 0; });
  }
  agent::EnvSpec spec_;
  std::vector<int64_t> s_;
};

TEST(CudaAgent, AnEnvThatIsNotOpenLoopIsRefusedInGraphSegments) {
  REQUIRE_GPU();
  if (!agent::env_registered("shows-the-action"))
    agent::register_env("shows-the-action", [](int64_t batch, uint64_t seed, const agent::EnvOptions&) -> std::unique_ptr<agent::Env> {
      return std::make_unique<ShowsTheAction>(batch, seed);
    });
  agent::TrainConfig c = recall_config("cuda");
  c.env = "shows-the-action";
  agent::Trainer t(c);
  ASSERT_TRUE(t.graph_segments());
  for (int s = 0; s < 6; ++s) t.run_segment();  // steps 0 to 47: honest
  const uint64_t replays = t.tape().stats().graph_replays;
  EXPECT_EQ(replays, 2u);
  const std::vector<std::vector<float>> before = host_params(t.policy());
  try {
    t.run_segment();
    FAIL() << "an env whose observations follow the actions passed as open_loop";
  } catch (const agent::EnvContractError& e) {
    EXPECT_NE(std::string(e.what()).find("env 'shows-the-action' says its spec is open_loop, but at step "), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(t.tape().stats().graph_replays, replays + 1);  // (the lie came out in a replayed segment)
  EXPECT_EQ(t.step(), 56);                                 // the segment stands
  EXPECT_NE(host_params(t.policy()), before);
  EXPECT_TRUE(std::isfinite(t.evaluate(8, 1)));            // still usable
}

// Recurrent PPO (agent/ppo.cpp) on the device: the same iterations as the
// CPU (losses, the approximate KL, parameters after the run), no device
// allocation after the first iteration, and for exact:K/T its minibatch
// window state and replay drivers inside the measured persistent pool (a
// pool too small would throw when they are made). On the host-emulated
// device (CI) this runs the device code paths of PPO's host logic. Twice
// under tbptt: the update windows' recurrence step by step (the seam off:
// kernels::Options::fused_gru off, also on a GPU), and as one gru_sequence with the
// episode ends in keep (TrainConfig::force_sequence; on a GPU, fused).
TEST(CudaAgent, PpoMatchesTheCpuWithFixedDeviceMemory) {
  REQUIRE_GPU();
  for (const bool force_sequence : {false, true})
  for (const char* env : {"recall", "tmaze"})
    for (const char* history : {"tbptt:8", "exact:4/16"}) {
      if (force_sequence && std::string_view(history) != "tbptt:8") continue;
      SCOPED_TRACE(std::string(env) + " " + history + (force_sequence ? ", force_sequence" : ""));
      auto config = [&](const char* device) {
        agent::TrainConfig c = recall_config(device);
        c.env = env;
        c.env_options.corridor = 4;
        c.history = agent::History::parse(history);
        c.algo = agent::Algo::Ppo;
        c.rollout = 24;
        c.epochs = 2;
        c.minibatches = 2;
        // exact:4/16: a rollout of 24 ends in a window of 8 (a driver of its
        // own), the run's last rollout of 20 in one of 4 (another: the fixed
        // pool holds both; a driver made per length overflowed it)
        c.steps = 24 * 3 + 20;
        return c;
      };
      agent::Trainer cpu(config("cpu"));
      std::optional<agent::Trainer> made;
      {
        std::optional<test::NoFusedGru> seam;
        if (!force_sequence) seam.emplace();
        agent::TrainConfig g = config("cuda");
        g.force_sequence = force_sequence;
        made.emplace(g);
      }
      agent::Trainer& gpu = *made;
      EXPECT_FALSE(cpu.ppo_sequence());
      EXPECT_EQ(gpu.ppo_sequence(), force_sequence);
      // the summary's words for it: the path and why (here the fused kernels do not run: the emulated device has none)
      EXPECT_EQ(cpu.recurrence(), "cells, step by step");
      const std::string path = gpu.recurrence();
      EXPECT_EQ(path.rfind(force_sequence ? "one gru_sequence a segment: " : "cells, step by step", 0), 0u) << path;
      if (kEmulated) {
        EXPECT_NE(path.find("gru_cell steps (this device has no fused GRU kernels)"), std::string::npos) << path;
      }
      uint64_t allocs = 0;
      for (int s = 0; !gpu.done(); ++s) {
        const agent::UpdateResult rc = cpu.run_segment(), rg = gpu.run_segment();
        ASSERT_EQ(rg.steps, rc.steps);
        EXPECT_NEAR(rg.loss_sum, rc.loss_sum, 1e-4 * std::max(1.0, std::fabs(rc.loss_sum))) << "iteration " << s;
        EXPECT_NEAR(rg.metric("approx_kl"), rc.metric("approx_kl"), 1e-5) << "iteration " << s;
        if (s == 0) allocs = memory::device_allocations();
        if (s >= 1 && s < 3) {
          EXPECT_EQ(memory::device_allocations(), allocs) << "device allocation in iteration " << s;
        }
      }
      EXPECT_LE(gpu.tape().stats().persistent_bytes, gpu.tape().options().device_persistent);
      const auto a = cpu.policy().named_parameters(), b = gpu.policy().named_parameters();
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        const std::vector<float> x = a[i].second.to_host<float>(), y = b[i].second.to_host<float>();
        for (size_t j = 0; j < x.size(); ++j) ASSERT_NEAR(x[j], y[j], 1e-4 * std::max(1.0f, std::fabs(x[j]))) << a[i].first;
      }
    }
}

// --history overlap:K/T/S on the device (the host-emulated one in CI):
// supervised, A2C and PPO train as on the CPU (bit for bit on the emulated
// device, whose ops are the CPU's; within float rounding on a GPU), the ring
// of the window's states in the measured persistent pool, no device
// allocation once the windows are full.
TEST(CudaAgent, OverlappingWindowsMatchTheCpuWithFixedDeviceMemory) {
  REQUIRE_GPU();
  const double tol = kEmulated ? 0.0 : 1e-4;
  for (const auto& [env, ppo] : {std::pair{"recall", false}, std::pair{"tmaze", false}, std::pair{"tmaze", true}}) {
    SCOPED_TRACE(std::string(env) + (ppo ? " ppo" : ""));
    auto config = [&](const char* device) {
      agent::TrainConfig c = recall_config(device);
      c.env = env;
      c.env_options.corridor = 4;
      c.history = agent::History::parse("overlap:4/16/8");
      c.steps = 8 * 12;
      if (ppo) c.algo = agent::Algo::Ppo, c.rollout = 24, c.epochs = 2, c.minibatches = 2, c.steps = 24 * 4;
      return c;
    };
    agent::Trainer cpu(config("cpu")), gpu(config("cuda"));
    uint64_t allocs = 0;
    for (int s = 0; !gpu.done(); ++s) {
      const agent::UpdateResult rc = cpu.run_segment(), rg = gpu.run_segment();
      ASSERT_EQ(rg.steps, rc.steps);
      EXPECT_NEAR(rg.loss_sum, rc.loss_sum, tol * std::max(1.0, std::fabs(rc.loss_sum))) << "update " << s;
      EXPECT_EQ(rg.steps_run, rc.steps_run) << "update " << s;
      if (s == 2) allocs = memory::device_allocations();
      if (s > 2) {
        EXPECT_EQ(memory::device_allocations(), allocs) << "device allocation in update " << s;
      }
    }
    EXPECT_LE(gpu.tape().stats().persistent_bytes, gpu.tape().options().device_persistent);
    const auto a = cpu.policy().named_parameters(), b = gpu.policy().named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      const std::vector<float> x = a[i].second.to_host<float>(), y = b[i].second.to_host<float>();
      for (size_t j = 0; j < x.size(); ++j) ASSERT_NEAR(x[j], y[j], tol * std::max(1.0f, std::fabs(x[j]))) << a[i].first;
    }
  }
}

// A device's persistent pool is measured (a counting pass over the real
// model on a CPU tape), not guessed: after the constructor it holds exactly
// what the trainer made, for each env kind and history, and the run makes
// nothing more (under exact the last, shorter window runs on the windows'
// driver). Training, evaluate, save and load all fit.
TEST(CudaAgent, ThePersistentPoolIsWhatTheTrainerKeeps) {
  REQUIRE_GPU();
  const fs::path f = scratch("pool.safetensors");
  for (const char* env : {"recall", "tmaze"})
    for (const char* history : {"tbptt:8", "window:4", "exact:4/16"}) {
      SCOPED_TRACE(std::string(env) + " " + history);
      agent::TrainConfig c = recall_config("cuda");
      c.env = env;
      c.env_options.corridor = 4;
      c.history = agent::History::parse(history);
      c.steps = 40;  // exact: windows of 16, 16 and a last one of 8
      agent::Trainer t(c);
      const size_t pool = t.tape().options().device_persistent, made = t.tape().stats().persistent_bytes;
      EXPECT_EQ(made, pool);
      while (!t.done()) t.run_segment();
      EXPECT_TRUE(std::isfinite(t.evaluate(16, 3)));
      t.save(f);
      t.load(f);
      EXPECT_EQ(t.tape().stats().persistent_bytes, made);
    }
  fs::remove_all(f.parent_path());
}

TEST(CudaAgent, ActorCriticRunsOnCuda) {
  REQUIRE_GPU();
  agent::TrainConfig c = recall_config("cuda");
  c.env = "tmaze";
  c.env_options.corridor = 4;
  agent::Trainer t(c);
  double sum = 0;
  while (!t.done()) sum += t.run_segment().loss_sum;
  EXPECT_TRUE(std::isfinite(sum));
}

TEST(CudaAgent, RetentionLabPitfallGrowsAndFixIsFlatOnCuda) {
  REQUIRE_GPU();
  agent::retention::LabConfig cfg;
  cfg.steps = 40;
  cfg.device = "cuda";
  cfg.device_arena = size_t(256) << 20;
  using agent::retention::Case;
  const auto pit = agent::retention::run_segtape(Case::HiddenNotDetached, cfg);
  ASSERT_TRUE(pit.error.empty()) << pit.error;
  EXPECT_GT(pit.bytes.back(), 4 * pit.bytes[size_t(cfg.lag) + 1]);
  const auto fix = agent::retention::run_segtape(Case::Tbptt, cfg);
  ASSERT_TRUE(fix.error.empty()) << fix.error;
  ASSERT_GE(fix.segment_peaks.size(), size_t(3));
  // From the second segment on (the first ends before the first target: no backward).
  for (size_t i = 1; i < fix.segment_peaks.size(); ++i) EXPECT_EQ(fix.segment_peaks[i], fix.segment_peaks[1]) << "segment " << i;
  // The lab's anomaly-mode cost on the device (its trainers run eager segments: anomaly mode reads every output).
  const agent::retention::AnomalyCost cost = agent::retention::anomaly_cost(cfg, 64);
  EXPECT_GT(cost.us_off, 0.0);
  EXPECT_GT(cost.us_on, 0.0);
}

// ------------------------------------------------------------------ the emulation itself

// What makes the emulated runs worth having: device memory is refused to the
// host exactly as on a GPU, so code that passes here does not touch it.
// Exact BPTT by segment replay on the device: the same gradients as on the
// CPU, the seeded backward and the input() leaves' gradients going through
// the backend (device copies; no host access to device memory).
TEST(CudaExact, ReplayDriverMatchesTheCpu) {
  REQUIRE_GPU();
  std::vector<std::vector<float>> grads[2];
  for (int dev = 0; dev < 2; ++dev) {
    Tape tape(dev ? Device::cuda() : Device::cpu(), small_device_pools());
    nn::Rng rng(5);
    Net net(tape, rng);
    Tensor h0 = tape.persistent({kB, 12});
    const replay::StepFn step = [&](Tape& t, int64_t s, const Tensor& h, replay::Inputs& in) {
      auto tok = in.take<int64_t>(kB, [&](std::span<int64_t> v) {
        for (int64_t b = 0; b < kB; ++b) v[size_t(b)] = (s * 3 + b) % 10;
      });
      Tensor h1 = net.cell(net.enc(t.from(tok, {kB})), h);
      auto y = in.take<int64_t>(kB, [&](std::span<int64_t> v) {
        for (int64_t b = 0; b < kB; ++b) v[size_t(b)] = (s * 3 + b + 7) % 10;  // the token 3 steps back
      });
      return replay::StepResult{h1, cross_entropy(net.head(h1), t.from(y, {kB}))};
    };
    for (auto [schedule, snaps] : {std::pair{replay::Schedule::Uniform, int64_t(0)}, std::pair{replay::Schedule::Binomial, int64_t(2)}}) {
      replay::Driver drv(tape, h0, {.horizon = 40, .k = 8, .schedule = schedule, .snapshots = snaps});
      (void)drv.run(step, h0);
    }
    for (const auto& [name, p] : net.named_parameters()) grads[dev].push_back(p.grad_tensor().to_host<float>());
  }
  expect_close(grads[1], grads[0], 1e-4, "exact BPTT gradients, device vs CPU");
  for (const std::vector<float>& g : grads[0])
    EXPECT_TRUE(std::any_of(g.begin(), g.end(), [](float v) { return v != 0.0f; })) << "a parameter got no gradient";
}

TEST(EmulatedDevice, RefusesHostAccessLikeAGpu) {
  if (!kEmulated) GTEST_SKIP() << "only in emulated_device_test";
  Tape tape(Device::cuda(), small_device_pools());
  const Tensor p = tape.parameter({2, 3});
  EXPECT_TRUE(p.on_device());
  EXPECT_THROW((void)p.data<float>(), TapeError);
  EXPECT_THROW((void)p.span<float>(), TapeError);
  const std::vector<float> v = {1, 2, 3, 4, 5, 6};
  p.from_host(std::span<const float>(v));
  EXPECT_EQ(p.to_host<float>(), v);
  EXPECT_GT(memory::device_allocations(), 0u);
  TapeOptions grow = small_device_pools();
  grow.grow = true;
  EXPECT_THROW(Tape(Device::cuda(), grow), Error);  // the teaching policy is CPU-only, as on a GPU
}

// ------------------------------------------------------------------ without a GPU

TEST(CudaAgent, WithoutAGpuTheTrainerSaysWhy) {
  if (gpu_missing().empty()) GTEST_SKIP() << (kEmulated ? "the host-emulated device is on" : "a GPU is present");
  try {
    agent::Trainer t(recall_config("cuda"));
    ADD_FAILURE() << "a CUDA trainer was made without a GPU";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA GPU found"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--device cpu"), std::string::npos) << e.what();
  }
}

// Data parallelism on a CUDA tape (docs/distributed.md): GradientAverager on
// the device gradients. In a build with NCCL, on a GPU, they go through one
// NCCL group on the tape's stream (here with one rank, as the GPU check runs
// it: NCCL's all-reduce of one rank is the identity, then the scaling by 1);
// on the host-emulated device through host memory. Either way the averaged
// gradients equal the CPU's, and Adam's step after them too.
TEST(CudaDist, DeviceGradientsAveragedEqualTheCpus) {
  REQUIRE_GPU();
  auto run = [](Device d, bool averaged, std::string* transport) {
    Tape tape(d, test::small_device_pools());
    nn::Rng rng(3);
    nn::Linear lin(tape, rng, 24, 16);
    std::unique_ptr<dist::Communicator> one = dist::local();
    std::unique_ptr<dist::GradientAverager> avg;
    if (averaged) avg = std::make_unique<dist::GradientAverager>(*one, lin, 256), *transport = avg->transport();
    std::vector<float> x(5 * 24), y(5 * 16);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.3f * float(i));
    for (size_t i = 0; i < y.size(); ++i) y[i] = std::cos(0.7f * float(i));
    {
      Segment seg = tape.segment();
      seg.backward(mse_loss(lin(tape.from(std::span<const float>(x), {5, 24})), tape.from(std::span<const float>(y), {5, 16})));
    }
    if (avg) avg->average();
    std::vector<float> g;
    for (const Tensor& p : lin.parameters()) {
      const std::vector<float> v = p.grad_tensor().to_host<float>();
      g.insert(g.end(), v.begin(), v.end());
    }
    return g;
  };
  std::string transport;
  const std::vector<float> dev = run(Device::cuda(), true, &transport), cpu = run(Device::cpu(), false, nullptr);
  if (!kEmulated && dist::nccl_built()) {
    EXPECT_EQ(transport, "nccl");
  }
  if (kEmulated) {
    EXPECT_EQ(transport, "local");
  }
  ASSERT_EQ(dev.size(), cpu.size());
  for (size_t i = 0; i < dev.size(); ++i) EXPECT_NEAR(dev[i], cpu[i], 1e-5 * (1 + std::abs(cpu[i]))) << i;
}
