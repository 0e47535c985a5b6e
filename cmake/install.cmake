# What `cmake --install` puts under the prefix (docs/build.md, "Installing"):
#   include/gradsnap/{client,clock,tls,types,dtype,digest_algo}.h  the public headers, nothing else
#   lib/libgradsnap.so                          the client library (embedded and remote back ends,
#                                               with the storage engine and the wire protocol
#                                               linked in; its own dependencies are shared)
#   lib/cmake/gradsnap/                         find_package(gradsnap): target gradsnap::gradsnap
#   lib/pkgconfig/gradsnap.pc                   pkg-config gradsnap
#   bin/gradsnap, gradsnap-server, gradsnap-train
#   lib/python3/dist-packages/gradsnap/         the Python package (python/CMakeLists.txt,
#                                               component python)
# Components (the Debian packages of cmake/package.cmake): `server` (bin/gradsnap-server) and
# `gradsnap` (the rest); a plain `cmake --install` installs both.
# (lib is GNUInstallDirs' CMAKE_INSTALL_LIBDIR.) The ctest test install_example installs into a
# temporary prefix and builds and runs examples/ against it (scripts/check-install.sh).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The shared library is the client archive linked whole, plus what it needs from the other
# archives; only the public headers' own dependency (Abseil's status and strings) is part of its
# interface.
add_library(gradsnap_shared SHARED ${CMAKE_SOURCE_DIR}/cmake/shared_library.cc)
add_library(gradsnap::gradsnap ALIAS gradsnap_shared)
set_target_properties(gradsnap_shared PROPERTIES
  OUTPUT_NAME gradsnap
  EXPORT_NAME gradsnap
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib
  GRADSNAP_SHARED_LIBRARY ON)  # storage/CMakeLists.txt: link RocksDB's shared library
target_link_libraries(gradsnap_shared
  PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,gradsnap_client>"
  PUBLIC absl::status absl::statusor absl::strings)
target_include_directories(gradsnap_shared PUBLIC
  $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(gradsnap_shared INTERFACE cxx_std_17)

install(TARGETS gradsnap_shared EXPORT gradsnapTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT gradsnap)
install(FILES
  ${CMAKE_SOURCE_DIR}/include/gradsnap/client.h
  ${CMAKE_SOURCE_DIR}/include/gradsnap/clock.h
  ${CMAKE_SOURCE_DIR}/include/gradsnap/tls.h
  ${CMAKE_SOURCE_DIR}/include/gradsnap/types.h
  ${CMAKE_SOURCE_DIR}/include/gradsnap/dtype.h
  ${CMAKE_SOURCE_DIR}/include/gradsnap/digest_algo.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/gradsnap COMPONENT gradsnap)
install(TARGETS gradsnap gradsnap-train RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT gradsnap)
install(TARGETS gradsnap-server RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT server)

set(_gradsnap_cmakedir ${CMAKE_INSTALL_LIBDIR}/cmake/gradsnap)
install(EXPORT gradsnapTargets NAMESPACE gradsnap:: DESTINATION ${_gradsnap_cmakedir}
  COMPONENT gradsnap)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/gradsnapConfig.cmake.in
  ${CMAKE_BINARY_DIR}/gradsnapConfig.cmake INSTALL_DESTINATION ${_gradsnap_cmakedir})
# 0.x: a minor version may break the interface.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/gradsnapConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES
  ${CMAKE_BINARY_DIR}/gradsnapConfig.cmake ${CMAKE_BINARY_DIR}/gradsnapConfigVersion.cmake
  DESTINATION ${_gradsnap_cmakedir} COMPONENT gradsnap)

# gradsnap.pc finds the prefix from its own location, so the installed tree can be moved (and
# `cmake --install --prefix P` works without reconfiguring).
file(RELATIVE_PATH _gradsnap_pc_to_prefix "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" _gradsnap_pc_to_prefix "${_gradsnap_pc_to_prefix}")
configure_file(${CMAKE_SOURCE_DIR}/cmake/gradsnap.pc.in ${CMAKE_BINARY_DIR}/gradsnap.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/gradsnap.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
  COMPONENT gradsnap)

add_test(NAME install_example
  COMMAND bash ${CMAKE_SOURCE_DIR}/scripts/check-install.sh ${CMAKE_BINARY_DIR})
set_tests_properties(install_example PROPERTIES LABELS install TIMEOUT 300)
