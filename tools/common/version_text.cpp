#include "version_text.h"

#include <exception>

#include "kiln/runtime/compiler.h"
#include "kiln/runtime/device.h"
#include "kiln/version.h"
#include "kiln_build_commit.h"  // generated at build time (cmake/build_commit.cmake)

namespace kiln::cli {

const char* build_commit() { return KILN_BUILD_COMMIT; }

void add_version_flag(CLI::App& app) {
  app.set_version_flag(
      "--version", [] { return version_text(); },
      "Print kiln's version and commit, and the NVRTC and CUDA driver versions");
}

std::string version_text() {
  std::string nvrtc;
  try {
    nvrtc = "NVRTC " + rt::nvrtc_version();
  } catch (const std::exception& e) {
    nvrtc = std::string("NVRTC: unavailable (") + e.what() + ")";
  }
  const std::string driver = rt::driver_version();
  return std::string("kiln ") + kiln::version() + " (commit " + build_commit() + ")\n" + nvrtc + "\n" +
         (driver.empty() ? "CUDA driver: not found" : "CUDA driver " + driver);
}

std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv,
                                      const std::function<int(const std::string&)>& on_error) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return on_error(e.what());
  }
  return std::nullopt;
}

}  // namespace kiln::cli
