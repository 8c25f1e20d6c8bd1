# Build options. Each is documented in docs/building.md.
include(CheckLanguage)

option(TANDEM_TESTS "Build the test suite" ON)
option(TANDEM_WERROR "Treat warnings as errors" OFF)
set(TANDEM_SANITIZE "" CACHE STRING
    "Sanitizer: address, undefined, address,undefined, thread, or empty")
set_property(CACHE TANDEM_SANITIZE PROPERTY STRINGS "" address undefined "address,undefined"
                                                    thread)
option(TANDEM_FUZZ "Build the libFuzzer harnesses of tests/fuzz (clang)" OFF)

# TANDEM_CUDA defaults to on when a CUDA compiler is found (off in fuzzing builds).
if(NOT DEFINED TANDEM_CUDA)
  # nvcc is often installed under /usr/local/cuda without being on PATH.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    find_program(_tandem_nvcc nvcc)
    if(NOT _tandem_nvcc)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    endif()
  endif()
  check_language(CUDA)
  # Fuzzing builds the host code only.
  if(CMAKE_CUDA_COMPILER AND NOT TANDEM_FUZZ)
    set(_tandem_cuda_default ON)
  else()
    set(_tandem_cuda_default OFF)
  endif()
  option(TANDEM_CUDA "Build the CUDA backend" ${_tandem_cuda_default})
endif()
set(TANDEM_CUDA_ARCH "90" CACHE STRING "CUDA architectures to build for (CMAKE_CUDA_ARCHITECTURES syntax)")
