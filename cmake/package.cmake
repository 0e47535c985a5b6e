# Debian packages with CPack (docs/deploy.md, "Packages"): `cpack -G DEB` in the build
# directory, once the binaries are built, writes
#   gradsnap-server_VERSION_ARCH.deb  bin/gradsnap-server, the systemd unit
#                                     (lib/systemd/system/gradsnap-server.service), the conffile
#                                     /etc/gradsnap/server.conf, docs; its postinst makes the
#                                     system user `gradsnap` and /var/lib/gradsnap
#   gradsnap_VERSION_ARCH.deb         the CLI, the trainer, libgradsnap.so, the public headers,
#                                     the CMake package and gradsnap.pc
# both under /usr, with dependencies found by dpkg-shlibdeps. The unit and the conffile are
# installed by the packages only (EXCLUDE_FROM_ALL: a `cmake --install --prefix P` does not
# write /etc). The ctest test `debian_packages` (scripts/check-packages.sh) builds and checks
# them.
# cpack runs the `preinstall` target first; without this it depends on `all`, and building the
# packages would build every test and benchmark. `cmake --install` never builds either.
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)
set(_pkg ${CMAKE_SOURCE_DIR}/packaging)
install(FILES ${_pkg}/gradsnap-server.service DESTINATION lib/systemd/system
  COMPONENT server EXCLUDE_FROM_ALL)
install(FILES ${_pkg}/server.conf DESTINATION /etc/gradsnap COMPONENT server EXCLUDE_FROM_ALL)
install(FILES ${CMAKE_SOURCE_DIR}/docs/deploy.md ${CMAKE_SOURCE_DIR}/docs/protocol.md
  DESTINATION ${CMAKE_INSTALL_DOCDIR}-server COMPONENT server EXCLUDE_FROM_ALL)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME gradsnap)
set(CPACK_PACKAGE_VENDOR gradsnap)
set(CPACK_PACKAGE_CONTACT "gradsnap maintainers <gradsnap@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "fault-tolerant checkpointing for GPU training")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_COMPONENTS_ALL server gradsnap)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_SERVER_PACKAGE_NAME gradsnap-server)
set(CPACK_DEBIAN_SERVER_PACKAGE_DEPENDS adduser)
set(CPACK_DEBIAN_SERVER_PACKAGE_SECTION net)
set(CPACK_DEBIAN_SERVER_DESCRIPTION
  "The storage node: gradsnap-server stores training checkpoints (io_uring, zstd,\n RocksDB) and serves them over gRPC; it runs as the systemd service gradsnap-server.")
set(CPACK_DEBIAN_SERVER_PACKAGE_CONTROL_EXTRA
  ${_pkg}/conffiles ${_pkg}/postinst ${_pkg}/prerm ${_pkg}/postrm)
set(CPACK_DEBIAN_SERVER_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_GRADSNAP_PACKAGE_NAME gradsnap)
# A shlibs file, and ldconfig run by postinst and postrm for libgradsnap.so.
set(CPACK_DEBIAN_GRADSNAP_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_GRADSNAP_DESCRIPTION
  "The gradsnap CLI, the gradsnap-train trainer, the client library libgradsnap.so\n and its headers, CMake package and pkg-config file.")
include(CPack)

add_test(NAME debian_packages
  COMMAND bash ${CMAKE_SOURCE_DIR}/scripts/check-packages.sh ${CMAKE_BINARY_DIR})
# 77: everything passed but systemd-analyze verify, which could not run (the reason is printed).
set_tests_properties(debian_packages PROPERTIES LABELS install TIMEOUT 300 SKIP_RETURN_CODE 77)
