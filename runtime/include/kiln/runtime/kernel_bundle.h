#pragma once
// Registered kernels compiled several to one NVRTC program (a bundle). Much of NVRTC's cost is
// a program's, not a kernel's: eight unary kernels compile in about 60% of their time apart.
// Each kernel keeps its own disk cache entry, found by its own source as before; the entry holds
// the bundle's binaries and names its entry point there (EntryKey::function), and the kernels
// of one bundle share one loaded module (EntryKey::bundle).
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/runtime/module_cache.h"

namespace kiln::rt {

struct KernelSpec;

struct BundleItem {
  const KernelSpec* spec = nullptr;
  DTypes dtypes;
  std::uint32_t variant = 0;
};

// Whether an item's kernel may share a program: its template takes the runtime's prelude and is
// not arch-specific. ValueError or DTypeError for an item its spec does not support.
bool bundleable(const BundleItem& item);

// `items` split into groups that may share a program, each of at most `most` kernels (>= 1):
// kernels of one template whose sources take the same prelude (header set) and agree on waiting
// for the kernel before them. The largest groups come first, then in the order of their first
// kernel, each in the items' order; a kernel that shares with none (or that its spec does not
// support, which warm_bundle then reports) is a group of its own.
// Indices into `items`.
std::vector<std::vector<std::size_t>> bundle_groups(std::span<const BundleItem> items, std::size_t most);

struct BundleResult {
  std::optional<WarmOutcome> outcome;  // empty when it failed
  std::string digest;                  // its entry's
  std::exception_ptr error;            // when it failed
  double ms = 0;                       // compiled: its program's compile and stores over the kernels compiled in it
};

// Fills the disk cache for `arch` with one group of bundle_groups, as warm_kernel does for each
// kernel: those cached already are left, the others compile in one program. Should that program
// fail, each compiles alone, so that an error names its own kernel.
std::vector<BundleResult> warm_bundle(std::span<const BundleItem> items, int arch);

// The program holding the items' kernels, each entry point renamed to bundled_entry(entry, i):
// the prelude once, then each kernel's source in a namespace of its own, its macros undefined
// after it. ValueError when they cannot share one.
std::string bundle_source(std::span<const BundleItem> items);
std::string bundled_entry(const std::string& entry, std::size_t index);
// The entry point a function of a bundle was renamed from (`function` as it stands otherwise):
// what graph statistics and logs call it, so a kernel has one name however it was compiled.
std::string_view entry_name_of(std::string_view function);

}  // namespace kiln::rt
