// The torchrun-style environment of a process group, and the pure planning helpers DDP uses.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

#include "kiln/dist.h"
#include "kiln/error.h"

namespace kiln::dist {

namespace {

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

// Whole-string, non-negative integers only: "1x", " 1", "-1" and overflows are all errors.
std::optional<int> read_int(const char* name) {
  const std::optional<std::string> text = get(name);
  if (!text) return std::nullopt;
  int v = 0;
  const char* end = text->data() + text->size();
  const auto [ptr, ec] = std::from_chars(text->data(), end, v);
  if (text->empty() || ec != std::errc() || ptr != end)
    throw ValueError(std::string("[dist.env] ") + name + "='" + *text + "' is not an integer");
  if (v < 0) throw ValueError(std::string("[dist.env] ") + name + "=" + *text + " is negative");
  return v;
}

}  // namespace

Env env_from_environment() {
  const std::optional<int> rank = read_int("RANK"), world = read_int("WORLD_SIZE"), local = read_int("LOCAL_RANK");
  Env e;
  if (world) {
    if (*world < 1) throw ValueError("[dist.env] WORLD_SIZE=" + std::to_string(*world) + " must be at least 1");
    if (!rank && *world > 1)
      throw ValueError("[dist.env] WORLD_SIZE=" + std::to_string(*world) + " is set but RANK is not");
    e.world_size = *world;
  } else if (rank) {
    throw ValueError("[dist.env] RANK=" + std::to_string(*rank) + " is set but WORLD_SIZE is not");
  }
  e.rank = rank.value_or(0);
  e.local_rank = local.value_or(e.rank);
  if (e.rank >= e.world_size)
    throw ValueError("[dist.env] RANK=" + std::to_string(e.rank) +
                     " is not below WORLD_SIZE=" + std::to_string(e.world_size));
  if (e.local_rank >= e.world_size)
    throw ValueError("[dist.env] LOCAL_RANK=" + std::to_string(e.local_rank) +
                     " is not below WORLD_SIZE=" + std::to_string(e.world_size));
  return e;
}

std::chrono::milliseconds timeout_from_environment() {
  const std::optional<std::string> text = get("KILN_DIST_TIMEOUT_S");
  if (!text) return std::chrono::seconds(300);
  char* end = nullptr;
  const double s = std::strtod(text->c_str(), &end);
  if (text->empty() || *end != '\0' || !std::isfinite(s) || s <= 0 || s > 1e9)
    throw ValueError("[dist.env] KILN_DIST_TIMEOUT_S='" + *text + "' is not a positive number of seconds");
  return std::chrono::milliseconds(std::max<std::int64_t>(1, std::llround(s * 1000)));
}

OnFailure on_failure_from_environment() {
  const std::optional<std::string> text = get("KILN_DIST_ON_FAILURE");
  if (!text || *text == "exit") return OnFailure::end_process;
  if (*text == "throw") return OnFailure::throw_error;
  throw ValueError("[dist.env] KILN_DIST_ON_FAILURE='" + *text + "' must be exit or throw");
}

std::vector<std::vector<std::size_t>> bucket_params(const std::vector<std::size_t>& bytes, std::size_t cap) {
  if (cap == 0) throw ValueError("[dist.bucket_params] the bucket cap must be more than 0 bytes");
  std::vector<std::vector<std::size_t>> buckets;
  std::vector<std::size_t> current;
  std::size_t filled = 0;
  for (std::size_t i = bytes.size(); i-- > 0;) {
    if (!current.empty() && bytes[i] > cap - filled) {
      buckets.push_back(std::move(current));
      current.clear();
      filled = 0;
    }
    current.push_back(i);
    filled += bytes[i];
    if (filled >= cap) {  // full, or one oversized parameter alone
      buckets.push_back(std::move(current));
      current.clear();
      filled = 0;
    }
  }
  if (!current.empty()) buckets.push_back(std::move(current));
  return buckets;
}

std::pair<std::int64_t, std::int64_t> shard(std::int64_t global_batch, int rank, int world) {
  if (world < 1) throw ValueError("[dist.shard] world size " + std::to_string(world) + " must be at least 1");
  if (rank < 0 || rank >= world)
    throw ValueError("[dist.shard] rank " + std::to_string(rank) + " is outside [0, " + std::to_string(world) + ")");
  if (global_batch <= 0 || global_batch % world != 0)
    throw ValueError("[dist.shard] global batch " + std::to_string(global_batch) +
                     " is not a positive multiple of world size " + std::to_string(world));
  const std::int64_t per = global_batch / world;
  return {rank * per, (rank + 1) * per};
}

}  // namespace kiln::dist
