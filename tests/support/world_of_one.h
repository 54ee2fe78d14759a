#pragma once
// A process group of one rank through NCCL on cuda:0, for the GPU suites: the launcher's
// variables set while it lives, the NCCL id passed through a file in a scratch folder. Check
// kiln_test::nccl_or_skip() first.
#include <optional>

#include "kiln/dist.h"
#include "scoped_env.h"
#include "temp_dir.h"

namespace kiln_test {

struct WorldOfOne {
  TempDir tmp;
  ScopedEnv env{{"RANK", "0"},
                {"WORLD_SIZE", "1"},
                {"LOCAL_RANK", "0"},
                {"KILN_DIST_ID_FILE", tmp.file("nccl-id")},
                {"MASTER_ADDR", std::nullopt},
                {"MASTER_PORT", std::nullopt}};
  kiln::dist::ProcessGroup group = kiln::dist::ProcessGroup::init();
};

}  // namespace kiln_test
