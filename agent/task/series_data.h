// A time series from CSV files (private to the agent library): a header row
// of column names, then one row per time step, oldest first. The column to
// predict (--target) and the columns observed (--features, the target alone
// by default) are read as numbers; other columns (a date) are not read. The
// training, validation and test parts are one buffer of rows, in time order:
// --data's rows (less the last --split of them, the validation part, when
// --valid is not given), then --valid's, then --test's. Each column is
// normalised by the mean and standard deviation of its training rows only
// (a column constant there is divided by 1), so nothing of the validation or
// test part leaks into the model's inputs.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace segtape::agent {

// The checkpoint metadata key of a series run's normalisation (SeriesData::normalisation_json).
inline constexpr const char* kSeriesNormalisationKey = "series.normalisation";

struct SeriesData {
  std::string target;
  std::vector<std::string> features;
  int64_t rows = 0;         // all the parts'
  int64_t train_end = 0;    // rows [0, train_end): the training part
  int64_t valid_end = 0;    // [train_end, valid_end): validation; [valid_end, rows): test
  std::vector<float> x;     // [rows, features.size()]: the features, normalised
  std::vector<float> y;     // [rows]: the target, normalised
  std::vector<double> mean, std;  // [features.size()]: fitted on the training rows
  double target_mean = 0, target_std = 1;

  int64_t dim() const { return int64_t(features.size()); }
  // One line of JSON: the columns, their means and standard deviations.
  std::string normalisation_json() const;
};

// "a,b,c" -> {"a", "b", "c"} ("" -> {}); an Error naming --features for an empty name or one given twice.
std::vector<std::string> parse_features(const std::string& s);

// The series of `data` (and `valid`, `test` where given), read once per
// process and set of arguments and shared. Refuses with one line (an Error
// that names the file, and the line and column where one is at fault): no
// such file, a directory, unreadable, empty, no rows, no column named
// `target` or a feature, a row with another number of cells than the header,
// a cell that is not a number or not finite (NaN, inf), a validation part
// with no rows.
std::shared_ptr<const SeriesData> load_series(const std::string& data, const std::string& valid, const std::string& test,
                                          const std::string& target, const std::string& features, double split);

}  // namespace segtape::agent
