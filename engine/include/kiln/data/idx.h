#pragma once
// IDX files (the MNIST format): magic 0x00 0x00 <type> <ndim>, ndim big-endian u32 dims,
// then the big-endian data. Read from raw or gzip files (detected by the gzip magic, not
// the name; one gzip member, nothing after it). A bad or truncated file throws IoError
// naming the file, the byte offset and what was expected there.
#include <cstdint>
#include <string>

#include "kiln/tensor.h"

namespace kiln::data {

// A CPU tensor with the file's dims: type 0x08 -> u8, 0x09 (i8) and 0x0B (i16) -> i32,
// 0x0C -> i32, 0x0D -> f32, 0x0E -> f64.
Tensor read_idx(const std::string& path);

struct IdxHeader {
  DType dtype;  // as read_idx returns it
  Shape shape;
  std::uint64_t data_offset;  // where the data starts in the (decompressed) stream
};
// Reads and checks only the header, e.g. to compare files before reading their data.
IdxHeader read_idx_header(const std::string& path);

// Writes a raw (or, with gzip, gzip-compressed) IDX file from a contiguous CPU tensor of
// u8, i32, f32 or f64; DTypeError for other dtypes.
void write_idx(const std::string& path, const Tensor& t, bool gzip = false);

}  // namespace kiln::data
