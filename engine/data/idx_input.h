#pragma once
// The byte stream of an IDX file, raw or gzip (recognised by its 1f 8b magic, not the name).
// gzip goes through zlib's inflate, not gzread: gzread ignores bytes after the stream, and
// reads of 2 MiB or more went around its check that the stream's trailer is there.
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace kiln::data::detail {

class IdxInput {
 public:
  explicit IdxInput(const std::string& path);  // IoError when the file cannot be read
  ~IdxInput();
  IdxInput(const IdxInput&) = delete;
  IdxInput& operator=(const IdxInput&) = delete;

  // Reads up to n bytes of the (decompressed) stream; fewer only at its end.
  std::size_t read(void* dst, std::size_t n);
  // After the data: IoError when the gzip stream lacks its end (offset `at`) or bytes follow it.
  void check_gzip_end(std::uint64_t at);

  bool gzip() const { return gzip_; }
  // The file's size on disk, or -1 when it is not a regular file (a pipe has no size).
  std::int64_t file_size() const { return file_size_; }
  // Offsets of a gzip file count decompressed bytes; saying so avoids looking in the wrong place.
  std::string bytes(std::uint64_t n) const;

 private:
  std::size_t refill();  // bytes now buffered; 0 at the end of the file
  std::size_t read_raw(unsigned char* dst, std::size_t n);
  std::size_t inflate_into(unsigned char* dst, std::size_t n);
  [[noreturn]] void fail_zlib(const char* msg) const;

  std::string path_;
  std::FILE* f_ = nullptr;
  std::int64_t file_size_ = -1;
  bool gzip_ = false;
  z_stream z_{};
  bool z_open_ = false, ended_ = false, truncated_ = false;
  std::vector<unsigned char> buf_;  // file bytes read but not yet used: [at_, at_ + have_)
  std::size_t at_ = 0, have_ = 0;
  std::uint64_t pos_ = 0;  // of the (decompressed) stream
};

}  // namespace kiln::data::detail
