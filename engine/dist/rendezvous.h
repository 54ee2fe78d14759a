#pragma once
// How the ranks of a process group agree on NCCL's unique id (128 bytes that rank 0 makes):
// through a file (KILN_DIST_ID_FILE) or TCP to rank 0's host (MASTER_ADDR, MASTER_PORT).
#include <array>
#include <chrono>
#include <string>

#include "dist/tcp/tcp.h"
#include "kiln/dist.h"

namespace kiln::dist::detail {

using IdBytes = std::array<unsigned char, 128>;

struct Rendezvous {
  std::string file;  // wins when set
  std::string host;  // a host name, IPv4 or IPv6 literal ("localhost" becomes "127.0.0.1")
  int port = 0;
};

// From KILN_DIST_ID_FILE, else (in a world above 1) MASTER_ADDR and MASTER_PORT. ValueError naming
// the variable for a bad port, one of the pair alone, or none. The host is resolved when used.
Rendezvous rendezvous_from_environment(const Env& env);

// Rank 0 publishes `id` (to the file even in a world of 1) and returns it; every other rank
// returns rank 0's. DeviceError naming the file or address when rank 0 (or a rank, for rank 0 on
// TCP) does not show up within `timeout`, or when rank 0 cannot listen on MASTER_ADDR:MASTER_PORT. ProcessGroup::init's
// rank 0 removes the file once every rank has joined, so a later run cannot read a stale id.
IdBytes exchange_id(const Rendezvous& r, const Env& env, const IdBytes& id, std::chrono::milliseconds timeout);


}  // namespace kiln::dist::detail
