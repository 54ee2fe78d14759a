#pragma once
// GPU suites that need NCCL skip, with the reason as a message, where it does not load.
#include <doctest/doctest.h>

#include <string>

#include "kiln/dist.h"

namespace kiln_test {

inline bool nccl_or_skip() {
  std::string why;
  if (kiln::dist::nccl_available(&why)) return true;
  MESSAGE("skipped: NCCL does not load: " << why);
  return false;
}

}  // namespace kiln_test
