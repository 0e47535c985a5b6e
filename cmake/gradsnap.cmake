# Small helpers so each folder's CMakeLists.txt is a list of sources and dependencies.

# gradsnap_library(NAME SRCS a.cc b.cc DEPS x y)  ->  target gradsnap_NAME, alias gradsnap::NAME
function(gradsnap_library name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS" ${ARGN})
  add_library(gradsnap_${name} STATIC ${ARG_SRCS})
  add_library(gradsnap::${name} ALIAS gradsnap_${name})
  target_link_libraries(gradsnap_${name} PUBLIC ${ARG_DEPS})
endfunction()

# gradsnap_binary(NAME SRCS ... DEPS ...)  ->  build/bin/NAME
function(gradsnap_binary name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SRCS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
endfunction()

# gradsnap_test(NAME SRCS ... DEPS ... [LABELS l1 l2] [TIMEOUT s])
# A GoogleTest binary registered with ctest test by test. Tests run from the build directory.
function(gradsnap_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SRCS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  gtest_discover_tests(${name}
    WORKING_DIRECTORY ${CMAKE_BINARY_DIR}
    PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}"
    DISCOVERY_TIMEOUT 60)
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
