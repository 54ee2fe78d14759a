// mnist-train's progress line: samples/s and the time left, from readings taken where the
// trainer already reads a loss back, formatted for one terminal line.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "../../examples/mnist/progress.h"
#include "progress_line.h"

TEST_CASE("format_rate and format_duration") {
  CHECK(mnist::format_rate(0) == "0");
  CHECK(mnist::format_rate(950.4) == "950");
  CHECK(mnist::format_rate(52'340) == "52.3k");
  CHECK(mnist::format_rate(1'254'000) == "1.25M");
  CHECK(mnist::format_rate(NAN) == "?");
  CHECK(kiln::cli::format_duration(0.2) == "0s");
  CHECK(kiln::cli::format_duration(42.4) == "42s");
  CHECK(kiln::cli::format_duration(185) == "3m05s");
  CHECK(kiln::cli::format_duration(3720) == "1h02m");
  CHECK(kiln::cli::format_duration(NAN) == "?");
  CHECK(kiln::cli::format_duration(INFINITY) == "?");
}

TEST_CASE("RateMeter: the first reading's interval (compiles, capture) is not counted after it") {
  mnist::RateMeter m;
  CHECK(std::isnan(m.samples_per_s()));
  CHECK(std::isnan(m.seconds_left(1000)));
  m.record(2.0, 100);                               // a slow first interval: kernels compiled
  CHECK(m.samples_per_s() == doctest::Approx(50));  // one reading: the rate since the start
  CHECK(m.seconds_left(1000) == doctest::Approx(18));
  m.record(3.0, 1100);
  CHECK(m.samples_per_s() == doctest::Approx(1000));  // (1100 - 100) / (3 - 2)
  CHECK(m.seconds_left(6100) == doctest::Approx(5));
  m.record(4.0, 6100);
  CHECK(m.seconds_left(6100) == 0);
  mnist::RateMeter instant;
  instant.record(0, 10);  // no time elapsed yet: unknown, not infinite
  CHECK(std::isnan(instant.samples_per_s()));
}

TEST_CASE("progress_line shows the bar, step, loss, samples/s and the time left") {
  const std::string line = mnist::progress_line({.epoch = 3,
                                                 .epochs = 10,
                                                 .step = 235,
                                                 .steps = 469,
                                                 .loss = 0.23456,
                                                 .samples_per_s = 52'340,
                                                 .seconds_left = 185});
  CHECK(line == "epoch 3/10 [========        ] 235/469 loss 0.2346, 52.3k samples/s, ETA 3m05s");
  CHECK(line.size() < 80);  // one line of a standard terminal, so '\r' redraws it in place
  const std::string unknown = mnist::progress_line(
      {.epoch = 1, .epochs = 1, .step = 1, .steps = 1, .loss = 2.5, .samples_per_s = NAN, .seconds_left = NAN});
  CHECK(unknown == "epoch 1/1 [================] 1/1 loss 2.5000, ? samples/s, ETA ?");
}

TEST_CASE("long_run_note: one line when the rest of a run takes two minutes or more, else nothing") {
  // The cnn before the CPU fast path: 26 samples/s over 5 epochs of 60,000.
  CHECK(mnist::long_run_note(26, 300'000) ==
        "mnist-train: on the CPU this run will take about 3h12m (26 samples/s); a GPU takes seconds");
  CHECK(mnist::long_run_note(2'000, 1'440'000) ==
        "mnist-train: on the CPU this run will take about 12m00s (2000 samples/s); a GPU takes seconds");
  CHECK(mnist::long_run_note(26'000, 600'000).empty());  // the mlp: 23 s
  CHECK(mnist::long_run_note(1'000, 119'000).empty());   // just under the threshold
  CHECK(mnist::long_run_note(NAN, 600'000).empty());
  CHECK(mnist::long_run_note(0, 600'000).empty());
}
