#include "checkpoints.h"

#include <fmt/format.h>

#include <charconv>

namespace segtape_cli {

using segtape::Error;

namespace {
constexpr const char* kIntervalKey = "run.interval";
constexpr const char* kIntervalPeakKey = "run.interval_peak";
}  // namespace

void Checkpoints::save(const Interval* open) {
  Metadata m = run_meta_;
  if (open) {
    m[kIntervalKey] = fmt::format("{:.17g},{},{:.17g},{},{},{:.17g}", open->loss_sum, open->loss_steps, open->return_sum,
                                  open->episodes, open->steps, open->last_loss);
    m[kIntervalPeakKey] = std::to_string(open->peak);
  }
  if (before_save_) before_save_();
  tr_.save(file_, m);
}

namespace {

// run.interval: six numbers, each read in full, counts >= 0 (the sums may be
// non-finite: a diverged run stays resumable).
void restore_sums(const std::string& v, Interval& open, const fs::path& out) {
  const char *p = v.data(), *end = v.data() + v.size();
  bool ok = true;
  auto next = [&](auto& x, bool last) {
    const auto r = std::from_chars(p, end, x);
    ok = ok && r.ec == std::errc() && (last ? r.ptr == end : r.ptr < end && *r.ptr == ',');
    p = ok ? r.ptr + (last ? 0 : 1) : end;
  };
  next(open.loss_sum, false), next(open.loss_steps, false), next(open.return_sum, false), next(open.episodes, false),
      next(open.steps, false), next(open.last_loss, true);
  constexpr int64_t most = int64_t(1) << 53;  // (counts a run could reach; more would overflow the sums they go on into)
  const auto in_range = [&](int64_t n) { return n >= 0 && n <= most; };
  if (!ok || !in_range(open.loss_steps) || !in_range(open.episodes) || !in_range(open.steps))
    throw Error("--resume " + out.string() + ": checkpoint metadata run.interval is malformed ('" + v + "')");
}

}  // namespace

void restore_interval(const Metadata& ck_meta, Interval& open, const fs::path& out) {
  if (auto it = ck_meta.find(kIntervalKey); it != ck_meta.end()) restore_sums(it->second, open, out);
  if (auto it = ck_meta.find(kIntervalPeakKey); it != ck_meta.end()) {  // (absent from checkpoints before it: 0)
    const std::string& v = it->second;
    const auto r = std::from_chars(v.data(), v.data() + v.size(), open.peak);
    if (r.ec != std::errc() || r.ptr != v.data() + v.size())
      throw Error("--resume " + out.string() + ": checkpoint metadata " + kIntervalPeakKey + " is malformed ('" + v + "')");
  }
}

}  // namespace segtape_cli
