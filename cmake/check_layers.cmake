# Fails when a file includes a header of a layer it must not see (cmake -DSOURCE_DIR=... -P).
# The directions, from the bottom up (architecture.md, "Where the pieces go"):
#   runtime/                 runtime's own headers only: it knows no tensor
#   engine/include/kiln/     public headers: kiln/... only
#   engine/backend/          backend
#   engine/core/             core, backend
#   engine/ops/              ops, core, backend
#   engine/compile/          compile, ops, core, backend
#   engine/{nn,optim,data,io,dist}/   itself, ops, core, backend
#   tools/, examples/        public headers (kiln/...), their own files, tests/support (tools)
# An include is named by its path from engine/ ("core/registry.h"); no file reaches another
# folder with "../".
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "usage: cmake -DSOURCE_DIR=<kiln checkout> -P check_layers.cmake")
endif()
set(layers backend core ops compile nn optim data io dist)
set(sees_backend backend)
set(sees_core core backend)
set(sees_ops ops core backend)
set(sees_compile compile ops core backend)
foreach(top nn optim data io dist)
  set(sees_${top} ${top} ops core backend)
endforeach()
string(JOIN "|" layer_alt ${layers})

set(problems "")
# check(<folder> <allowed layers...>): every quoted include in the folder's .h/.cpp files.
function(check folder)
  file(GLOB_RECURSE files "${SOURCE_DIR}/${folder}/*.h" "${SOURCE_DIR}/${folder}/*.cpp")
  foreach(f ${files})
    file(STRINGS "${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]+\"")
    file(RELATIVE_PATH rel "${SOURCE_DIR}" "${f}")
    foreach(line ${lines})
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]+\"([^\"]+)\".*$" "\\1" inc "${line}")
      set(bad "")
      if(folder STREQUAL "runtime" AND inc MATCHES "^kiln/" AND NOT EXISTS "${SOURCE_DIR}/runtime/include/${inc}")
        set(bad "includes an engine header: the runtime knows no tensor")
      elseif(inc MATCHES "^\\.\\./")
        set(bad "reaches another folder with ../")
      elseif(inc MATCHES "^(${layer_alt})/")
        string(REGEX REPLACE "/.*$" "" layer "${inc}")
        list(FIND ARGN ${layer} seen)
        if(seen EQUAL -1)
          set(bad "includes the ${layer} layer, which ${folder} must not see")
        endif()
      endif()
      if(bad)
        string(APPEND problems "  ${rel}: \"${inc}\" ${bad}\n")
      endif()
    endforeach()
  endforeach()
  set(problems "${problems}" PARENT_SCOPE)
endfunction()

foreach(layer ${layers})
  check(engine/${layer} ${sees_${layer}})
endforeach()
check(engine/include)
check(runtime)
check(tools)
check(examples)

if(problems)
  message(FATAL_ERROR "[layers] includes against the layer directions (cmake/check_layers.cmake):\n${problems}")
endif()
message(STATUS "[layers] every include follows the layer directions")
