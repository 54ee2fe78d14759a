// IdxInput: a buffered file, inflated by zlib when it starts with the gzip magic. Only one
// gzip member is read; anything after it is an error rather than silently dropped.
#include "idx_input.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "kiln/error.h"

namespace kiln::data::detail {

namespace {
constexpr std::size_t kChunk = std::size_t{1} << 18;
}  // namespace

IdxInput::IdxInput(const std::string& path) : path_(path), buf_(kChunk) {
  f_ = std::fopen(path.c_str(), "rb");
  if (!f_) throw IoError(path, 0, std::string("expected a readable file (") + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(::fileno(f_), &st) == 0 && S_ISREG(st.st_mode)) file_size_ = st.st_size;
  try {
    refill();
    gzip_ = have_ >= 2 && buf_[0] == 0x1f && buf_[1] == 0x8b;
    if (gzip_ && inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK)  // 16: a gzip wrapper, nothing else
      throw IoError(path, 0, "expected memory for zlib's inflate state");
  } catch (...) {
    std::fclose(f_);
    throw;
  }
  z_open_ = gzip_;
}

IdxInput::~IdxInput() {
  if (z_open_) inflateEnd(&z_);
  std::fclose(f_);
}

std::size_t IdxInput::refill() {
  at_ = 0;
  have_ = std::fread(buf_.data(), 1, buf_.size(), f_);
  if (have_ == 0 && std::ferror(f_))
    throw IoError(path_, pos_, std::string("expected a readable file (") + std::strerror(errno) + ")");
  return have_;
}

std::size_t IdxInput::read(void* dst, std::size_t n) {
  auto* out = static_cast<unsigned char*>(dst);
  const std::size_t got = gzip_ ? inflate_into(out, n) : read_raw(out, n);
  pos_ += got;
  return got;
}

std::size_t IdxInput::read_raw(unsigned char* dst, std::size_t n) {
  std::size_t got = 0;
  while (got < n && (have_ > 0 || refill() > 0)) {
    const std::size_t k = std::min(n - got, have_);
    std::memcpy(dst + got, buf_.data() + at_, k);
    at_ += k;
    have_ -= k;
    got += k;
  }
  return got;
}

std::size_t IdxInput::inflate_into(unsigned char* dst, std::size_t n) {
  std::size_t got = 0;
  while (got < n && !ended_) {
    if (have_ == 0 && refill() == 0) {
      truncated_ = true;  // the file ended inside the stream
      break;
    }
    z_.next_in = buf_.data() + at_;
    z_.avail_in = static_cast<uInt>(have_);
    z_.next_out = dst + got;
    z_.avail_out = static_cast<uInt>(std::min<std::size_t>(n - got, std::numeric_limits<uInt>::max()));
    const uInt room = z_.avail_out;
    const int r = inflate(&z_, Z_NO_FLUSH);
    got += room - z_.avail_out;
    at_ += have_ - z_.avail_in;
    have_ = z_.avail_in;
    if (r == Z_STREAM_END)
      ended_ = true;
    else if ((r != Z_OK && r != Z_BUF_ERROR) || (r == Z_BUF_ERROR && have_ > 0))
      fail_zlib(z_.msg);
  }
  return got;
}

void IdxInput::check_gzip_end(std::uint64_t at) {
  if (!gzip_) return;
  if (!ended_) throw IoError(path_, at, "expected the gzip stream's trailer after the data (the file is truncated)");
  std::uint64_t extra = have_;
  while (refill() > 0) extra += have_;
  if (extra > 0)
    throw IoError(path_, z_.total_in,
                  "expected the end of the file, found " + std::to_string(extra) +
                      " bytes after the gzip stream (offset in compressed bytes)");
}

std::string IdxInput::bytes(std::uint64_t n) const {
  return std::to_string(n) + (gzip_ ? " decompressed bytes" : " bytes") +
         (truncated_ ? " (the gzip stream is cut short)" : "");
}

void IdxInput::fail_zlib(const char* msg) const {
  throw IoError(path_, pos_, std::string("expected a valid gzip stream (zlib: ") + (msg ? msg : "no progress") + ")");
}

}  // namespace kiln::data::detail
