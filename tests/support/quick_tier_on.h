#pragma once
// The quick tier (and the deferred tuning it brings) switched on for a scope.
#include "kiln/runtime/quick_tier.h"

namespace kiln_test {

struct QuickTierOn {
  bool was = kiln::rt::quick_tier();
  QuickTierOn() { kiln::rt::set_quick_tier(true); }
  ~QuickTierOn() { kiln::rt::set_quick_tier(was); }
  QuickTierOn(const QuickTierOn&) = delete;
  QuickTierOn& operator=(const QuickTierOn&) = delete;
};

}  // namespace kiln_test
