# Installs kiln into a scratch prefix, then compiles examples/embed/main.cpp with nothing but
# `pkg-config --cflags --libs kiln`, as a project without CMake would, and runs it.
# Args: -DBUILD_DIR= -DSOURCE_DIR= -DWORK_DIR= -DLIBDIR= (relative to the prefix) -DCXX=
find_program(PKG_CONFIG NAMES pkg-config pkgconf)
if(NOT PKG_CONFIG)
  message(STATUS "SKIPPED: pkg-config is not installed (apt-get install pkg-config)")
  return()
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}"
                RESULT_VARIABLE r OUTPUT_QUIET)
if(r)
  message(FATAL_ERROR "install failed: ${r}")
endif()

set(ENV{PKG_CONFIG_PATH} "${prefix}/${LIBDIR}/pkgconfig")
execute_process(COMMAND "${PKG_CONFIG}" --cflags --libs kiln RESULT_VARIABLE r OUTPUT_VARIABLE flags
                ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
if(r)
  message(FATAL_ERROR "pkg-config --cflags --libs kiln failed: ${err}")
endif()
message(STATUS "pkg-config --cflags --libs kiln: ${flags}")
if(NOT flags STREQUAL "-I${prefix}/include -L${prefix}/${LIBDIR} -lkiln -lkiln_runtime")
  message(FATAL_ERROR "kiln.pc does not name the prefix installed to (${prefix})")
endif()

# The README's command, through a shell as a user types it.
execute_process(COMMAND sh -c "\"${CXX}\" -std=c++20 \"${SOURCE_DIR}/examples/embed/main.cpp\" \
$(\"${PKG_CONFIG}\" --cflags --libs kiln) -o \"${WORK_DIR}/embed\""
                RESULT_VARIABLE r)
if(r)
  message(FATAL_ERROR "compiling examples/embed with pkg-config's flags failed: ${r}")
endif()
# kiln.pc sets no rpath: the loader finds libkiln through LD_LIBRARY_PATH.
execute_process(COMMAND ${CMAKE_COMMAND} -E env "LD_LIBRARY_PATH=${prefix}/${LIBDIR}" "${WORK_DIR}/embed"
                RESULT_VARIABLE r OUTPUT_VARIABLE out)
message(STATUS "${out}")
if(r OR NOT out MATCHES "loss [0-9.]+, ")
  message(FATAL_ERROR "the embedding example built with pkg-config failed: ${r}")
endif()
