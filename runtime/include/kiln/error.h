#pragma once
// Every error kiln throws derives from kiln::Error. Messages start with the op
// or component in brackets: "[matmul] shapes (3,4) and (5,6) cannot be multiplied".
#include <cstdint>
#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ShapeError : public Error { using Error::Error; };
class DTypeError : public Error { using Error::Error; };
class DeviceError : public Error { using Error::Error; };
// Bad configuration or arguments that are not shapes/dtypes/devices
// (an unknown template placeholder, a malformed environment variable).
class ValueError : public Error { using Error::Error; };

// A failed CUDA driver, NVRTC or cuBLAS call.
class CudaError : public Error {
 public:
  CudaError(std::string call, std::string result_name, std::string message, const char* file, int line);
  const std::string& call() const { return call_; }
  const std::string& result_name() const { return result_name_; }

 private:
  std::string call_, result_name_;
};

// NVRTC rejected an instantiated template.
class CompileError : public Error {
 public:
  CompileError(std::string op, std::string dtypes, std::string log, std::string numbered_source,
               std::string source_path);
  const std::string& op() const { return op_; }
  const std::string& log() const { return log_; }
  const std::string& source_path() const { return source_path_; }

 private:
  std::string op_, dtypes_, log_, source_path_;
};

// A file that could not be read or parsed: names the file, the offset and what was expected.
class IoError : public Error {
 public:
  IoError(std::string file, std::uint64_t offset, const std::string& what_expected);
  const std::string& file() const { return file_; }
  std::uint64_t offset() const { return offset_; }

 private:
  std::string file_;
  std::uint64_t offset_;
};

}  // namespace kiln
