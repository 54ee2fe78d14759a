#pragma once
// kiln's loggers. KILN_LOG_LEVEL=trace|debug|info|warn|error|off (default warn).
#include <memory>
#include <string_view>

// fmt 9's float formatting (fmt::detail::bigint, under spdlog) trips GCC 13's -Warray-bounds
// (with that one off, -Wstringop-overflow) in std::copy: a false positive of that pairing
// (fmtlib/fmt#3533), reported inside fmt's own code.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Warray-bounds="
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#pragma GCC diagnostic ignored "-Wstringop-overflow="
#endif
#include <spdlog/spdlog.h>
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 13
#pragma GCC diagnostic pop
#endif

namespace kiln::rt {
spdlog::logger& log();  // the "kiln" logger
// An on/off environment switch: unset or empty gives `fallback`; any other word than on or off
// is warned about (as `who` says) and gives `fallback`.
bool env_switch(const char* name, bool fallback, const char* who);
}  // namespace kiln::rt
