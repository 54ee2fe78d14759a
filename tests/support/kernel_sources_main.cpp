// kiln_kernel_sources: the SHA-256 of every registered kernel's instantiated source, one line per
// (op, dtypes, variant), sorted; or one instantiated source; or the digest of the code NVRTC makes
// of each. Needs no GPU. Two listings diffed show which kernels a change to kernel_templates/ or
// the bindings touched, and (--ptx) whether a changed source still compiles to the same code.
//   kiln_kernel_sources                                op dtypes variant sha256(source), one line each
//   kiln_kernel_sources --source OP [DTYPES [VARIANT]]  the source (default: OP's first tuple, variant)
//   kiln_kernel_sources --ptx ARCH [OP,OP...]           op dtypes variant sha256(normalized PTX)
//   kiln_kernel_sources --dump DIR                      every source as DIR/op_dtypes_variant.cu (diff -r)
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kernel_sources.h"
#include "kiln/dtype.h"
#include "kiln/runtime/compiler.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/version.h"
#include "sha256.h"

namespace {

int usage() {
  std::fprintf(
      stderr,
      "usage: kiln_kernel_sources                                (op dtypes variant sha256 per line)\n"
      "       kiln_kernel_sources --source OP [DTYPES [VARIANT]]  (one instantiated source)\n"
      "       kiln_kernel_sources --ptx ARCH [OP,OP...]           (sha256 of normalized PTX per line)\n"
      "       kiln_kernel_sources --dump DIR                      (every source as DIR/op_dtypes_variant.cu)\n");
  return 2;
}

int print_source(const std::string& op, const char* dtypes, const char* variant) {
  const kiln::rt::KernelSpec* spec = kiln::rt::find_kernel(op);
  if (!spec) {
    std::fprintf(stderr, "kiln_kernel_sources: no registered kernel '%s'\n", op.c_str());
    return 1;
  }
  const kiln::DTypes d = dtypes ? kiln::DTypes::parse(dtypes) : spec->dtypes.front();
  const std::uint32_t v = variant ? static_cast<std::uint32_t>(std::stoul(variant)) : spec->variants.front();
  const std::string src = kiln::rt::instantiate_kernel(*spec, d, v);
  std::fwrite(src.data(), 1, src.size(), stdout);
  return 0;
}

int dump_sources(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  for (const kiln::rt::KernelSpec* spec : kiln::rt::registered_kernels())
    for (const kiln::DTypes& d : spec->dtypes)
      for (std::uint32_t v : spec->variants) {
        std::string dtypes = d.str();
        std::replace(dtypes.begin(), dtypes.end(), ',', '-');
        const std::filesystem::path file = dir / (spec->op + "_" + dtypes + "_" + std::to_string(v) + ".cu");
        std::ofstream out(file, std::ios::binary);
        out << kiln::rt::instantiate_kernel(*spec, d, v);
        if (!out) {
          std::fprintf(stderr, "kiln_kernel_sources: cannot write %s\n", file.c_str());
          return 1;
        }
      }
  return 0;
}

// Mangled names (a __shared__ array, a device function: named after its C++ namespace and,
// for internal ones, a hash of the whole source) numbered in order of first use.
struct NameNumbers {
  std::vector<std::string> names;
  std::string rename(const std::string& line) {
    static const std::regex mangled(R"(_Z[A-Za-z0-9_$]+)");
    std::string out;
    std::size_t last = 0;
    for (std::sregex_iterator it(line.begin(), line.end(), mangled), end; it != end; ++it) {
      const std::size_t k = std::find(names.begin(), names.end(), it->str()) - names.begin();
      if (k == names.size()) names.push_back(it->str());
      out += line.substr(last, static_cast<std::size_t>(it->position()) - last) + "_Z#" + std::to_string(k);
      last = static_cast<std::size_t>(it->position() + it->length());
    }
    return out + line.substr(last);
  }
};

// The name a one-line module-scope declaration declares: ".shared .align 4 .b8 NAME[32];".
std::string declared_name(std::string decl) {
  decl.erase(std::min(decl.find('='), decl.find(';')));
  decl.erase(std::min(decl.find('['), decl.size()));
  decl.erase(decl.find_last_not_of(" \t") + 1);
  return decl.substr(decl.find_last_of(" \t") + 1);
}

bool uses_word(const std::string& text, const std::string& word) {
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$'; };
  for (std::size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1))
    if ((at == 0 || !ident(text[at - 1])) && (at + word.size() == text.size() || !ident(text[at + word.size()])))
      return true;
  return false;
}

// PTX reduced to what the code does: comments dropped, mangled names numbered in order of use in
// the code, module-scope variables the code never names dropped (a constexpr kept as a global)
// and the rest sorted. Moving a helper to another namespace leaves it unchanged; a change to
// the code does not.
std::string normalized_ptx(const std::string& ptx) {
  std::vector<std::string> decls, body;
  std::istringstream in(ptx);
  for (std::string line; std::getline(in, line);) {
    line.erase(std::min(line.find("//"), line.size()));
    line.erase(line.find_last_not_of(" \t\r") + 1);
    if (line.empty()) continue;
    const bool decl = line.back() == ';' &&
                      (line.rfind(".global", 0) == 0 || line.rfind(".shared", 0) == 0 || line.rfind(".const", 0) == 0);
    (decl ? decls : body).push_back(line);
  }
  NameNumbers numbers;
  std::string code;
  for (const std::string& line : body) code += numbers.rename(line) + "\n";
  std::vector<std::string> kept;
  for (const std::string& decl : decls) {
    const std::string name = declared_name(decl);
    const bool numbered = std::find(numbers.names.begin(), numbers.names.end(), name) != numbers.names.end();
    if (numbered || (name.rfind("_Z", 0) != 0 && uses_word(code, name))) kept.push_back(numbers.rename(decl));
  }
  std::sort(kept.begin(), kept.end());
  std::string out;
  for (const std::string& decl : kept) out += decl + "\n";
  return out + code;
}

struct Job {
  const kiln::rt::KernelSpec* spec;
  kiln::DTypes dtypes;
  std::uint32_t variant;
};

int print_ptx(int arch, const std::string& ops) {
  std::vector<Job> jobs;
  for (const kiln::rt::KernelSpec* spec : kiln::rt::registered_kernels()) {
    if (!ops.empty() && ("," + ops + ",").find("," + spec->op + ",") == std::string::npos) continue;
    for (const kiln::DTypes& d : spec->dtypes)
      for (std::uint32_t v : spec->variants) jobs.push_back({spec, d, v});
  }
  std::vector<std::string> lines;
  std::mutex mu;
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  auto worker = [&] {
    for (std::size_t i = next++; i < jobs.size(); i = next++) {
      const Job& j = jobs[i];
      std::string line = j.spec->op + " " + j.dtypes.str() + " " + std::to_string(j.variant) + " ";
      try {
        const kiln::rt::CompileRequest req{j.spec->op, j.dtypes.str(),
                                           kiln::rt::instantiate_kernel(*j.spec, j.dtypes, j.variant), arch};
        line += kiln::rt::sha256_hex(normalized_ptx(kiln::rt::compile(req).ptx));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "kiln_kernel_sources: %s: %.2000s\n", line.c_str(), e.what());
        line += "compile-error";
        failed = true;
      }
      std::lock_guard lock(mu);
      lines.push_back(line);
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < std::max(1u, std::thread::hardware_concurrency()); ++t) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();
  std::sort(lines.begin(), lines.end());
  for (const std::string& line : lines) std::printf("%s\n", line.c_str());
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Referencing libkiln keeps it linked, so its static initialisers register the specs.
  if (!kiln::version()) return 1;
  try {
    if (argc == 1) {
      for (const std::string& line : kiln_test::kernel_source_lines()) std::printf("%s\n", line.c_str());
      return 0;
    }
    const std::string mode = argv[1];
    if (mode == "--source" && argc >= 3 && argc <= 5)
      return print_source(argv[2], argc >= 4 ? argv[3] : nullptr, argc >= 5 ? argv[4] : nullptr);
    if (mode == "--dump" && argc == 3) return dump_sources(argv[2]);
    if (mode == "--ptx" && argc >= 3 && argc <= 4)
      return print_ptx(kiln::rt::parse_arch(argv[2]), argc == 4 ? argv[3] : "");
    return usage();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln_kernel_sources: %s\n", e.what());
    return 1;
  }
}
