// The translation unit of libgradsnap.so (cmake/install.cmake). The library's code is the
// gradsnap_client archive, linked whole; CMake needs one source file of the target's own.
