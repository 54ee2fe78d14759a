#include "plot_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace mnist {

namespace {

// Pixel layout: the legend sits right of the plots so that it never covers a curve.
constexpr double kWidth = 820, kLeft = 72, kRight = 190, kPanelHeight = 210, kGap = 40, kBottom = 48;
constexpr double kTitleLine = 20;
constexpr std::size_t kMaxMarkers = 40;  // per series; past that the dots hide the line

struct Range {
  double lo, hi;
  std::vector<double> ticks;
};

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}
std::string px(double v) { return fixed(v, 2); }

// Decimals that print every multiple of `step` exactly (0.25 needs 2, 5 needs 0).
int decimals(double step) {
  for (int d = 0; d < 8; ++d) {
    const double scaled = step * std::pow(10.0, d);
    if (std::abs(scaled - std::round(scaled)) < 1e-6 * std::max(1.0, scaled)) return d;
  }
  return 8;
}

Range range_of(double lo, double hi, int target, double min_step) {
  Range r{0, 1, nice_ticks(lo, hi, target, min_step)};
  r.lo = r.ticks.front();
  r.hi = r.ticks.back();
  return r;
}

bool all_whole(const std::vector<PlotPanel>& panels) {
  for (const PlotPanel& p : panels)
    for (const PlotSeries& s : p.series)
      for (const auto& [x, y] : s.points)
        if (x != std::floor(x)) return false;
  return true;
}

class Writer {
 public:
  explicit Writer(const Chart& c) : chart_(c) {
    double max_x = 0;
    for (const PlotPanel& p : c.panels)
      for (const PlotSeries& s : p.series)
        for (const auto& [x, y] : s.points)
          if (std::isfinite(x)) max_x = std::max(max_x, x);
    // Whole epochs get whole-number ticks; quarter-epoch points allow fractional ones.
    x_ = range_of(0, max_x > 0 ? max_x : 1, 8, all_whole(c.panels) ? 1 : 0);
    top_ = 16 + kTitleLine * static_cast<double>(std::max<std::size_t>(c.title.size(), 1)) + 12;
    const double n = static_cast<double>(c.panels.size());
    height_ = top_ + n * kPanelHeight + std::max(0.0, n - 1) * kGap + kBottom;
  }

  std::string svg() {
    out_ += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    out_ += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(kWidth) + "\" height=\"" + px(height_) +
            "\" viewBox=\"0 0 " + px(kWidth) + " " + px(height_) +
            "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
    std::string whole_title;
    for (const std::string& line : chart_.title) whole_title += (whole_title.empty() ? "" : "; ") + line;
    out_ += "<title>" + xml_escape(whole_title) + "</title>\n";
    out_ += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    for (std::size_t i = 0; i < chart_.title.size(); ++i)
      out_ += text(kWidth / 2, 22 + kTitleLine * static_cast<double>(i), chart_.title[i],
                   i == 0 ? "class=\"title\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\""
                          : "class=\"subtitle\" text-anchor=\"middle\" font-size=\"12\"");
    for (std::size_t i = 0; i < chart_.panels.size(); ++i)
      panel(chart_.panels[i], top_ + static_cast<double>(i) * (kPanelHeight + kGap), i + 1 == chart_.panels.size());
    out_ += "</svg>\n";
    return out_;
  }

 private:
  static std::string text(double x, double y, const std::string& s, const std::string& attrs) {
    return "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\" " + attrs + ">" + xml_escape(s) + "</text>\n";
  }
  static std::string line(double x1, double y1, double x2, double y2) {
    return "<line x1=\"" + px(x1) + "\" y1=\"" + px(y1) + "\" x2=\"" + px(x2) + "\" y2=\"" + px(y2) + "\"/>\n";
  }

  void panel(const PlotPanel& p, double top, bool last) {
    const double w = kWidth - kLeft - kRight, bottom = top + kPanelHeight;
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (const PlotSeries& s : p.series)
      for (const auto& [x, y] : s.points)
        if (std::isfinite(y)) lo = std::min(lo, y * p.y_scale), hi = std::max(hi, y * p.y_scale);
    if (lo > hi) lo = 0, hi = 1;  // nothing to draw: an empty frame
    if (p.from_zero) lo = std::min(lo, 0.0);
    const Range y = range_of(lo, hi, 5, 0);
    auto to_x = [&](double v) { return kLeft + (v - x_.lo) / (x_.hi - x_.lo) * w; };
    auto to_y = [&](double v) { return bottom - (v - y.lo) / (y.hi - y.lo) * kPanelHeight; };

    out_ += "<g class=\"panel\">\n<g class=\"grid\" stroke=\"#e3e3e3\" stroke-width=\"1\">\n";
    for (double t : y.ticks) out_ += line(kLeft, to_y(t), kLeft + w, to_y(t));
    for (double t : x_.ticks) out_ += line(to_x(t), top, to_x(t), bottom);
    out_ += "</g>\n<rect x=\"" + px(kLeft) + "\" y=\"" + px(top) + "\" width=\"" + px(w) + "\" height=\"" +
            px(kPanelHeight) + "\" fill=\"none\" stroke=\"#444\"/>\n";
    out_ += "<g class=\"y-ticks\" text-anchor=\"end\" fill=\"#333\">\n";
    const int yd = decimals(y.ticks.size() > 1 ? y.ticks[1] - y.ticks[0] : 1);
    for (double t : y.ticks) out_ += text(kLeft - 6, to_y(t) + 4, fixed(t, yd), "");
    out_ += "</g>\n<g class=\"x-ticks\" text-anchor=\"middle\" fill=\"#333\">\n";
    const int xd = decimals(x_.ticks.size() > 1 ? x_.ticks[1] - x_.ticks[0] : 1);
    for (double t : x_.ticks) out_ += text(to_x(t), bottom + 16, fixed(t, xd), "");
    out_ += "</g>\n";
    if (last)  // the panels share their x axis: named once, under the lowest
      out_ +=
          text(kLeft + w / 2, bottom + 36, chart_.x_label, "class=\"x-label\" text-anchor=\"middle\" font-size=\"13\"");
    const double mid = top + kPanelHeight / 2;
    out_ +=
        text(20, mid, p.y_label,
             "class=\"y-label\" text-anchor=\"middle\" font-size=\"13\" transform=\"rotate(-90 20 " + px(mid) + ")\"");

    for (const PlotSeries& s : p.series) {
      std::string points;
      std::size_t n = 0;
      for (const auto& [x, v] : s.points) {
        if (!std::isfinite(x) || !std::isfinite(v)) continue;
        if (n++) points += ' ';
        points += px(to_x(x)) + "," + px(to_y(v * p.y_scale));
      }
      const std::string id = xml_escape(s.id), color = xml_escape(s.color);
      out_ += "<polyline id=\"" + id + "\" class=\"series " + id + "\" fill=\"none\" stroke=\"" + color +
              "\" stroke-width=\"2\" stroke-linejoin=\"round\" points=\"" + points + "\"/>\n";
      if (n > kMaxMarkers) continue;
      out_ += "<g class=\"markers " + id + "\" fill=\"" + color + "\">\n";
      for (const auto& [x, v] : s.points)
        if (std::isfinite(x) && std::isfinite(v))
          out_ += "<circle cx=\"" + px(to_x(x)) + "\" cy=\"" + px(to_y(v * p.y_scale)) + "\" r=\"3\"/>\n";
      out_ += "</g>\n";
    }

    out_ += "<g class=\"legend\">\n";
    for (std::size_t i = 0; i < p.series.size(); ++i) {
      const double lx = kLeft + w + 16, ly = top + 14 + 20 * static_cast<double>(i);
      out_ += "<line x1=\"" + px(lx) + "\" y1=\"" + px(ly) + "\" x2=\"" + px(lx + 24) + "\" y2=\"" + px(ly) +
              "\" stroke=\"" + xml_escape(p.series[i].color) + "\" stroke-width=\"2\"/>\n";
      out_ += text(lx + 30, ly + 4, p.series[i].label, "");
    }
    out_ += "</g>\n</g>\n";
  }

  const Chart& chart_;
  Range x_;
  double top_ = 0, height_ = 0;
  std::string out_;
};

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target, double min_step) {
  if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi) return {0, 1};
  if (hi - lo <= 1e-12 * std::max(1.0, std::abs(hi))) {
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.01;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(1, target - 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * mag;
  for (double m : {1.0, 2.0, 2.5, 5.0})
    if (m * mag >= raw * (1 - 1e-9)) {
      step = m * mag;
      break;
    }
  step = std::max(step, min_step);
  const double first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
  std::vector<double> ticks;
  for (double k = first; k <= last; ++k) ticks.push_back(k == 0 ? 0.0 : k * step);  // no -0
  if (ticks.size() == 1) ticks.push_back(ticks[0] + step);
  return ticks;
}

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        const auto u = static_cast<unsigned char>(c);
        out += (u < 0x20 && c != '\t' && c != '\n' && c != '\r') ? '?' : c;
    }
  }
  return out;
}

std::string render_svg(const Chart& chart) { return Writer(chart).svg(); }

}  // namespace mnist
