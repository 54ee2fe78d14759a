#pragma once
// kiln's loggers. KILN_LOG_LEVEL=trace|debug|info|warn|error|off (default warn).
#include <memory>
#include <string_view>

#include <spdlog/spdlog.h>

namespace kiln::rt {
spdlog::logger& log();  // the "kiln" logger
}  // namespace kiln::rt
