#pragma once
// The free space of a private pool's chunks. A request takes the smallest free range that holds
// it (best fit) and a returned range merges with its free neighbours, so a block freed in the
// capture's order serves any later request it can hold: the step's values are laid out by
// lifetime, and the pool grows only when what is live at once does not fit.
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace kiln::rt {

class ArenaSpace {
 public:
  // Adds the chunk [base, base + bytes), all of it free. Ranges never merge across chunks (each
  // is its own allocation of the driver).
  void add_chunk(std::uint64_t base, std::uint64_t bytes);
  // Grows the chunk that starts at `base` by `bytes` at its end (addresses mapped right after
  // it); they merge with the chunk's free tail. Throws ValueError for no such chunk.
  void extend_chunk(std::uint64_t base, std::uint64_t bytes);
  // The bytes free at the end of the chunk that starts at `base`: what a growth joins.
  std::uint64_t free_at_end(std::uint64_t base) const;
  // The start of `bytes` taken from the smallest free range that holds them; none if none does.
  std::optional<std::uint64_t> take(std::uint64_t bytes);
  // Frees [at, at + bytes), which take handed out. Throws ValueError for a range that is not in
  // a chunk or overlaps free space (returned twice), leaving the space as it was.
  void give_back(std::uint64_t at, std::uint64_t bytes);

  std::uint64_t bytes_in_use() const { return in_use_; }
  std::uint64_t peak_in_use() const { return peak_; }  // the most in use at once so far
  std::uint64_t largest_free() const { return by_size_.empty() ? 0 : by_size_.rbegin()->first; }
  std::size_t free_ranges() const { return free_.size(); }

 private:
  void insert_free(std::uint64_t at, std::uint64_t bytes);
  void erase_free(std::map<std::uint64_t, std::uint64_t>::iterator it);

  std::map<std::uint64_t, std::uint64_t> free_;                // start -> bytes
  std::set<std::pair<std::uint64_t, std::uint64_t>> by_size_;  // (bytes, start): best fit
  std::map<std::uint64_t, std::uint64_t> chunks_;              // base -> bytes
  std::uint64_t in_use_ = 0, peak_ = 0;
};

}  // namespace kiln::rt
