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

}  // namespace

std::string series_color(size_t i) { return kColors[i % (sizeof kColors / sizeof *kColors)]; }

std::string render_svg(const std::vector<Panel>& panels, int width, int panel_height) {
  size_t longest = 0;
  for (const Panel& P : panels)
    for (const Series& se : P.series) longest = std::max(longest, se.label.size());
  const int ml = 90, mb = 46;
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
    const Panel& P = panels[p];
    std::vector<std::string> note;
    for (size_t a = 0; !P.note.empty() && a <= P.note.size();) {
      const size_t e = std::min(P.note.find('\n', a), P.note.size());
      note.push_back(P.note.substr(a, e - a));
      a = e + 1;
    }
    const int mt = 34 + 15 * int(note.size());
    const double y0 = double(p) * panel_height;
    const double pw = width - ml - mr, ph = panel_height - mt - mb;
    double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
    auto ty = [&](double v) { return P.log_y ? std::log10(v) : v; };
    auto take_y = [&](double v) {
      if ((P.log_y && !(v > 0)) || !std::isfinite(v)) return;
      ylo = std::min(ylo, ty(v)), yhi = std::max(yhi, ty(v));
    };
    for (const Series& se : P.series)
      for (size_t i = 0; i < se.x.size() && i < se.y.size(); ++i) {
        if (P.log_y && !(se.y[i] > 0)) continue;
        if (!std::isfinite(se.y[i]) || !std::isfinite(se.x[i])) continue;
        xlo = std::min(xlo, se.x[i]), xhi = std::max(xhi, se.x[i]);
        take_y(se.y[i]);
      }
    for (const RefLine& l : P.hlines) take_y(l.y);
    if (!std::isfinite(xlo)) xlo = 0, xhi = 1;
    if (!std::isfinite(ylo)) ylo = 0, yhi = 1;
    if (xhi == xlo) xhi = xlo + 1;
    if (yhi == ylo) yhi = ylo + (P.log_y ? 1 : std::max(1.0, std::fabs(ylo) * 0.1));
    if (!P.log_y && ylo > 0 && ylo < 0.5 * yhi) ylo = 0;  // anchor at zero when it is near
    const double pad = (yhi - ylo) * 0.05;
    yhi += pad;
    if (P.log_y || ylo != 0) ylo -= pad;
    if (P.y_min && (!P.log_y || *P.y_min > 0)) ylo = ty(*P.y_min);
    if (P.y_max && (!P.log_y || *P.y_max > 0)) yhi = ty(*P.y_max);
    if (!(yhi > ylo)) yhi = ylo + 1;
    auto X = [&](double v) { return ml + (v - xlo) / (xhi - xlo) * pw; };
    auto Y = [&](double v) { return y0 + mt + ph - (ty(v) - ylo) / (yhi - ylo) * ph; };
    auto Yt = [&](double tv) { return y0 + mt + ph - (tv - ylo) / (yhi - ylo) * ph; };
    auto inside = [&](double x, double y) {
      return std::isfinite(y) && (!P.log_y || y > 0) && ty(y) >= ylo && ty(y) <= yhi && x >= xlo && x <= xhi;
    };
    std::snprintf(buf, sizeof buf, "<text x=\"%d\" y=\"%.1f\" font-size=\"14\" font-weight=\"bold\">%s</text>\n", ml,
                  y0 + 20, esc(P.title).c_str());
    s += buf;
    for (size_t i = 0; i < note.size(); ++i) {
      std::snprintf(buf, sizeof buf, "<text x=\"%d\" y=\"%.1f\" fill=\"#333\">%s</text>\n", ml, y0 + 36 + 15 * double(i),
                    esc(note[i]).c_str());
      s += buf;
    }
    std::snprintf(buf, sizeof buf,
                  "<clipPath id=\"plot%zu\"><rect x=\"%d\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/></clipPath>\n"
                  "<rect x=\"%d\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#444\"/>\n",
                  p, ml, y0 + mt, pw, ph, ml, y0 + mt, pw, ph);
    s += buf;
    for (double t : ticks(xlo, xhi)) {
      std::snprintf(buf, sizeof buf,
                    "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%.1f\" "
                    "text-anchor=\"middle\">%s</text>\n",
                    X(t), X(t), y0 + mt, y0 + mt + ph, X(t), y0 + mt + ph + 16, fmt_num(t, false).c_str());
      s += buf;
    }
    std::vector<double> yt;
    if (P.log_y) {
      // Decades (or, for bytes, powers of 1024), with 1-2-5 (powers of 4) between them when the range is narrow.
      const bool narrow = yhi - ylo < 2.5;
      if (P.bytes_y) {
        const double l2 = std::log2(10.0);
        for (double k = std::floor(ylo * l2); k <= std::ceil(yhi * l2); k += 1) {
          const double t = k / l2;
          if (t >= ylo && t <= yhi && std::fmod(k, narrow ? 2.0 : 10.0) == 0) yt.push_back(t);
        }
      } else {
        for (double e = std::floor(ylo); e <= yhi; e += 1)
          for (double m : {1.0, 2.0, 5.0}) {
            const double t = e + std::log10(m);
            if ((narrow || m == 1.0) && t >= ylo && t <= yhi) yt.push_back(t);
          }
      }
    }
    if (!P.log_y && P.bytes_y) {  // nice numbers in the binary unit of the range (KiB, MiB, GiB)
      const double unit = std::pow(1024.0, std::floor(std::log(std::max(std::fabs(yhi), 1.0)) / std::log(1024.0)));
      for (double t : ticks(ylo / unit, yhi / unit)) yt.push_back(t * unit);
    } else if (!P.log_y) {
      yt = ticks(ylo, yhi);
    }
    for (double t : yt) {
      const double label = P.log_y ? std::pow(10.0, t) : t;
      std::snprintf(buf, sizeof buf,
                    "<line x1=\"%d\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%d\" y=\"%.1f\" "
                    "text-anchor=\"end\">%s</text>\n",
                    ml, ml + pw, Yt(t), Yt(t), ml - 6, Yt(t) + 4, fmt_num(label, P.bytes_y).c_str());
      s += buf;
    }
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", ml + pw / 2,
                  y0 + panel_height - 8, esc(P.xlabel).c_str());
    s += buf;
    std::snprintf(buf, sizeof buf,
                  "<text x=\"16\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 16 %.1f)\">%s%s</text>\n",
                  y0 + mt + ph / 2, y0 + mt + ph / 2, esc(P.ylabel).c_str(), P.log_y ? " (log)" : "");
    s += buf;
    for (const RefLine& l : P.hlines) {
      if (!inside(xlo, l.y)) continue;
      std::snprintf(buf, sizeof buf,
                    "<line class=\"hline\" x1=\"%d\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.4\"%s/>"
                    "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"%s\">%s</text>\n",
                    ml, ml + pw, Y(l.y), Y(l.y), l.color.c_str(),
                    l.dash.empty() ? "" : (" stroke-dasharray=\"" + l.dash + "\"").c_str(), ml + pw - 4, Y(l.y) - 5,
                    l.color.c_str(), esc(l.label).c_str());
      s += buf;
    }
    for (size_t k = 0; k < P.series.size(); ++k) {
      const Series& se = P.series[k];
      const std::string col = se.color.empty() ? series_color(k) : se.color;
      const std::string dash = se.dash.empty() ? "" : " stroke-dasharray=\"" + se.dash + "\"";
      std::string pts, marks;
      for (size_t i = 0; i < se.x.size() && i < se.y.size(); ++i) {
        if ((P.log_y && !(se.y[i] > 0)) || !std::isfinite(se.y[i])) continue;
        std::snprintf(buf, sizeof buf, "%.1f,%.1f ", X(se.x[i]), Y(se.y[i]));
        pts += buf;
        if (se.marker != Marker::None && i >= se.marker_offset && (i - se.marker_offset) % std::max<size_t>(se.marker_every, 1) == 0 &&
            inside(se.x[i], se.y[i]))
          marks += marker_svg(se.marker, X(se.x[i]), Y(se.y[i]), 3.5, col, col, 1);
      }
      s += "<polyline class=\"series\" data-label=\"";
      s += esc(se.label);
      s += "\" fill=\"none\" stroke-width=\"1.8\" stroke=\"";
      s += col;
      s += "\"";
      s += dash;
      s += " clip-path=\"url(#plot" + std::to_string(p) + ")\" points=\"";
      s += pts;
      s += "\"/>\n";
      if (!marks.empty()) {
        s += "<g class=\"markers\">";
        s += marks;
        s += "</g>\n";
      }
      for (const Mark& m : se.marks) {
        if (!inside(m.x, m.y)) continue;
        s += "<g class=\"mark\">" +
             marker_svg(se.marker == Marker::None ? Marker::Circle : se.marker, X(m.x), Y(m.y), 6.5, col, "white", 2.2);
        if (!m.label.empty()) {
          std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">%s</text>", X(m.x) + 9, Y(m.y) - 8, col.c_str(),
                        esc(m.label).c_str());
          s += buf;
        }
        s += "</g>\n";
      }
      const double ly = y0 + mt + 10 + double(k) * 16, lx = ml + pw + 10;
      std::snprintf(buf, sizeof buf,
                    "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2.5\"%s/>", lx, lx + 26, ly,
                    ly, col.c_str(), dash.c_str());
      s += buf;
      s += marker_svg(se.marker, lx + 13, ly, 3.5, col, col, 1);
      std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", lx + 31, ly + 4, esc(se.label).c_str());
      s += buf;
    }
  }
  s += "</svg>\n";
  return s;
}

}  // namespace segtape::agent
