#pragma once
// MD5 (RFC 1321) of a file, to check downloads against the published MNIST sums.
#include <string>

namespace mnist {

// Lower-case hex digest; IoError when the file cannot be read.
std::string md5_file(const std::string& path);
std::string md5_hex(const std::string& bytes);

}  // namespace mnist
