// Data parallelism over MPI (docs/distributed.md), run as two ranks:
// `mpirun -np 2 dist_test` (tests/dist.cmake). Every test runs on both ranks;
// a failure on either fails the job.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "agent_util.h"
#include "segtape/agent/trainer.h"
#include "segtape/nn/dist.h"
#include "segtape/nn/layers.h"
#include "segtape/nn/safetensors.h"
#include "segtape/ops.h"

using namespace segtape;
using namespace segtape::agent;
using segtape::test::params_of;
namespace fs = std::filesystem;

namespace {

dist::Communicator& comm() {
  static std::unique_ptr<dist::Communicator> c = dist::mpi({.timeout_s = 60});
  return *c;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), n += double(b[i]) * b[i];
  return std::sqrt(d / n);
}

TrainConfig small(int64_t batch) {
  TrainConfig c;
  c.env = "recall";
  c.env_options.lag = 4;
  c.history = History::parse("tbptt:8");
  c.batch = batch;
  c.hidden = 32;
  c.embed = 8;
  c.steps = 400;  // 50 segments
  return c;
}

// A directory both ranks name alike (one machine here): rank 0's, shared.
fs::path shared_dir(const std::string& name) {
  std::string path;
  if (comm().rank() == 0) {
    path = (fs::temp_directory_path() / ("segtape-dist-" + name + "-" + std::to_string(::getpid()))).string();
    fs::create_directories(path);
  }
  return fs::path(comm().allgather(path, "test dir")[0]);
}

}  // namespace

TEST(Dist, RunsAsTwoRanks) {
  ASSERT_EQ(comm().size(), 2) << "run me with mpirun -np 2";
  EXPECT_EQ(comm().backend(), "mpi");
}

// One in-place all-reduce of the gradient of a linear layer over the two
// ranks' halves of a batch equals the gradient of one process over the whole
// batch: float reassociation only.
TEST(Dist, AveragedGradientsEqualTheWholeBatchGradient) {
  const int r = comm().rank();
  const int64_t B = 6, In = 40, Out = 30;
  auto data = [&](int64_t rows, int64_t first, std::vector<float>& x, std::vector<float>& y) {
    x.resize(size_t(rows * In)), y.resize(size_t(rows * Out));
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < In; ++j) x[size_t(i * In + j)] = std::sin(0.37f * float((first + i) * In + j));
      for (int64_t j = 0; j < Out; ++j) y[size_t(i * Out + j)] = std::cos(0.11f * float((first + i) * Out + j));
    }
  };
  auto grads = [&](int64_t rows, int64_t first, bool averaged) {
    Tape tape;
    nn::Rng rng(5);
    nn::Linear lin(tape, rng, In, Out);
    std::unique_ptr<dist::GradientAverager> avg;
    // 256-byte buckets: the weight (4800 bytes) is reduced in its own buffer, the bias packed
    if (averaged) avg = std::make_unique<dist::GradientAverager>(comm(), lin, 256);
    std::vector<float> x, y;
    data(rows, first, x, y);
    {
      Segment seg = tape.segment();
      Tensor out = lin(tape.from(std::span<const float>(x), {rows, In}));
      seg.backward(mse_loss(out, tape.from(std::span<const float>(y), {rows, Out})));
    }
    if (avg) {
      avg->average();
      EXPECT_EQ(avg->stats().collectives, 2);
    }
    std::vector<float> g;
    for (const Tensor& p : lin.parameters()) {
      const std::vector<float> v = p.grad_tensor().to_host<float>();
      g.insert(g.end(), v.begin(), v.end());
    }
    return g;
  };
  const std::vector<float> mine = grads(B, r * B, true), whole = grads(2 * B, 0, false);
  ASSERT_EQ(mine.size(), whole.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < mine.size(); ++i) worst = std::max(worst, std::abs(double(mine[i]) - whole[i])), scale = std::max(scale, std::abs(double(whole[i])));
  EXPECT_LE(worst, 1e-6 * scale) << "largest difference " << worst << " of largest gradient " << scale;
  if (r == 0) std::printf("averaged gradient vs whole batch: largest difference %.3g of the largest gradient\n", worst / scale);
  // and both ranks hold the same bits
  const auto all = comm().allgather(std::string(reinterpret_cast<const char*>(mine.data()), mine.size() * 4), "grads");
  EXPECT_EQ(all[0], all[1]);
}

// Where the reduction order is fixed, the averaging adds no rounding of its
// own: an f64 model's gradient averaged over two ranks (each with half the
// batch) is bit for bit (g0 + g1) / 2 computed in one process, g0 and g1 the
// two halves' gradients. (With two ranks the all-reduce's sum is g0 + g1 on
// both; the scaling by 1/2 is exact.)
TEST(Dist, Float64GradientsAverageBitwiseAsTheFixedOrderSum) {
  const int64_t rows = 3, In = 7, Out = 5;
  auto grads = [&](int half, dist::Communicator* c) {
    Tape tape;
    nn::Rng rng(11);
    nn::Linear lin(tape, rng, In, Out, true, DType::F64);
    std::unique_ptr<dist::GradientAverager> avg;
    if (c) avg = std::make_unique<dist::GradientAverager>(*c, lin);
    std::vector<double> x(size_t(rows * In)), y(size_t(rows * Out));
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.9 * double(half * 100 + int(i)));
    for (size_t i = 0; i < y.size(); ++i) y[i] = std::cos(0.4 * double(half * 100 + int(i)));
    {
      Segment seg = tape.segment();
      seg.backward(mse_loss(lin(tape.from(std::span<const double>(x), {rows, In})), tape.from(std::span<const double>(y), {rows, Out})));
    }
    if (avg) avg->average();
    std::vector<double> g;
    for (const Tensor& p : lin.parameters()) {
      const std::vector<double> v = p.grad_tensor().to_host<double>();
      g.insert(g.end(), v.begin(), v.end());
    }
    return g;
  };
  const std::vector<double> averaged = grads(comm().rank(), &comm());
  const std::vector<double> g0 = grads(0, nullptr), g1 = grads(1, nullptr);
  std::vector<double> fixed_order(g0.size());
  for (size_t i = 0; i < g0.size(); ++i) fixed_order[i] = (g0[i] + g1[i]) * 0.5;
  EXPECT_EQ(averaged, fixed_order);
  EXPECT_NE(g0, g1);
}

// The trainer: two ranks of B streams against one process of 2B streams
// made as two shards with the ranks' seeds. After 50 segments (50 Adam
// updates) the parameters differ by float reassociation only, measured as
// the relative L2 distance (elementwise, Adam turns the ~1e-7 relative
// gradient differences of near-zero gradients, |g| ~ eps, into larger ones).
TEST(Dist, FiftySegmentsEqualOneProcessWithTwiceTheStreams) {
  Trainer two(small(4), &comm());
  for (int i = 0; i < 50; ++i) two.run_segment();
  ASSERT_TRUE(two.done());
  EXPECT_NO_THROW(dist::check_replicas(comm(), two.policy(), "after 50 segments"));
  TrainConfig one_c = small(8);
  one_c.env_shards = 2;
  Trainer one(one_c);
  for (int i = 0; i < 50; ++i) one.run_segment();
  const double d = rel_l2(params_of(two), params_of(one));
  if (comm().rank() == 0) std::printf("2 ranks x 4 streams vs 1 process x 8: relative L2 distance %.3g after 50 updates\n", d);
  EXPECT_LE(d, 1e-6);
  EXPECT_GT(d, 0.0) << "bitwise equal: the test would not see reassociation (are the ranks' gradients averaged?)";
  // the streams really are the shards: a single process seeded otherwise differs by far more
  Trainer other(small(8));
  for (int i = 0; i < 50; ++i) other.run_segment();
  EXPECT_GT(rel_l2(params_of(two), params_of(other)), 1e-3);
  ASSERT_NE(two.dist_stats(), nullptr);
  EXPECT_EQ(two.dist_stats()->calls, 50);
}

TEST(Dist, DifferentConfigurationsAreRefusedNamingTheSetting) {
  TrainConfig c = small(4);
  if (comm().rank() == 1) c.hidden = 24;
  try {
    Trainer t(c, &comm());
    FAIL() << "a configuration that differs between ranks was accepted";
  } catch (const dist::CollectiveError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("hidden is '32' on rank 0, but rank 1 has '24'"), std::string::npos) << m;
  }
}

// The ranks' models must match before the broadcast and the all-reduces pair
// their buffers (a larger model on one rank made MPI write past the other's:
// heap corruption); and settings holding any bytes, a NUL included, compare
// exactly (a NUL in a differing value made the comparison loop forever).
TEST(Dist, ModelsOrBucketsThatDifferAreRefusedBeforeAnyCollectiveOnThem) {
  const int r = comm().rank();
  auto message = [&](int64_t out, size_t bucket) {
    Tape tape;
    nn::Rng rng(5);
    nn::Linear lin(tape, rng, 6, out);
    try {
      dist::GradientAverager avg(comm(), lin, bucket);
      return std::string();
    } catch (const dist::CollectiveError& e) {
      return std::string(e.what());
    }
  };
  std::string m = message(r == 0 ? 3 : 300000, 1 << 20);
  EXPECT_NE(m.find("the model (dist::GradientAverager's parameters) differs between ranks: parameter 00000 is 'f32[3,6]' on rank 0, "
                   "but rank 1 has 'f32[300000,6]'"),
            std::string::npos)
      << m;
  m = message(3, r == 0 ? 256 : 512);
  EXPECT_NE(m.find("bucket_bytes is '256' on rank 0, but rank 1 has '512'"), std::string::npos) << m;
  EXPECT_EQ(message(3, 256), "");
  // A model one rank refuses on its own (here its bucket size) is every
  // rank's error, named with that rank, not a wait in the comparison.
  m = message(3, r == 1 ? 2 : 256);
  EXPECT_NE(m.find("(rank 1) dist::GradientAverager: bucket_bytes must be >= 4"), std::string::npos) << m;

  for (const auto& [mine, other] : {std::pair<std::map<std::string, std::string>, std::map<std::string, std::string>>{
                                        {{"a", std::string("x\0y", 3)}}, {{"a", "x"}}},
                                    {{{"a", std::string("b\0c\0d", 5)}}, {{"a", "b"}, {"c", "d"}}}}) {
    try {
      dist::check_same(comm(), r == 0 ? mine : other, "the test's settings");
      ADD_FAILURE() << "settings that differ were accepted";
    } catch (const dist::CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find("the test's settings differs between ranks"), std::string::npos) << e.what();
    }
  }
  dist::check_same(comm(), {{"a", std::string("x\0y", 3)}}, "equal settings with a NUL");
}

TEST(Dist, ReplicasThatDivergeAreFound) {
  Trainer t(small(4), &comm());
  t.run_segment();
  EXPECT_NO_THROW(dist::check_replicas(comm(), t.policy(), "after update 1"));
  if (comm().rank() == 1) {
    Tensor w = t.policy().parameters()[0];
    std::vector<float> v = w.to_host<float>();
    v[3] += 1e-6f;
    w.from_host(std::span<const float>(v));
  }
  try {
    dist::check_replicas(comm(), t.policy(), "after update 1");
    FAIL() << "diverged replicas went unnoticed";
  } catch (const dist::CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1 do not hold rank 0's values"), std::string::npos) << e.what();
  }
}

// (PPO: an iteration is many updates; the request rides the first, and
// stays agreed through the rest.)
TEST(Dist, AStopRequestedByOneRankIsAgreedByAll) {
  for (const char* algo : {"a2c", "ppo"}) {
    TrainConfig c = small(4);
    if (std::string(algo) == "ppo") c.env = "tmaze", c.algo = Algo::Ppo, c.rollout = 16, c.epochs = 2, c.minibatches = 2;
    Trainer t(c, &comm());
    t.run_segment();
    EXPECT_FALSE(t.stop_agreed()) << algo;
    EXPECT_EQ(t.stop_reason(), 0) << algo;
    if (comm().rank() == 1) t.request_stop();
    t.run_segment();
    EXPECT_TRUE(t.stop_agreed()) << algo;
    EXPECT_EQ(t.stop_reason(), 1) << algo;  // rank 1's reason, on rank 0 too
  }
}

// Why the ranks stop travels with the request: SIGINT to rank 1 alone is
// SIGINT on rank 0 too (the program's reason 1; it was recorded as SIGTERM);
// where ranks give different reasons, 1 is agreed wherever any rank gave it.
TEST(Dist, TheReasonForAStopIsAgreedByAll) {
  for (const auto& [r0, r1, agreed] : {std::tuple{0, 1, 1}, {0, 2, 2}, {2, 1, 1}, {2, 2, 2}, {1, 2, 1}}) {
    SCOPED_TRACE("rank 0 " + std::to_string(r0) + ", rank 1 " + std::to_string(r1));
    Trainer t(small(4), &comm());
    const int mine = comm().rank() == 0 ? r0 : r1;
    if (mine) t.request_stop(mine);
    t.run_segment();
    EXPECT_TRUE(t.stop_agreed());
    EXPECT_EQ(t.stop_reason(), agreed);
    t.run_segment();  // (stays agreed)
    EXPECT_EQ(t.stop_reason(), agreed);
  }
  Trainer t(small(4), &comm());
  EXPECT_THROW(t.request_stop(3), Error);
}

// Segments in which no stream has a target (recall's first `lag` steps):
// every rank still joins the update's all-reduce, and none steps, as one
// process does not; the ranks stay in step with one process of both ranks' streams.
TEST(Dist, SegmentsWithoutTargetsKeepTheRanksInStep) {
  TrainConfig c = small(4);
  c.env_options.lag = 8;
  c.history = History::parse("tbptt:4");
  c.steps = 40;
  Trainer two(c, &comm());
  while (!two.done()) two.run_segment();
  EXPECT_EQ(two.dist_stats()->calls, 10);
  TrainConfig one_c = c;
  one_c.batch = 8, one_c.env_shards = 2;
  Trainer one(one_c);
  while (!one.done()) one.run_segment();
  EXPECT_LE(rel_l2(params_of(two), params_of(one)), 1e-6);
  EXPECT_NO_THROW(dist::check_replicas(comm(), two.policy(), "after 10 segments"));
}

// A checkpoint holds every rank's streams: a resumed pair of ranks ends
// bit-identical to one that never stopped; a checkpoint of another rank count
// is refused on every rank, naming the counts.
TEST(Dist, ResumeIsBitIdenticalAndChecksTheRankCount) {
  const fs::path dir = shared_dir("resume");
  const fs::path ck = dir / "checkpoint.safetensors";
  std::vector<float> unbroken;
  {
    Trainer t(small(4), &comm());
    for (int i = 0; i < 5; ++i) t.run_segment();
    t.save(ck);
    for (int i = 0; i < 5; ++i) t.run_segment();
    unbroken = params_of(t);
  }
  {
    Trainer t(small(4), &comm());
    t.load(ck);
    EXPECT_EQ(t.step(), 40);
    for (int i = 0; i < 5; ++i) t.run_segment();
    EXPECT_EQ(params_of(t), unbroken);
  }
  // One process's checkpoint, loaded by two ranks.
  if (comm().rank() == 0) {
    Trainer single(small(4));
    single.run_segment();
    single.save(dir / "single.safetensors");
  }
  comm().allgather("", "barrier");
  Trainer t(small(4), &comm());
  try {
    t.load(dir / "single.safetensors");
    FAIL() << "a checkpoint of one process was loaded by two ranks";
  } catch (const dist::CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("written by a run of 1 rank(s) (mpirun -np 1); this run has 2"), std::string::npos) << e.what();
  }
  // ... and the two ranks' checkpoint by one process.
  if (comm().rank() == 0) {
    Trainer single(small(4));
    try {
      single.load(ck);
      ADD_FAILURE() << "a checkpoint of two ranks was loaded by one process";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("written by a run of 2 rank(s)"), std::string::npos) << e.what();
      // that alone, not the other ranks' entries it then holds extra
      EXPECT_NE(std::string(e.what()).find("1 problem (nothing was loaded)"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find("unexpected"), std::string::npos) << e.what();
    }
  }
  comm().allgather("", "barrier");
  // Damage only rank 1's streams (a well-formed file: rank 0 reads them as
  // numbers, rank 1's env refuses them): every rank refuses, naming the file.
  const fs::path bad = dir / "rank1-damaged.safetensors";
  if (comm().rank() == 0) {
    const safetensors::File f = safetensors::load(ck);
    std::vector<std::vector<std::byte>> data;
    std::vector<safetensors::TensorRef> refs;
    for (const safetensors::TensorInfo& info : f.tensors) {
      const auto bytes = f.data(info);
      data.emplace_back(bytes.begin(), bytes.end());
      if (info.name == "dist.rank1.ints") {
        const int64_t out_of_range = -7;  // the env's score numerator (its rng state, before it, takes any value)
        std::memcpy(data.back().data() + 2 * sizeof(int64_t), &out_of_range, sizeof out_of_range);
      }
    }
    for (size_t i = 0; i < f.tensors.size(); ++i) refs.push_back({f.tensors[i].name, f.tensors[i].dtype, f.tensors[i].shape, data[i]});
    safetensors::save_atomic(bad, refs, f.metadata);
  }
  comm().allgather("", "barrier");
  {
    Trainer damaged(small(4), &comm());
    const std::vector<float> before = params_of(damaged);
    try {
      damaged.load(bad);
      ADD_FAILURE() << "rank 1's damaged streams were loaded";
    } catch (const dist::CollectiveError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(bad.string() + ": cannot load the training checkpoint: 1 problem (nothing was loaded)"), std::string::npos) << m;
      EXPECT_NE(m.find("rank 1's streams: env 'recall': saved state is out of range"), std::string::npos) << m;
    }
    // Nothing was loaded on any rank (checked after the broadcast, a refusal
    // left rank 0 with the file and the others with its parameters).
    EXPECT_EQ(damaged.step(), 0);
    EXPECT_EQ(params_of(damaged), before);
  }
  comm().allgather("", "barrier");
  if (comm().rank() == 0) fs::remove_all(dir);
}

// Every kind of update averages: exact BPTT's windows, A2C on tmaze, PPO's
// minibatches. The replicas stay bitwise equal and train (their parameters move).
TEST(Dist, ExactA2cAndPpoRanksStayOneModel) {
  for (const char* kind : {"exact", "a2c", "ppo"}) {
    TrainConfig c = small(4);
    if (std::string(kind) == "exact") c.history = History::parse("exact:4/16");
    if (std::string(kind) != "exact") c.env = "tmaze", c.env_options.corridor = 4;
    if (std::string(kind) == "ppo") c.algo = Algo::Ppo, c.rollout = 16, c.epochs = 2, c.minibatches = 2;
    Trainer t(c, &comm());
    const std::vector<float> before = params_of(t);
    for (int i = 0; i < 3; ++i) t.run_segment();
    EXPECT_NO_THROW(dist::check_replicas(comm(), t.policy(), std::string("after 3 ") + kind + " iterations")) << kind;
    EXPECT_GT(rel_l2(params_of(t), before), 1e-4) << kind;
    EXPECT_GE(t.dist_stats()->calls, 3) << kind;
  }
}
