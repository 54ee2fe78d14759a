// The entry parser on the partial reads the directory scan makes (found by fuzz_disk_cache_entry).
#include <doctest/doctest.h>

#include <string>

#include "disk_cache_format.h"

using namespace kiln::rt;

TEST_CASE("disk cache check_layout given fewer bytes than the fixed header asks for them") {
  // It read the version and text length past the 10 bytes it had, then judged garbage.
  const std::string file("KILNMOD\0\x01\0\0\0\x0a\x64\x4b\0\0op=t", 21);
  EntryLayout l;
  CHECK(check_layout(file.substr(0, 10), file.size(), &l) == kNeedMoreBytes);
  CHECK(l.payload_at == 16);
  CHECK(check_layout(file.substr(0, 3), file.size(), &l) == kNeedMoreBytes);
  // With the fixed header read, the verdict is the whole file's.
  EntryLayout whole;
  const std::string verdict = check_layout(file, file.size(), &whole);
  CHECK(verdict.find("header text of 4940810 bytes") != std::string::npos);
  CHECK(check_layout(file.substr(0, 16), file.size(), &l) == verdict);
}
