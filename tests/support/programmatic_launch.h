#pragma once
// GPU tests of programmatic dependent launch: the launch setting for one scope, and whether
// the device launches kernels early at all.
#include "kiln/runtime/device.h"
#include "kiln/runtime/launch.h"

namespace kiln_test {

// Sets programmatic launch for one scope, then restores it (also when a check throws).
struct ProgrammaticLaunch {
  bool before = kiln::rt::programmatic_launch();
  explicit ProgrammaticLaunch(bool on) { kiln::rt::set_programmatic_launch(on); }
  ~ProgrammaticLaunch() { kiln::rt::set_programmatic_launch(before); }
  ProgrammaticLaunch(const ProgrammaticLaunch&) = delete;
  ProgrammaticLaunch& operator=(const ProgrammaticLaunch&) = delete;
};

// The device can start a kernel before the one ahead of it finishes (sm_90 or later).
inline bool launches_early() { return kiln::rt::device_info(0).arch() >= 90; }

}  // namespace kiln_test
