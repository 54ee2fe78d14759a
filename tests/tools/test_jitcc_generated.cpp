// Kernels made at run time (fused kernels, user-defined pointwise ops) in jitcc: list, dump and
// show name them by their label, and warm --from-cache rebuilds them for another arch. The test
// process compiles them through its own module cache (NVRTC needs no GPU) and copies the entries.
#include <regex>

#include "jitcc_test_util.h"
#include "kiln/kiln.h"
#include "kiln/runtime/disk_cache.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"
#include "terminal_process.h"

using namespace jitcc_test;
namespace rt = kiln::rt;

namespace {

constexpr const char* kFusedLabel = "fused(neg,mul) f32";
constexpr const char* kUserOp = "jitcc_test_swish";

// Copies the global cache's entry `digest` into the cache directory `to`.
void copy_entry(const std::string& digest, const fs::path& to) {
  const fs::path shard = fs::path(digest.substr(0, 2));
  fs::create_directories(to / shard);
  fs::copy_file(rt::DiskCache::global().dir() / shard / (digest + ".kiln"), to / shard / (digest + ".kiln"),
                fs::copy_options::overwrite_existing);
}

struct Compiled {
  std::string generated_op, generated_digest, user_digest;
};

// A hand-registered generated template (what fusion registers) and a user op, each compiled for
// sm_90 through the module cache once per test run.
const Compiled& compiled() {
  static const Compiled c = [] {
    REQUIRE_MESSAGE(rt::DiskCache::global().mode() == rt::CacheMode::read_write, "these tests need KILN_CACHE=rw");
    Compiled out;
    out.generated_op = "fused_jitcc_test_0001";
    rt::add_generated_template(out.generated_op,
                               "extern \"C\" __global__ void kiln_fused(float* p) { p[threadIdx.x] *= -3.f; }\n", kFusedLabel);
    rt::KernelSpec s;
    s.op = out.generated_op;
    s.template_name = out.generated_op;
    s.entry = "kiln_fused";
    s.dtypes = {kiln::DTypes{kiln::DType::u8}};
    s.bind = [](const kiln::DTypes&, std::uint32_t) { return rt::Bindings{}; };
    rt::warm_kernel(rt::register_kernel(std::move(s)), kiln::DTypes{kiln::DType::u8}, 0, 90, &out.generated_digest);

    kiln::pointwise(kUserOp, "x * sigmoid(x)", {kiln::ones({2})});  // registers the op and its kernel
    const rt::KernelSpec* user = rt::find_kernel(kUserOp);
    REQUIRE(user);
    rt::warm_kernel(*user, kiln::DTypes{kiln::DType::f32, kiln::DType::f32}, 0, 90, &out.user_digest);
    return out;
  }();
  return c;
}

const nlohmann::json* find_by(const nlohmann::json& list, const char* field, const std::string& value) {
  for (const nlohmann::json& e : list)
    if (e.value(field, "") == value) return &e;
  return nullptr;
}

}  // namespace

TEST_CASE("jitcc list, dump and show name a generated kernel by its label") {
  ScratchDir dir, out;
  copy_entry(compiled().generated_digest, dir.path());
  const std::string cache = dir.path().string();

  nlohmann::json list = jitcc_json({"list", "--cache-dir", cache});
  REQUIRE(list.at("entries").size() == 1);
  const nlohmann::json& e = list.at("entries")[0];
  CHECK(e.at("name") == kFusedLabel);
  CHECK(e.at("label") == kFusedLabel);
  CHECK(e.at("op") == compiled().generated_op);  // the key keeps the hash name
  ProcessResult text = jitcc({"list", "--cache-dir", cache});
  CHECK(text.exit_code == 0);
  CHECK(text.out.find(kFusedLabel) != std::string::npos);
  CHECK(text.out.find(compiled().generated_op) == std::string::npos);

  nlohmann::json dump = jitcc_json({"dump", "--out", out.path().string(), "--cache-dir", cache});
  CHECK(dump.at("dumped") == 1);
  const fs::path stem = out.path() / ("fused_neg_mul_f32_sm90_" + compiled().generated_digest.substr(0, 8));
  CHECK(read_text(fs::path(stem) += ".cu").find("kiln_fused") != std::string::npos);
  nlohmann::json key = nlohmann::json::parse(read_text(fs::path(stem) += ".json"));
  CHECK(key.at("label") == kFusedLabel);
  CHECK(key.at("op") == compiled().generated_op);

  // show finds a kernel jitcc has no spec for in the cache, by label or by hash name.
  ProcessResult by_label = jitcc({"show", kFusedLabel, "--cache-dir", cache});
  INFO(by_label.err);
  CHECK(by_label.exit_code == 0);
  CHECK(by_label.out == read_text(fs::path(stem) += ".cu"));
  nlohmann::json by_op = jitcc_json({"show", compiled().generated_op, "--cache-dir", cache});
  CHECK(by_op.at("name") == kFusedLabel);
  CHECK(by_op.at("source") == by_label.out);
  nlohmann::json ptx = jitcc_json({"show", kFusedLabel, "--ptx", "--arch", "sm_80", "--cache-dir", cache});
  CHECK(ptx.at("ptx").get<std::string>().find(".target sm_80") != std::string::npos);

  ProcessResult missing = jitcc({"show", "fused(nothing) f32", "--cache-dir", cache});
  CHECK(missing.exit_code == 2);
  CHECK(missing.err.find("fused(nothing) f32") != std::string::npos);
}

TEST_CASE("jitcc show of a label that several generated kernels share lists a few of their ops and the count") {
  // Ten kernels under one label and one dtype: --dtypes and --variant cannot tell them apart, their ops can.
  constexpr const char* kLabel = "fused(jitcc_ambiguous) f32";
  ScratchDir dir;
  std::vector<std::string> ops;
  for (int i = 0; i < 10; ++i) {
    const std::string op = "fused_jitcc_ambiguous_" + std::to_string(i);
    rt::add_generated_template(op, "extern \"C\" __global__ void kiln_fused(float* p) { p[threadIdx.x] += " + std::to_string(i) +
                                       ".f; }\n",
                               kLabel);
    rt::KernelSpec s;
    s.op = s.template_name = op;
    s.entry = "kiln_fused";
    s.dtypes = {kiln::DTypes{kiln::DType::u8}};
    s.bind = [](const kiln::DTypes&, std::uint32_t) { return rt::Bindings{}; };
    std::string digest;
    rt::warm_kernel(rt::register_kernel(std::move(s)), kiln::DTypes{kiln::DType::u8}, 0, 90, &digest);
    copy_entry(digest, dir.path());
    ops.push_back(op);
  }
  ProcessResult r = jitcc({"show", kLabel, "--cache-dir", dir.path().string()});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("names 10 kernels in the cache") != std::string::npos);
  CHECK(r.err.find("and 2 more") != std::string::npos);
  CHECK(r.err.find("pick one by its op") != std::string::npos);
  int listed = 0;
  for (const std::string& op : ops) listed += r.err.find(op + " (u8)") != std::string::npos;
  CHECK(listed == 8);
  // Each listed op names exactly one kernel.
  ProcessResult one = jitcc({"show", ops[3], "--cache-dir", dir.path().string()});
  CHECK(one.exit_code == 0);
  CHECK(one.out.find("+= 3.f") != std::string::npos);
}

TEST_CASE("jitcc warm --from-cache rebuilds generated and user-defined kernels for another arch") {
  ScratchDir from, to;
  copy_warmed_cache(from.path());  // built-in kernels: plain `warm` rebuilds those
  copy_entry(compiled().generated_digest, from.path());
  copy_entry(compiled().user_digest, from.path());
  const std::vector<std::string> args{"warm",   "--from-cache", from.path().string(), "--arch",
                                      "sm_80", "--cache-dir",  to.path().string()};

  nlohmann::json first = jitcc_json(args);
  CHECK(first.at("compiled") == 2);
  CHECK(first.at("cached") == 0);
  CHECK(first.at("failed") == 0);
  CHECK(first.at("builtin_skipped") == static_cast<std::int64_t>(selection().instances.size()));
  REQUIRE(first.at("kernels").size() == 2);
  CHECK(find_by(first.at("kernels"), "name", kFusedLabel));
  CHECK(find_by(first.at("kernels"), "name", kUserOp));
  CHECK(first.at("families").size() == 2);  // each kernel's op is its own family here

  nlohmann::json list = jitcc_json({"list", "--cache-dir", to.path().string()});
  REQUIRE(list.at("entries").size() == 2);
  const nlohmann::json* fused = find_by(list.at("entries"), "label", kFusedLabel);
  REQUIRE(fused);
  CHECK(fused->at("arch") == "sm_80");
  CHECK(fused->at("op") == compiled().generated_op);
  const nlohmann::json* user = find_by(list.at("entries"), "op", kUserOp);
  REQUIRE(user);
  CHECK(user->at("arch") == "sm_80");
  CHECK(user->at("dtypes") == "f32,f32");

  nlohmann::json second = jitcc_json(args);
  CHECK(second.at("compiled") == 0);
  CHECK(second.at("cached") == 2);

  ProcessResult text = jitcc(args);
  CHECK(text.exit_code == 0);
  CHECK(text.out.find(std::string("cached ") + kFusedLabel + " for sm_80") != std::string::npos);

  // On a terminal: progress while reading DIR and while compiling, then the same text.
  const std::string tty = jitcc_on_terminal(args).out;
  const std::string n = std::to_string(selection().instances.size() + 2);
  CHECK(tty.starts_with("\rwarm: reading 0/" + n + " entries (0%)"));
  CHECK(tty.find("\rwarm 1/2 kernels (50%): 0 compiled, 1 cached, 0 failed; ") != std::string::npos);
  const std::regex seconds("in [0-9]+\\.[0-9]+ s");
  CHECK(std::regex_replace(after_progress(tty), seconds, "") == std::regex_replace(text.out, seconds, ""));
}

TEST_CASE("jitcc warm --from-cache: a source that does not compile and a bad entry are named; bad arguments are usage errors") {
  ScratchDir from, to;
  rt::DiskCache cache(from.path(), rt::CacheMode::read_write, 0);
  rt::Entry broken;
  broken.key = {.op = "fused_jitcc_test_broken", .dtypes = "u8", .arch = 90, .kind = "ptx", .nvrtc_version = "0",
                .options = "-x", .label = "fused(broken) f32"};
  broken.source = "extern \"C\" __global__ void kiln_fused() { this does not compile }\n";
  broken.ptx = "// none\n";
  cache.store(broken);
  const fs::path broken_file = cache.list().at(0).path;
  fs::create_directories(from.path() / "ab");
  std::ofstream(from.path() / "ab" / (std::string(64, 'a') + ".kiln")) << "not an entry";

  nlohmann::json j = jitcc_json(
      {"warm", "--from-cache", from.path().string(), "--arch", "sm_80", "--cache-dir", to.path().string()}, 1);
  CHECK(j.at("compiled") == 0);
  CHECK(j.at("failed") == 2);
  const nlohmann::json* failure = find_by(j.at("failures"), "name", "fused(broken) f32");
  REQUIRE(failure);
  CHECK(failure->at("entry") == broken_file.string());
  CHECK(failure->at("log").get<std::string>().find("error") != std::string::npos);
  CHECK(find_by(j.at("failures"), "entry", (from.path() / "ab" / (std::string(64, 'a') + ".kiln")).string()));
  ProcessResult text = jitcc({"warm", "--from-cache", from.path().string(), "--arch", "sm_80", "--cache-dir",
                              to.path().string()});
  CHECK(text.exit_code == 1);
  CHECK(text.err.find("jitcc: failed: fused(broken) f32 (" + broken_file.string() + ")") != std::string::npos);

  ProcessResult absent = jitcc({"warm", "--from-cache", (from.path() / "absent").string(), "--arch", "sm_80"});
  CHECK(absent.exit_code == 2);
  CHECK(absent.err.find((from.path() / "absent").string()) != std::string::npos);
  ProcessResult with_ops =
      jitcc({"warm", "--from-cache", from.path().string(), "--ops", "add", "--arch", "sm_80"});
  CHECK(with_ops.exit_code == 2);
  CHECK(with_ops.err.find("--ops") != std::string::npos);
}
