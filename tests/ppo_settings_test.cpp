// What the reference implementations of PPO do, as segtape's choices
// (docs/agent.md, "Recurrent PPO"): the clip range's schedule, and a hidden
// layer before each head (SB3's net_arch).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "agent_util.h"
#include "segtape/agent/trainer.h"
#include "segtape/ops.h"
#include "util.h"

using namespace segtape;
using namespace segtape::agent;
using segtape::test::params_of;
namespace fs = std::filesystem;

namespace {

TrainConfig small_ppo(const std::string& clip_schedule, int64_t iterations) {
  TrainConfig c = test::small_config("tmaze", "tbptt:8", 16 * iterations);
  c.algo = Algo::Ppo;
  c.rollout = 16, c.epochs = 4, c.minibatches = 1;
  c.lr = 0.05;  // (large: the later epochs' ratios move well away from 1)
  c.lr_schedule = "constant";
  c.clip_range = 0.1;
  c.clip_schedule = clip_schedule;
  return c;
}

}  // namespace

// --clip-schedule linear is SB3's lin_ schedule: clip_range x (1 - step /
// steps), set at each iteration's start. Over two iterations of a run of
// two, the first (step 0) is the constant schedule's bit for bit; the second
// starts from the same parameters and rollout, so its first epoch is the
// same too, and its later epochs meet the same ratios with half the clip
// range (0.05 for 0.1): they clip more terms, and the run ends elsewhere.
TEST(PpoSettings, TheLinearClipScheduleHalvesTheRangeHalfwayThrough) {
  Trainer constant(small_ppo("constant", 2)), linear(small_ppo("linear", 2));
  const test::PpoIteration c1 = test::ppo_iteration(constant), l1 = test::ppo_iteration(linear);
  EXPECT_EQ(c1.loss_sum, l1.loss_sum);
  EXPECT_EQ(c1.clip_fraction, l1.clip_fraction);
  EXPECT_GT(c1.clip_fraction, 0) << "the ratios must reach the clip range for the test to tell the two apart";
  EXPECT_EQ(params_of(constant), params_of(linear));
  const test::PpoIteration c2 = test::ppo_iteration(constant), l2 = test::ppo_iteration(linear);
  EXPECT_GT(l2.clip_fraction, c2.clip_fraction);
  EXPECT_NE(params_of(constant), params_of(linear));
  // The constant schedule's second iteration at half the clip range (resumed
  // from its first iteration's checkpoint with --clip-range 0.05) is the
  // linear one's, bit for bit.
  const fs::path dir = fs::temp_directory_path() / ("segtape_clip_half_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  Trainer wide(small_ppo("constant", 2));
  test::ppo_iteration(wide);
  wide.save(dir / "ck.safetensors");
  TrainConfig half = small_ppo("constant", 2);
  half.clip_range = 0.05;
  Trainer narrow(half);
  narrow.load(dir / "ck.safetensors");
  const test::PpoIteration n2 = test::ppo_iteration(narrow);
  EXPECT_EQ(n2.clip_fraction, l2.clip_fraction);
  EXPECT_EQ(n2.loss_sum, l2.loss_sum);
  EXPECT_EQ(params_of(narrow), params_of(linear));
  fs::remove_all(dir);
}

// The schedule is kept in the checkpoint (written only when linear: a
// constant run's checkpoint is as before the flag, and one without it is
// constant), a resumed run continues bit for bit, a checkpoint of the other
// schedule is refused naming the flag, and another word is refused.
TEST(PpoSettings, TheClipScheduleIsCheckpointedAndChecked) {
  const fs::path dir = fs::temp_directory_path() / ("segtape_clip_schedule_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  EXPECT_EQ(test::expect_resumes_bit_identically(small_ppo("linear", 4), dir / "ck.safetensors", 32).clip_schedule, "linear");
  Trainer other(small_ppo("constant", 4));
  EXPECT_NE(test::message_of<CheckpointError>([&] { other.load(dir / "ck.safetensors"); }).find("--clip-schedule"),
            std::string::npos);
  std::map<std::string, std::string> m = small_ppo("constant", 4).to_metadata();
  EXPECT_EQ(m.count("clip_schedule"), 0u) << "a constant schedule's checkpoint is written as before the flag";
  EXPECT_EQ(TrainConfig::from_metadata(m).clip_schedule, "constant");
  m["clip_schedule"] = "cosine";
  EXPECT_THROW(TrainConfig::from_metadata(m), CheckpointError);
  TrainConfig wrong = small_ppo("cosine", 1);
  EXPECT_NE(test::message_of<Error>([&] { Trainer t(wrong); }).find("--clip-schedule 'cosine': choose linear or constant"),
            std::string::npos);
  fs::remove_all(dir);
}

// --value-clip c: the value loss is the larger of (v - R)^2 and the clipped
// value's (v_old + clamp(v - v_old, +-c) - R)^2. A clip too wide to bind
// changes nothing, bit for bit; a clip of 1e-6 binds from each iteration's
// second epoch on (the first replays the rollout: v = v_old) and the run
// ends elsewhere; it is kept in the checkpoint only when on, resumes bit for
// bit, and a negative clip is refused.
TEST(PpoSettings, ValueClipBindsOnlyWhereTheValueMovedPastIt) {
  const auto with_clip = [](double clip) {
    TrainConfig c = small_ppo("constant", 2);
    c.value_clip = clip;
    return c;
  };
  Trainer off(with_clip(0)), wide(with_clip(1e29)), tight(with_clip(1e-6));
  for (int i = 0; i < 2; ++i) {
    const test::PpoIteration o = test::ppo_iteration(off), w = test::ppo_iteration(wide), t = test::ppo_iteration(tight);
    EXPECT_EQ(o.loss_sum, w.loss_sum);
    EXPECT_NE(o.loss_sum, t.loss_sum);
  }
  EXPECT_EQ(params_of(off), params_of(wide));
  EXPECT_NE(params_of(off), params_of(tight));
  // One epoch: every value is its rollout value, and the clip cannot bind.
  TrainConfig one_epoch = with_clip(1e-6), unclipped = with_clip(0);
  one_epoch.epochs = unclipped.epochs = 1;
  Trainer a(one_epoch), b(unclipped);
  test::ppo_iteration(a), test::ppo_iteration(b);
  EXPECT_EQ(params_of(a), params_of(b));

  std::map<std::string, std::string> m = with_clip(0).to_metadata();
  EXPECT_EQ(m.count("value_clip"), 0u) << "an unclipped run's checkpoint is written as before the flag";
  const fs::path dir = fs::temp_directory_path() / ("segtape_value_clip_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  TrainConfig four = with_clip(0.05);
  four.steps = 64;
  EXPECT_EQ(test::expect_resumes_bit_identically(four, dir / "ck.safetensors", 32).value_clip, 0.05);
  fs::remove_all(dir);
  m["value_clip"] = "-1";
  EXPECT_THROW(TrainConfig::from_metadata(m), CheckpointError);
  EXPECT_NE(test::message_of<Error>([&] { Trainer t(with_clip(-1)); }).find("--value-clip must be in [0, 1e30)"), std::string::npos);
}

// --ortho-init (SB3's ortho_init): the encoder and the heads' hidden layers
// orthogonal with gain sqrt(2), the action head 0.01, the value head 1
// (W W^T or W^T W, the smaller side, is gain^2 I), every bias of theirs 0;
// the recurrent cell is PyTorch's, the same draws as without it. Kept in
// the checkpoint only when on; a language model refuses it.
TEST(PpoSettings, OrthoInitDrawsTheLinearLayersOutsideTheCoreOrthogonal) {
  auto env = make_env("dialogue", 3, 1, EnvOptions{});  // (vector observations: a linear encoder)
  ASSERT_GT(env->spec().obs_dim, 0);
  const EnvSpec& spec = env->spec();
  PolicyShape shape{6, 10, 0, true};
  shape.head_hidden = 7;
  Tape tape;
  nn::Rng r1(3), r2(3);
  const Policy plain(tape, r1, spec, shape);
  shape.ortho_init = true;
  const Policy ortho(tape, r2, spec, shape);
  std::map<std::string, Tensor> a, b;
  for (const auto& [name, t] : plain.named_parameters()) a[name] = t;
  for (const auto& [name, t] : ortho.named_parameters()) b[name] = t;
  for (const char* cell : {"gru.weight_ih", "gru.weight_hh", "gru.bias_ih", "gru.bias_hh"})
    EXPECT_EQ(a.at(cell).to_host<float>(), b.at(cell).to_host<float>()) << cell;
  for (const auto& [layer, gain] : std::vector<std::pair<std::string, double>>{
           {"encoder", std::sqrt(2.0)}, {"pi", std::sqrt(2.0)}, {"vf", std::sqrt(2.0)}, {"head", 0.01}, {"value", 1.0}}) {
    SCOPED_TRACE(layer);
    const Tensor& w = b.at(layer + ".weight");
    const int64_t rows = w.dim(0), cols = w.dim(1), m = std::min(rows, cols);
    const std::vector<float> v = w.to_host<float>();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j) {  // the smaller side's Gram matrix
        double dot = 0;
        for (int64_t k = 0; k < std::max(rows, cols); ++k)
          dot += rows <= cols ? double(v[size_t(i * cols + k)]) * v[size_t(j * cols + k)]
                              : double(v[size_t(k * cols + i)]) * v[size_t(k * cols + j)];
        EXPECT_NEAR(dot, i == j ? gain * gain : 0.0, 1e-5 * gain * gain) << i << ", " << j;
      }
    EXPECT_NE(v, a.at(layer + ".weight").to_host<float>());
    for (const float x : b.at(layer + ".bias").to_host<float>()) EXPECT_EQ(x, 0.0f);
  }
  TrainConfig c = small_ppo("constant", 1);
  EXPECT_EQ(c.to_metadata().count("ortho_init"), 0u) << "a run without it writes its checkpoint as before the flag";
  c.ortho_init = true;
  std::map<std::string, std::string> m = c.to_metadata();
  EXPECT_TRUE(TrainConfig::from_metadata(m).ortho_init);
  m["ortho_init"] = "2";
  EXPECT_THROW(TrainConfig::from_metadata(m), CheckpointError);
  c.algo = Algo::Lm;
  EXPECT_NE(test::message_of<Error>([&] { c.validate(); }).find("--ortho-init is the agents'"), std::string::npos);
}

// --head-hidden N: Linear(hidden, N) + ReLU ("pi") before the action head and
// one ("vf") before the value head, which read N units: the logits and the
// value are those layers composed by hand, the critic's rows feeding "vf"
// where it has its own GRU.
TEST(PpoSettings, HiddenLayersBeforeTheHeadsAreLinearThenRelu) {
  auto env = make_env("tmaze", 3, 1, EnvOptions{});
  const EnvSpec& spec = env->spec();
  for (const bool separate : {false, true}) {
    SCOPED_TRACE(separate ? "separate critic" : "shared core");
    PolicyShape shape{6, 10, 0, true};
    shape.head_hidden = 7, shape.separate_critic = separate;
    Tape tape;
    nn::Rng rng(2);
    const Policy p(tape, rng, spec, shape);
    std::map<std::string, Tensor> w;
    for (const auto& [name, t] : p.named_parameters()) w[name] = t;
    EXPECT_EQ(w.at("pi.weight").shape, (Shape{7, 10}));
    EXPECT_EQ(w.at("vf.weight").shape, (Shape{7, 10}));
    EXPECT_EQ(w.at("head.weight").shape, (Shape{spec.num_actions, 7}));
    EXPECT_EQ(w.at("value.weight").shape, (Shape{1, 7}));
    Segment seg = tape.segment();
    const std::vector<int64_t> tokens{0, 1, 2};
    Tensor h = tape.zeros({shape.state_rows() * 3, 10});
    for (int t = 0; t < 2; ++t) h = p.recur(p.encode(tape.from(std::span<const int64_t>(tokens), {3})), h);
    const Tensor f = p.output(h);
    const Tensor mine = separate ? slice(f, 0, 0, 3) : f, critics = separate ? slice(f, 0, 3, 3) : f;
    auto layer = [&](const Tensor& x, const std::string& name) {
      return add(matmul(x, w.at(name + ".weight"), false, true), w.at(name + ".bias"));
    };
    const std::vector<float> logits = p.logits(f).to_host<float>(), value = p.value(f).to_host<float>();
    const std::vector<float> want_logits = layer(relu(layer(mine, "pi")), "head").to_host<float>();
    const std::vector<float> want_value = layer(relu(layer(critics, "vf")), "value").to_host<float>();
    ASSERT_EQ(logits.size(), want_logits.size());
    for (size_t i = 0; i < logits.size(); ++i) EXPECT_FLOAT_EQ(logits[i], want_logits[i]) << i;
    ASSERT_EQ(value.size(), want_value.size());
    for (size_t i = 0; i < value.size(); ++i) EXPECT_FLOAT_EQ(value[i], want_value[i]) << i;
  }
}

// The layers are kept in the checkpoint (the size written only where > 0:
// a checkpoint without it has none), a resumed run continues bit for bit, a
// run without them refuses the checkpoint naming the flag, and a tied head
// or a negative size is refused.
TEST(PpoSettings, HeadHiddenIsCheckpointedAndChecked) {
  const fs::path dir = fs::temp_directory_path() / ("segtape_head_hidden_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  TrainConfig c = small_ppo("constant", 4);
  c.head_hidden = 5;
  EXPECT_EQ(test::expect_resumes_bit_identically(c, dir / "ck.safetensors", 32).head_hidden, 5);
  Trainer plain(small_ppo("constant", 4));
  EXPECT_NE(test::message_of<CheckpointError>([&] { plain.load(dir / "ck.safetensors"); }).find("--head-hidden"),
            std::string::npos);
  std::map<std::string, std::string> m = small_ppo("constant", 4).to_metadata();
  EXPECT_EQ(m.count("head_hidden"), 0u);
  EXPECT_EQ(TrainConfig::from_metadata(m).head_hidden, 0);
  m["head_hidden"] = "-3";
  EXPECT_THROW(TrainConfig::from_metadata(m), CheckpointError);
  TrainConfig negative = small_ppo("constant", 1);
  negative.head_hidden = -1;
  EXPECT_NE(test::message_of<Error>([&] { Trainer t(negative); }).find("--head-hidden must be in [0, 16384]"), std::string::npos);
  fs::remove_all(dir);
}

// --cell lstm for RL: the agent's one-layer LSTM ("rnn", PyTorch's names),
// its state each stream's h rows then c rows, [2 B, hidden]; the heads read
// h. PPO's minibatches replay their windows from both halves of the stored
// states: with one epoch of one minibatch the first iteration's replay is
// its rollout again (every ratio 1) and its loss that of a run that stores
// no state but the first (tbptt:16), under tbptt:4 and exact:4/8. A2C and
// PPO resume bit for bit; the checkpoint names the cell (a GRU run's, as
// before, does not); a history without a recurrent core is refused naming
// the flags (a separate critic with an LSTM: critic_test).
TEST(PpoSettings, AnLstmCoreReplaysAndResumesExactly) {
  auto lstm = [](const char* history, Algo algo) {
    TrainConfig c = small_ppo("constant", 1);
    c.algo = algo, c.history = History::parse(history), c.cell = "lstm", c.env_options.corridor = 4;
    c.epochs = 1, c.minibatches = 1, c.entropy = 0, c.lr = 3e-3;
    return c;
  };
  test::expect_first_ppo_iteration_replays_its_rollout([&](const char* history) { return lstm(history, Algo::Ppo); });
  Trainer probe(lstm("tbptt:4", Algo::Ppo));
  std::map<std::string, Shape> shapes;
  for (const auto& [name, t] : probe.policy().named_parameters()) shapes[name] = t.shape;
  EXPECT_EQ(shapes.at("rnn.weight_ih_l0"), (Shape{4 * 16, 8}));
  EXPECT_EQ(shapes.count("gru.weight_ih"), 0u);
  const fs::path dir = fs::temp_directory_path() / ("segtape_rl_lstm_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const auto& [algo, history] : {std::pair{Algo::Ppo, "exact:4/8"}, std::pair{Algo::A2c, "tbptt:4"}}) {
    SCOPED_TRACE(history);
    TrainConfig c = lstm(history, algo);
    c.steps = 64;
    EXPECT_EQ(test::expect_resumes_bit_identically(c, dir / "ck.safetensors", 32).cell, "lstm");
  }
  EXPECT_EQ(small_ppo("constant", 1).to_metadata().count("cell"), 0u) << "a GRU run's checkpoint is written as before";
  TrainConfig window = lstm("window:4", Algo::A2c);
  EXPECT_NE(test::message_of<Error>([&] { Trainer t(window); }).find("--cell lstm recurs"), std::string::npos);
  fs::remove_all(dir);
}

// --adam-eps reaches Adam: Adam's first step moves each parameter by
// lr g / (|g| + eps) (m and v bias-corrected are g and g^2), so from the
// step taken with eps 0.5 the gradient's size is read back (|g| = 0.5 d /
// (lr - d)) and the step with eps 1 predicted from it. The same gradient (same
// initial parameters, same segment) feeds all three runs; the default
// (1e-8) moves each parameter by about lr. The eps is kept in checkpoints
// only where it is not 1e-8, a resumed run continues bit for bit, and
// another eps, or one with --optim sgd, is refused naming the flag.
TEST(PpoSettings, AdamEpsIsAdamsAndCheckpointed) {
  auto a2c = [](double eps) {
    TrainConfig c = test::small_config("tmaze", "tbptt:8", 64);
    c.lr = 0.01;
    c.adam_eps = eps;
    return c;
  };
  Trainer t0(a2c(1e-8)), t1(a2c(0.5)), t3(a2c(1.0));
  const std::vector<float> p0 = params_of(t0);
  ASSERT_EQ(p0, params_of(t1));
  t0.run_segment(), t1.run_segment(), t3.run_segment();
  const std::vector<float> a0 = params_of(t0), a1 = params_of(t1), a3 = params_of(t3);
  int checked = 0;
  for (size_t i = 0; i < p0.size(); ++i) {
    const double d1 = double(a1[i]) - p0[i], d3 = double(a3[i]) - p0[i];
    if (std::abs(d1) < 1e-4) continue;  // (a gradient too small to read back through float32's rounding)
    const double g = 0.5 * std::abs(d1) / (0.01 - std::abs(d1));
    EXPECT_NEAR(d3, 0.01 * std::copysign(g, d1) / (g + 1.0), 2e-6) << i;
    EXPECT_NEAR(std::abs(double(a0[i]) - p0[i]), 0.01, 2e-5) << i;
    ++checked;
  }
  EXPECT_GT(checked, 20);
  const fs::path dir = fs::temp_directory_path() / ("segtape_adam_eps_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  TrainConfig c = small_ppo("constant", 4);
  c.adam_eps = 1e-5;
  EXPECT_EQ(test::expect_resumes_bit_identically(c, dir / "ck.safetensors", 32).adam_eps, 1e-5);
  Trainer plain(small_ppo("constant", 4));
  EXPECT_NE(test::message_of<CheckpointError>([&] { plain.load(dir / "ck.safetensors"); }).find("--adam-eps"), std::string::npos);
  std::map<std::string, std::string> m = small_ppo("constant", 4).to_metadata();
  EXPECT_EQ(m.count("adam_eps"), 0u) << "the default's checkpoint is written as before the flag";
  EXPECT_EQ(TrainConfig::from_metadata(m).adam_eps, 1e-8);
  m["adam_eps"] = "0";
  EXPECT_THROW(TrainConfig::from_metadata(m), CheckpointError);
  TrainConfig sgd = a2c(1e-5);
  sgd.optim = "sgd";
  EXPECT_NE(test::message_of<Error>([&] { Trainer t(sgd); }).find("--adam-eps is Adam's and AdamW's"), std::string::npos);
  fs::remove_all(dir);
}

// --encoder none: a vector observation goes into the GRU as it is (SB3's
// Flatten features extractor): no "encoder" parameters, the cells read
// obs_dim inputs (the critic's too), encode() is the observation itself,
// and a step's state is the GRU cell of the observation by hand; the same
// with an LSTM and an LSTM critic (sb3-contrib's RecurrentPPO's whole
// architecture with --head-hidden). A run resumes bit for bit; the
// checkpoint names the encoder (a linear one's, as before, does not); token
// envs and histories without a recurrent core are refused naming the flag.
TEST(PpoSettings, NoEncoderFeedsTheObservationToTheCell) {
  auto env = make_env("dialogue", 3, 1, EnvOptions{});
  const EnvSpec& spec = env->spec();
  ASSERT_GT(spec.obs_dim, 0);
  PolicyShape shape{spec.obs_dim, 10, 0, true};
  shape.raw_obs = true, shape.separate_critic = true;
  Tape tape;
  nn::Rng rng(2);
  const Policy p(tape, rng, spec, shape);
  std::map<std::string, Tensor> w;
  for (const auto& [name, t] : p.named_parameters()) w[name] = t;
  EXPECT_EQ(w.count("encoder.weight"), 0u);
  EXPECT_EQ(w.at("gru.weight_ih").shape, (Shape{30, spec.obs_dim}));
  EXPECT_EQ(w.at("critic.weight_ih").shape, (Shape{30, spec.obs_dim}));
  EXPECT_EQ(p.parameter_count(), Policy::parameters_for(spec, shape));
  EXPECT_EQ(test::largest_parameter(p), Policy::largest_parameter_for(spec, shape));
  Segment seg = tape.segment();
  std::vector<float> obs(size_t(3 * spec.obs_dim));
  for (size_t i = 0; i < obs.size(); ++i) obs[i] = float(i % 7) * 0.1f - 0.3f;
  const Tensor x = tape.from(std::span<const float>(obs), {3, spec.obs_dim});
  EXPECT_EQ(p.encode(x).to_host<float>(), obs);
  const Tensor h = tape.zeros({6, 10});
  const std::vector<float> got = p.recur(p.encode(x), h).to_host<float>();
  const std::vector<float> want =
      gru_cell(x, tape.zeros({3, 10}), w.at("gru.weight_ih"), w.at("gru.weight_hh"), w.at("gru.bias_ih"), w.at("gru.bias_hh")).to_host<float>();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << i;
  {
    PolicyShape ls = shape;
    ls.lstm = true, ls.head_hidden = 5;
    const Policy q(tape, rng, spec, ls);
    std::map<std::string, Tensor> v;
    for (const auto& [name, t] : q.named_parameters()) v[name] = t;
    EXPECT_EQ(v.count("encoder.weight"), 0u);
    EXPECT_EQ(v.at("rnn.weight_ih_l0").shape, (Shape{40, spec.obs_dim}));
    EXPECT_EQ(v.at("critic.weight_ih").shape, (Shape{40, spec.obs_dim}));
    EXPECT_EQ(q.parameter_count(), Policy::parameters_for(spec, ls));
    const Tensor s = q.recur(q.encode(x), tape.zeros({12, 10}));
    const std::vector<float> mine = slice(s, 0, 0, 6).to_host<float>(), theirs = slice(s, 0, 6, 6).to_host<float>();
    const auto by_hand = [&](const std::string& cell, const std::string& suffix) {  // one lstm_cell step from zeros
      return lstm_cell(x, tape.zeros({2, 3, 10}), v.at(cell + "weight_ih" + suffix), v.at(cell + "weight_hh" + suffix),
                       v.at(cell + "bias_ih" + suffix), v.at(cell + "bias_hh" + suffix))
          .to_host<float>();
    };
    const std::vector<float> want_mine = by_hand("rnn.", "_l0"), want_theirs = by_hand("critic.", "");
    for (size_t i = 0; i < want_mine.size(); ++i) EXPECT_FLOAT_EQ(mine[i], want_mine[i]) << "the policy's LSTM, " << i;
    for (size_t i = 0; i < want_theirs.size(); ++i) EXPECT_FLOAT_EQ(theirs[i], want_theirs[i]) << "the critic's LSTM, " << i;
  }

  const fs::path dir = fs::temp_directory_path() / ("segtape_encoder_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  TrainConfig c = test::small_config("dialogue", "tbptt:8", 64);
  c.algo = Algo::Ppo, c.rollout = 8, c.epochs = 2, c.minibatches = 2;
  c.encoder = "none", c.critic = "separate";
  EXPECT_EQ(test::expect_resumes_bit_identically(c, dir / "ck.safetensors", 32).encoder, "none");
  TrainConfig sb3 = c;  // sb3-contrib's architecture: the observation into an LSTM, an LSTM critic, a layer before each head
  sb3.cell = "lstm", sb3.head_hidden = 8;
  EXPECT_EQ(test::expect_resumes_bit_identically(sb3, dir / "ck.safetensors", 32).cell, "lstm");
  TrainConfig linear = c;
  linear.encoder = "linear";
  Trainer other(linear);
  EXPECT_NE(test::message_of<CheckpointError>([&] { other.load(dir / "ck.safetensors"); }).find("--encoder"), std::string::npos);
  EXPECT_EQ(linear.to_metadata().count("encoder"), 0u);
  TrainConfig tokens = small_ppo("constant", 1);
  tokens.encoder = "none";
  EXPECT_NE(test::message_of<Error>([&] { Trainer t(tokens); }).find("--encoder none feeds vector observations"), std::string::npos);
  TrainConfig window = c;
  window.history = History::parse("window:4");
  EXPECT_NE(test::message_of<Error>([&] { Trainer t(window); }).find("--encoder none feeds the observations to the agent's recurrent cell"),
            std::string::npos);
  fs::remove_all(dir);
}
