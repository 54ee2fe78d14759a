#pragma once
// Kernels whose source is made at run time (fused groups, per-shape convolutions): one entry
// point keyed by a few 64-bit words, whose builder runs only on a miss. A hit builds no
// strings and hashes no source; the module then loads through get_function like any spec.
#include <array>
#include <bit>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/runtime/kernel_registry.h"

namespace kiln::rt {

// A non-owning reference to a callable, valid for the call it is passed to (no allocation).
template <class Sig>
class FunctionRef;
template <class R, class... A>
class FunctionRef<R(A...)> {
 public:
  // Implicit, so that a lambda can be passed where a FunctionRef is taken.
  template <class F, std::enable_if_t<!std::is_same_v<std::remove_cvref_t<F>, FunctionRef>, int> = 0>
  FunctionRef(F&& f) noexcept
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))), call_([](void* obj, A... a) -> R {
          return std::invoke(*static_cast<std::remove_reference_t<F>*>(obj), std::forward<A>(a)...);
        }) {}
  R operator()(A... a) const { return call_(obj_, std::forward<A>(a)...); }

 private:
  void* obj_;
  R (*call_)(void*, A...);
};

// FNV-1a 64: stable across processes and builds (std::hash is not), so names derived from it
// find their disk cache entries again. `h` continues an earlier hash.
constexpr std::uint64_t kFnvOffset = 0xcbf29ce484222325ull;
std::uint64_t fnv1a64(std::string_view bytes, std::uint64_t h = kFnvOffset);

// What a generated module depends on: a kind (a static string of letters, digits and '_',
// the spec name's prefix) and words (op ids, dtypes, sizes, parameter bits). Two keys are the
// same module exactly when kind and words are equal. Words live inline up to kInline.
class GeneratedKey {
 public:
  static constexpr std::size_t kInline = 32;

  explicit GeneratedKey(const char* kind) : kind_(kind) {}
  explicit GeneratedKey(std::string_view kind) : kind_(kind) {}
  // The key keeps a view of its kind, which a temporary string would leave dangling.
  explicit GeneratedKey(std::string&& kind) = delete;

  // Integers and enums as their value, doubles as their bits.
  template <class... T>
  GeneratedKey& add(T... values) {
    (push(word(values)), ...);
    return *this;
  }

  std::string_view kind() const { return kind_; }
  std::span<const std::uint64_t> words() const {
    return spill_.empty() ? std::span<const std::uint64_t>(inline_.data(), size_) : std::span(spill_);
  }
  // FNV-1a 64 over the kind, a zero byte, then each word's 8 bytes little-endian.
  std::uint64_t hash() const;

 private:
  template <class T>
  static std::uint64_t word(T v) {
    if constexpr (std::is_enum_v<T>)
      return static_cast<std::uint64_t>(static_cast<std::underlying_type_t<T>>(v));
    else if constexpr (std::is_floating_point_v<T>)
      return std::bit_cast<std::uint64_t>(static_cast<double>(v));
    else {
      static_assert(std::is_integral_v<T>, "GeneratedKey words are integers, enums or doubles");
      return static_cast<std::uint64_t>(v);
    }
  }
  void push(std::uint64_t w);

  std::string_view kind_;
  std::array<std::uint64_t, kInline> inline_{};
  std::vector<std::uint64_t> spill_;  // all the words, once there are more than kInline
  std::size_t size_ = 0;
};

// What a builder returns: the module's source, the readable label the disk cache records and
// jitcc shows ("fused(mul,add) f32", "conv2d fwd tf32"), and its extern "C" entry points.
struct GeneratedModule {
  std::string source;
  std::string label;
  std::vector<std::string> entries;
};

// The specs (one per entry, in entry order) of the generated module `key`. `build` runs once
// per key per process, only on a miss; concurrent first use builds once, and a builder that
// throws leaves the key to be built by a later call. A module is named by its source: the first
// spec "<kind>_<16 hex digits of fnv1a64(source)>", the others that name + "_1", "_2", ...; two
// keys whose builders return the same source and entries share those specs (one compile), and
// when a different module took the name (a 64-bit collision), "_1", "_2", ... go after the hash
// until one is free. The specs take dtypes (u8), variant 0, and instantiate to a header line
// plus the source.
std::span<const KernelSpec* const> generated_kernels(const GeneratedKey& key, FunctionRef<GeneratedModule()> build);

struct Function;
// The loaded function of the entry point named `entry` of a generated module (the specs that
// generated_kernels returned) on `device`; ValueError when the module has no such entry.
Function generated_function(std::span<const KernelSpec* const> module, std::string_view entry, int device);
// The one dtype tuple every generated spec takes, and every registered kernel whose source has no
// dtype placeholders (step I/O): no caller spells a placeholder dtype.
const DTypes& generated_dtypes();

// How many builders have run in this process: lets tests prove a warm key builds nothing.
std::uint64_t generated_builds();

}  // namespace kiln::rt
