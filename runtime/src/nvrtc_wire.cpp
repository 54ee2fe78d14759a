#include "nvrtc_wire.h"

#include <nvrtc.h>

#include <cstdint>
#include <memory>

#include "fd_io.h"

namespace kiln::rt {

namespace {

// Records the first NVRTC call that fails; later calls are skipped by the caller's checks.
bool called(NvrtcOutput& out, nvrtcResult r, const char* call) {
  if (r == NVRTC_SUCCESS) return true;
  out.result = static_cast<int>(r);
  out.failed_call = call;
  return false;
}

void put_u64(std::string& out, std::uint64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }

void put(std::string& out, const std::string& field) {
  put_u64(out, field.size());
  out += field;
}

bool get_u64(int fd, std::uint64_t& v) { return read_exact(fd, reinterpret_cast<char*>(&v), sizeof v); }

bool read_field(int fd, std::string& field) {
  std::uint64_t n = 0;
  if (!get_u64(fd, n) || n > (std::uint64_t{1} << 32)) return false;
  field.resize(n);
  return read_exact(fd, field.data(), n);
}

constexpr std::uint64_t kMaxOptions = 4096;  // more is a malformed request, not a compile

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
  put_u64(bytes, req.want_cubin);
  put_u64(bytes, req.options.size());
  put(bytes, req.source);
  put(bytes, req.name);
  for (const std::string& o : req.options) put(bytes, o);
  return send_all(fd, bytes);
}

std::optional<NvrtcRequest> receive_request(int fd) {
  NvrtcRequest req;
  std::uint64_t cubin = 0, count = 0;
  if (!get_u64(fd, cubin) || !get_u64(fd, count) || count > kMaxOptions || !read_field(fd, req.source) ||
      !read_field(fd, req.name))
    return std::nullopt;
  req.want_cubin = cubin != 0;
  req.options.resize(count);
  for (std::string& o : req.options)
    if (!read_field(fd, o)) return std::nullopt;
  return req;
}

bool send_output(int fd, const NvrtcOutput& out) {
  std::string bytes;
  put_u64(bytes, out.ok);
  put_u64(bytes, static_cast<std::uint32_t>(out.result));
  for (const std::string* f : {&out.failed_call, &out.log, &out.ptx, &out.cubin}) put(bytes, *f);
  return send_all(fd, bytes);
}

std::optional<NvrtcOutput> receive_output(int fd) {
  NvrtcOutput out;
  std::uint64_t ok = 0, result = 0;
  if (!get_u64(fd, ok) || !get_u64(fd, result)) return std::nullopt;
  for (std::string* f : {&out.failed_call, &out.log, &out.ptx, &out.cubin})
    if (!read_field(fd, *f)) return std::nullopt;
  out.ok = ok != 0;
  out.result = static_cast<int>(static_cast<std::uint32_t>(result));
  return out;
}

void serve_nvrtc(int in, int out) {
  while (const std::optional<NvrtcRequest> req = receive_request(in))
    if (!send_output(out, nvrtc_compile(*req))) return;
}

}  // namespace kiln::rt
