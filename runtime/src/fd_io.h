#pragma once
// Whole reads and writes on a descriptor, retried across EINTR and short transfers.
#include <cstddef>
#include <string>

namespace kiln::rt {

// False on an error (errno says which; EIO when nothing more could be written).
bool write_all(int fd, const std::string& bytes);
// The same on a socket, whose peer having gone is an error here, never a SIGPIPE.
bool send_all(int fd, const std::string& bytes);
// False on an error or at end of file before `n` bytes.
bool read_exact(int fd, char* p, std::size_t n);

}  // namespace kiln::rt
