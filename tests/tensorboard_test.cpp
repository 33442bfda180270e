// TensorBoard event files (agent/tensorboard.h): CRC-32C against its check
// value, records read back, damage found, and `segtape train --log-dir`
// writing the metrics rows' values. python/tests/test_tensorboard.py reads
// the same kind of file with TensorBoard's own reader.
#include "tensorboard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "process.h"
#include "segtape/error.h"

namespace fs = std::filesystem;
using namespace segtape;
namespace tb = segtape::agent::tensorboard;

namespace {
std::span<const std::byte> bytes(const std::string& s) { return {reinterpret_cast<const std::byte*>(s.data()), s.size()}; }
fs::path temp_dir(const char* name) {
  const fs::path d = fs::temp_directory_path() / (std::string("segtape_tb_") + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}
}  // namespace

TEST(TensorBoard, Crc32cHasItsCheckValue) {
  EXPECT_EQ(tb::crc32c(bytes("123456789")), 0xE3069283u);  // the CRC-32C check value (RFC 3720)
  EXPECT_EQ(tb::crc32c(bytes("")), 0u);
  // Incremental: the CRC of a whole equals the CRC continued over its parts.
  EXPECT_EQ(tb::crc32c(bytes("6789"), tb::crc32c(bytes("12345"))), 0xE3069283u);
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(tb::masked_crc32c(bytes("123456789")), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TensorBoard, ScalarsReadBackInOrder) {
  const fs::path dir = temp_dir("read");
  fs::path file;
  {
    tb::EventWriter w(dir / "nested");
    file = w.file();
    w.scalar("train/loss", 32, 1.5);
    w.scalar("train/accuracy", 32, 0.25);
    w.scalar("train/loss", 64, 0.75);
  }
  EXPECT_EQ(file.parent_path(), dir / "nested");
  EXPECT_EQ(file.filename().string().rfind("events.out.tfevents.", 0), 0u);
  const tb::EventFile f = tb::read_events(file);
  EXPECT_EQ(f.file_version, "brain.Event:2");
  ASSERT_EQ(f.scalars.size(), 3u);
  EXPECT_EQ(f.scalars[0].tag, "train/loss");
  EXPECT_EQ(f.scalars[0].step, 32);
  EXPECT_EQ(f.scalars[0].value, 1.5f);
  EXPECT_EQ(f.scalars[1].tag, "train/accuracy");
  EXPECT_EQ(f.scalars[2].step, 64);
  EXPECT_EQ(f.scalars[2].value, 0.75f);
  EXPECT_GT(f.scalars[0].wall_time, 1.6e9);  // seconds since 1970
  fs::remove_all(dir);
}

TEST(TensorBoard, DamageIsFoundAndNamed) {
  const fs::path dir = temp_dir("damage");
  fs::path file;
  {
    tb::EventWriter w(dir);
    file = w.file();
    w.scalar("x", 1, 2.0);
  }
  const std::string good = test::slurp(file);
  auto write = [&](const std::string& s) { std::ofstream(file, std::ios::binary | std::ios::trunc) << s; };
  std::string flipped = good;
  flipped[flipped.size() - 6] ^= 0x10;  // inside the last record's data
  write(flipped);
  try {
    tb::read_events(file);
    FAIL() << "a flipped bit was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data CRC mismatch"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
  }
  write(good.substr(0, good.size() - 3));
  EXPECT_THROW(tb::read_events(file), Error);
  write(good);
  EXPECT_EQ(tb::read_events(file).scalars.size(), 1u);
  fs::remove_all(dir);
}

TEST(TensorBoard, AFolderThatCannotBeMadeIsAnErrorNamingTheFlag) {
  const fs::path dir = temp_dir("blocked");
  std::ofstream(dir.string()) << "a file, not a folder";
  try {
    tb::EventWriter w(dir / "logs");
    FAIL() << "made a folder under a file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--log-dir " + (dir / "logs").string()), std::string::npos) << e.what();
  }
  fs::remove(dir);
}

// `segtape train --log-dir`: every metrics row's values as scalars, eval at the checkpoints.
TEST(TensorBoard, TrainWritesTheMetricsRowsAndAnEvalCurve) {
  const fs::path dir = temp_dir("train");
  const std::string out = (dir / "run").string(), logs = (dir / "logs").string();
  const test::Process r = test::run_shell(std::string(SEGTAPE_BIN) + " train --env tmaze --steps 256 --batch 4 --hidden 8" +
                                          " --log-every 64 --checkpoint-every 128 --eval-steps 64 --out " + out +
                                          " --log-dir " + logs + " 2>&1");
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(logs)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  const tb::EventFile f = tb::read_events(files[0]);
  std::map<std::string, std::vector<std::pair<int64_t, float>>> by_tag;
  for (const tb::ScalarEvent& s : f.scalars) by_tag[s.tag].push_back({s.step, s.value});
  for (const char* tag : {"train/loss", "train/success", "train/episode_return", "memory/segment_peak_bytes",
                          "memory/rss_bytes", "speed/steps_per_s", "eval/success"})
    EXPECT_TRUE(by_tag.count(tag)) << tag;
  // The loss curve is metrics.csv's: steps 64, 128, 192, 256 and the same values (as float).
  std::ifstream csv(out + "/metrics.csv");
  std::string header, line;
  std::getline(csv, header);
  ASSERT_EQ(header.rfind("step,loss,", 0), 0u) << header;
  std::vector<std::pair<int64_t, float>> want;
  while (std::getline(csv, line)) {
    std::stringstream ls(line);
    std::string step, loss;
    std::getline(ls, step, ',');
    std::getline(ls, loss, ',');
    want.push_back({std::stoll(step), float(std::stod(loss))});
  }
  ASSERT_EQ(want.size(), 4u);
  ASSERT_EQ(by_tag["train/loss"].size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(by_tag["train/loss"][i].first, want[i].first);
    EXPECT_NEAR(by_tag["train/loss"][i].second, want[i].second, 1e-5 * std::abs(want[i].second) + 1e-6);
  }
  // Eval at the checkpoint of step 128 and at the end (256); 0..1 each.
  ASSERT_EQ(by_tag["eval/success"].size(), 2u);
  EXPECT_EQ(by_tag["eval/success"][0].first, 128);
  EXPECT_EQ(by_tag["eval/success"][1].first, 256);
  for (const auto& [step, v] : by_tag["eval/success"]) EXPECT_TRUE(v >= 0 && v <= 1) << v;
  fs::remove_all(dir);
}

// `--algo ppo` adds its diagnostics: the approximate KL and clip fraction of
// the last iteration (>= 0; the fraction <= 1) and the annealed learning rate
// (falling from --lr towards 0 row by row).
TEST(TensorBoard, PpoRunsLogTheirDiagnostics) {
  const fs::path dir = temp_dir("ppo");
  const std::string out = (dir / "run").string(), logs = (dir / "logs").string();
  const test::Process r = test::run_shell(std::string(SEGTAPE_BIN) + " train --env tmaze --algo ppo --steps 256 --batch 4" +
                                          " --hidden 8 --rollout 32 --minibatches 2 --epochs 2 --lr 0.004 --log-every 64" +
                                          " --eval-steps 32 --out " + out + " --log-dir " + logs + " 2>&1");
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(logs)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  std::map<std::string, std::vector<std::pair<int64_t, float>>> by_tag;
  for (const tb::ScalarEvent& s : tb::read_events(files[0]).scalars) by_tag[s.tag].push_back({s.step, s.value});
  ASSERT_EQ(by_tag["ppo/approx_kl"].size(), 4u);
  ASSERT_EQ(by_tag["ppo/clip_fraction"].size(), 4u);
  ASSERT_EQ(by_tag["ppo/lr"].size(), 4u);
  for (const auto& [step, v] : by_tag["ppo/approx_kl"]) EXPECT_GE(v, 0.0f);
  for (const auto& [step, v] : by_tag["ppo/clip_fraction"]) EXPECT_TRUE(v >= 0 && v <= 1) << v;
  // The row at step 64 comes after the iteration that started at step 32: lr = 0.004 * (1 - 32 / 256).
  EXPECT_NEAR(by_tag["ppo/lr"][0].second, 0.004 * (1 - 32.0 / 256), 1e-9);
  for (size_t i = 1; i < 4; ++i) EXPECT_LT(by_tag["ppo/lr"][i].second, by_tag["ppo/lr"][i - 1].second);
  fs::remove_all(dir);
}
