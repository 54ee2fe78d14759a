# Installs kiln.pc next to the CMake package, for projects built without CMake:
#   c++ -std=c++20 main.cpp $(pkg-config --cflags --libs kiln)
# The prefix is filled in at install time, so `cmake --install --prefix DIR` gets a kiln.pc
# naming DIR; libdir and includedir follow GNUInstallDirs (absolute ones are kept as given).
foreach(kind LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${kind}}")
    set(KILN_PC_${kind} "${CMAKE_INSTALL_${kind}}")
  else()
    set(KILN_PC_${kind} "\${prefix}/${CMAKE_INSTALL_${kind}}")
  endif()
endforeach()
set(KILN_PC_PREFIX "@CMAKE_INSTALL_PREFIX@")  # for the install-time pass below
configure_file(${PROJECT_SOURCE_DIR}/cmake/kiln.pc.in ${CMAKE_BINARY_DIR}/kiln.pc.in @ONLY)

if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(kiln_pc_dir "\$ENV{DESTDIR}${CMAKE_INSTALL_LIBDIR}/pkgconfig")
else()
  set(kiln_pc_dir "\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig")
endif()
# Written straight into the prefix (not the build tree) so that concurrent installs to two
# prefixes (the embed and pkg-config tests) cannot swap files.
install(CODE "
  set(kiln_pc \"${kiln_pc_dir}/kiln.pc\")
  message(STATUS \"Installing: \${kiln_pc}\")
  configure_file(\"${CMAKE_BINARY_DIR}/kiln.pc.in\" \"\${kiln_pc}\" @ONLY)
  list(APPEND CMAKE_INSTALL_MANIFEST_FILES \"\${kiln_pc}\")
")
