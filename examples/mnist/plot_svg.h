#pragma once
// Line charts as one self-contained SVG file (no script, no external font or style): panels
// stacked over a shared x axis, each with its own y axis, grid, and a legend beside it.
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mnist {

struct PlotSeries {
  std::string id;                                 // the <polyline>'s id and class, e.g. "train-loss"
  std::string label;                              // legend text
  std::string color;                              // an SVG colour, e.g. "#1f77b4"
  std::vector<std::pair<double, double>> points;  // (x, y); a non-finite y is left out
};

struct PlotPanel {
  std::string y_label;
  std::vector<PlotSeries> series;
  double y_scale = 1;      // 100 draws fractions as percentages
  bool from_zero = false;  // the y axis starts at 0 (losses) instead of the lowest value
};

struct Chart {
  std::vector<std::string> title;  // one <text> line each
  std::string x_label;
  std::vector<PlotPanel> panels;
};

std::string render_svg(const Chart& chart);

// Evenly spaced round values (1, 2, 2.5 or 5 times a power of ten, at least min_step apart)
// from at or below lo to at or above hi, about `target` of them; lo == hi is widened.
std::vector<double> nice_ticks(double lo, double hi, int target = 5, double min_step = 0);

// `text` as XML character data or attribute value: &<>"' escaped, and the control characters
// XML 1.0 cannot hold replaced by '?'.
std::string xml_escape(std::string_view text);

}  // namespace mnist
