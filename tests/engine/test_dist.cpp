// kiln::dist without a GPU: the torchrun environment, the NCCL id rendezvous (file and TCP,
// between threads), the planning helpers DDP uses, the collectives' argument checks, and the
// NCCL loader's failure path.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "dist/collective_checks.h"
#include "dist/rendezvous.h"
#include "dist/tcp/tcp.h"
#include "error_message.h"
#include "kiln/dist.h"
#include "kiln/error.h"
#include "kiln/kiln.h"
#include "nccl_loader.h"
#include "scoped_env.h"
#include "temp_dir.h"

using namespace kiln;
using namespace kiln::dist;
using kiln_test::message_of;
using kiln_test::ScopedEnv;
using std::nullopt;

namespace {

using Clock = std::chrono::steady_clock;

ScopedEnv clean_dist_env() {
  return ScopedEnv{{"RANK", nullopt},
                   {"WORLD_SIZE", nullopt},
                   {"LOCAL_RANK", nullopt},
                   {"MASTER_ADDR", nullopt},
                   {"MASTER_PORT", nullopt},
                   {"KILN_DIST_ID_FILE", nullopt},
                   {"KILN_DIST_TIMEOUT_S", nullopt}};
}

std::string env_error(std::initializer_list<std::pair<std::string, std::optional<std::string>>> vars) {
  ScopedEnv clean = clean_dist_env();
  ScopedEnv e(vars);
  return message_of<ValueError>([] { env_from_environment(); });
}

detail::IdBytes id_of(unsigned char seed) {
  detail::IdBytes id{};
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<unsigned char>(seed + i * 7);
  return id;
}

// World of 3 in threads: ranks 1 and 2 start first, rank 0 a little later; each returns what it got.
std::vector<detail::IdBytes> exchange_in_threads(const detail::Rendezvous& r) {
  std::vector<std::future<detail::IdBytes>> got;
  for (int rank : {1, 2, 0}) {
    got.push_back(std::async(std::launch::async, [r, rank] {
      if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const detail::IdBytes mine = id_of(static_cast<unsigned char>(rank == 0 ? 42 : rank));
      return detail::exchange_id(r, Env{rank, 3, rank}, mine, std::chrono::seconds(20));
    }));
  }
  std::vector<detail::IdBytes> out;
  for (auto& f : got) out.push_back(f.get());
  return out;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

TEST_CASE("dist env: unset is a world of 1; RANK, WORLD_SIZE, LOCAL_RANK as torchrun sets them") {
  {
    ScopedEnv clean = clean_dist_env();
    CHECK(env_from_environment() == Env{0, 1, 0});
    CHECK(timeout_from_environment() == std::chrono::seconds(300));
  }
  {
    ScopedEnv clean = clean_dist_env();
    ScopedEnv e{{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"KILN_DIST_TIMEOUT_S", "2.5"}};
    CHECK(env_from_environment() == Env{5, 8, 1});
    CHECK(timeout_from_environment() == std::chrono::milliseconds(2500));
  }
  {
    ScopedEnv clean = clean_dist_env();
    ScopedEnv e{{"RANK", "2"}, {"WORLD_SIZE", "3"}};  // LOCAL_RANK defaults to RANK
    CHECK(env_from_environment() == Env{2, 3, 2});
  }
  {
    ScopedEnv clean = clean_dist_env();
    ScopedEnv e{{"WORLD_SIZE", "1"}};
    CHECK(env_from_environment() == Env{0, 1, 0});
  }
}

TEST_CASE("dist env: malformed, negative or inconsistent values are a ValueError naming variable and value") {
  CHECK(env_error({{"RANK", "abc"}, {"WORLD_SIZE", "2"}}) == "[dist.env] RANK='abc' is not an integer");
  CHECK(env_error({{"RANK", "1x"}, {"WORLD_SIZE", "2"}}) == "[dist.env] RANK='1x' is not an integer");
  CHECK(env_error({{"RANK", " 1"}, {"WORLD_SIZE", "2"}}) == "[dist.env] RANK=' 1' is not an integer");
  CHECK(env_error({{"RANK", ""}, {"WORLD_SIZE", "2"}}) == "[dist.env] RANK='' is not an integer");
  CHECK(env_error({{"WORLD_SIZE", "99999999999"}}) == "[dist.env] WORLD_SIZE='99999999999' is not an integer");
  CHECK(env_error({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}) == "[dist.env] RANK=-1 is negative");
  CHECK(env_error({{"LOCAL_RANK", "-2"}}) == "[dist.env] LOCAL_RANK=-2 is negative");
  CHECK(env_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}) == "[dist.env] WORLD_SIZE=0 must be at least 1");
  CHECK(env_error({{"RANK", "3"}, {"WORLD_SIZE", "3"}}) == "[dist.env] RANK=3 is not below WORLD_SIZE=3");
  CHECK(env_error({{"RANK", "1"}}) == "[dist.env] RANK=1 is set but WORLD_SIZE is not");
  CHECK(env_error({{"WORLD_SIZE", "2"}}) == "[dist.env] WORLD_SIZE=2 is set but RANK is not");
  CHECK(env_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}}) ==
        "[dist.env] LOCAL_RANK=2 is not below WORLD_SIZE=2");
  for (const char* bad : {"0", "-1", "x", "", "1e99", "nan"}) {
    CAPTURE(bad);
    ScopedEnv e{{"KILN_DIST_TIMEOUT_S", bad}};
    CHECK(message_of<ValueError>([] { timeout_from_environment(); }) ==
          std::string("[dist.env] KILN_DIST_TIMEOUT_S='") + bad + "' is not a positive number of seconds");
  }
}

TEST_CASE("dist env: KILN_DIST_ON_FAILURE is exit (the default) or throw; anything else is a ValueError") {
  {
    ScopedEnv e{{"KILN_DIST_ON_FAILURE", std::nullopt}};
    CHECK(on_failure_from_environment() == OnFailure::end_process);
  }
  {
    ScopedEnv e{{"KILN_DIST_ON_FAILURE", "exit"}};
    CHECK(on_failure_from_environment() == OnFailure::end_process);
  }
  {
    ScopedEnv e{{"KILN_DIST_ON_FAILURE", "throw"}};
    CHECK(on_failure_from_environment() == OnFailure::throw_error);
  }
  for (const char* bad : {"", "Exit", "abort", "1"}) {
    CAPTURE(bad);
    ScopedEnv e{{"KILN_DIST_ON_FAILURE", bad}};
    CHECK(message_of<ValueError>([] { on_failure_from_environment(); }) ==
          std::string("[dist.env] KILN_DIST_ON_FAILURE='") + bad + "' must be exit or throw");
  }
  CHECK(kFailureExitCode == 75);  // EX_TEMPFAIL: kiln-run --max-restarts and schedulers retry it
}

TEST_CASE("dist rendezvous: the file wins over MASTER_ADDR/PORT; any host; bad or half-set pairs") {
  ScopedEnv clean = clean_dist_env();
  const Env world3{1, 3, 1};
  {
    ScopedEnv e{{"KILN_DIST_ID_FILE", "/tmp/x/id"}, {"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "29500"}};
    const detail::Rendezvous r = detail::rendezvous_from_environment(world3);
    CHECK(r.file == "/tmp/x/id");
    CHECK(r.port == 0);
  }
  {
    ScopedEnv e{{"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "29500"}};
    const detail::Rendezvous r = detail::rendezvous_from_environment(world3);
    CHECK(r.file.empty());
    CHECK(r.host == "127.0.0.1");
    CHECK(r.port == 29500);
  }
  auto error = [&](std::initializer_list<std::pair<std::string, std::optional<std::string>>> vars) {
    ScopedEnv e(vars);
    return message_of<ValueError>([&] { detail::rendezvous_from_environment(world3); });
  };
  {
    // Another machine: any host name or address is taken as it is, and resolved when used.
    for (const char* host : {"10.0.0.2", "node0.cluster", "fe80::1"}) {
      ScopedEnv e{{"MASTER_ADDR", host}, {"MASTER_PORT", "29500"}};
      CHECK(detail::rendezvous_from_environment(world3).host == host);
    }
  }
  CHECK(error({{"MASTER_ADDR", "::1"}, {"MASTER_PORT", "0"}}) ==
        "[dist.rendezvous] MASTER_PORT='0' is not a port number (1-65535)");
  CHECK(error({{"MASTER_ADDR", "::1"}, {"MASTER_PORT", "70000"}}).find("MASTER_PORT='70000'") != std::string::npos);
  CHECK(error({{"MASTER_ADDR", "::1"}, {"MASTER_PORT", "http"}}).find("MASTER_PORT='http'") != std::string::npos);
  CHECK(error({{"MASTER_PORT", "29500"}}) == "[dist.rendezvous] MASTER_PORT=29500 is set but MASTER_ADDR is not");
  CHECK(error({{"MASTER_ADDR", "127.0.0.1"}}) ==
        "[dist.rendezvous] MASTER_ADDR=127.0.0.1 is set but MASTER_PORT is not");
  CHECK(message_of<ValueError>([&] { detail::rendezvous_from_environment(world3); }).find("WORLD_SIZE=3 needs") !=
        std::string::npos);
  CHECK(detail::rendezvous_from_environment(Env{}).port == 0);  // a world of 1 needs nothing
}

TEST_CASE("dist rendezvous through a file: every rank of a world of 3 gets rank 0's 128 bytes") {
  kiln_test::TempDir tmp;
  detail::Rendezvous r;
  r.file = tmp.file("nccl-id");
  const std::vector<detail::IdBytes> got = exchange_in_threads(r);
  for (const detail::IdBytes& id : got) CHECK(id == id_of(42));
  CHECK(std::filesystem::file_size(r.file) == 128);
  CHECK(std::distance(std::filesystem::directory_iterator(tmp.path()), {}) == 1);  // no temp file left

  // A world of 1 takes the same path (rank 0 writes; ProcessGroup::init removes it after).
  detail::Rendezvous alone;
  alone.file = tmp.file("alone");
  CHECK(detail::exchange_id(alone, Env{}, id_of(9), std::chrono::milliseconds(100)) == id_of(9));
  CHECK(std::filesystem::file_size(alone.file) == 128);
}

TEST_CASE("dist rendezvous over localhost TCP: every rank of a world of 3 gets rank 0's 128 bytes") {
  for (const char* host : {"127.0.0.1", "::1"}) {
    CAPTURE(host);
    detail::Rendezvous r;
    r.host = host;
    r.port = detail::free_tcp_port();
    std::vector<detail::IdBytes> got;
    try {
      got = exchange_in_threads(r);
    } catch (const DeviceError& e) {
      // A container without IPv6 cannot listen on ::1; IPv4 must work.
      if (std::string(host) == "::1" && std::string(e.what()).find("cannot listen") != std::string::npos) continue;
      throw;
    }
    REQUIRE(got.size() == 3);
    for (const detail::IdBytes& id : got) CHECK(id == id_of(42));
  }
}

TEST_CASE("dist rendezvous: a missing peer is a DeviceError naming the file or address, after the timeout") {
  kiln_test::TempDir tmp;
  const auto timeout = std::chrono::milliseconds(200);
  detail::Rendezvous file;
  file.file = tmp.file("never-written");
  auto t0 = Clock::now();
  std::string m = message_of<DeviceError>([&] { detail::exchange_id(file, Env{2, 3, 2}, id_of(2), timeout); });
  CHECK(seconds_since(t0) < 3);
  CHECK(m == "[dist.rendezvous] rank 2 waited 0.2 s for KILN_DIST_ID_FILE=" + file.file +
                 ", which rank 0 writes; is rank 0 running?");

  detail::Rendezvous tcp;
  tcp.host = "127.0.0.1";
  tcp.port = detail::free_tcp_port();
  t0 = Clock::now();
  m = message_of<DeviceError>([&] { detail::exchange_id(tcp, Env{1, 3, 1}, id_of(1), timeout); });
  CHECK(seconds_since(t0) < 3);
  CHECK(m.find("[dist.rendezvous] rank 1 could not get the NCCL id from rank 0 at 127.0.0.1:" +
               std::to_string(tcp.port) + " within 0.2 s") == 0);
  t0 = Clock::now();
  m = message_of<DeviceError>([&] { detail::exchange_id(tcp, Env{0, 3, 0}, id_of(0), timeout); });
  CHECK(seconds_since(t0) < 3);
  CHECK(m.find("[dist.rendezvous] rank 0 waited 0.2 s on 127.0.0.1:" + std::to_string(tcp.port) +
               " for 2 other ranks; 0 connected") == 0);
}

TEST_CASE("dist rendezvous over TCP on another loopback address: rank 0 binds MASTER_ADDR itself") {
  detail::Rendezvous r;
  r.host = "127.0.0.2";  // a second address of this machine, as a second host's would be
  r.port = detail::free_tcp_port();
  const std::vector<detail::IdBytes> got = exchange_in_threads(r);
  REQUIRE(got.size() == 3);
  for (const detail::IdBytes& id : got) CHECK(id == id_of(42));

  // Bound to 127.0.0.2 only: nothing answers on 127.0.0.1 at that port.
  std::string why;
  detail::Fd held(detail::tcp_listen("127.0.0.2", r.port, 1, &why));
  REQUIRE(held.get() >= 0);
  detail::Fd other(detail::tcp_connect("127.0.0.1", r.port, Clock::now() + std::chrono::seconds(2), &why));
  CHECK(other.get() < 0);
  CHECK(why == "Connection refused");
}

TEST_CASE("dist rendezvous: an address of another machine for rank 0 listens on the wildcard address") {
  // 192.0.2.1 (TEST-NET-1) is no address of this machine; binding it sends nothing anywhere.
  const int port = detail::free_tcp_port();
  std::string why;
  detail::Fd s(detail::tcp_listen("192.0.2.1", port, 1, &why));
  INFO("why: " << why);
  REQUIRE(s.get() >= 0);
  detail::Fd c(detail::tcp_connect("127.0.0.1", port, Clock::now() + std::chrono::seconds(2), &why));
  CHECK(c.get() >= 0);
}

TEST_CASE("dist rendezvous: an unreachable master is a DeviceError naming it, after the timeout") {
  // 127.0.0.3 with nobody listening; tests never send traffic beyond this machine.
  detail::Rendezvous r;
  r.host = "127.0.0.3";
  r.port = detail::free_tcp_port();
  const auto t0 = Clock::now();
  const std::string m = message_of<DeviceError>([&] {
    detail::exchange_id(r, Env{1, 2, 1}, id_of(1), std::chrono::milliseconds(300));
  });
  const double took = seconds_since(t0);
  CHECK(took >= 0.29);
  CHECK(took < 3);
  CHECK(m.find("[dist.rendezvous] rank 1 could not get the NCCL id from rank 0 at 127.0.0.3:" + std::to_string(r.port) +
               " within 0.3 s (Connection refused)") == 0);
}

TEST_CASE("dist rendezvous: a file that is not an id (left from another run) is a ValueError") {
  kiln_test::TempDir tmp;
  detail::Rendezvous r;
  r.file = tmp.file("stale");
  std::ofstream(r.file) << "not an id";
  const std::string m = message_of<ValueError>([&] {
    detail::exchange_id(r, Env{1, 2, 1}, id_of(1), std::chrono::milliseconds(100));
  });
  CHECK(m.find("KILN_DIST_ID_FILE=" + r.file + " does not hold a 128-byte NCCL id") != std::string::npos);
}

TEST_CASE("bucket_params: reverse order, greedy up to the cap, an oversized parameter alone") {
  using Buckets = std::vector<std::vector<std::size_t>>;
  CHECK(bucket_params({}, 100) == Buckets{});
  CHECK(bucket_params({10, 20, 30}, 100) == Buckets{{2, 1, 0}});
  CHECK(bucket_params({40, 30, 30, 40}, 100) == Buckets{{3, 2, 1}, {0}});  // exactly full closes
  CHECK(bucket_params({60, 50, 40}, 100) == Buckets{{2, 1}, {0}});
  CHECK(bucket_params({10, 500, 10, 10}, 100) == Buckets{{3, 2}, {1}, {0}});
  CHECK(bucket_params({500}, 100) == Buckets{{0}});
  CHECK(bucket_params({100, 100}, 100) == Buckets{{1}, {0}});
  CHECK(bucket_params({0, 0, 5}, 4) == Buckets{{2}, {1, 0}});
  // Every index exactly once, and no bucket of several parameters over the cap.
  std::vector<std::size_t> sizes(50);
  for (std::size_t i = 0; i < sizes.size(); ++i) sizes[i] = (i * 37) % 90 + 1;
  std::vector<int> seen(sizes.size(), 0);
  for (const auto& b : bucket_params(sizes, 120)) {
    std::size_t total = 0;
    for (std::size_t i : b) total += sizes[i], ++seen[i];
    CHECK((b.size() == 1 || total <= 120));
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  CHECK(message_of<ValueError>([] { bucket_params({1}, 0); }).find("[dist.bucket_params]") == 0);
}

TEST_CASE("shard: each rank's contiguous slice; the slices in rank order are the whole batch") {
  CHECK(shard(12, 0, 1) == std::pair<std::int64_t, std::int64_t>{0, 12});
  CHECK(shard(12, 0, 3) == std::pair<std::int64_t, std::int64_t>{0, 4});
  CHECK(shard(12, 2, 3) == std::pair<std::int64_t, std::int64_t>{8, 12});
  std::int64_t next = 0;
  for (int r = 0; r < 4; ++r) {
    const std::pair<std::int64_t, std::int64_t> s = shard(512, r, 4);
    CHECK(s.first == next);
    CHECK(s.second - s.first == 128);
    next = s.second;
  }
  CHECK(next == 512);
  CHECK(message_of<ValueError>([] { shard(10, 0, 3); }) ==
        "[dist.shard] global batch 10 is not a positive multiple of world size 3");
  CHECK(message_of<ValueError>([] { shard(12, 3, 3); }).find("rank 3") != std::string::npos);
  CHECK(message_of<ValueError>([] { shard(12, 0, 0); }).find("world size 0") != std::string::npos);
}

TEST_CASE("nccl loader: a missing library or symbol says why and how to install NCCL") {
  const rt::nccl::Library missing = rt::nccl::load({"/nonexistent/libnccl.so.2"});
  CHECK(missing.why.find("[nccl] cannot load libnccl.so.2 (/nonexistent/libnccl.so.2: cannot open") == 0);
  CHECK(missing.why.find("install the nvidia-nccl-cu13 wheel or set KILN_NCCL_LIBRARY") != std::string::npos);
  CHECK(missing.path.empty());

  const rt::nccl::Library not_nccl = rt::nccl::load({"libz.so.1"});  // loads, but is not NCCL
  CHECK(not_nccl.why.find("[nccl] libz.so.1 lacks ncclGetVersion") == 0);

  {
    ScopedEnv e{{"KILN_NCCL_LIBRARY", "/nonexistent/libnccl.so.2"}};
    CHECK(rt::nccl::library_candidates() == std::vector<std::string>{"/nonexistent/libnccl.so.2"});
  }
  {
    ScopedEnv e{{"KILN_NCCL_LIBRARY", nullopt}};
    const std::vector<std::string> c = rt::nccl::library_candidates();
    REQUIRE_FALSE(c.empty());
    CHECK(c.front() == "libnccl.so.2");
    for (std::size_t i = 1; i < c.size(); ++i) CHECK(c[i].find("/nvidia/nccl/lib/libnccl.so.2") != std::string::npos);
  }
  // Whatever this machine has, asking never throws and agrees with the version.
  std::string why;
  const bool ok = nccl_available(&why);
  CHECK(ok == !nccl_version().empty());
  if (!ok) CHECK(why.find("[nccl]") == 0);
  if (ok) MESSAGE("NCCL " << nccl_version() << " loads here");
  CHECK_THROWS_WITH_AS(rt::nccl::check(3, "ncclAllReduce"), doctest::Contains("[nccl] ncclAllReduce failed"),
                       DeviceError);
}

TEST_CASE("collective checks: dtype, device and layout errors name the op") {
  const Device cuda0 = Device::cuda(0);
  CHECK(message_of<DTypeError>([&] {
          detail::checked_nccl_type(zeros({3}, {.dtype = DType::boolean}), cuda0, "dist.all_reduce");
        }) == "[dist.all_reduce] dtype bool is not supported (f16, bf16, f32, f64, i32, i64, u8)");
  CHECK(message_of<DeviceError>([&] { detail::checked_nccl_type(zeros({3}), cuda0, "dist.broadcast"); }) ==
        "[dist.broadcast] the tensor is on cpu; this process group's device is cuda:0");
  CHECK(message_of<ValueError>([&] {
          detail::checked_nccl_type(transpose(zeros({2, 3}), 0, 1), Device::cpu(), "dist.all_gather");
        }).find("[dist.all_gather] the tensor (3,2) with strides (1,3) is not contiguous") == 0);
  CHECK(message_of<ValueError>([&] { detail::checked_nccl_type(Tensor(), cuda0, "dist.all_reduce"); }) ==
        "[dist.all_reduce] the tensor is undefined");
  CHECK(detail::checked_nccl_type(zeros({2}, {.dtype = DType::bf16}), Device::cpu(), "x") == rt::nccl::kBfloat16);
  CHECK(detail::checked_nccl_type(zeros({2}, {.dtype = DType::u8}), Device::cpu(), "x") == rt::nccl::kUint8);
  CHECK(detail::checked_nccl_type(zeros({2}, {.dtype = DType::i64}), Device::cpu(), "x") == rt::nccl::kInt64);
}

TEST_CASE("process group: an empty group, a CPU device and a world without rendezvous are typed errors") {
  ProcessGroup empty;
  Tensor t = zeros({2});
  CHECK(message_of<ValueError>([&] { empty.all_reduce(t); }).find("[dist.all_reduce] this ProcessGroup is empty") == 0);
  CHECK_THROWS_AS(empty.rank(), ValueError);
  CHECK_FALSE(empty.failed());
  CHECK(message_of<DeviceError>([] { ProcessGroup::init({.env = Env{}, .device = Device::cpu()}); }) ==
        "[dist.init] a process group needs a CUDA device, not cpu");
  ScopedEnv clean = clean_dist_env();
  CHECK(message_of<ValueError>([] {
          ProcessGroup::init({.env = Env{1, 2, 1}});
        }).find("WORLD_SIZE=2 needs") != std::string::npos);
  CHECK(message_of<ValueError>([] { ProcessGroup::init({.env = Env{2, 2, 0}}); }).find("[dist.init]") == 0);
}
