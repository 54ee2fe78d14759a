#pragma once
// Kernel templates: CUDA C++ text with ${NAME} placeholders, embedded into the
// library at build time. KILN_TEMPLATE_DIR reads them from disk instead.
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/dtype.h"

namespace kiln::rt {

using Bindings = std::vector<std::pair<std::string, std::string>>;

// The template's text; throws ValueError naming the template when it does not exist.
std::string template_source(std::string_view name);
// Source made at run time (a fused kernel), found by template_source under `name` before the
// files. Adding a name again with the same text is a no-op; with other text a ValueError.
// `label` is the readable name the disk cache records and jitcc shows ("fused(mul,add) f32").
void add_generated_template(std::string_view name, std::string text, std::string label = {});
// The label of a generated template (its name when it was given none); nullopt when `name`
// is not a generated template.
std::optional<std::string> generated_template_label(std::string_view name);
std::vector<std::string> template_names();
// The distinct placeholder names in `text`, in order of first appearance.
std::vector<std::string> template_placeholders(std::string_view text);
// Replaces every ${NAME}. A placeholder without a binding, or a binding the
// template does not use, throws ValueError naming the template and the placeholder.
std::string instantiate(std::string_view template_name, std::string_view text, const Bindings& b);

// The text every template binds to ${PRELUDE}: the half-precision headers the tuple `d` needs,
// then the "prelude" template (kernel_templates/prelude.cu).
std::string device_prelude(const DTypes& d);

}  // namespace kiln::rt
