// The walk behind kiln_kernel_sources: one well-formed line per registered (op, dtypes, variant),
// the same listing every time (the lead diffs two listings to prove a template move changed nothing).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kernel_sources.h"
#include "kiln/dtype.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/version.h"

using namespace kiln;

TEST_CASE("kernel source listing: one well-formed line per registered instantiation, deterministic") {
  // Referencing libkiln keeps it linked, so its static initialisers register the specs.
  REQUIRE(kiln::version() != nullptr);

  std::size_t expected = 0;
  for (const rt::KernelSpec* spec : rt::registered_kernels()) expected += spec->dtypes.size() * spec->variants.size();
  REQUIRE(expected > 100);

  const std::vector<std::string> lines = kiln_test::kernel_source_lines();
  CHECK(lines.size() == expected);
  CHECK(std::is_sorted(lines.begin(), lines.end()));

  std::set<std::string> keys;
  for (const std::string& line : lines) {
    CAPTURE(line);
    std::istringstream in(line);
    std::string op, dtypes, variant, digest, extra;
    REQUIRE(static_cast<bool>(in >> op >> dtypes >> variant >> digest));
    CHECK_FALSE(static_cast<bool>(in >> extra));
    const rt::KernelSpec* spec = rt::find_kernel(op);
    REQUIRE(spec != nullptr);
    const DTypes d = DTypes::parse(dtypes);
    CHECK(std::find(spec->dtypes.begin(), spec->dtypes.end(), d) != spec->dtypes.end());
    const auto v = static_cast<std::uint32_t>(std::stoul(variant));
    CHECK(std::find(spec->variants.begin(), spec->variants.end(), v) != spec->variants.end());
    CHECK(digest.size() == 64);
    CHECK(digest.find_first_not_of("0123456789abcdef") == std::string::npos);
    CHECK(keys.insert(op + " " + dtypes + " " + variant).second);  // no instantiation listed twice
  }
  // A second walk gives the same text: no source depends on state or order.
  CHECK(kiln_test::kernel_source_lines() == lines);
}
