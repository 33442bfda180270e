#include "series_data.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>
#include <tuple>

#include "segtape/error.h"

namespace segtape::agent {

std::string SeriesData::normalisation_json() const {
  nlohmann::json j;
  j["target"] = target, j["target_mean"] = target_mean, j["target_std"] = target_std;
  j["features"] = features, j["mean"] = mean, j["std"] = std;
  j["train_rows"] = train_end;
  return j.dump();
}

std::vector<std::string> parse_features(const std::string& s) {
  std::vector<std::string> names;
  if (s.empty()) return names;
  for (size_t at = 0;;) {
    const size_t comma = std::min(s.find(',', at), s.size());
    std::string name = s.substr(at, comma - at);
    if (name.empty()) throw Error("--features '" + s + "': an empty column name (give names separated by commas: a,b,c)");
    if (std::find(names.begin(), names.end(), name) != names.end()) throw Error(std::string("--features '").append(s).append("': '").append(name).append("' is given twice"));
    names.push_back(std::move(name));
    if (comma == s.size()) return names;
    at = comma + 1;
  }
}

namespace {

std::string shortest(double v) {  // the shortest text that reads back to v
  char b[40];
  return std::string(b, std::to_chars(b, b + sizeof b, v).ptr);
}

// A file's text, refused with the messages a corpus's are (corpus.cpp).
std::string read_text(const std::string& name) {
  struct stat st {};
  if (::stat(name.c_str(), &st) != 0)
    throw Error(name + ": " + (errno == ENOENT ? std::string("no such file") : "cannot read it (" + std::string(std::strerror(errno)) + ")"));
  if (S_ISDIR(st.st_mode)) throw Error(name + ": is a directory, not a CSV file");
  if (!S_ISREG(st.st_mode)) throw Error(name + ": not a regular file");
  std::ifstream in(name, std::ios::binary);
  if (!in) throw Error(name + ": cannot read it (" + std::string(std::strerror(errno)) + ")");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error(name + ": cannot read it (a read error)");
  std::string s = std::move(text).str();
  if (s.empty()) throw Error(name + ": is empty");
  return s;
}

// A cell without its surrounding blanks (and carriage return), and the double quotes around it.
std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

void split_cells(std::string_view line, std::vector<std::string_view>& cells) {
  cells.clear();
  for (size_t at = 0;;) {
    const size_t comma = std::min(line.find(',', at), line.size());
    cells.push_back(trim(line.substr(at, comma - at)));
    if (comma == line.size()) return;
    at = comma + 1;
  }
}

// The columns `wanted` of a CSV file, appended to cols (one vector per wanted name).
void read_csv(const std::string& file, const std::vector<std::string>& wanted, std::vector<std::vector<double>>& cols) {
  const std::string text = read_text(file);
  std::vector<std::string_view> cells;
  std::vector<size_t> at(wanted.size());  // each wanted column's index in a row
  size_t width = 0, rows = 0;
  int64_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    const std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    const std::string where = file + " line " + std::to_string(line_no);
    if (trim(line).empty()) {
      if (line_no == 1) throw Error(where + ": no header (the first line names the columns: a,b,c)");
      continue;  // (blank lines, a trailing one among them, hold no row)
    }
    split_cells(line, cells);
    if (line_no == 1) {
      width = cells.size();
      for (size_t w = 0; w < wanted.size(); ++w) {
        const auto it = std::find(cells.begin(), cells.end(), wanted[w]);
        if (it == cells.end()) {
          std::string names;
          for (const std::string_view c : cells) names += (names.empty() ? "" : ", ") + std::string(c);
          throw Error(std::string(where).append(": no column '").append(wanted[w]).append("' (").append(w == 0 ? "--target" : "--features")
                          .append("; its columns: ").append(names).append(")"));
        }
        if (std::find(it + 1, cells.end(), wanted[w]) != cells.end()) throw Error(std::string(where).append(": the column '").append(wanted[w]).append("' is named twice"));
        at[w] = size_t(it - cells.begin());
      }
      continue;
    }
    if (cells.size() != width)
      throw Error(where + ": " + std::to_string(cells.size()) + (cells.size() == 1 ? " cell" : " cells") + ", but the header names " +
                  std::to_string(width) + " columns (a ragged row)");
    for (size_t w = 0; w < wanted.size(); ++w) {
      const std::string_view c = cells[at[w]];
      const std::string here = where + ", column '" + wanted[w] + "': ";
      if (c.empty()) throw Error(here + "an empty cell (a missing value; fill or drop the row)");
      const std::string_view digits = c.front() == '+' ? c.substr(1) : c;
      double v = 0;
      const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v);
      if (digits.empty() || r.ec != std::errc() || r.ptr != digits.data() + digits.size())
        throw Error(here + "'" + std::string(c) + "' is not a number");
      if (!std::isfinite(v)) throw Error(here + "'" + std::string(c) + "' is not a finite number");
      cols[w].push_back(v);
    }
    ++rows;
  }
  if (rows == 0) throw Error(file + ": no rows (only a header)");
}

std::shared_ptr<SeriesData> read_series(const std::string& data, const std::string& valid, const std::string& test, const std::string& target,
                                    const std::string& features, double split) {
  auto s = std::make_shared<SeriesData>();
  s->target = target;
  s->features = parse_features(features);
  if (s->features.empty()) s->features = {target};
  std::vector<std::string> wanted = {target};  // the target, then the features it is not one of
  for (const std::string& f : s->features)
    if (f != target) wanted.push_back(f);
  std::vector<std::vector<double>> cols(wanted.size());
  read_csv(data, wanted, cols);
  const auto data_rows = int64_t(cols[0].size());
  if (!valid.empty()) {
    s->train_end = data_rows;
    read_csv(valid, wanted, cols);
  } else {  // the last `split` of the rows
    const auto n = int64_t(double(data_rows) * split);
    if (n < 1)
      throw Error(data + ": the last " + shortest(split) + " (--split) of its " + std::to_string(data_rows) +
                  " rows is no row to validate on: a larger --split, or --valid FILE");
    s->train_end = data_rows - n;
  }
  s->valid_end = int64_t(cols[0].size());
  if (!test.empty()) read_csv(test, wanted, cols);
  s->rows = int64_t(cols[0].size());
  // Each column's mean and standard deviation over the training rows (a constant one: 1).
  std::vector<double> mean(wanted.size()), sd(wanted.size());
  const auto n = size_t(s->train_end);
  for (size_t w = 0; w < wanted.size(); ++w) {
    double sum = 0, sq = 0;
    for (size_t i = 0; i < n; ++i) sum += cols[w][i];
    mean[w] = sum / double(n);
    for (size_t i = 0; i < n; ++i) sq += (cols[w][i] - mean[w]) * (cols[w][i] - mean[w]);
    sd[w] = std::sqrt(sq / double(n));
    if (!(sd[w] > 0) || !std::isfinite(sd[w])) sd[w] = 1;
  }
  const auto normalised = [&](size_t w, size_t i) {
    const auto v = float((cols[w][i] - mean[w]) / sd[w]);
    if (!std::isfinite(v))
      throw Error(data + ": the column '" + wanted[w] + "' has values too far apart to normalise in float (" + std::to_string(cols[w][i]) + ")");
    return v;
  };
  const auto rows = size_t(s->rows), F = s->features.size();
  s->x.resize(rows * F), s->y.resize(rows);
  for (size_t f = 0; f < F; ++f) {
    const auto w = size_t(std::find(wanted.begin(), wanted.end(), s->features[f]) - wanted.begin());
    s->mean.push_back(mean[w]), s->std.push_back(sd[w]);
    for (size_t i = 0; i < rows; ++i) s->x[i * F + f] = normalised(w, i);
  }
  for (size_t i = 0; i < rows; ++i) s->y[i] = normalised(0, i);
  s->target_mean = mean[0], s->target_std = sd[0];
  return s;
}

}  // namespace

std::shared_ptr<const SeriesData> load_series(const std::string& data, const std::string& valid, const std::string& test,
                                          const std::string& target, const std::string& features, double split) {
  if (data.empty()) throw Error("--task series needs a CSV file to learn: --data FILE.csv");
  if (target.empty()) throw Error("--task series needs the column to predict: --target COLUMN");
  // One per process and set of arguments (the trainer and its evaluations share it).
  static std::mutex lock;
  static std::map<std::tuple<std::string, std::string, std::string, std::string, std::string, double>, std::weak_ptr<const SeriesData>> loaded;
  const std::lock_guard<std::mutex> hold(lock);
  const auto key = std::make_tuple(data, valid, test, target, features, split);
  if (auto it = loaded.find(key); it != loaded.end())
    if (std::shared_ptr<const SeriesData> s = it->second.lock()) return s;
  std::shared_ptr<const SeriesData> s = read_series(data, valid, test, target, features, split);
  loaded[key] = s;
  return s;
}

}  // namespace segtape::agent
