// ArenaSpace: best-fit placement and merging of free ranges inside a private pool's chunks.
#include "arena_space.h"

#include <algorithm>
#include <string>

#include "kiln/error.h"

namespace kiln::rt {

void ArenaSpace::add_chunk(std::uint64_t base, std::uint64_t bytes) {
  if (bytes == 0) return;
  chunks_.emplace(base, bytes);
  insert_free(base, bytes);
}

void ArenaSpace::extend_chunk(std::uint64_t base, std::uint64_t bytes) {
  const auto chunk = chunks_.find(base);
  if (chunk == chunks_.end()) throw ValueError("[memory] no chunk of the pool starts at " + std::to_string(base));
  if (bytes == 0) return;
  const std::uint64_t end = base + chunk->second;
  std::uint64_t start = end, size = bytes;
  if (const std::uint64_t tail = free_at_end(base)) {
    start = end - tail;
    size += tail;
    erase_free(free_.find(start));
  }
  chunk->second += bytes;
  insert_free(start, size);
}

std::uint64_t ArenaSpace::free_at_end(std::uint64_t base) const {
  const auto chunk = chunks_.find(base);
  if (chunk == chunks_.end()) return 0;
  const std::uint64_t end = base + chunk->second;
  auto it = free_.lower_bound(end);
  if (it == free_.begin()) return 0;
  --it;
  return it->first >= base && it->first + it->second == end ? it->second : 0;
}

std::optional<std::uint64_t> ArenaSpace::take(std::uint64_t bytes) {
  if (bytes == 0) return std::nullopt;
  const auto fit = by_size_.lower_bound({bytes, 0});
  if (fit == by_size_.end()) return std::nullopt;
  const auto [size, at] = *fit;
  erase_free(free_.find(at));
  if (size > bytes) insert_free(at + bytes, size - bytes);
  in_use_ += bytes;
  peak_ = std::max(peak_, in_use_);
  return at;
}

void ArenaSpace::give_back(std::uint64_t at, std::uint64_t bytes) {
  auto chunk = chunks_.upper_bound(at);
  if (bytes == 0 || chunk == chunks_.begin() || at + bytes > std::prev(chunk)->first + std::prev(chunk)->second)
    throw ValueError("[memory] a private block at " + std::to_string(at) + " of " + std::to_string(bytes) +
                     " bytes is not inside one of its pool's chunks");
  const std::uint64_t chunk_base = std::prev(chunk)->first;
  auto next = free_.lower_bound(at);
  auto prev = next == free_.begin() ? free_.end() : std::prev(next);
  const bool overlaps_next = next != free_.end() && next->first < at + bytes;
  const bool overlaps_prev = prev != free_.end() && prev->first + prev->second > at;
  if (overlaps_next || overlaps_prev)
    throw ValueError("[memory] a private block at " + std::to_string(at) + " of " + std::to_string(bytes) +
                     " bytes is already free (returned twice)");
  std::uint64_t start = at, size = bytes;
  // Merged with a free neighbour only inside the same chunk.
  if (prev != free_.end() && prev->first + prev->second == at && at != chunk_base) {
    start = prev->first;
    size += prev->second;
    erase_free(prev);
  }
  if (next != free_.end() && next->first == at + bytes && !chunks_.contains(next->first)) {
    size += next->second;
    erase_free(next);
  }
  insert_free(start, size);
  in_use_ -= bytes;
}

void ArenaSpace::insert_free(std::uint64_t at, std::uint64_t bytes) {
  free_.emplace(at, bytes);
  by_size_.emplace(bytes, at);
}

void ArenaSpace::erase_free(std::map<std::uint64_t, std::uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  free_.erase(it);
}

}  // namespace kiln::rt
