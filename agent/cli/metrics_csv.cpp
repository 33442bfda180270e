#include "metrics_csv.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "run_dir.h"
#include "segtape/error.h"

namespace segtape_cli {

using segtape::Error;

std::string loss_text(const Row& r, const char* none, const char* format) {
  if (!r.has_loss) return none;
  return std::isnan(r.loss) ? "nan" : fmt::format(fmt::runtime(format), r.loss);
}

std::string printable(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '\r') out += "\\r";
    else if (ch == '\t') out += "\\t";
    else if (u < 0x20 || u == 0x7f) out += fmt::format("\\x{:02x}", u);
    else out += ch;
  }
  return out;
}

MetricsCsv::~MetricsCsv() {
  if (f_) std::fclose(f_);
}

void MetricsCsv::start(const std::vector<Row>& rows) {
  std::string text = header_of(measure_, rl_);
  for (const Row& r : rows) text += line(r);
  write_text(path_, text);
  f_ = std::fopen(path_.c_str(), "ab");
  if (!f_) throw Error("cannot append to " + path_.string() + ": " + std::strerror(errno));
}

void MetricsCsv::append(const Row& r) {
  const std::string l = line(r);
  if (std::fwrite(l.data(), 1, l.size(), f_) != l.size() || std::fflush(f_) != 0)
    throw Error("cannot append to " + path_.string() + ": " + std::strerror(errno));
}

namespace {

// The cells of a line (a last empty cell included: getline drops it).
std::vector<std::string> cells_of(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream ls(line);
  for (std::string v; std::getline(ls, v, ',');) cells.push_back(v);
  if (!line.empty() && line.back() == ',') cells.emplace_back();
  return cells;
}

// The columns of line 1: a header of the form this program writes, and no
// other (a renamed or missing column read as zeros, a deleted header took the
// first row's place).
std::vector<std::string> header_columns(const fs::path& p, const std::string& line) {
  std::vector<std::string> cols;
  std::stringstream hs(line);
  for (std::string c; std::getline(hs, c, ',');) cols.push_back(c);
  const bool rl = cols.size() == 7;
  const std::vector<std::string> tail = {"segment_peak_bytes", "rss_bytes", "steps_per_s"};
  if ((cols.size() != 6 && !rl) || cols[0] != "step" || cols[1] != "loss" || cols[2].empty() ||
      (rl && cols[3] != "episode_return") || !std::equal(tail.begin(), tail.end(), cols.end() - 3))
    throw Error(fmt::format("{} line 1: the header is '{}', not step,loss,<measure>[,episode_return],segment_peak_bytes,"
                            "rss_bytes,steps_per_s as this program writes it; fix the line or delete the file (the "
                            "checkpoint does not need it)", p.string(), printable(line)));
  return cols;
}

// Where a cell is read: the file, its line and the cell's column.
struct CellAt {
  const fs::path& file;
  int64_t line;
  const std::string& column;
  const std::string& value;
  Error bad(const char* what) const {
    return Error(fmt::format("{} line {}: {} '{}' is {}; fix the line or delete the file (the checkpoint does not need it)",
                             file.string(), line, printable(column), printable(value), what));
  }
};

int64_t whole_cell(const CellAt& at) {  // a whole number >= 0
  const std::string& v = at.value;
  int64_t x = 0;
  const auto res = std::from_chars(v.data(), v.data() + v.size(), x);
  if (res.ec != std::errc() || res.ptr != v.data() + v.size() || x < 0) throw at.bad("not a whole number >= 0");
  return x;
}

double number_cell(const CellAt& at) {  // empty: nothing measured; inf and nan are numbers (a run that diverged)
  const std::string& v = at.value;
  char* end = nullptr;
  const double d = v.empty() ? std::nan("") : std::strtod(v.c_str(), &end);
  if (!v.empty() && end != v.c_str() + v.size()) throw at.bad("not a number");
  return d;
}

// Cell i of a row, by its column's name; column 2 is the env's measure (accuracy, success).
void take_cell(Row& r, size_t i, const CellAt& at) {
  const std::string& c = at.column;
  if (c == "step") r.step = whole_cell(at);
  else if (c == "segment_peak_bytes") r.segment_peak = size_t(whole_cell(at));
  else if (c == "rss_bytes") r.rss = size_t(whole_cell(at));
  else if (c == "loss") r.loss = number_cell(at), r.has_loss = !at.value.empty();
  else if (c == "episode_return") r.episode_return = number_cell(at);
  else if (c == "steps_per_s") r.steps_per_s = number_cell(at);
  else if (const double d = number_cell(at); i == 2) r.score = d;
}

Row row_of(const fs::path& p, int64_t n, const std::string& line, const std::vector<std::string>& cols) {
  const std::vector<std::string> cells = cells_of(line);
  if (cells.size() != cols.size())
    throw Error(fmt::format("{} line {}: {} cells where the header has {}; fix the line or delete the file (the "
                            "checkpoint does not need it)", p.string(), n, cells.size(), cols.size()));
  Row r;
  for (size_t i = 0; i < cols.size(); ++i) take_cell(r, i, {p, n, cols[i], cells[i]});
  return r;
}

}  // namespace

std::vector<Row> MetricsCsv::read(const fs::path& p, std::string& header) {
  std::vector<Row> rows;
  header.clear();
  (void)text_target(p, "--resume");  // (a FIFO there: the open below waited forever)
  std::error_code ec;
  if (!fs::exists(p, ec) && !ec) return rows;  // (no file: the checkpoint does not need it)
  std::ifstream in(p);
  if (!in)  // (an unreadable file was taken for none, and the run's rows were written over)
    throw Error(fmt::format("--resume: cannot read {} ({}); make it readable, or delete it (the checkpoint does not need it)",
                            p.string(), std::strerror(errno)));
  std::string line;
  if (!std::getline(in, line)) return rows;
  header = line;
  const std::vector<std::string> cols = header_columns(p, line);
  for (int64_t n = 2; std::getline(in, line); ++n) {
    if (in.eof()) break;  // a last line with no newline: cut short by a kill or a full disk, dropped unread
    rows.push_back(row_of(p, n, line, cols));
  }
  if (in.bad()) throw Error(fmt::format("--resume: cannot read {} ({})", p.string(), std::strerror(errno)));
  return rows;
}

void MetricsCsv::check_header(const fs::path& p, const std::string& found, const std::string& measure, bool rl) {
  const std::string want = header_of(measure, rl);
  if (!found.empty() && found + '\n' != want)
    throw Error(fmt::format("{} line 1: the header is '{}', not '{}' as this run writes it; fix the line or delete the file "
                            "(the checkpoint does not need it)", p.string(), printable(found), want.substr(0, want.size() - 1)));
}

std::string MetricsCsv::header_of(const std::string& measure, bool rl) {
  return "step,loss," + measure + (rl ? ",episode_return" : "") + ",segment_peak_bytes,rss_bytes,steps_per_s\n";
}

namespace {
// An interval with no loss (no target asked yet) or nothing scored (no
// target, no finished episode) leaves that cell empty, as episode_return.
std::string cell(double v) { return std::isnan(v) ? std::string() : fmt::format("{:.6g}", v); }
}  // namespace

std::string MetricsCsv::line(const Row& r) const {
  return fmt::format("{},{},{}{},{},{},{:.6g}\n", r.step, loss_text(r, "", "{:.6g}"), cell(r.score),
                     rl_ ? "," + cell(r.episode_return) : "",
                     r.segment_peak, r.rss, r.steps_per_s);
}

}  // namespace segtape_cli
