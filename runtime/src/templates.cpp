#include "kiln/runtime/templates.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "kiln/error.h"

namespace kiln::detail {
// Generated from kernel_templates/*.cu by cmake/embed_templates.cmake.
const std::vector<std::pair<std::string_view, std::string_view>>& embedded_templates();
}  // namespace kiln::detail

namespace kiln::rt {

namespace {

bool name_start(char c) { return (c >= 'A' && c <= 'Z') || c == '_'; }
bool name_char(char c) { return name_start(c) || (c >= '0' && c <= '9'); }

// Length of the placeholder "${NAME}" starting at text[pos] ("${" already seen), or 0.
std::size_t placeholder_length(std::string_view text, std::size_t pos) {
  std::size_t i = pos + 2;
  if (i >= text.size() || !name_start(text[i])) return 0;
  while (i < text.size() && name_char(text[i])) ++i;
  return i < text.size() && text[i] == '}' ? i + 1 - pos : 0;
}

int line_of(std::string_view text, std::size_t pos) {
  return 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(pos), '\n'));
}

std::string template_dir() {
  const char* dir = std::getenv("KILN_TEMPLATE_DIR");
  return dir ? dir : "";
}

// Template names are file stems; refusing separators keeps KILN_TEMPLATE_DIR lookups inside the directory.
void check_name(std::string_view name) {
  bool ok = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
  if (!ok) throw ValueError("[templates] '" + std::string(name) + "' is not a template name (letters, digits, _ and -)");
}

std::string joined_placeholders(std::string_view text) {
  std::string out;
  for (const auto& p : template_placeholders(text)) out += (out.empty() ? "${" : " ${") + p + "}";
  return out.empty() ? "none" : out;
}

struct GeneratedText {
  std::string text, label;
};

struct Generated {
  std::mutex mu;
  std::map<std::string, GeneratedText, std::less<>> by_name;
};

Generated& generated() {
  static auto* g = new Generated;  // leaked: specs naming these live for the process
  return *g;
}

}  // namespace

void add_generated_template(std::string_view name, std::string text, std::string label) {
  check_name(name);
  if (label.empty()) label = name;
  Generated& g = generated();
  std::lock_guard lock(g.mu);
  if (auto it = g.by_name.find(name); it != g.by_name.end()) {
    if (it->second.text != text)
      throw ValueError("[templates] generated template '" + std::string(name) + "' exists with other text");
    return;
  }
  g.by_name.emplace(std::string(name), GeneratedText{std::move(text), std::move(label)});
}

std::optional<std::string> generated_template_label(std::string_view name) {
  Generated& g = generated();
  std::lock_guard lock(g.mu);
  if (auto it = g.by_name.find(name); it != g.by_name.end()) return it->second.label;
  return std::nullopt;
}

std::string template_source(std::string_view name) {
  check_name(name);
  {
    Generated& g = generated();
    std::lock_guard lock(g.mu);
    if (auto it = g.by_name.find(name); it != g.by_name.end()) return it->second.text;
  }
  if (std::string dir = template_dir(); !dir.empty()) {
    std::filesystem::path path = std::filesystem::path(dir) / (std::string(name) + ".cu");
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      throw ValueError("[templates] template '" + std::string(name) + "' not found: cannot read " + path.string() +
                       " (KILN_TEMPLATE_DIR is set)");
    }
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }
  for (const auto& [stem, text] : kiln::detail::embedded_templates())
    if (stem == name) return std::string(text);
  std::string known;
  for (const auto& n : template_names()) known += " " + n;
  throw ValueError("[templates] unknown template '" + std::string(name) + "' (known:" + known + ")");
}

std::vector<std::string> template_names() {
  std::vector<std::string> names;
  if (std::string dir = template_dir(); !dir.empty()) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
      if (e.path().extension() == ".cu") names.push_back(e.path().stem().string());
  } else {
    for (const auto& [stem, text] : kiln::detail::embedded_templates()) names.emplace_back(stem);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> template_placeholders(std::string_view text) {
  std::vector<std::string> names;
  for (std::size_t pos = text.find("${"); pos != std::string_view::npos; pos = text.find("${", pos + 1)) {
    std::size_t len = placeholder_length(text, pos);
    if (len == 0) continue;
    std::string name(text.substr(pos + 2, len - 3));
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(std::move(name));
  }
  return names;
}

std::string instantiate(std::string_view template_name, std::string_view text, const Bindings& b) {
  const std::string who = "[template " + std::string(template_name) + "] ";
  std::size_t out_size = text.size();
  for (std::size_t i = 0; i < b.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j)
      if (b[j].first == b[i].first) throw ValueError(who + "binding " + b[i].first + " is given twice");
    out_size += b[i].second.size();
  }

  // One pass over the text; bindings are few, so a linear search per placeholder is cheapest.
  std::vector<bool> used(b.size(), false);
  std::string out;
  out.reserve(out_size);
  std::size_t copied = 0;
  for (std::size_t pos = text.find("${"); pos != std::string_view::npos; pos = text.find("${", pos)) {
    std::size_t len = placeholder_length(text, pos);
    if (len == 0) {
      throw ValueError(who + "malformed placeholder at line " + std::to_string(line_of(text, pos)) +
                       " (placeholders are ${NAME} with NAME made of A-Z, 0-9 and _)");
    }
    std::string_view name = text.substr(pos + 2, len - 3);
    std::size_t k = 0;
    while (k < b.size() && b[k].first != name) ++k;
    if (k == b.size()) throw ValueError(who + "placeholder ${" + std::string(name) + "} has no binding");
    used[k] = true;
    out.append(text.substr(copied, pos - copied));
    out.append(b[k].second);
    pos += len;
    copied = pos;
  }
  out.append(text.substr(copied));

  for (std::size_t k = 0; k < b.size(); ++k) {
    if (!used[k]) {
      throw ValueError(who + "binding " + b[k].first + " is not a placeholder of the template (placeholders: " +
                       joined_placeholders(text) + ")");
    }
  }
  return out;
}

}  // namespace kiln::rt
