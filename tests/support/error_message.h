#pragma once
// The message of the exception of type E that f throws; fails the test when none is thrown.
#include <doctest/doctest.h>

#include <string>

namespace kiln_test {

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("no exception of the expected type");
  return {};
}

}  // namespace kiln_test
