#include "progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

namespace mnist {

namespace {
constexpr int kWidth = 30;
constexpr std::int64_t kRedraws = 50;  // per epoch: each reads the loss back once
}  // namespace

Progress::Progress(int epoch, int epochs, std::int64_t steps)
    : epoch_(epoch), epochs_(epochs), steps_(steps), tty_(isatty(STDOUT_FILENO) != 0),
      start_(std::chrono::steady_clock::now()) {}

bool Progress::wants_loss(std::int64_t step) const {
  if (!tty_) return false;
  const std::int64_t every = std::max<std::int64_t>(1, steps_ / kRedraws);
  return step % every == 0 || step == steps_;
}

void Progress::update(std::int64_t step, double loss) {
  if (!tty_ || std::isnan(loss)) return;
  const int filled = static_cast<int>(kWidth * step / std::max<std::int64_t>(steps_, 1));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::printf("\repoch %d/%d [%.*s%*s] %lld/%lld loss %.4f %.1fs", epoch_, epochs_, filled,
              "==============================", kWidth - filled, "", static_cast<long long>(step),
              static_cast<long long>(steps_), loss, s);
  std::fflush(stdout);
}

void Progress::finish(const std::string& summary) {
  if (tty_) std::printf("\r\033[K");
  std::printf("epoch %d/%d %s\n", epoch_, epochs_, summary.c_str());
  std::fflush(stdout);
}

}  // namespace mnist
