// Training curves: the SVG writer (well-formed XML, one <polyline> per curve with one point per
// metrics row), mnist-train --plot end to end on the CPU, and tools/plot_metrics.py's errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "../../examples/mnist/plot_svg.h"
#include "mnist_train_util.h"
#include "tiny_xml.h"

using namespace mnist_test;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while ((i = s.find_first_not_of(' ', i)) != std::string::npos) {
    const std::size_t end = s.find(' ', i);
    out.push_back(s.substr(i, end - i));
    i = end;
  }
  return out;
}

// The <polyline class="series ..."> elements by id, each checked to have only "x,y" points.
std::map<std::string, std::vector<std::string>> series_points(const tiny_xml::Element& svg) {
  std::vector<const tiny_xml::Element*> lines;
  tiny_xml::find_all(svg, "polyline", lines);
  std::map<std::string, std::vector<std::string>> out;
  for (const tiny_xml::Element* l : lines) {
    CHECK(l->attrs.at("class").rfind("series ", 0) == 0);
    const std::vector<std::string> points = split(l->attrs.at("points"));
    for (const std::string& p : points) {
      CAPTURE(p);
      CHECK(p.find(',') != std::string::npos);
      CHECK(std::isfinite(std::stod(p)));
      CHECK(std::isfinite(std::stod(p.substr(p.find(',') + 1))));
    }
    CHECK(out.emplace(l->attrs.at("id"), points).second);  // one polyline per series
  }
  return out;
}

std::string all_text(const tiny_xml::Element& e) {
  std::string out = e.text;
  for (const auto& c : e.children) out.append("\n").append(all_text(c));
  return out;
}

}  // namespace

TEST_CASE("tiny_xml accepts well-formed XML and refuses what is not") {
  const tiny_xml::Element e =
      tiny_xml::parse("<?xml version=\"1.0\"?>\n<a x='1' y=\"&lt;&amp;\"><b/>t&#65;<!-- c --></a>\n");
  CHECK(e.attrs.at("y") == "<&");
  CHECK(e.children.size() == 1);
  CHECK(e.text == "tA");
  for (const char* bad : {"<a><b></a>", "<a>&foo;</a>", "<a x=1/>", "<a>x & y</a>", "<a x='1' x='2'/>", "<a/><b/>",
                          "<a>", "<a x='<'/>", "<!DOCTYPE a><a/>", "<a>1 < 2</a>"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(tiny_xml::parse(bad), std::runtime_error);
  }
}

TEST_CASE("nice_ticks: round, evenly spaced values covering the range") {
  auto same = [](const std::vector<double>& got, const std::vector<double>& want) {
    CAPTURE(got.size());
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-9));
  };
  same(mnist::nice_ticks(0, 0.37), {0, 0.1, 0.2, 0.3, 0.4});
  same(mnist::nice_ticks(96.2, 98.7), {96, 97, 98, 99});
  same(mnist::nice_ticks(96.2, 97.9), {96, 96.5, 97, 97.5, 98});
  same(mnist::nice_ticks(0, 3, 8, 1), {0, 1, 2, 3});  // whole epochs only
  same(mnist::nice_ticks(0, 3, 8), {0, 0.5, 1, 1.5, 2, 2.5, 3});
  for (const std::pair<double, double>& range :
       {std::pair{0.0, 10.0}, {1e-4, 3e-4}, {-2.5, 7.0}, {5.0, 5.0}, {0.0, 0.0}, {99.9, 100.0}}) {
    const double lo = range.first, hi = range.second;  // not a structured binding: clang 14's CAPTURE
    CAPTURE(lo);
    CAPTURE(hi);
    const std::vector<double> t = mnist::nice_ticks(lo, hi);
    REQUIRE(t.size() >= 2);
    CHECK(t.size() <= 11);
    CHECK(t.front() <= lo);
    CHECK(t.back() >= hi);
    const double step = t[1] - t[0];
    CHECK(step > 0);
    const double mantissa = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
    CHECK((std::abs(mantissa - 1) < 1e-6 || std::abs(mantissa - 2) < 1e-6 || std::abs(mantissa - 2.5) < 1e-6 ||
           std::abs(mantissa - 5) < 1e-6));
    for (std::size_t i = 1; i < t.size(); ++i) CHECK(t[i] - t[i - 1] == doctest::Approx(step));
  }
}

TEST_CASE("render_svg: well-formed with any title, one polyline per series, one point per finite value") {
  CHECK(mnist::xml_escape("a<b & \"c\" 'd'>\x01\tz") == "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;?\tz");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  mnist::PlotSeries a{"a", "loss <a> & \"b\"", "#123456", {{1, 0.5}, {2, 0.25}, {3, nan}, {3.25, 0.2}}};
  mnist::PlotSeries b{"b", "b", "#654321", {}};
  mnist::PlotSeries many{"many", "many", "red", {}};
  for (int i = 0; i < 100; ++i) many.points.emplace_back(i / 10.0, i % 7);
  const mnist::Chart chart{.title = {"run <1> & 'x'", "second line"},
                           .x_label = "epoch",
                           .panels = {{.y_label = "loss", .series = {a, b}, .from_zero = true},
                                      {.y_label = "%", .series = {many}, .y_scale = 100}}};
  const std::string svg = mnist::render_svg(chart);
  INFO(svg);
  const tiny_xml::Element root = tiny_xml::parse(svg);
  CHECK(root.name == "svg");
  CHECK(root.attrs.at("xmlns") == "http://www.w3.org/2000/svg");
  const auto series = series_points(root);
  REQUIRE(series.size() == 3);
  CHECK(series.at("a").size() == 3);  // the NaN is left out
  CHECK(series.at("b").empty());
  CHECK(series.at("many").size() == 100);
  const std::string text = all_text(root);
  for (const char* s : {"run <1> & 'x'", "second line", "loss <a> & \"b\"", "epoch"})
    CHECK(text.find(s) != std::string::npos);
  std::vector<const tiny_xml::Element*> circles;
  tiny_xml::find_all(root, "circle", circles);
  CHECK(circles.size() == 3);  // markers on the short series only
}

TEST_CASE("mnist-train --plot draws train and test loss and test accuracy, one point per metrics row") {
  Scratch s;
  const fs::path metrics = s.dir.path() / "m.jsonl", plot = s.dir.path() / "curves.svg";
  auto r = train({"--data", s.dir.path().string(), "--device", "cpu", "--epochs", "3", "--batch-size", "256", "--seed",
                  "4", "--metrics", metrics.string(), "--plot", plot.string()});
  REQUIRE(r.exit_code == 0);
  const auto rows = json_lines(metrics);
  REQUIRE(rows.size() == 3);
  const std::string svg = slurp(plot);
  INFO(svg);
  const tiny_xml::Element root = tiny_xml::parse(svg);
  const auto series = series_points(root);
  REQUIRE(series.size() == 3);
  for (const char* id : {"train-loss", "test-loss", "test-accuracy"}) {
    CAPTURE(id);
    REQUIRE(series.count(id) == 1);
    const std::vector<std::string>& points = series.at(id);
    CHECK(points.size() == rows.size());
    for (std::size_t i = 1; i < points.size(); ++i) CHECK(std::stod(points[i]) > std::stod(points[i - 1]));  // x grows
  }
  // Losses fall: in SVG coordinates y grows downwards.
  const auto& train_loss = series.at("train-loss");
  CHECK(std::stod(train_loss.back().substr(train_loss.back().find(',') + 1)) >
        std::stod(train_loss.front().substr(train_loss.front().find(',') + 1)));
  const std::string text = all_text(root);
  for (const char* want :
       {"mlp on cpu (eager steps), 3 epochs", "adam lr 0.001 (cosine), batch 256, precision default, seed 4", "train loss",
        "test loss", "test accuracy", "epoch", "test accuracy (%)"}) {
    CAPTURE(want);
    CHECK(text.find(want) != std::string::npos);
  }
  // Written by rename: no temporary file is left beside it.
  for (const auto& e : fs::directory_iterator(s.dir.path()))
    CHECK(e.path().string().find(".tmp-") == std::string::npos);
  if (std::system("python3 -c '' >/dev/null 2>&1") == 0) {  // a second, independent XML parser
    const std::string cmd =
        "python3 -c \"import sys, xml.etree.ElementTree as E; r = E.parse(sys.argv[1]).getroot(); "
        "sys.exit(len(r.findall('.//{http://www.w3.org/2000/svg}polyline')) != 3)\" " +
        plot.string();
    CHECK(std::system(cmd.c_str()) == 0);
  }
  auto help = train({"--help"});
  CHECK(help.out.find("--plot") != std::string::npos);
}

namespace {

bool python3_imports(const std::string& module) {
  return std::system(("python3 -c 'import " + module + "' >/dev/null 2>&1").c_str()) == 0;
}

kiln_test::ProcessResult plot_metrics(const std::vector<std::string>& args, kiln_test::EnvOverrides env = {}) {
  std::vector<std::string> argv{"/usr/bin/env", "python3", std::string(KILN_SOURCE_DIR) + "/tools/plot_metrics.py"};
  argv.insert(argv.end(), args.begin(), args.end());
  kiln_test::ProcessResult r = kiln_test::run_process(argv, env);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.exit_code < 128);
  return r;
}

constexpr const char* kTwoRows =
    "{\"epoch\":1,\"train_loss\":0.26,\"test_loss\":0.10,\"test_accuracy\":0.967,\"precision\":\"f32\"}\n"
    "{\"epoch\":2,\"train_loss\":0.08,\"test_loss\":0.07,\"test_accuracy\":0.976,\"precision\":\"f32\"}\n";

}  // namespace

TEST_CASE("plot_metrics.py: usage and input errors, and a clear message without matplotlib") {
  if (!python3_imports("json")) {
    MESSAGE("skipped: no python3");
    return;
  }
  jitcc_test::ScratchDir dir;
  const std::string good = (dir.path() / "a.jsonl").string(), out = (dir.path() / "c.png").string();
  std::ofstream(good) << kTwoRows;
  auto usage = [&](const std::vector<std::string>& args, const std::string& needle) {
    const auto r = plot_metrics(args);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(needle) != std::string::npos);
  };
  usage({}, "usage");
  usage({good}, "--output");
  usage({good, "-o", (dir.path() / "c.gif").string()}, ".png, .svg, .pdf");
  usage({good, good, "-o", out, "--label", "one"}, "1 --label for 2 files");

  auto bad_input = [&](const std::string& name, const std::string& text, const std::string& needle) {
    const std::string path = (dir.path() / name).string();
    std::ofstream(path) << text;
    const auto r = plot_metrics({good, path, "-o", out});
    CAPTURE(name);
    CHECK(r.exit_code == 1);
    CHECK(r.err.find(path) != std::string::npos);
    CHECK(r.err.find(needle) != std::string::npos);
  };
  bad_input("empty.jsonl", "\n", "no metrics rows");
  bad_input("broken.jsonl", std::string(kTwoRows) + "{\"epoch\":3,\n", ":3: expected a JSON object per line");
  bad_input("no-epoch.jsonl", "{\"train_loss\":0.2}\n", ":1: expected an object with a numeric \"epoch\"");
  bad_input("no-curve.jsonl", "{\"epoch\":1,\"seconds\":2}\n", "expected at least one of train_loss");
  bad_input("text-loss.jsonl", "{\"epoch\":1,\"train_loss\":\"low\"}\n", "expected a number for \"train_loss\"");
  const auto missing = plot_metrics({(dir.path() / "none.jsonl").string(), "-o", out});
  CHECK(missing.exit_code == 1);
  CHECK(missing.err.find("none.jsonl: cannot read it") != std::string::npos);

  // A matplotlib that fails to import stands in for none installed, whatever this machine has.
  fs::create_directories(dir.path() / "fake" / "matplotlib");
  std::ofstream(dir.path() / "fake" / "matplotlib" / "__init__.py") << "raise ImportError('not installed here')\n";
  const auto r = plot_metrics({good, "-o", out}, {{"PYTHONPATH", (dir.path() / "fake").string()}});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("pip install matplotlib") != std::string::npos);
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("plot_metrics.py draws several runs into PNG and SVG (when matplotlib is installed)") {
  if (!python3_imports("matplotlib")) {
    MESSAGE("skipped: python3 cannot import matplotlib");
    return;
  }
  jitcc_test::ScratchDir dir;
  const fs::path a = dir.path() / "compiled.jsonl", b = dir.path() / "eager.jsonl";
  std::ofstream(a) << kTwoRows;
  std::ofstream(b) << kTwoRows << "{\"epoch\":2.5,\"test_loss\":0.06,\"test_accuracy\":0.98}\n";
  for (const char* name : {"runs.png", "runs.svg"}) {
    const fs::path out = dir.path() / name;
    const auto r = plot_metrics({a.string(), b.string(), "-o", out.string(), "--title", "compiled vs eager"});
    CHECK(r.exit_code == 0);
    const std::string bytes = slurp(out);
    CHECK(bytes.find(name == std::string("runs.png") ? "\x89PNG" : "<svg") != std::string::npos);
  }
  for (const auto& e : fs::directory_iterator(dir.path())) CHECK(e.path().string().find(".tmp-") == std::string::npos);
}
