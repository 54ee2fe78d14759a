# Installs kiln into a scratch prefix, then builds and runs examples/embed against
# it with find_package(kiln), as a user's project would.
# Args: -DBUILD_DIR= -DSOURCE_DIR= -DWORK_DIR=
file(REMOVE_RECURSE "${WORK_DIR}")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix"
                RESULT_VARIABLE r OUTPUT_QUIET)
if(r)
  message(FATAL_ERROR "install failed: ${r}")
endif()
# The library finds its compile server in <libexecdir>/kiln (runtime/src/nvrtc_run.cpp).
file(GLOB server "${WORK_DIR}/prefix/libexec/kiln/kiln-nvrtc-server")
if(NOT server)
  message(FATAL_ERROR "the install has no libexec/kiln/kiln-nvrtc-server")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}/examples/embed" -B "${WORK_DIR}/build"
                        -G Ninja "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix"
                RESULT_VARIABLE r)
if(r)
  message(FATAL_ERROR "configuring the embedding example failed: ${r}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}/build" RESULT_VARIABLE r)
if(r)
  message(FATAL_ERROR "building the embedding example failed: ${r}")
endif()
execute_process(COMMAND "${WORK_DIR}/build/embed" RESULT_VARIABLE r OUTPUT_VARIABLE out)
message(STATUS "${out}")
if(r OR NOT out MATCHES "loss [0-9.]+, ")
  message(FATAL_ERROR "the embedding example failed: ${r}")
endif()
