#include "kiln/runtime/kernel_bundle.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>

#include "compile_lock.h"
#include "kiln/error.h"
#include "kiln/runtime/compiler.h"
#include "kiln/runtime/disk_cache.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/log.h"
#include "module_cache_internal.h"

namespace kiln::rt {

namespace {

// Bound to ${PRELUDE} in place of the prelude, so that a kernel's source splits where it goes.
constexpr std::string_view kBundlePreludeMark = "\x01kiln-prelude\x01";
constexpr std::string_view kBundleWaitLine = "KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS";
constexpr std::string_view kBundleSuffix = "__kiln_bundle_";

bool ident_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// The names a text #defines, each once.
std::vector<std::string> macros_defined(std::string_view text) {
  std::vector<std::string> names;
  for (std::size_t at = 0; at < text.size();) {
    std::size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(at, end - at);
    at = end + 1;
    auto skip_blanks = [&line] {
      while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    };
    skip_blanks();
    if (line.empty() || line.front() != '#') continue;
    line.remove_prefix(1);
    skip_blanks();
    if (line.substr(0, 6) != "define" || line.size() < 7 || (line[6] != ' ' && line[6] != '\t')) continue;
    line.remove_prefix(6);
    skip_blanks();
    std::size_t n = 0;
    while (n < line.size() && ident_char(line[n])) ++n;
    std::string name(line.substr(0, n));
    if (n > 0 && std::find(names.begin(), names.end(), name) == names.end()) names.push_back(std::move(name));
  }
  return names;
}

// `text` with every whole-word `from` (not part of a longer name) replaced by `to`.
std::string replace_whole_word(const std::string& text, const std::string& from, const std::string& to) {
  std::string out;
  std::size_t copied = 0;
  for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + from.size())) {
    const std::size_t end = at + from.size();
    if ((at > 0 && ident_char(text[at - 1])) || (end < text.size() && ident_char(text[end]))) continue;
    out.append(text, copied, at - copied);
    out += to;
    copied = end;
  }
  return out.append(text, copied);
}

// Removes the first line of `text` that is exactly `line`; false when there is none.
bool remove_exact_line(std::string& text, std::string_view line) {
  for (std::size_t at = text.find(line); at != std::string::npos; at = text.find(line, at + 1)) {
    const std::size_t end = at + line.size();
    if ((at == 0 || text[at - 1] == '\n') && (end == text.size() || text[end] == '\n')) {
      text.erase(at, std::min(end + 1, text.size()) - at);
      return true;
    }
  }
  return false;
}

// One kernel's source taken apart: the prelude it binds and the rest, with the mark where the
// prelude goes.
struct KernelSplit {
  std::string prelude, text;
  bool waits = false;  // the text has a KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS line
};

std::optional<KernelSplit> split_kernel(const BundleItem& item) {
  const KernelSpec& spec = *item.spec;
  const std::string own = instantiate_kernel(spec, item.dtypes, item.variant);  // its checks first
  if (wants_arch_specific(own)) return std::nullopt;
  Bindings b = spec.bind(item.dtypes, item.variant);
  auto prelude = std::find_if(b.begin(), b.end(), [](const auto& kv) { return kv.first == "PRELUDE"; });
  if (prelude == b.end()) return std::nullopt;
  KernelSplit s{prelude->second, {}, false};
  prelude->second = kBundlePreludeMark;
  s.text = instantiate_kernel_with(spec, item.dtypes, item.variant, b);
  const std::size_t mark = s.text.find(kBundlePreludeMark);
  if (mark == std::string::npos || s.text.find(kBundlePreludeMark, mark + 1) != std::string::npos) return std::nullopt;
  std::string whole = s.text;
  whole.replace(mark, kBundlePreludeMark.size(), s.prelude);
  if (whole != own) return std::nullopt;  // the template binds the prelude in a way this split does not see
  s.text.erase(mark, kBundlePreludeMark.size());
  // A kernel redefining a prelude macro would leave it undefined for the kernels after it.
  const std::vector<std::string> ours = macros_defined(s.prelude);
  for (const std::string& m : macros_defined(s.text))
    if (std::find(ours.begin(), ours.end(), m) != ours.end()) return std::nullopt;
  s.waits = remove_exact_line(s.text, kBundleWaitLine);
  return s;
}

// Kernels may share a program when this is equal; "" when a kernel cannot share one.
std::string bundle_group_key(const BundleItem& item) {
  const std::optional<KernelSplit> s = split_kernel(item);
  if (!s) return "";
  return item.spec->template_name + '\0' + (s->waits ? "w" : "-") + '\0' + s->prelude;
}

double bundle_ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

struct BundlePending {
  std::size_t index;  // into the items
  std::string source;
  EntryKey key;
};

void warm_bundled_alone(const BundleItem& item, int arch, BundleResult& r) {
  try {
    const auto start = std::chrono::steady_clock::now();
    r.outcome = warm_kernel(*item.spec, item.dtypes, item.variant, arch, &r.digest);
    if (r.outcome == WarmOutcome::compiled) r.ms = bundle_ms_since(start);
  } catch (...) {
    r.outcome.reset();
    r.error = std::current_exception();
  }
}

// Compiles the pending kernels in one program and stores an entry for each; throws when the
// program fails or lacks an entry point.
void warm_together(std::span<const BundleItem> items, const std::vector<BundlePending>& pending, int arch,
                   std::vector<BundleResult>& results) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<BundleItem> members;
  for (const BundlePending& p : pending) members.push_back(items[p.index]);
  const std::string source = bundle_source(members);
  CompiledModule m = compile(
      {"bundle of " + std::to_string(members.size()) + " " + members.front().spec->template_name, "", source, arch});
  count_compile(m.ms);
  for (std::size_t j = 0; j < members.size(); ++j)
    if (m.ptx.find(".entry " + bundled_entry(members[j].spec->entry, j) + "(") == std::string::npos)
      throw ValueError("[bundle] the program lacks the entry point of " + members[j].spec->op);
  const std::string bundle = entry_key_for_arch(EntryKey{}, arch, source).digest;
  for (std::size_t j = 0; j < pending.size(); ++j) {
    Entry e{pending[j].key, pending[j].source, m.ptx, m.cubin};
    e.key.function = bundled_entry(members[j].spec->entry, j);
    e.key.bundle = bundle;
    DiskCache::global().store(e);
  }
  const double each = bundle_ms_since(start) / static_cast<double>(pending.size());
  for (const BundlePending& p : pending) {
    results[p.index].outcome = WarmOutcome::compiled;
    results[p.index].ms = each;
  }
}

}  // namespace

std::string bundled_entry(const std::string& entry, std::size_t index) {
  return entry + std::string(kBundleSuffix) + std::to_string(index);
}

std::string_view entry_name_of(std::string_view function) {
  const std::size_t at = function.rfind(kBundleSuffix);
  if (at == std::string_view::npos || at + kBundleSuffix.size() == function.size()) return function;
  const std::string_view index = function.substr(at + kBundleSuffix.size());
  const bool digits = std::all_of(index.begin(), index.end(), [](char c) { return c >= '0' && c <= '9'; });
  return digits ? function.substr(0, at) : function;
}

bool bundleable(const BundleItem& item) { return !bundle_group_key(item).empty(); }

std::vector<std::vector<std::size_t>> bundle_groups(std::span<const BundleItem> items, std::size_t most) {
  if (most == 0) throw ValueError("[bundle] a bundle holds at least one kernel");
  std::vector<std::vector<std::size_t>> groups;
  std::map<std::string, std::vector<std::size_t>> open;  // by group key: the group still filling
  for (std::size_t i = 0; i < items.size(); ++i) {
    std::string key;
    try {
      key = bundle_group_key(items[i]);
    } catch (const Error&) {  // a tuple or variant its spec lacks: warm_bundle reports it for this kernel alone
    }
    if (key.empty() || most == 1) {
      groups.push_back({i});
      continue;
    }
    std::vector<std::size_t>& g = open[key];
    g.push_back(i);
    if (g.size() == most) groups.push_back(std::exchange(g, {}));
  }
  for (auto& [key, g] : open)
    if (!g.empty()) groups.push_back(std::move(g));
  std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
    return a.size() != b.size() ? a.size() > b.size() : a.front() < b.front();
  });
  return groups;
}

std::string bundle_source(std::span<const BundleItem> items) {
  if (items.empty()) throw ValueError("[bundle] no kernels to bundle");
  std::string out = "// kiln bundle of " + std::to_string(items.size()) + " kernels\n", prelude;
  bool waits = false;
  std::string body;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::optional<KernelSplit> s = split_kernel(items[i]);
    if (!s) throw ValueError("[bundle] " + items[i].spec->op + " cannot share a program");
    if (i == 0) {
      prelude = s->prelude;
      waits = s->waits;
    } else if (s->prelude != prelude || s->waits != waits) {
      throw ValueError("[bundle] " + items[i].spec->op + " takes another prelude than " + items[0].spec->op);
    }
    const std::string ns = "kiln_bundle_" + std::to_string(i);
    // Every entry point of the template, not just the item's: a template may hold several.
    std::string text = s->text;
    for (const std::string& entry : template_entries(items[i].spec->template_name))
      text = replace_whole_word(text, entry, bundled_entry(entry, i));
    body += "namespace " + ns + " {\n" + text + "\n}  // namespace " + ns + "\n";
    for (const std::string& m : macros_defined(s->text)) body += "#undef " + m + "\n";
  }
  out += prelude;
  if (waits) out += std::string(kBundleWaitLine) + "\n";
  return out + body;
}

std::vector<BundleResult> warm_bundle(std::span<const BundleItem> items, int arch) {
  std::vector<BundleResult> results(items.size());
  std::vector<BundlePending> pending;
  DiskCache& cache = DiskCache::global();
  for (std::size_t i = 0; i < items.size(); ++i) {
    try {
      const BundleItem& it = items[i];
      std::string source = instantiate_kernel(*it.spec, it.dtypes, it.variant);
      EntryKey key = kernel_entry_key(*it.spec, it.dtypes, it.variant, arch, source);
      results[i].digest = key.digest;
      if (cache.load(key)) {
        count_disk_hit();
        results[i].outcome = WarmOutcome::cached;
      } else {
        pending.push_back({i, std::move(source), std::move(key)});
      }
    } catch (...) {
      results[i].error = std::current_exception();
    }
  }
  const char* no_compile = std::getenv("KILN_NO_COMPILE");  // each kernel's own attempt reports it
  if (pending.size() > 1 && !(no_compile && *no_compile && std::string(no_compile) != "0")) {
    // The compile locks of the kernels, as one compile of each takes its own (compile_lock.h):
    // taken in digest order, so that two processes never wait on each other in opposite orders;
    // one another process stored meanwhile is done.
    std::sort(pending.begin(), pending.end(),
              [](const BundlePending& a, const BundlePending& b) { return a.key.digest < b.key.digest; });
    std::vector<CompileLock> held;
    std::vector<BundlePending> mine;
    for (BundlePending& p : pending) {
      std::optional<CompileLock> lock = CompileLock::acquire(cache, p.key.digest);
      if (lock && cache.load(p.key)) {
        count_disk_hit();
        results[p.index].outcome = WarmOutcome::cached;
        continue;
      }
      if (lock) held.push_back(std::move(*lock));
      mine.push_back(std::move(p));
    }
    std::sort(mine.begin(), mine.end(),
              [](const BundlePending& a, const BundlePending& b) { return a.index < b.index; });
    pending = std::move(mine);
    if (pending.size() > 1) {
      try {
        warm_together(items, pending, arch, results);
        return results;
      } catch (const std::exception& e) {
        log().debug("a bundle of {} kernels ({} first) failed, compiling each alone: {}", pending.size(),
                    items[pending.front().index].spec->op, e.what());
      }
    }
    held.clear();  // each kernel compiled alone takes its own lock
  }
  for (const BundlePending& p : pending) warm_bundled_alone(items[p.index], arch, results[p.index]);
  return results;
}

}  // namespace kiln::rt
