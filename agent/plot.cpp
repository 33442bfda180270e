#include "segtape/agent/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace segtape::agent {
namespace {

// One colour per case of the retention lab (13), before they repeat.
const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
                         "#7f7f7f", "#bcbd22", "#17becf", "#000000", "#aec7e8", "#00a65a"};

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else o += c;
  }
  return o;
}

std::string fmt_num(double v, bool bytes) {
  char b[40];
  const double a = std::fabs(v);
  if (bytes) {
    if (a >= 1 << 30) std::snprintf(b, sizeof b, "%.3g GiB", v / (1 << 30));
    else if (a >= 1 << 20) std::snprintf(b, sizeof b, "%.3g MiB", v / (1 << 20));
    else if (a >= 1 << 10) std::snprintf(b, sizeof b, "%.3g KiB", v / (1 << 10));
    else std::snprintf(b, sizeof b, "%.3g B", v);
  } else if (a < 1e9 && v == std::floor(v)) {
    std::snprintf(b, sizeof b, "%.0f", v);
  } else if (a != 0 && (a >= 1e5 || a < 1e-3)) {
    std::snprintf(b, sizeof b, "%.2g", v);
  } else {
    std::snprintf(b, sizeof b, "%.4g", v);
  }
  return b;
}

// "Nice" tick positions covering [lo, hi].
std::vector<double> ticks(double lo, double hi, int target = 5) {
  std::vector<double> t;
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) t.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
  return t;
}

// One marker centred at (x, y), radius r.
std::string marker_svg(Marker m, double x, double y, double r, const std::string& stroke, const std::string& fill, double sw) {
  char b[400];
  const std::string style = "fill=\"" + fill + "\" stroke=\"" + stroke + "\" stroke-width=\"" + fmt_num(sw, false) + "\"";
  switch (m) {
    case Marker::None: return "";
    case Marker::Circle: std::snprintf(b, sizeof b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\" %s/>", x, y, r, style.c_str()); break;
    case Marker::Square:
      std::snprintf(b, sizeof b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" %s/>", x - r * 0.85, y - r * 0.85, 1.7 * r,
                    1.7 * r, style.c_str());
      break;
    case Marker::Triangle:
      std::snprintf(b, sizeof b, "<polygon points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f\" %s/>", x, y - r * 1.1, x - r, y + r * 0.8, x + r,
                    y + r * 0.8, style.c_str());
      break;
    case Marker::TriangleDown:
      std::snprintf(b, sizeof b, "<polygon points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f\" %s/>", x, y + r * 1.1, x - r, y - r * 0.8, x + r,
                    y - r * 0.8, style.c_str());
      break;
    case Marker::Plus:
      std::snprintf(b, sizeof b,
                    "<path d=\"M%.1f,%.1f L%.1f,%.1f M%.1f,%.1f L%.1f,%.1f\" fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\"/>",
                    x - r * 1.2, y, x + r * 1.2, y, x, y - r * 1.2, x, y + r * 1.2, stroke.c_str(), std::max(sw, 1.8));
      break;
    case Marker::Diamond:
      std::snprintf(b, sizeof b, "<polygon points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f\" %s/>", x, y - r * 1.2, x + r, y, x,
                    y + r * 1.2, x - r, y, style.c_str());
      break;
    case Marker::Cross:
      std::snprintf(b, sizeof b,
                    "<path d=\"M%.1f,%.1f L%.1f,%.1f M%.1f,%.1f L%.1f,%.1f\" fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\"/>",
                    x - r, y - r, x + r, y + r, x - r, y + r, x + r, y - r, stroke.c_str(), std::max(sw, 1.5));
      break;
  }
  return b;
}

// The margins of every panel's plot area: left and bottom fixed, top by the
// panel's note, right the legend column.
constexpr int kLeft = 90, kBottom = 46;

// A panel's note, one line per '\n'.
std::vector<std::string> note_lines(const std::string& note) {
  std::vector<std::string> lines;
  for (size_t a = 0; !note.empty() && a <= note.size();) {
    const size_t e = std::min(note.find('\n', a), note.size());
    lines.push_back(note.substr(a, e - a));
    a = e + 1;
  }
  return lines;
}

// The data's extent on both axes (y in the axis's units: log10 on a log
// axis); the reference lines count on y. Unset: infinite.
struct Extent {
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
};

Extent extent_of(const Panel& P) {
  Extent e;
  auto ty = [&](double v) { return P.log_y ? std::log10(v) : v; };
  auto take_y = [&](double v) {
    if ((P.log_y && !(v > 0)) || !std::isfinite(v)) return;
    e.ylo = std::min(e.ylo, ty(v)), e.yhi = std::max(e.yhi, ty(v));
  };
  for (const Series& se : P.series)
    for (size_t i = 0; i < se.x.size() && i < se.y.size(); ++i) {
      if (P.log_y && !(se.y[i] > 0)) continue;
      if (!std::isfinite(se.y[i]) || !std::isfinite(se.x[i])) continue;
      e.xlo = std::min(e.xlo, se.x[i]), e.xhi = std::max(e.xhi, se.x[i]);
      take_y(se.y[i]);
    }
  for (const RefLine& l : P.hlines) take_y(l.y);
  return e;
}

// One panel's geometry: its plot area and its axes' ranges, and the maps from
// data to pixels.
struct Frame {
  const Panel& P;
  size_t index;       // the panel's position (its clip path's id)
  int mt;             // top margin: the title and the note's lines
  int panel_height;
  double y0, pw, ph;  // the panel's top, the plot area's width and height
  double xlo = 0, xhi = 1, ylo = 0, yhi = 1;  // y in the axis's units (log10 on a log axis)

  double ty(double v) const { return P.log_y ? std::log10(v) : v; }
  double X(double v) const { return kLeft + (v - xlo) / (xhi - xlo) * pw; }
  double Y(double v) const { return y0 + mt + ph - (ty(v) - ylo) / (yhi - ylo) * ph; }
  double Yt(double tv) const { return y0 + mt + ph - (tv - ylo) / (yhi - ylo) * ph; }  // tv in the axis's units
  bool inside(double x, double y) const {
    return std::isfinite(y) && (!P.log_y || y > 0) && ty(y) >= ylo && ty(y) <= yhi && x >= xlo && x <= xhi;
  }
};

// The data's y range, padded, anchored at zero when it is near.
void pad_y(const Panel& P, double& ylo, double& yhi) {
  if (!std::isfinite(ylo)) ylo = 0, yhi = 1;
  if (yhi == ylo) yhi = ylo + (P.log_y ? 1 : std::max(1.0, std::fabs(ylo) * 0.1));
  if (!P.log_y && ylo > 0 && ylo < 0.5 * yhi) ylo = 0;  // anchor at zero when it is near
  const double pad = (yhi - ylo) * 0.05;
  yhi += pad;
  if (P.log_y || ylo != 0) ylo -= pad;
}

// The axes' ranges: the data's (y padded), or the panel's fixed y range.
void fit_ranges(Frame& f) {
  const Panel& P = f.P;
  const Extent e = extent_of(P);
  double xlo = e.xlo, xhi = e.xhi, ylo = e.ylo, yhi = e.yhi;
  if (!std::isfinite(xlo)) xlo = 0, xhi = 1;
  if (xhi == xlo) xhi = xlo + 1;
  pad_y(P, ylo, yhi);
  if (P.y_min && (!P.log_y || *P.y_min > 0)) ylo = f.ty(*P.y_min);
  if (P.y_max && (!P.log_y || *P.y_max > 0)) yhi = f.ty(*P.y_max);
  if (!(yhi > ylo)) yhi = ylo + 1;
  f.xlo = xlo, f.xhi = xhi, f.ylo = ylo, f.yhi = yhi;
}

// A log axis's ticks (in log10 units): decades (or, for bytes, powers of
// 1024), with 1-2-5 (powers of 4) between them when the range is narrow.
std::vector<double> log_ticks(const Frame& f) {
  std::vector<double> yt;
  const bool narrow = f.yhi - f.ylo < 2.5;
  if (f.P.bytes_y) {
    const double l2 = std::log2(10.0);
    for (double k = std::floor(f.ylo * l2); k <= std::ceil(f.yhi * l2); k += 1) {
      const double t = k / l2;
      if (t >= f.ylo && t <= f.yhi && std::fmod(k, narrow ? 2.0 : 10.0) == 0) yt.push_back(t);
    }
    return yt;
  }
  for (double e = std::floor(f.ylo); e <= f.yhi; e += 1)
    for (double m : {1.0, 2.0, 5.0}) {
      const double t = e + std::log10(m);
      if ((narrow || m == 1.0) && t >= f.ylo && t <= f.yhi) yt.push_back(t);
    }
  return yt;
}

// The y axis's ticks, in the axis's units.
std::vector<double> y_ticks(const Frame& f) {
  if (f.P.log_y) return log_ticks(f);
  if (!f.P.bytes_y) return ticks(f.ylo, f.yhi);
  // nice numbers in the binary unit of the range (KiB, MiB, GiB)
  std::vector<double> yt;
  const double unit = std::pow(1024.0, std::floor(std::log(std::max(std::fabs(f.yhi), 1.0)) / std::log(1024.0)));
  for (double t : ticks(f.ylo / unit, f.yhi / unit)) yt.push_back(t * unit);
  return yt;
}

// The title, the note, the plot area's frame and clip path.
void draw_heading(std::string& s, const Frame& f, const std::vector<std::string>& note) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "<text x=\"%d\" y=\"%.1f\" font-size=\"14\" font-weight=\"bold\">%s</text>\n", kLeft,
                f.y0 + 20, esc(f.P.title).c_str());
  s += buf;
  for (size_t i = 0; i < note.size(); ++i) {
    std::snprintf(buf, sizeof buf, "<text x=\"%d\" y=\"%.1f\" fill=\"#333\">%s</text>\n", kLeft, f.y0 + 36 + 15 * double(i),
                  esc(note[i]).c_str());
    s += buf;
  }
  std::snprintf(buf, sizeof buf,
                "<clipPath id=\"plot%zu\"><rect x=\"%d\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/></clipPath>\n"
                "<rect x=\"%d\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#444\"/>\n",
                f.index, kLeft, f.y0 + f.mt, f.pw, f.ph, kLeft, f.y0 + f.mt, f.pw, f.ph);
  s += buf;
}

// Grid lines with their tick labels, and the axes' labels.
void draw_axes(std::string& s, const Frame& f) {
  char buf[512];
  for (double t : ticks(f.xlo, f.xhi)) {
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%.1f\" "
                  "text-anchor=\"middle\">%s</text>\n",
                  f.X(t), f.X(t), f.y0 + f.mt, f.y0 + f.mt + f.ph, f.X(t), f.y0 + f.mt + f.ph + 16, fmt_num(t, false).c_str());
    s += buf;
  }
  for (double t : y_ticks(f)) {
    const double label = f.P.log_y ? std::pow(10.0, t) : t;
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%d\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%d\" y=\"%.1f\" "
                  "text-anchor=\"end\">%s</text>\n",
                  kLeft, kLeft + f.pw, f.Yt(t), f.Yt(t), kLeft - 6, f.Yt(t) + 4, fmt_num(label, f.P.bytes_y).c_str());
    s += buf;
  }
  std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", kLeft + f.pw / 2,
                f.y0 + f.panel_height - 8, esc(f.P.xlabel).c_str());
  s += buf;
  std::snprintf(buf, sizeof buf,
                "<text x=\"16\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 16 %.1f)\">%s%s</text>\n",
                f.y0 + f.mt + f.ph / 2, f.y0 + f.mt + f.ph / 2, esc(f.P.ylabel).c_str(), f.P.log_y ? " (log)" : "");
  s += buf;
}

void draw_hlines(std::string& s, const Frame& f) {
  char buf[512];
  for (const RefLine& l : f.P.hlines) {
    if (!f.inside(f.xlo, l.y)) continue;
    std::snprintf(buf, sizeof buf,
                  "<line class=\"hline\" x1=\"%d\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.4\"%s/>"
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"%s\">%s</text>\n",
                  kLeft, kLeft + f.pw, f.Y(l.y), f.Y(l.y), l.color.c_str(),
                  l.dash.empty() ? "" : (" stroke-dasharray=\"" + l.dash + "\"").c_str(), kLeft + f.pw - 4, f.Y(l.y) - 5,
                  l.color.c_str(), esc(l.label).c_str());
    s += buf;
  }
}

// A series' line, clipped to the plot area, and its point markers.
void draw_line(std::string& s, const Frame& f, const Series& se, const std::string& col, const std::string& dash) {
  char buf[512];
  std::string pts, marks;
  for (size_t i = 0; i < se.x.size() && i < se.y.size(); ++i) {
    if ((f.P.log_y && !(se.y[i] > 0)) || !std::isfinite(se.y[i])) continue;
    std::snprintf(buf, sizeof buf, "%.1f,%.1f ", f.X(se.x[i]), f.Y(se.y[i]));
    pts += buf;
    if (se.marker != Marker::None && i >= se.marker_offset && (i - se.marker_offset) % std::max<size_t>(se.marker_every, 1) == 0 &&
        f.inside(se.x[i], se.y[i]))
      marks += marker_svg(se.marker, f.X(se.x[i]), f.Y(se.y[i]), 3.5, col, col, 1);
  }
  s += "<polyline class=\"series\" data-label=\"";
  s += esc(se.label);
  s += "\" fill=\"none\" stroke-width=\"1.8\" stroke=\"";
  s += col;
  s += "\"";
  s += dash;
  s += " clip-path=\"url(#plot" + std::to_string(f.index) + ")\" points=\"";
  s += pts;
  s += "\"/>\n";
  if (!marks.empty()) {
    s += "<g class=\"markers\">";
    s += marks;
    s += "</g>\n";
  }
}

// A series' marks: larger open markers, with their labels.
void draw_marks(std::string& s, const Frame& f, const Series& se, const std::string& col) {
  char buf[512];
  for (const Mark& m : se.marks) {
    if (!f.inside(m.x, m.y)) continue;
    s += "<g class=\"mark\">" +
         marker_svg(se.marker == Marker::None ? Marker::Circle : se.marker, f.X(m.x), f.Y(m.y), 6.5, col, "white", 2.2);
    if (!m.label.empty()) {
      std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">%s</text>", f.X(m.x) + 9, f.Y(m.y) - 8, col.c_str(),
                    esc(m.label).c_str());
      s += buf;
    }
    s += "</g>\n";
  }
}

// Series k's entry in the legend column: its line, its marker, its label.
void draw_legend_entry(std::string& s, const Frame& f, const Series& se, size_t k, const std::string& col, const std::string& dash) {
  char buf[512];
  const double ly = f.y0 + f.mt + 10 + double(k) * 16, lx = kLeft + f.pw + 10;
  std::snprintf(buf, sizeof buf,
                "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2.5\"%s/>", lx, lx + 26, ly,
                ly, col.c_str(), dash.c_str());
  s += buf;
  s += marker_svg(se.marker, lx + 13, ly, 3.5, col, col, 1);
  std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", lx + 31, ly + 4, esc(se.label).c_str());
  s += buf;
}

void draw_series(std::string& s, const Frame& f) {
  for (size_t k = 0; k < f.P.series.size(); ++k) {
    const Series& se = f.P.series[k];
    const std::string col = se.color.empty() ? series_color(k) : se.color;
    const std::string dash = se.dash.empty() ? "" : " stroke-dasharray=\"" + se.dash + "\"";
    draw_line(s, f, se, col, dash);
    draw_marks(s, f, se, col);
    draw_legend_entry(s, f, se, k, col, dash);
  }
}

}  // namespace

std::string series_color(size_t i) { return kColors[i % (sizeof kColors / sizeof *kColors)]; }

std::string render_svg(const std::vector<Panel>& panels, int width, int panel_height) {
  size_t longest = 0;
  for (const Panel& P : panels)
    for (const Series& se : P.series) longest = std::max(longest, se.label.size());
  const int mr = std::max(200, 50 + int(6.6 * double(longest)));  // the legend column: about 6.6 px per character
  const int height = int(panels.size()) * panel_height;
  std::string s;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                width, height, width, height);
  s += buf;
  for (size_t p = 0; p < panels.size(); ++p) {
    const std::vector<std::string> note = note_lines(panels[p].note);
    const int mt = 34 + 15 * int(note.size());
    Frame f{panels[p], p, mt, panel_height, double(p) * panel_height, double(width - kLeft - mr), double(panel_height - mt - kBottom)};
    fit_ranges(f);
    draw_heading(s, f, note);
    draw_axes(s, f);
    draw_hlines(s, f);
    draw_series(s, f);
  }
  s += "</svg>\n";
  return s;
}

}  // namespace segtape::agent
