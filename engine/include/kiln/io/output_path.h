#pragma once
// Checks of a path a file is about to be written to, made before the (possibly long) work
// that produces the file, and again by the save functions themselves; the atomic write they share.
#include <string>
#include <string_view>

namespace kiln::io {

// IoError naming `path` unless a stream can write there: its directory exists and is
// writable, and `path` is not a directory. A fifo or device node is accepted.
void check_output_path(const std::string& path);

// check_output_path, and an existing `path` must be a regular file: save functions write a
// temporary file beside it and rename that over `path`, which would replace a symlink, a
// device node or a fifo rather than write through it.
void check_replaceable_file(const std::string& path);

// Writes `contents` as save_safetensors writes its files: to a temporary file beside `path`,
// flushed, fsynced and renamed over it. IoError naming `path` as check_replaceable_file does,
// or when a write fails (the target is then left as it was).
void write_file_atomically(const std::string& path, std::string_view contents);

}  // namespace kiln::io
