# Writes OUTPUT, a header defining KILN_BUILD_COMMIT as the short hash of SOURCE_DIR's HEAD
# ("-dirty" with uncommitted changes, "unknown" outside a git checkout). Runs on every build
# and rewrites OUTPUT only when the text changes, so an unchanged commit rebuilds nothing.
# Args: -DSOURCE_DIR= -DOUTPUT=
set(commit unknown)
find_package(Git QUIET)
if(GIT_FOUND)
  # A source tree vendored inside another project's checkout is not that project's commit.
  execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${SOURCE_DIR}" rev-parse --show-toplevel
                  OUTPUT_VARIABLE top OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${SOURCE_DIR}" rev-parse --short=7 HEAD
                  RESULT_VARIABLE r OUTPUT_VARIABLE hash OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  file(REAL_PATH "${SOURCE_DIR}" source_real)
  if(top)
    file(REAL_PATH "${top}" top)
  endif()
  if(r EQUAL 0 AND hash MATCHES "^[0-9a-f]+$" AND top STREQUAL source_real)
    set(commit "${hash}")
    # Staged or unstaged edits to tracked files; untracked files do not count.
    execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${SOURCE_DIR}" diff --quiet HEAD --
                    RESULT_VARIABLE dirty OUTPUT_QUIET ERROR_QUIET)
    if(dirty EQUAL 1)
      string(APPEND commit "-dirty")
    endif()
  endif()
endif()
set(text "#pragma once\n#define KILN_BUILD_COMMIT \"${commit}\"\n")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUTPUT}" "${text}")
endif()
