// metrics.csv: one row per log interval, each on disk as soon as it is
// logged (appended and flushed), so a run that stops loses no row; and read
// back when a run resumes.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace segtape_cli {

namespace fs = std::filesystem;

// One metrics row: a log interval's means.
struct Row {
  int64_t step = 0;
  double loss = 0, score = 0;  // loss: NaN with has_loss false when the interval had none; with it true, a diverged run's
  bool has_loss = true;
  double episode_return = std::nan("");  // RL: mean return of the episodes that ended in the interval
  size_t segment_peak = 0, rss = 0;
  double steps_per_s = 0;
};

// A row's loss as text: `none` when the interval had none, `nan` for a
// diverged run's (fmt writes x86's default NaN as -nan), else in `format`.
std::string loss_text(const Row& r, const char* none, const char* format);

// Text quoted in an error line, its control characters written out: a CRLF
// file's header read as the expected one with an invisible \r, and a binary
// file's bytes went to the terminal.
std::string printable(const std::string& text);

class MetricsCsv {
 public:
  MetricsCsv(const fs::path& path, const std::string& measure, bool rl) : path_(path), measure_(measure), rl_(rl) {}
  ~MetricsCsv();
  MetricsCsv(const MetricsCsv&) = delete;
  MetricsCsv& operator=(const MetricsCsv&) = delete;
  // Starts the file with these rows (a resumed run's rows up to its checkpoint).
  void start(const std::vector<Row>& rows);
  void append(const Row& r);
  // The rows of an existing file of this run (columns found by name).
  // A cell that is not what this program writes (a hand-edited or damaged
  // file) is refused, naming the file, the line and the column.
  // `header`: line 1 as found ("" without a file), for check_header once the
  // env's measure is known.
  static std::vector<Row> read(const fs::path& p, std::string& header);
  // A header read by read() that is this run's (its env's measure, and
  // episode_return for RL), or none: another one was taken for this run's
  // and written over.
  static void check_header(const fs::path& p, const std::string& found, const std::string& measure, bool rl);

 private:
  static std::string header_of(const std::string& measure, bool rl);
  std::string line(const Row& r) const;
  fs::path path_;
  std::string measure_;
  bool rl_;
  FILE* f_ = nullptr;
};

}  // namespace segtape_cli
