#pragma once
// Checks of a path a file is about to be written to, made before the (possibly long) work
// that produces the file, and again by the save functions themselves.
#include <string>

namespace kiln::io {

// IoError naming `path` unless a stream can write there: its directory exists and is
// writable, and `path` is not a directory. A fifo or device node is accepted.
void check_output_path(const std::string& path);

// check_output_path, and an existing `path` must be a regular file: save functions write a
// temporary file beside it and rename that over `path`, which would replace a symlink, a
// device node or a fifo rather than write through it.
void check_replaceable_file(const std::string& path);

}  // namespace kiln::io
