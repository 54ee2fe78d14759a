// dist::reducer_buckets without a GPU: GradReducer's bucket layout, DDP's small first bucket
// (closed as soon as it holds first_bucket_bytes, or before a parameter that would overfill it,
// so the first all-reduce starts early) and then bucket_params' greedy buckets for the rest.
#include <doctest/doctest.h>

#include <cstddef>
#include <vector>

#include "error_message.h"
#include "kiln/dist/grad_reducer.h"
#include "kiln/error.h"

using kiln::dist::reducer_buckets;
using kiln::dist::ReducerOptions;
using kiln_test::message_of;
using Buckets = std::vector<std::vector<std::size_t>>;

TEST_CASE("reducer_buckets: a first bucket closed once it holds first_bucket_bytes, then capped buckets") {
  const ReducerOptions small{.bucket_bytes = 100, .first_bucket_bytes = 30};
  CHECK(reducer_buckets({}, small) == Buckets{});
  // Last parameter first: 10 + 25 >= 30 closes the first bucket; the rest greedy up to 100.
  CHECK(reducer_buckets({40, 70, 20, 25, 10}, small) == Buckets{{4, 3}, {2, 1}, {0}});
  // A parameter that would take the first bucket past bucket_bytes starts the next one (DDP
  // lets it in and holds back the first all-reduce); alone, it is the first bucket.
  CHECK(reducer_buckets({5, 500, 10}, small) == Buckets{{2}, {1}, {0}});
  CHECK(reducer_buckets({5, 90, 10}, small) == Buckets{{2, 1}, {0}});  // 10 + 90 fits bucket_bytes
  CHECK(reducer_buckets({5, 91, 10}, small) == Buckets{{2}, {1, 0}});
  CHECK(reducer_buckets({5, 500}, small) == Buckets{{1}, {0}});
  CHECK(reducer_buckets({5}, small) == Buckets{{0}});

  // No separate first bucket when it is 0 or not below bucket_bytes: bucket_params alone.
  CHECK(reducer_buckets({40, 30, 30, 40}, {.bucket_bytes = 100, .first_bucket_bytes = 0}) == Buckets{{3, 2, 1}, {0}});
  CHECK(reducer_buckets({8192, 128, 1280, 40}, {.bucket_bytes = 2048}) == Buckets{{3, 2, 1}, {0}});

  // The trainer's cnn in f32 with the defaults (1 MiB first, 25 MiB after): the fully connected
  // layers' bucket starts while the convolutions still differentiate.
  const std::vector<std::size_t> cnn{3200, 128, 128, 204800, 256, 256, 1605632, 512, 5120, 40};
  CHECK(reducer_buckets(cnn, {}) == Buckets{{9, 8, 7, 6}, {5, 4, 3, 2, 1, 0}});
  // The wide MLP 784-4096-4096-10: the output layer and the hidden bias go first, the 64 MiB
  // layer alone, then the first layer.
  const std::vector<std::size_t> mlp{784 * 4096 * 4, 4096 * 4, 4096 * 4096 * 4, 4096 * 4, 4096 * 10 * 4, 40};
  CHECK(reducer_buckets(mlp, {}) == Buckets{{5, 4, 3}, {2}, {1, 0}});

  CHECK(message_of<kiln::ValueError>([] {
          reducer_buckets({1}, {.bucket_bytes = 0});
        }).find("[dist.GradReducer] bucket_bytes") == 0);
}
