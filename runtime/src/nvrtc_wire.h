#pragma once
// An NVRTC compile and the bytes that carry it between a process and its compile server
// (kiln-nvrtc-server). Depends on NVRTC alone, so the server links nothing else of kiln.
#include <optional>
#include <string>
#include <vector>

namespace kiln::rt {

struct NvrtcRequest {
  std::string source, name;
  std::vector<std::string> options;
  bool want_cubin = false;
};

struct NvrtcOutput {
  bool ok = false;
  int result = 0;           // nvrtcResult of the compile, or of failed_call
  std::string failed_call;  // an NVRTC call other than the compile that failed; empty if none
  std::string log, ptx, cubin;
};

// One compile; never throws for NVRTC's sake (a failed call other than the compile is named in
// failed_call).
NvrtcOutput nvrtc_compile(const NvrtcRequest& req);

// Whole messages on a stream socket; false at end of file, on an error or a malformed
// message. The sender never raises SIGPIPE.
bool send_request(int fd, const NvrtcRequest& req);
std::optional<NvrtcRequest> receive_request(int fd);
bool send_output(int fd, const NvrtcOutput& out);
std::optional<NvrtcOutput> receive_output(int fd);

// The server's loop: requests from `in`, outputs to `out`, until `in` ends.
void serve_nvrtc(int in, int out);

// The argument the server requires, so a server of another protocol refuses to start.
inline constexpr const char* kNvrtcServerProtocol = "--kiln-nvrtc-protocol=1";
// The server's second argument when it should run below its parent's priority.
inline constexpr const char* kNvrtcServerLowered = "--lowered";
inline constexpr int kNvrtcServerNiceness = 5;  // added to the parent's

}  // namespace kiln::rt
