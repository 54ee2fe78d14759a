#pragma once
// A flag set for a scope: what the scopes that mark a thread's calls share (LateRequests,
// FullTierOnly), each over its own thread_local flag.

namespace kiln::rt {

// Sets `flag` to true while it lives, then back to what it was (so scopes nest).
class ScopedFlag {
 public:
  explicit ScopedFlag(bool& flag) : flag_(flag), was_(flag) { flag = true; }
  ~ScopedFlag() { flag_ = was_; }
  ScopedFlag(const ScopedFlag&) = delete;
  ScopedFlag& operator=(const ScopedFlag&) = delete;

 private:
  bool& flag_;
  const bool was_;
};

}  // namespace kiln::rt
