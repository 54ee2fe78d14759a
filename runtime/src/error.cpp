#include "kiln/error.h"

#include <string>

namespace kiln {

CudaError::CudaError(std::string call, std::string result_name, std::string message, const char* file, int line)
    : Error("[cuda] " + call + " failed: " + result_name + " (" + message + ") at " + file + ":" +
            std::to_string(line)),
      call_(std::move(call)),
      result_name_(std::move(result_name)) {}

CompileError::CompileError(std::string op, std::string dtypes, std::string log, std::string numbered_source,
                           std::string source_path)
    : Error("[" + op + "] NVRTC failed to compile" + (dtypes.empty() ? "" : " dtypes (" + dtypes + ")") + "; " +
            (source_path.empty() ? "source not written to a file (the log's last line says why)"
                                 : "source written to " + source_path) +
            "\n--- NVRTC log ---\n" + log + "\n--- source ---\n" + numbered_source),
      op_(std::move(op)),
      dtypes_(std::move(dtypes)),
      log_(std::move(log)),
      source_path_(std::move(source_path)) {}

IoError::IoError(std::string file, std::uint64_t offset, const std::string& what_expected)
    : Error("[io] " + file + " at offset " + std::to_string(offset) + ": " + what_expected),
      file_(std::move(file)),
      offset_(offset) {}

}  // namespace kiln
