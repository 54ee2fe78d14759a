// rt::env_switch, the on/off environment switches (KILN_PDL, KILN_GRAD_STREAM): unset or empty
// keep the default, on and off set it, any other word keeps the default.
#include <doctest/doctest.h>

#include "kiln/runtime/log.h"
#include "scoped_env.h"

using kiln::rt::env_switch;

TEST_CASE("env_switch: on, off, unset, empty and a malformed word") {
  constexpr const char* kName = "KILN_TEST_SWITCH";
  {
    const kiln_test::ScopedEnv env{{kName, std::nullopt}};
    CHECK(env_switch(kName, true, "test"));
    CHECK_FALSE(env_switch(kName, false, "test"));
  }
  {
    const kiln_test::ScopedEnv env{{kName, ""}};
    CHECK(env_switch(kName, true, "test"));
  }
  {
    const kiln_test::ScopedEnv env{{kName, "on"}};
    CHECK(env_switch(kName, false, "test"));
  }
  {
    const kiln_test::ScopedEnv env{{kName, "off"}};
    CHECK_FALSE(env_switch(kName, true, "test"));
  }
  {
    const kiln_test::ScopedEnv env{{kName, "yes"}};  // warned about, the default kept
    CHECK(env_switch(kName, true, "test"));
    CHECK_FALSE(env_switch(kName, false, "test"));
  }
}
