#pragma once
// What can be compiled: each KernelSpec names a template and entry point, the
// dtype tuples it is instantiated for, and how a tuple binds the placeholders.
// `jitcc warm` and the compile-everything test walk this registry.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "templates.h"

namespace kiln::rt {

struct KernelSpec {
  std::string op;             // unique name, e.g. "add", "cast", "sum"
  std::string template_name;  // file stem in kernel_templates/
  std::string entry;          // extern "C" __global__ function name
  std::vector<DTypes> dtypes;            // every tuple the op supports
  std::vector<std::uint32_t> variants{0};  // e.g. vector width; part of the key
  // Placeholder bindings for one (dtypes, variant).
  std::function<Bindings(const DTypes&, std::uint32_t variant)> bind;
  std::uint16_t id = 0;  // assigned by register_kernel
};

// Registers `spec` (throws ValueError on a duplicate op) and returns the stored copy,
// whose address is stable for the process.
const KernelSpec& register_kernel(KernelSpec spec);
const std::vector<const KernelSpec*>& registered_kernels();
const KernelSpec* find_kernel(std::string_view op);  // nullptr when absent
// The entry points of the specs registered with template `template_name`, each once.
std::vector<std::string> template_entries(std::string_view template_name);

// The name a spec's source header and cache entry carry: its op, or for an entry of a
// generated module the module's, so a module's entries share one source and one compile.
std::string kernel_source_name(const KernelSpec& spec);

// Instantiated source for one (spec, dtypes, variant); throws ValueError/DTypeError
// for a tuple the spec does not support.
std::string instantiate_kernel(const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant);
// The same source from `bindings` instead of spec.bind's (a caller's edited copy of them),
// without the checks.
std::string instantiate_kernel_with(const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant,
                                    const Bindings& bindings);

}  // namespace kiln::rt
