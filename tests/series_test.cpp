// Time series (--task series): the CSV loader, its normalisation and split,
// the streams' layout, a short run that beats the naive last-value forecast,
// resume, memory, and the bad inputs. The series is tests/data/sunspots.csv,
// the yearly sunspot numbers 1700-2008 (statsmodels' sunspots, public domain).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "agent_util.h"
#include "alloc_hook.h"
#include "segtape/agent/trainer.h"
#include "segtape/nn/safetensors.h"

#include "../agent/task/series_data.h"
#include "process.h"

using namespace segtape;
using namespace segtape::agent;
using segtape::test::params_of;
namespace fs = std::filesystem;

namespace {

const fs::path kSunspots = fs::path(SEGTAPE_SOURCE_DIR) / "tests" / "data" / "sunspots.csv";

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("segtape_series_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d / name;
}

fs::path write(const std::string& name, const std::string& text) {
  const fs::path p = scratch(name);
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// --task series's defaults (agent/cli/train_plan.cpp), `epochs` epochs of the sunspots' training part.
TrainConfig series_config(const std::string& data, int64_t steps) {
  TrainConfig c;
  c.env = "series";
  c.algo = Algo::Series;
  c.env_options.data = data;
  c.env_options.target = "sunactivity";
  c.history = History::parse("tbptt:16");
  c.batch = 4;
  c.hidden = 64;
  c.embed = 16;
  c.steps = steps;
  c.lr = 3e-3;
  c.clip = 1;
  return c;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

constexpr int64_t kEpoch = 278 / 4 - 1;  // the sunspots' 309 rows less the last 10 % (30), in 4 streams

}  // namespace

// The columns read by name (a date column left alone), the last --split of
// the rows the validation part, --valid and --test rows after them, each
// column normalised by its training rows' mean and standard deviation; the
// env's streams contiguous as lm's, observing row b N/B + i and asked for the
// target of the next row, an epoch of N/B - 1 steps.
TEST(Series, TheLoaderNormalisesOnTheTrainingPartAndTheStreamsAreContiguous) {
  const fs::path f = write("f.csv", "date,temp,load\n"
                                    "2020-01,1,10\n2020-02,3,20\n2020-03,5,30\n2020-04,7,40\n2020-05,9,50\n"
                                    "2020-06,11,60\n2020-07,13,70\n\n2020-08,15,80\n2020-09,100,90\n2020-10,200,100\n");
  const SeriesData s = *load_series(f.string(), "", "", "load", "temp,load", 0.2);
  EXPECT_EQ(s.rows, 10);
  EXPECT_EQ(s.train_end, 8);
  EXPECT_EQ(s.valid_end, 10);
  ASSERT_EQ(s.dim(), 2);
  EXPECT_DOUBLE_EQ(s.mean[0], 8);  // temp over the 8 training rows only: 1, 3, ..., 15
  EXPECT_DOUBLE_EQ(s.std[0], std::sqrt(21.0));
  EXPECT_DOUBLE_EQ(s.target_mean, 45);
  EXPECT_DOUBLE_EQ(s.target_std, std::sqrt(525.0));
  EXPECT_FLOAT_EQ(s.x[0], float((1 - 8) / std::sqrt(21.0)));
  EXPECT_FLOAT_EQ(s.x[9 * 2 + 0], float((200 - 8) / std::sqrt(21.0)));  // (the validation rows normalised as the training ones)
  EXPECT_FLOAT_EQ(s.x[9 * 2 + 1], s.y[9]);
  EXPECT_FLOAT_EQ(s.y[9], float((100 - 45) / std::sqrt(525.0)));
  EXPECT_NE(s.normalisation_json().find("\"target\":\"load\""), std::string::npos);
  const SeriesData alone = *load_series(f.string(), "", "", "temp", "", 0.2);
  EXPECT_EQ(alone.features, std::vector<std::string>{"temp"});
  // --valid and --test: their rows after --data's, normalised by --data's
  const fs::path v = write("v.csv", "load,temp\n110,300\n"), t = write("t.csv", "temp,load,note\n400,120,x\n500,130,y\n");
  const SeriesData parts = *load_series(f.string(), v.string(), t.string(), "load", "", 0.2);
  EXPECT_EQ(parts.train_end, 10);
  EXPECT_EQ(parts.valid_end, 11);
  EXPECT_EQ(parts.rows, 13);
  EXPECT_DOUBLE_EQ(parts.target_mean, 55);
  EXPECT_FLOAT_EQ(parts.y[12], float((130 - 55) / parts.target_std));
  // the env: 8 training rows in B = 2 streams of 4, an epoch of 3 steps
  EnvOptions o;
  o.data = f.string(), o.target = "load", o.features = "temp,load", o.split = 0.2;
  auto env = make_env("series", 2, 1, o);
  EXPECT_EQ(env->spec().obs_dim, 2);
  EXPECT_EQ(env->spec().num_actions, 1);
  std::vector<float> obs(4), y(2), r(2);
  std::vector<int64_t> a(2, 0);
  std::vector<uint8_t> done(2);
  for (int step = 0; step < 4; ++step) {
    const int i = step % 3;  // the step in the epoch
    env->observe({}, obs);
    env->target_values(y);
    EXPECT_EQ(obs[0], s.x[size_t(i * 2)]) << step;  // stream 0: rows 0..3; stream 1: rows 4..7
    EXPECT_EQ(obs[3], s.x[size_t((4 + i) * 2 + 1)]) << step;
    EXPECT_EQ(y[0], s.y[size_t(i + 1)]) << step;
    EXPECT_EQ(y[1], s.y[size_t(4 + i + 1)]) << step;
    env->step(a, r, done);
    EXPECT_EQ(done[0], uint8_t(i == 2)) << step;
  }
  // an env without real targets says so
  auto recall = make_env("recall", 2, 1, {});
  EXPECT_NE(message_of([&] { recall->target_values(y); }).find("env 'recall' has no real-valued targets"), std::string::npos);
}

// A short run on the sunspots: the validation MSE, reported each epoch beside
// the naive last-value forecast's, ends well below it; the chunks' segment
// peaks repeat epoch after epoch; the normalisation is in the checkpoint;
// resumed from a mid-run checkpoint, the run ends with the same parameters
// bit for bit.
TEST(Series, AShortRunBeatsTheNaiveForecastAndResumesBitIdentically) {
  constexpr int64_t kEpochs = 30;
  const TrainConfig c = series_config(kSunspots.string(), kEpochs * kEpoch);
  Trainer tr(c), first(c);
  std::vector<std::vector<size_t>> peaks(kEpochs);
  std::vector<double> valid, naive;
  while (!tr.done()) {
    const int64_t at = tr.step();
    const UpdateResult r = tr.run_segment();
    peaks[size_t(at / kEpoch)].push_back(tr.tape().stats().last_segment_peak);
    if (r.metric("valid_mse") > 0) valid.push_back(r.metric("valid_mse")), naive.push_back(r.metric("naive_mse"));
  }
  ASSERT_EQ(valid.size(), size_t(kEpochs)) << "a validation at each epoch's end";
  EXPECT_EQ(naive.front(), naive.back());
  EXPECT_LT(valid.back(), 0.5 * naive.back()) << "the model's validation MSE against the naive forecast's";
  EXPECT_LT(valid.back(), valid.front());
  for (int64_t e = 2; e < kEpochs; ++e) EXPECT_EQ(peaks[size_t(e)], peaks[1]) << "epoch " << e << "'s chunks against epoch 1's";
  // resume
  const fs::path ck = scratch("ck.safetensors");
  while (first.step() < 10 * kEpoch + 5) first.run_segment();
  first.save(ck);
  const auto meta = safetensors::load(ck).metadata;
  ASSERT_TRUE(meta.count(kSeriesNormalisationKey));
  EXPECT_NE(meta.at(kSeriesNormalisationKey).find("\"target\":\"sunactivity\""), std::string::npos);
  Trainer second(Trainer::read_config(ck));
  second.load(ck);
  while (!second.done()) second.run_segment();
  EXPECT_EQ(params_of(second), params_of(tr));
  fs::remove_all(ck.parent_path());
}

// A checkpoint resumes only on the series it was trained with: one value of
// the training part changed since (the fitted mean and scale with it) is
// refused, naming the normalisation; the same file still resumes.
TEST(Series, ResumeRefusesASeriesWhoseNormalisationChanged) {
  const TrainConfig c = series_config(kSunspots.string(), 16);
  const fs::path ck = scratch("norm.safetensors");
  {
    Trainer tr(c);
    tr.run_segment();
    tr.save(ck);
  }
  std::string text = slurp(kSunspots);
  const size_t at = text.find("1701,11.0");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 9, "1701,12.0");
  TrainConfig changed = c;
  changed.env_options.data = write("changed.csv", text).string();
  Trainer other(changed);
  const std::string m = message_of([&] { other.load(ck); });
  EXPECT_NE(m.find("series.normalisation differs from the one this run made from its data"), std::string::npos) << m;
  Trainer same(c);
  EXPECT_EQ(message_of([&] { same.load(ck); }), "");
  fs::remove_all(ck.parent_path());
}

// After the first chunk, training allocates nothing on the heap, the
// epochs' ends (their validations) included.
TEST(Series, NoHeapAllocationAfterTheFirstChunk) {
  Trainer tr(series_config(kSunspots.string(), 2 * kEpoch + 20));
  tr.run_segment();
  const uint64_t before = alloc_hook::count();
  alloc_hook::enable(true);
  while (!tr.done()) tr.run_segment();
  alloc_hook::enable(false);
  EXPECT_EQ(alloc_hook::count() - before, 0u);
}

// Each bad input is one line naming the file and what is wrong.
TEST(Series, BadInputNamesTheFileAndWhatIsWrong) {
  const auto refused = [](const std::string& file, const std::string& target = "b") {
    TrainConfig c = series_config(file, 10);
    c.env_options.target = target;
    return message_of([&] { Trainer t(c); });
  };
  const auto expect = [](const std::string& message, const std::string& want) {
    EXPECT_NE(message.find(want), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  };
  const fs::path missing = scratch("missing.csv"), dir = scratch("adir");
  fs::create_directories(dir);
  expect(refused(missing.string()), missing.string() + ": no such file");
  expect(refused(write("empty.csv", "").string()), "empty.csv: is empty");
  expect(refused(dir.string()), dir.string() + ": is a directory");
  expect(refused(write("header.csv", "a,b\n").string()), "header.csv: no rows (only a header)");
  expect(refused(write("target.csv", "a,b\n1,2\n").string(), "c"), "target.csv line 1: no column 'c' (--target; its columns: a, b)");
  expect(refused(write("word.csv", "a,b\n1,2\n3,four\n").string()), "word.csv line 3, column 'b': 'four' is not a number");
  expect(refused(write("nan.csv", "a,b\n1,2\n3,NaN\n").string()), "nan.csv line 3, column 'b': 'NaN' is not a finite number");
  expect(refused(write("inf.csv", "a,b\n1,inf\n").string()), "inf.csv line 2, column 'b': 'inf' is not a finite number");
  expect(refused(write("hole.csv", "a,b\n1,\n").string()), "hole.csv line 2, column 'b': an empty cell");
  expect(refused(write("ragged.csv", "a,b\n1,2\n3,4,5\n").string()), "ragged.csv line 3: 3 cells, but the header names 2 columns");
  expect(refused(write("short.csv", "a,b\n1,2\n3,4\n5,6\n").string()), "short.csv: the last 0.1 (--split) of its 3 rows is no row");
  TrainConfig few = series_config(write("few.csv", "a,b\n1,2\n3,4\n5,6\n7,8\n").string(), 10);
  few.env_options.target = "b", few.env_options.split = 0.25;
  expect(message_of([&] { Trainer t(few); }), "few.csv: its training part has 3 rows, fewer than 2 for each of the 4 streams");
  TrainConfig features = series_config(kSunspots.string(), 10);
  features.env_options.features = "year,,sunactivity";
  expect(message_of([&] { Trainer t(features); }), "--features 'year,,sunactivity': an empty column name");
  features.env_options.features = "year,nope";
  expect(message_of([&] { Trainer t(features); }), "sunspots.csv line 1: no column 'nope' (--features");
  TrainConfig recall;
  recall.algo = Algo::Series;
  expect(message_of([&] { Trainer t(recall); }), "--algo series learns a time series: --task series");
  fs::remove_all(missing.parent_path());
}

// The program: a bad file is one line on stderr, and nothing is written —
// no new run's folder, and with --force an existing run left as it was.
TEST(Series, TheProgramWritesNothingOnBadInput) {
  const fs::path dir = scratch("cli");
  fs::create_directories(dir);
  const std::string segtape = SEGTAPE_BIN, good = (dir / "good").string();
  const test::Process made = test::run_shell(segtape + " train --task series --data " + kSunspots.string() +
                                             " --target sunactivity --steps 200 --out " + good + " 2>&1");
  ASSERT_TRUE(made.exited && made.code == 0) << made.output;
  EXPECT_NE(made.output.find("naive_mse"), std::string::npos) << made.output;
  const std::string ck = slurp(dir / "good" / "checkpoint.safetensors"), csv = slurp(dir / "good" / "metrics.csv");
  const fs::path bad = write("cli-bad.csv", "year,sunactivity\n1700,5\n1701,x\n");
  for (const std::string& out : {(dir / "fresh").string() + "", good + " --force"}) {
    const test::Process r =
        test::run_shell(segtape + " train --task series --data " + bad.string() + " --target sunactivity --out " + out + " 2>&1 >/dev/null");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_EQ(r.output, "segtape: error: " + bad.string() + " line 3, column 'sunactivity': 'x' is not a number\n");
  }
  EXPECT_FALSE(fs::exists(dir / "fresh"));
  EXPECT_EQ(slurp(dir / "good" / "checkpoint.safetensors"), ck);
  EXPECT_EQ(slurp(dir / "good" / "metrics.csv"), csv);
  fs::remove_all(dir.parent_path());
}
