// --critic separate: the value head reads a GRU (or, with --cell lstm, an
// LSTM) of its own ("critic", over the same embeddings) instead of the
// policy's, as sb3-contrib's RecurrentPPO gives its critic an LSTM of its
// own. The state is the policy's rows then the critic's, [2 B, hidden]
// ([4 B, hidden] for LSTMs: h, c, then the critic's h, c); each loss
// reaches only its own core; PPO replays minibatches from both halves of
// the stored states; checkpoints keep the choice (and one without it is the
// shared core's).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "agent_util.h"
#include "segtape/agent/trainer.h"
#include "segtape/ops.h"

using namespace segtape;
using namespace segtape::agent;
namespace fs = std::filesystem;

namespace {

TrainConfig small(const std::string& env, const std::string& history, Algo algo, int64_t steps) {
  TrainConfig c = test::small_config(env, history, steps);
  c.algo = algo;
  c.critic = "separate";
  if (algo == Algo::Ppo) c.rollout = 16, c.epochs = 2, c.minibatches = 2;
  return c;
}

double grad_norm(const Policy& p, const std::string& prefix) {
  double s = 0;
  for (const auto& [name, w] : p.named_parameters())
    if (name.rfind(prefix, 0) == 0)
      for (float g : w.grad_tensor().to_host<float>()) s += double(g) * g;
  return std::sqrt(s);
}

}  // namespace

// The critic's GRU has the policy's shape and names ("critic.weight_ih",
// ...), counted before the policy is built as after; the value loss's
// gradient reaches the critic and not the policy's GRU or head, the policy
// loss's the policy's GRU and not the critic or the value head; the
// embeddings get both.
TEST(Critic, EachLossReachesOnlyItsOwnCore) {
  for (const bool lstm : {false, true}) {
    SCOPED_TRACE(lstm ? "lstm" : "gru");
    auto env = make_env("tmaze", 3, 1, EnvOptions{});
    const EnvSpec& spec = env->spec();
    PolicyShape shape{6, 10, 0, true};
    shape.separate_critic = true, shape.lstm = lstm;
    Tape tape;
    nn::Rng rng(1);
    const Policy p(tape, rng, spec, shape);
    EXPECT_EQ(Policy::parameters_for(spec, shape), p.parameter_count());
    EXPECT_EQ(Policy::largest_parameter_for(spec, shape), test::largest_parameter(p));
    EXPECT_EQ(shape.state_rows(), lstm ? 4 : 2);
    int critic_params = 0;
    for (const auto& [name, w] : p.named_parameters()) {
      critic_params += name.rfind("critic.", 0) == 0;
      if (name == "critic.weight_hh") {
        EXPECT_EQ(w.shape, (Shape{(lstm ? 4 : 3) * 10, 10}));
      }
    }
    EXPECT_EQ(critic_params, 4);
    const std::string core = lstm ? "rnn." : "gru.";
    for (const bool value_loss : {true, false}) {
      SCOPED_TRACE(value_loss ? "value loss" : "policy loss");
      for (const Tensor& w : p.parameters()) {
        const std::vector<float> zero(size_t(w.numel()), 0.0f);
        w.grad_tensor().from_host(std::span<const float>(zero));
      }
      Segment seg = tape.segment();
      const std::vector<int64_t> tokens{0, 1, 2};
      Tensor h = tape.zeros({shape.state_rows() * 3, 10});
      for (int t = 0; t < 3; ++t) h = p.recur(p.encode(tape.from(std::span<const int64_t>(tokens), {3})), h);
      const Tensor f = p.output(h);
      EXPECT_EQ(f.shape, (Shape{2 * 3, 10})) << "the policy's h rows, then the critic's";
      seg.backward(value_loss ? sum(p.value(f)) : sum(log_softmax(p.logits(f))));
      EXPECT_GT(grad_norm(p, value_loss ? "critic." : core), 0);
      EXPECT_EQ(grad_norm(p, value_loss ? core : "critic."), 0);
      EXPECT_EQ(grad_norm(p, value_loss ? "head." : "value."), 0);
      EXPECT_GT(grad_norm(p, value_loss ? "value." : "head."), 0);
      EXPECT_GT(grad_norm(p, "encoder."), 0);
    }
  }
}

// PPO's minibatch (its streams in the epoch's shuffled order) replays its
// windows from both halves of the states stored at rollout time (the
// policy's rows and the critic's). With one epoch of one minibatch the first
// iteration's replay is its rollout again: every ratio is 1 (the policy's
// half), and the values are the rollout's, so the loss it reports (ratio 1,
// no entropy bonus: the value term) is the one of a run that stores no state
// but the rollout's first (tbptt:16, the zero state) — under tbptt:4 and
// exact:4/8, whose windows start from stored states at steps 4, 8 and 12 or
// at 8. A half put back in the wrong rows would show in the KL (the policy's)
// or in the loss (the critic's).
TEST(Critic, PpoReplaysBothHalvesOfTheStoredStates) {
  for (const char* env : {"tmaze", "recall"})
    for (const char* cell : {"gru", "lstm"}) {
      SCOPED_TRACE(std::string(env) + ", " + cell);
      test::expect_first_ppo_iteration_replays_its_rollout([&](const char* history) {
        TrainConfig c = small(env, history, Algo::Ppo, 16);
        c.epochs = 1, c.minibatches = 1, c.entropy = 0, c.cell = cell;
        c.env_options.corridor = 4;  // (tmaze's episodes of 5 steps: a window's stored state is not one just reset to zero)
        return c;
      });
    }
}

// A run with its own critic resumes bit-identically from its checkpoint,
// which names the choice; a checkpoint without it (every run before the
// flag) is the shared core's, and a run of one kind refuses the other's
// parameters by name.
TEST(Critic, ResumesBitIdenticallyAndOldCheckpointsAreShared) {
  const fs::path dir = fs::temp_directory_path() / ("segtape_critic_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const auto& [algo, history] : {std::pair{Algo::Ppo, "tbptt:4"}, std::pair{Algo::Ppo, "exact:4/8"}, std::pair{Algo::A2c, "tbptt:4"}})
    for (const char* cell : {"gru", "lstm"}) {
      SCOPED_TRACE(std::string(algo == Algo::Ppo ? "ppo " : "a2c ") + history + ", " + cell);
      TrainConfig c = small("tmaze", history, algo, 16 * 4);
      c.cell = cell;
      EXPECT_EQ(test::expect_resumes_bit_identically(c, dir / "ck.safetensors", 32).critic, "separate");
      TrainConfig shared = c;
      shared.critic = "shared";
      Trainer other(shared);
      EXPECT_THROW(other.load(dir / "ck.safetensors"), CheckpointError);
    }
  TrainConfig shared = small("tmaze", "tbptt:4", Algo::A2c, 16);
  shared.critic = "shared";
  std::map<std::string, std::string> m = shared.to_metadata();
  EXPECT_EQ(m.count("critic"), 0u) << "a shared core's checkpoint is written as before the flag";
  EXPECT_EQ(TrainConfig::from_metadata(m).critic, "shared");
  m["critic"] = "both";
  EXPECT_THROW(TrainConfig::from_metadata(m), CheckpointError);
  fs::remove_all(dir);
}

// Where there is no value head or no GRU, --critic separate is refused,
// naming the flag.
TEST(Critic, IsRefusedWhereThereIsNoValueHeadOrNoGru) {
  auto refused = [](const TrainConfig& c) {
    try {
      Trainer t(c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(refused(small("tmaze", "window:4", Algo::A2c, 16)).find("--critic separate"), std::string::npos);
  EXPECT_NE(refused(small("recall", "tbptt:4", Algo::A2c, 16)).find("has no value head"), std::string::npos)
      << "a2c on a supervised env learns by cross-entropy";
  TrainConfig wrong = small("tmaze", "tbptt:4", Algo::A2c, 16);
  wrong.critic = "own";
  EXPECT_NE(refused(wrong).find("--critic 'own': choose shared or separate"), std::string::npos);
}
