// A small SVG line-chart writer for metrics and the retention lab: panels
// stacked vertically, each with its own series, axes, ticks and legend.
//
// A series is a solid line in the palette colour of its position unless it
// says otherwise: a dash pattern, a colour, point markers (on the line and in
// its legend entry) and marks (larger open markers at chosen points, e.g.
// where it first crosses a limit). A panel can add horizontal reference lines
// with labels, a fixed y range and a note under its title.
//
//   Series s{"loss", xs, ys};
//   s.dash = "6 3";                          // dashed
//   s.marker = Marker::Circle, s.marker_every = 25;
//   s.marks.push_back({33, 1024});           // an open marker at (33, 1024)
//   Panel p{"title", "step", "bytes", {s}, false, true};
//   p.hlines.push_back({1 << 20, "budget 1 MiB"});
//   p.y_min = 0, p.y_max = 2 << 20;
//   p.note = "dashed: pitfalls; solid: fixes";
//   render_svg({p});
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace segtape::agent {

enum class Marker { None, Circle, Square, Triangle, Diamond, Cross, TriangleDown, Plus };

// A highlighted point of a series: its marker (a circle when it has none),
// larger, open, in the series' colour; with an optional text beside it.
struct Mark {
  double x = 0, y = 0;
  std::string label{};
};

struct Series {
  std::string label;
  std::vector<double> x, y;
  std::string dash{};              // SVG stroke-dasharray, e.g. "6 3"; empty: solid
  std::string color{};             // empty: series_color(position in the panel)
  Marker marker = Marker::None;    // drawn at points marker_offset, marker_offset + marker_every, ...
  size_t marker_every = 1;
  size_t marker_offset = 0;
  std::vector<Mark> marks{};
};

// A horizontal line across the panel at y, its label above its right end.
struct RefLine {
  double y = 0;
  std::string label;
  std::string color = "#333333";
  std::string dash{};  // empty: solid
};

struct Panel {
  std::string title, xlabel, ylabel;
  std::vector<Series> series;
  bool log_y = false;      // log10 scale (non-positive values are skipped)
  bool bytes_y = false;    // format y ticks as bytes (KiB, MiB)
  std::vector<RefLine> hlines{};
  // Fixed y range in data units (positive on a log axis); unset: the data's
  // and the reference lines' range, padded.
  std::optional<double> y_min{}, y_max{};
  std::string note{};      // under the title, one line per '\n'
};

// The palette colour of the i-th series of a panel (wraps around).
std::string series_color(size_t i);

// Renders panels to an SVG document (width px; each panel panel_height px, a
// note's lines taken from its plot area). The legend column widens with the
// longest series label.
std::string render_svg(const std::vector<Panel>& panels, int width = 900, int panel_height = 300);

}  // namespace segtape::agent
