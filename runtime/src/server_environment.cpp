#include "server_environment.h"

#include <optional>
#include <string_view>

namespace kiln::rt {

namespace {

constexpr std::string_view kVisible = "CUDA_VISIBLE_DEVICES=";
constexpr std::string_view kCacheDisable = "CUDA_CACHE_DISABLE=";

}  // namespace

std::vector<std::string> compile_server_environment(const char* const* parent) {
  std::vector<std::string> env;
  std::optional<std::string_view> visible;
  bool cache_off = false;
  for (const char* const* p = parent; p && *p; ++p) {
    const std::string_view entry(*p);
    if (entry.starts_with(kVisible)) {
      visible = entry.substr(kVisible.size());
      continue;
    }
    if (entry.starts_with(kCacheDisable)) cache_off = entry.substr(kCacheDisable.size()) == "1";
    env.emplace_back(entry);
  }
  std::string_view shown = "0";
  if (cache_off)
    shown = "";
  else if (visible)
    shown = visible->substr(0, visible->find(','));
  env.push_back(std::string(kVisible) + std::string(shown));
  return env;
}

}  // namespace kiln::rt
