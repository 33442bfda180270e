// A small SVG line-chart writer for metrics and the retention lab: panels
// stacked vertically, each with its own series, axes, ticks and legend.
#pragma once
#include <string>
#include <vector>

namespace segtape::agent {

struct Series {
  std::string label;
  std::vector<double> x, y;
};

struct Panel {
  std::string title, xlabel, ylabel;
  std::vector<Series> series;
  bool log_y = false;      // log10 scale (non-positive values are skipped)
  bool bytes_y = false;    // format y ticks as bytes (KiB, MiB)
};

// Renders panels to an SVG document (width px; each panel panel_height px).
std::string render_svg(const std::vector<Panel>& panels, int width = 900, int panel_height = 300);

}  // namespace segtape::agent
