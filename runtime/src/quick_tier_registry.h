#pragma once
// Which loaded functions are quick builds, and the full builds that replaced them: what an
// instantiated graph reads at launch to swap its nodes' functions.
#include <cstdint>
#include <optional>

#include "kiln/runtime/module_cache.h"

namespace kiln::rt {

void note_quick_build(void* handle);
bool is_quick_handle(void* handle);
// `full` replaces the quick build `quick` from now on; tier_generation() moves on.
void note_full_build(void* quick, const Function& full);
std::optional<Function> full_build_of(void* quick);
// Changes whenever a full build replaces a quick one: a graph whose count is older looks again.
std::uint64_t tier_generation();

}  // namespace kiln::rt
