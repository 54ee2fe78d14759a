#include "rendezvous.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "kiln/error.h"

namespace kiln::dist::detail {

namespace {

using Clock = std::chrono::steady_clock;

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Written beside the target and renamed over it, so a reader never sees part of an id.
void publish_file(const std::string& path, const IdBytes& id) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(id.data()), static_cast<std::streamsize>(id.size()));
    if (!f.flush())
      throw ValueError("[dist.rendezvous] rank 0 cannot write KILN_DIST_ID_FILE=" + path + " (" + tmp +
                       "): " + std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw ValueError("[dist.rendezvous] rank 0 cannot rename " + tmp + " to KILN_DIST_ID_FILE=" + path + ": " +
                     ec.message());
  }
}

IdBytes await_file(const std::string& path, int rank, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    std::ifstream f(path, std::ios::binary);
    if (f) {
      IdBytes id{};
      f.read(reinterpret_cast<char*>(id.data()), static_cast<std::streamsize>(id.size()));
      const bool whole = f.gcount() == static_cast<std::streamsize>(id.size());
      if (whole && f.peek() == std::ifstream::traits_type::eof()) return id;
      throw ValueError("[dist.rendezvous] KILN_DIST_ID_FILE=" + path +
                       " does not hold a 128-byte NCCL id; is it left from another run? Use a fresh path");
    }
    if (Clock::now() >= deadline)
      throw DeviceError("[dist.rendezvous] rank " + std::to_string(rank) + " waited " + seconds_text(timeout) +
                        " for KILN_DIST_ID_FILE=" + path + ", which rank 0 writes; is rank 0 running?");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int parse_port(const std::string& text) {
  int v = 0;
  const char* end = text.data() + text.size();
  const auto r = std::from_chars(text.data(), end, v);
  if (text.empty() || r.ec != std::errc() || r.ptr != end || v < 1 || v > 65535)
    throw ValueError("[dist.rendezvous] MASTER_PORT='" + text + "' is not a port number (1-65535)");
  return v;
}

}  // namespace

Rendezvous rendezvous_from_environment(const Env& env) {
  Rendezvous r;
  r.file = env_or_empty("KILN_DIST_ID_FILE");
  if (!r.file.empty() || env.world_size == 1) return r;
  const std::string addr = env_or_empty("MASTER_ADDR"), port = env_or_empty("MASTER_PORT");
  if (addr.empty() && port.empty()) {
    if (env.world_size > 1)
      throw ValueError("[dist.rendezvous] WORLD_SIZE=" + std::to_string(env.world_size) +
                       " needs KILN_DIST_ID_FILE, or MASTER_ADDR and MASTER_PORT (kiln-run sets them)");
    return r;
  }
  if (addr.empty()) throw ValueError("[dist.rendezvous] MASTER_PORT=" + port + " is set but MASTER_ADDR is not");
  if (port.empty()) throw ValueError("[dist.rendezvous] MASTER_ADDR=" + addr + " is set but MASTER_PORT is not");
  r.host = addr == "localhost" ? "127.0.0.1" : addr;  // as kiln-run sets it, whatever the resolver prefers
  r.port = parse_port(port);
  return r;
}

IdBytes exchange_id(const Rendezvous& r, const Env& env, const IdBytes& id, std::chrono::milliseconds timeout) {
  if (!r.file.empty()) {
    if (env.rank != 0) return await_file(r.file, env.rank, timeout);
    publish_file(r.file, id);
    return id;
  }
  if (env.world_size == 1) return id;
  if (r.port == 0)
    throw ValueError("[dist.rendezvous] a world of " + std::to_string(env.world_size) + " needs a file or a port");
  if (env.rank == 0) {
    tcp_serve(r.host, r.port, env.world_size - 1, std::vector<unsigned char>(id.begin(), id.end()), timeout);
    return id;
  }
  const std::vector<unsigned char> got = tcp_fetch(r.host, r.port, id.size(), env.rank, timeout);
  IdBytes out{};
  std::copy(got.begin(), got.end(), out.begin());
  return out;
}

}  // namespace kiln::dist::detail
