#pragma once
// The localhost TCP transport of the NCCL id rendezvous: rank 0 serves a few bytes to every other
// rank. IPv4 or IPv6 loopback literals only ("127.0.0.1", "::1"); errors start with [dist.rendezvous].
#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace kiln::dist::detail {

// Listens on host:port, sends `payload` to each of `clients` connections, then closes. DeviceError
// when the port cannot be bound or not every client connected within `timeout`.
void tcp_serve(const std::string& host, int port, int clients, const std::vector<unsigned char>& payload,
               std::chrono::milliseconds timeout);
// Connects to host:port (retrying while nobody listens) and reads `size` bytes. `rank` is for messages.
std::vector<unsigned char> tcp_fetch(const std::string& host, int port, std::size_t size, int rank,
                                     std::chrono::milliseconds timeout);
// A port on 127.0.0.1 that was free a moment ago (the kernel's pick), for launchers and tests.
int free_tcp_port();

}  // namespace kiln::dist::detail
