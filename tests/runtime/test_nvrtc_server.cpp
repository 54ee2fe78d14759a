// The compile server (kiln-nvrtc-server): found beside the library, the same bytes as an
// in-process compile, safe to start from many threads at once, strict about its input.
#include <doctest/doctest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "kiln/runtime/compiler.h"
#include "nvrtc_run.h"
#include "process.h"

namespace rt = kiln::rt;

namespace {

rt::NvrtcRequest request(const std::string& body, bool want_cubin = true) {
  return {"extern \"C\" __global__ void k(float* x) { " + body + " }\n", "server_probe.cu",
          {"-std=c++17", "-arch=sm_90"}, want_cubin};
}

// This process's compile servers: its children whose program is kiln-nvrtc-server.
std::vector<pid_t> own_servers() {
  std::vector<pid_t> pids;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string pid, comm, state;
    pid_t ppid = 0;
    stat >> pid >> comm >> state >> ppid;
    if (ppid != ::getpid()) continue;
    if (std::filesystem::read_symlink(e.path() / "exe", ec).filename() == "kiln-nvrtc-server")
      pids.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  return pids;
}

}  // namespace

TEST_CASE("the build tree's library finds its compile server beside it") {
  const auto& path = rt::nvrtc_server_path();
  REQUIRE(path.has_value());
  CHECK(path->filename() == "kiln-nvrtc-server");
  const kiln_test::ProcessResult bare = kiln_test::run_process({path->string()});
  CHECK(bare.exit_code == 2);
  CHECK(bare.err.find(rt::kNvrtcServerProtocol) != std::string::npos);
  // With its protocol and no input (stdin is /dev/null) it ends at once, cleanly.
  CHECK(kiln_test::run_process({path->string(), rt::kNvrtcServerProtocol}).exit_code == 0);
}

TEST_CASE("a compile in the server gives the bytes and log an in-process compile gives") {
  for (const rt::NvrtcRequest& req : {request("x[0] = 2.f * x[1];"), request("x[0] = ;"), request("x[1] = 1.f;", false)}) {
    CAPTURE(req.source);
    const std::optional<rt::NvrtcOutput> served = rt::run_nvrtc_in_server(req);
    const rt::NvrtcOutput here = rt::run_nvrtc_in_process(req);
    REQUIRE(served.has_value());
    CHECK(served->ok == here.ok);
    CHECK(served->result == here.result);
    CHECK(served->log == here.log);
    CHECK(served->ptx == here.ptx);
    CHECK(served->cubin == here.cubin);
    CHECK(served->ok == (req.source.find("= ;") == std::string::npos));
    if (served->ok) CHECK(served->cubin.empty() == !req.want_cubin);
    if (!served->ok) CHECK(served->log.find("expected an expression") != std::string::npos);
  }
}

TEST_CASE("servers started from many threads while others allocate all answer") {
  // A bare fork here could copy a lock another thread held (the allocator's) into the child,
  // which then hung: the server is spawned and exec'd instead.
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> allocated{0};
  std::thread churn([&] {
    while (!stop) {
      std::vector<std::string> v(64, std::string(256, 'x'));
      allocated += v.back().size();
    }
  });
  std::atomic<int> compiled{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2; ++i)
        if (const auto out = rt::run_nvrtc_in_server(request("x[" + std::to_string(t * 2 + i) + "] = 1.f;")); out && out->ok)
          ++compiled;
    });
  for (auto& th : threads) th.join();
  stop = true;
  churn.join();
  CHECK(compiled == 16);
  CHECK(allocated > 0);
}

TEST_CASE("the server's loop ends at a malformed request, with no reply") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  const std::string junk = "\x05\x00\x00\x00\x00\x00\x00\x00" "abc";  // a field five long, cut at three
  REQUIRE(::write(sv[0], junk.data(), junk.size()) == static_cast<ssize_t>(junk.size()));
  ::shutdown(sv[0], SHUT_WR);
  rt::serve_nvrtc(sv[1], sv[1]);
  ::close(sv[1]);
  char c = 0;
  CHECK(::read(sv[0], &c, 1) == 0);  // end of file: nothing was written back
  ::close(sv[0]);
}

TEST_CASE("a compile server killed between compiles costs no compile: the next one runs here, then a new server") {
  std::thread([] {
    const std::vector<pid_t> before = own_servers();  // other threads' servers, left alone
    REQUIRE(rt::run_nvrtc_in_server(request("x[0] = 3.f;")).has_value());
    std::vector<pid_t> mine;
    for (pid_t p : own_servers())
      if (std::find(before.begin(), before.end(), p) == before.end()) mine.push_back(p);
    REQUIRE(mine.size() == 1);
    ::kill(mine[0], SIGKILL);
    // The dead server is found on this compile, which falls back in-process.
    const rt::CompiledModule m = rt::compile({"server_killed", "f32", request("x[0] = 4.f;").source, 90});
    CHECK(m.ptx.find(".entry k") != std::string::npos);
    const std::optional<rt::NvrtcOutput> again = rt::run_nvrtc_in_server(request("x[0] = 5.f;"));
    REQUIRE(again.has_value());
    CHECK(again->ok);
  }).join();
}
