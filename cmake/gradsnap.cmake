# Small helpers so each folder's CMakeLists.txt is a list of sources and dependencies.

# Include paths follow the dependency arrows of DESIGN.md section 2. There is no global include
# path: code includes "storage/engine.h" as before, but the directory that resolves it is the
# include root of the part storage/ (build/include_roots/storage/, holding one symlink, storage ->
# the source folder), and only targets of that folder and targets linking gradsnap::storage see
# it. Including a part one does not link is a compile error. The public headers
# (include/gradsnap/) come with gradsnap::common, generated protobuf code with gradsnap::proto.
# gradsnap_part_root(OUT) sets OUT to the include root of the current folder's top-level part
# (for tests/service: the part tests/).
function(gradsnap_part_root out)
  file(RELATIVE_PATH rel ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  string(REGEX REPLACE "/.*" "" part "${rel}")
  set(root ${CMAKE_BINARY_DIR}/include_roots/${part})
  if(NOT IS_SYMLINK ${root}/${part})
    file(MAKE_DIRECTORY ${root})
    file(CREATE_LINK ${CMAKE_SOURCE_DIR}/${part} ${root}/${part} SYMBOLIC)
  endif()
  set(${out} ${root} PARENT_SCOPE)
endfunction()

# gradsnap_library(NAME SRCS a.cc b.cc DEPS x y)  ->  target gradsnap_NAME, alias gradsnap::NAME;
# its folder's headers are part of its interface.
function(gradsnap_library name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS" ${ARGN})
  add_library(gradsnap_${name} STATIC ${ARG_SRCS})
  add_library(gradsnap::${name} ALIAS gradsnap_${name})
  target_link_libraries(gradsnap_${name} PUBLIC ${ARG_DEPS})
  gradsnap_part_root(root)
  target_include_directories(gradsnap_${name} PUBLIC ${root})
endfunction()

# gradsnap_binary(NAME SRCS ... DEPS ...)  ->  build/bin/NAME
function(gradsnap_binary name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SRCS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  gradsnap_part_root(root)
  target_include_directories(${name} PRIVATE ${root})
endfunction()

# gradsnap_test(NAME SRCS ... DEPS ... [LABELS l1 l2] [TIMEOUT s])
# A GoogleTest binary registered with ctest test by test. Tests run from the build directory.
# Every test links gradsnap::testing (tests/testing/: temporary directories, child processes).
function(gradsnap_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SRCS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} gradsnap::testing GTest::gtest
                        GTest::gtest_main)
  gradsnap_part_root(root)
  target_include_directories(${name} PRIVATE ${root})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  gtest_discover_tests(${name}
    WORKING_DIRECTORY ${CMAKE_BINARY_DIR}
    PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}"
    DISCOVERY_TIMEOUT 60)
endfunction()

# gradsnap_grpc_proto(TARGET PROTO OUT_DIR)
# The C++ messages and gRPC stubs of PROTO (protoc and grpc_cpp_plugin, found in proto/) as the
# OBJECT library TARGET; OUT_DIR lies under ${CMAKE_BINARY_DIR}/generated, which TARGET puts on
# its users' include path (proto/gradsnap.pb.h). Generated code is not ours to fix: its warnings
# stay quiet.
function(gradsnap_grpc_proto target proto out)
  get_filename_component(name ${proto} NAME_WE)
  get_filename_component(dir ${proto} DIRECTORY)
  add_custom_command(
    OUTPUT ${out}/${name}.pb.cc ${out}/${name}.pb.h ${out}/${name}.grpc.pb.cc
           ${out}/${name}.grpc.pb.h
    COMMAND ${CMAKE_COMMAND} -E make_directory ${out}
    COMMAND ${GRADSNAP_PROTOC} --proto_path=${dir} --cpp_out=${out} --grpc_out=${out}
            --plugin=protoc-gen-grpc=${GRADSNAP_GRPC_CPP_PLUGIN} ${proto}
    DEPENDS ${proto}
    COMMENT "protoc ${name}.proto"
    VERBATIM)
  add_library(${target} OBJECT ${out}/${name}.pb.cc ${out}/${name}.grpc.pb.cc)
  target_link_libraries(${target} PUBLIC gRPC::grpc++ protobuf::libprotobuf)
  target_include_directories(${target} PUBLIC ${CMAKE_BINARY_DIR}/generated)
  target_compile_options(${target} PRIVATE -w)
endfunction()

# CUDA is found, not required (GRADSNAP_CUDA=AUTO). Sets GRADSNAP_HAVE_CUDA.
macro(gradsnap_setup_cuda)
  set(GRADSNAP_HAVE_CUDA OFF)
  if(NOT GRADSNAP_CUDA STREQUAL "OFF")
    if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    endif()
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      set(CMAKE_CUDA_ARCHITECTURES ${GRADSNAP_CUDA_ARCH})
      enable_language(CUDA)
      # CMake 3.25 does not know nvcc's C++20 flag; device code is written in C++17.
      set(CMAKE_CUDA_STANDARD 17)
      set(CMAKE_CUDA_STANDARD_REQUIRED ON)
      find_package(CUDAToolkit REQUIRED)
      set(GRADSNAP_HAVE_CUDA ON)
      # Device code: no FMA contraction, so device AdamW matches the host replay bit for bit.
      string(APPEND CMAKE_CUDA_FLAGS " -fmad=false")
      message(STATUS "gradsnap: CUDA enabled (${CMAKE_CUDA_COMPILER}, sm_${GRADSNAP_CUDA_ARCH})")
    elseif(GRADSNAP_CUDA STREQUAL "ON")
      message(FATAL_ERROR "GRADSNAP_CUDA=ON but no CUDA compiler was found")
    else()
      message(STATUS "gradsnap: CUDA not found, building the CPU back ends only")
    endif()
  endif()
endmacro()
