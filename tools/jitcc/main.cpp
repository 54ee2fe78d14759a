// jitcc: manages kiln's kernel cache (warm, warm --from-cache, list, dump, show, verify, gc, clear, stats).
// Results go to stdout (one JSON object with --json); logs and errors go to stderr.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "cli.h"
#include "fatal_signals.h"
#include "kiln/error.h"
#include "kiln/runtime/compiler.h"
#include "kiln/version.h"
#include "version_text.h"

namespace {

// Errors are reported on stderr; with --json, stdout still carries one object.
int fail(bool json, int code, const std::string& message) {
  std::fprintf(stderr, "jitcc: error: %s\n", message.c_str());
  if (json) {
    const std::string out = jitcc::dump_json(jitcc::Json{{"error", message}}) + "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  return code;
}

// Before parsing succeeds, --json is known only from the raw arguments.
bool wants_json(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--json") == 0) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  kiln::cli::trace_fatal_signals("jitcc");
  // Loads libkiln, whose static initialisers register the kernels.
  std::string version = kiln::version();
  // Compiling is this process's work: its compile servers keep its priority.
  kiln::rt::set_compile_servers_lowered(false);

  CLI::App app{"jitcc " + version + ": fill, inspect and maintain kiln's kernel cache"};
  app.require_subcommand(1);
  kiln::cli::add_version_flag(app);
  app.footer(
      "Examples:\n"
      "  jitcc warm --arch sm_90                     compile every registered kernel for sm_90\n"
      "  jitcc warm --plan run.plan --arch sm_90     compile exactly the kernels a run's plan lists\n"
      "                                              (mnist-train --kernel-plan run.plan --plan-only)\n"
      "  jitcc warm --from-cache DIR --arch sm_80    recompile the fused and user-defined kernels that the\n"
      "                                              cache DIR recorded (e.g. a training run's) for sm_80\n"
      "  jitcc list                                  fused kernels show as e.g. fused(mul,add,relu) f32\n"
      "  jitcc show 'fused(mul,add,relu) f32'        the source of a kernel made at run time, from the cache\n"
      "  jitcc show --plan run.plan                  a planned run's compiled steps, group by group\n"
      "  jitcc show --tune 'n512'                    the tuner's choices for problems with n512: every\n"
      "                                              candidate's time, and the one that runs");
  jitcc::Context ctx;
  jitcc::add_warm(app, ctx);
  jitcc::add_list(app, ctx);
  jitcc::add_dump(app, ctx);
  jitcc::add_show(app, ctx);
  jitcc::add_verify(app, ctx);
  jitcc::add_gc(app, ctx);
  jitcc::add_clear(app, ctx);
  jitcc::add_stats(app, ctx);
  jitcc::add_tune(app, ctx);

  // CLI11 alone would answer a misspelt subcommand with "A subcommand is required".
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      known = known || sub->get_name() == argv[1];
      names += " " + sub->get_name();
    }
    if (!known)
      return fail(wants_json(argc, argv), jitcc::kUsageExit,
                  std::string("unknown subcommand '") + argv[1] + "' (one of:" + names + ")");
  }

  const auto usage = [&](const std::string& what) {
    return fail(wants_json(argc, argv), jitcc::kUsageExit, what + " (run 'jitcc --help')");
  };
  if (const std::optional<int> code = kiln::cli::parse_command_line(app, argc, argv, usage)) return *code;

  try {
    return ctx.run();
  } catch (const jitcc::UsageError& e) {
    return fail(ctx.common.json, jitcc::kUsageExit, e.what());
  } catch (const std::exception& e) {
    return fail(ctx.common.json, jitcc::kFailureExit, e.what());
  }
}
