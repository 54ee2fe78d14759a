// jitcc warm, list, dump and show, end to end as a user runs them (no GPU: --arch sm_90).
#include <set>
#include <tuple>

#include "jitcc_test_util.h"

using namespace jitcc_test;

namespace {

using Key = std::tuple<std::string, std::string, std::int64_t>;  // op, dtypes, variant

std::set<Key> expected_keys() {
  std::set<Key> keys;
  for (const Instance& i : selection().instances) keys.emplace(i.op, i.dtypes, i.variant);
  return keys;
}

bool looks_iso_utc(const std::string& s) {
  return s.size() == 20 && s[4] == '-' && s[7] == '-' && s[10] == 'T' && s[13] == ':' && s[16] == ':' && s[19] == 'Z';
}

}  // namespace

TEST_CASE("jitcc warm compiles every selected kernel once, then finds them all cached") {
  ScratchDir dir;
  const auto n = static_cast<std::int64_t>(selection().instances.size());

  nlohmann::json first = jitcc_json(warm_args(dir.path()));
  CHECK(first.at("compiled") == n);
  CHECK(first.at("cached") == 0);
  CHECK(first.at("failed") == 0);
  CHECK(first.at("seconds").get<double>() >= 0);
  CHECK(first.at("arch") == "sm_90");
  CHECK(first.at("failures").size() == 0);
  CHECK(entry_files(dir.path()).size() == static_cast<std::size_t>(n));

  nlohmann::json second = jitcc_json(warm_args(dir.path()));
  CHECK(second.at("compiled") == 0);
  CHECK(second.at("cached") == n);
  CHECK(second.at("failed") == 0);

  // The text report says the same for people.
  ProcessResult text = jitcc(warm_args(dir.path()));
  CHECK(text.exit_code == 0);
  CHECK(text.out.find("0 compiled, " + std::to_string(n) + " already cached, 0 failed") != std::string::npos);
}

TEST_CASE("jitcc list shows one row per entry with its key, size and times") {
  ScratchDir dir;
  copy_warmed_cache(dir.path());

  nlohmann::json j = jitcc_json({"list", "--cache-dir", dir.path().string()});
  const nlohmann::json& entries = j.at("entries");
  std::set<Key> seen;
  for (const nlohmann::json& e : entries) {
    seen.emplace(e.at("op").get<std::string>(), e.at("dtypes").get<std::string>(), e.at("variant").get<std::int64_t>());
    CHECK(e.at("arch") == "sm_90");
    CHECK((e.at("kind") == "cubin" || e.at("kind") == "ptx"));
    CHECK(e.at("bytes").get<std::int64_t>() > 0);
    CHECK(looks_iso_utc(e.at("created").get<std::string>()));
    CHECK(looks_iso_utc(e.at("last_used").get<std::string>()));
  }
  CHECK(entries.size() == selection().instances.size());
  CHECK(seen == expected_keys());

  ProcessResult text = jitcc({"list", "--cache-dir", dir.path().string()});
  CHECK(text.exit_code == 0);
  for (const Instance& i : selection().instances) CHECK(text.out.find(i.op) != std::string::npos);
  CHECK(text.out.find("last used") != std::string::npos);
}

TEST_CASE("jitcc dump writes .cu/.ptx/.json per entry, and the .cu is what show prints") {
  ScratchDir dir, out;
  copy_warmed_cache(dir.path());

  nlohmann::json j = jitcc_json({"dump", "--out", out.path().string(), "--cache-dir", dir.path().string()});
  CHECK(j.at("dumped") == static_cast<std::int64_t>(selection().instances.size()));

  for (const Instance& i : selection().instances) {
    std::string dtypes = i.dtypes;
    std::replace(dtypes.begin(), dtypes.end(), ',', '-');
    const std::string prefix = i.op + "_" + dtypes + "_v" + std::to_string(i.variant) + "_sm90_";
    std::vector<fs::path> cu;
    for (const auto& f : fs::directory_iterator(out.path())) {
      const std::string name = f.path().filename().string();
      if (name.starts_with(prefix) && f.path().extension() == ".cu") cu.push_back(f.path());
    }
    INFO("dump of " << prefix);
    REQUIRE(cu.size() == 1);
    fs::path stem = cu[0];
    stem.replace_extension();
    CHECK(read_text(fs::path(stem) += ".ptx").find(".target sm_90") != std::string::npos);
    nlohmann::json key = nlohmann::json::parse(read_text(fs::path(stem) += ".json"));
    CHECK(key.at("op") == i.op);
    CHECK(key.at("dtypes") == i.dtypes);
    CHECK(key.at("variant") == i.variant);
    CHECK(key.at("arch") == "sm_90");
    CHECK(key.at("digest").get<std::string>().size() == 64);

    ProcessResult show = jitcc({"show", i.op, "--dtypes", i.dtypes, "--variant", std::to_string(i.variant)});
    CHECK(show.exit_code == 0);
    CHECK(show.out == read_text(cu[0]));
  }

  // --ops keeps only the named op's entries.
  ScratchDir only;
  const Instance& first = selection().instances.front();
  nlohmann::json some =
      jitcc_json({"dump", "--out", only.path().string(), "--ops", first.op, "--cache-dir", dir.path().string()});
  std::int64_t want = 0;
  for (const Instance& i : selection().instances) want += i.op == first.op;
  CHECK(some.at("dumped") == want);
}

TEST_CASE("jitcc show prints the instantiated source, or its PTX, without touching the cache") {
  ScratchDir dir;
  const Instance& i = selection().instances.front();

  ProcessResult src = jitcc({"show", i.op, "--dtypes", i.dtypes, "--cache-dir", dir.path().string()});
  CHECK(src.exit_code == 0);
  CHECK(src.out.find(i.entry) != std::string::npos);
  const kiln::rt::KernelSpec* spec = kiln::rt::find_kernel(i.op);
  REQUIRE(spec);
  CHECK(src.out == kiln::rt::instantiate_kernel(*spec, kiln::DTypes::parse(i.dtypes), spec->variants.front()));

  nlohmann::json ptx =
      jitcc_json({"show", i.op, "--dtypes", i.dtypes, "--ptx", "--arch", "sm_90", "--cache-dir", dir.path().string()});
  CHECK(ptx.at("ptx").get<std::string>().find(".version") != std::string::npos);
  CHECK(ptx.at("ptx").get<std::string>().find(".target sm_90") != std::string::npos);
  CHECK(ptx.at("ptx").get<std::string>().find(i.entry) != std::string::npos);

  CHECK(jitcc_json({"list", "--cache-dir", dir.path().string()}).at("entries").size() == 0);
}

TEST_CASE("jitcc warm --bundle compiles kernels of one template together, each in an entry of its own") {
  ScratchDir together, apart;
  const std::vector<std::string> ops{"warm", "--arch", "sm_90", "--ops", "floor,ceil", "--dtypes", "f32"};
  auto with = [&](const ScratchDir& dir, const char* bundle) {
    std::vector<std::string> args = ops;
    args.insert(args.end(), {"--cache-dir", dir.path().string(), "--bundle", bundle});
    return jitcc_json(args);
  };
  const nlohmann::json one = with(together, "8"), each = with(apart, "1");
  CHECK(one.at("compiled") == 4);  // two ops, two variants each
  CHECK(one.at("programs") == 1);
  CHECK(each.at("compiled") == 4);
  CHECK(each.at("programs") == 4);
  CHECK(entry_files(together.path()).size() == 4);

  // Each entry is found by its own source; the bundled ones share their binaries.
  const nlohmann::json listed = jitcc_json({"list", "--cache-dir", together.path().string()});
  std::set<std::string> bundles;
  for (const nlohmann::json& e : listed.at("entries")) bundles.insert(e.at("bundle").get<std::string>());
  CHECK(bundles.size() == 1);
  CHECK(bundles.begin()->size() == 64);
  const nlohmann::json listed_apart = jitcc_json({"list", "--cache-dir", apart.path().string()});
  CHECK(listed_apart.at("entries").size() == 4);
  for (const nlohmann::json& e : listed_apart.at("entries")) CHECK(e.at("bundle") == "");
  // A warm of the same kernels one at a time finds them all.
  CHECK(with(together, "1").at("cached") == 4);

  std::vector<std::string> zero = ops;
  zero.insert(zero.end(), {"--cache-dir", together.path().string(), "--bundle", "0"});
  ProcessResult bad = jitcc(zero);
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("--bundle must be 1 or more, got 0") != std::string::npos);
}
