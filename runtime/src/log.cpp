#include "kiln/runtime/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <string>

namespace kiln::rt {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::get("kiln");
    if (!l) l = spdlog::stderr_color_mt("kiln");
    l->set_pattern("[%H:%M:%S.%e] [kiln] [%^%l%$] %v");
    l->set_level(spdlog::level::warn);
    if (const char* env = std::getenv("KILN_LOG_LEVEL")) {
      auto level = spdlog::level::from_str(env);  // unknown names map to off
      if (level == spdlog::level::off && std::string(env) != "off") {
        l->warn("KILN_LOG_LEVEL='{}' is not one of trace|debug|info|warn|error|off; using warn", env);
      } else {
        l->set_level(level);
      }
    }
    return l;
  }();
  return *logger;
}

bool env_switch(const char* name, bool fallback, const char* who) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  if (std::string_view(v) == "on") return true;
  if (std::string_view(v) == "off") return false;
  log().warn("[{}] {}='{}' is not on or off: it stays {}", who, name, v, fallback ? "on" : "off");
  return fallback;
}

}  // namespace kiln::rt
