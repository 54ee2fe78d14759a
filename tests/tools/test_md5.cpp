// The MD5 that mnist-train checks downloads with: RFC 1321's test suite, and the published
// sums of the MNIST files when they are at hand.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "../../examples/mnist/md5.h"
#include "kiln/error.h"
#include "temp_dir.h"

TEST_CASE("md5 of the RFC 1321 test strings") {
  CHECK(mnist::md5_hex("") == "d41d8cd98f00b204e9800998ecf8427e");
  CHECK(mnist::md5_hex("a") == "0cc175b9c0f1b6a831c399e269772661");
  CHECK(mnist::md5_hex("abc") == "900150983cd24fb0d6963f7d28e17f72");
  CHECK(mnist::md5_hex("message digest") == "f96b697d7cb7938d525a2f31aaf161d0");
  CHECK(mnist::md5_hex("abcdefghijklmnopqrstuvwxyz") == "c3fcd3d76192e4007dfb496cca67e13b");
  CHECK(mnist::md5_hex("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789") ==
        "d174ab98d277d9f5a5611c2c9f419d9f");
  CHECK(mnist::md5_hex("12345678901234567890123456789012345678901234567890123456789012345678901234567890") ==
        "57edf4a22be3c955ac49da2e2107b67a");
}

TEST_CASE("md5_file reads the file, and names it when it cannot") {
  kiln_test::TempDir dir;
  CHECK_THROWS_AS(mnist::md5_file(dir.file("absent")), kiln::IoError);
  const char* env = std::getenv("KILN_MNIST_DIR");
  const std::string mnist = env && *env ? env : std::string(KILN_SOURCE_DIR) + "/../shared/data/mnist";
  const std::string labels = mnist + "/t10k-labels-idx1-ubyte.gz";
  if (!std::filesystem::exists(labels)) {
    MESSAGE("no MNIST files at " << mnist << ": the published-sum check is skipped");
    return;
  }
  CHECK(mnist::md5_file(labels) == "ec29112dd5afa0611ce80d1b7f02629c");
}
