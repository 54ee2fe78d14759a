#include "nvrtc_wire.h"

#include <nvrtc.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <exception>
#include <memory>

namespace kiln::rt {

namespace {

// Records the first NVRTC call that fails; later calls are skipped by the caller's checks.
bool called(NvrtcOutput& out, nvrtcResult r, const char* call) {
  if (r == NVRTC_SUCCESS) return true;
  out.result = static_cast<int>(r);
  out.failed_call = call;
  return false;
}

void put(std::string& out, const std::string& field) {
  const std::uint64_t n = field.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out += field;
}

bool write_all(int fd, const std::string& bytes) {
  for (std::size_t done = 0; done < bytes.size();) {
    // send, not write: a server gone must be an error here, not a SIGPIPE that ends the process.
    ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == ENOTSOCK) n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

bool read_exact(int fd, char* p, std::size_t n) {
  for (std::size_t done = 0; done < n;) {
    const ssize_t got = ::read(fd, p + done, n - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    done += static_cast<std::size_t>(got);
  }
  return true;
}

bool read_field(int fd, std::string& field) {
  std::uint64_t n = 0;
  if (!read_exact(fd, reinterpret_cast<char*>(&n), sizeof n) || n > (std::uint64_t{1} << 32)) return false;
  field.resize(n);
  return read_exact(fd, field.data(), n);
}

std::string flag(bool b) { return b ? "1" : "0"; }

}  // namespace

NvrtcOutput nvrtc_compile(const NvrtcRequest& req) {
  NvrtcOutput out;
  std::vector<const char*> argv;
  for (const auto& o : req.options) argv.push_back(o.c_str());
  nvrtcProgram prog = nullptr;
  if (!called(out, nvrtcCreateProgram(&prog, req.source.c_str(), req.name.c_str(), 0, nullptr, nullptr),
              "nvrtcCreateProgram"))
    return out;
  // Destroy the program on every path out.
  std::unique_ptr<nvrtcProgram, void (*)(nvrtcProgram*)> guard(&prog, [](nvrtcProgram* p) { nvrtcDestroyProgram(p); });
  const nvrtcResult r = nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  out.result = static_cast<int>(r);
  std::size_t size = 0;
  if (!called(out, nvrtcGetProgramLogSize(prog, &size), "nvrtcGetProgramLogSize")) return out;
  out.log.assign(size, '\0');
  if (size > 1 && !called(out, nvrtcGetProgramLog(prog, out.log.data()), "nvrtcGetProgramLog")) return out;
  while (!out.log.empty() && out.log.back() == '\0') out.log.pop_back();
  if (r != NVRTC_SUCCESS) return out;
  if (!called(out, nvrtcGetPTXSize(prog, &size), "nvrtcGetPTXSize")) return out;
  out.ptx.resize(size);
  if (!called(out, nvrtcGetPTX(prog, out.ptx.data()), "nvrtcGetPTX")) return out;
  while (!out.ptx.empty() && out.ptx.back() == '\0') out.ptx.pop_back();
  if (req.want_cubin) {
    if (!called(out, nvrtcGetCUBINSize(prog, &size), "nvrtcGetCUBINSize")) return out;
    out.cubin.resize(size);
    if (!called(out, nvrtcGetCUBIN(prog, out.cubin.data()), "nvrtcGetCUBIN")) return out;
  }
  out.ok = true;
  return out;
}

bool send_request(int fd, const NvrtcRequest& req) {
  std::string bytes;
  put(bytes, req.source);
  put(bytes, req.name);
  put(bytes, flag(req.want_cubin));
  put(bytes, std::to_string(req.options.size()));
  for (const std::string& o : req.options) put(bytes, o);
  return write_all(fd, bytes);
}

std::optional<NvrtcRequest> receive_request(int fd) {
  NvrtcRequest req;
  std::string cubin, count;
  if (!read_field(fd, req.source) || !read_field(fd, req.name) || !read_field(fd, cubin) || !read_field(fd, count))
    return std::nullopt;
  if (count.empty() || count.size() > 6 || count.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  req.want_cubin = cubin == "1";
  req.options.resize(std::stoul(count));
  for (std::string& o : req.options)
    if (!read_field(fd, o)) return std::nullopt;
  return req;
}

bool send_output(int fd, const NvrtcOutput& out) {
  std::string bytes;
  put(bytes, flag(out.ok));
  put(bytes, std::to_string(out.result));
  for (const std::string* f : {&out.failed_call, &out.log, &out.ptx, &out.cubin}) put(bytes, *f);
  return write_all(fd, bytes);
}

std::optional<NvrtcOutput> receive_output(int fd) {
  NvrtcOutput out;
  std::string ok, result;
  if (!read_field(fd, ok) || !read_field(fd, result) || result.empty() || result.size() > 11) return std::nullopt;
  for (std::string* f : {&out.failed_call, &out.log, &out.ptx, &out.cubin})
    if (!read_field(fd, *f)) return std::nullopt;
  out.ok = ok == "1";
  try {
    out.result = std::stoi(result);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return out;
}

void serve_nvrtc(int in, int out) {
  while (const std::optional<NvrtcRequest> req = receive_request(in))
    if (!send_output(out, nvrtc_compile(*req))) return;
}

}  // namespace kiln::rt
