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

# TANDEM_PYTHON (the `tandem` Python module of python/, built with pybind11) defaults to on
# when pybind11 and the headers of the Python found are there; never in sanitizer or fuzzing
# builds (a module would need the sanitizer runtime loaded into the interpreter first). The
# interpreter is Debian's /usr/bin/python3, where python3-pybind11 and python3-numpy
# install, unless Python3_EXECUTABLE names another.
if(NOT TANDEM_SANITIZE AND NOT TANDEM_FUZZ)
  if(NOT DEFINED Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python3_EXECUTABLE /usr/bin/python3)
  endif()
  find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
  if(Python3_FOUND)
    find_package(pybind11 CONFIG QUIET)
  endif()
endif()
if(Python3_FOUND AND pybind11_FOUND)
  set(_tandem_python_default ON)
else()
  set(_tandem_python_default OFF)
endif()
option(TANDEM_PYTHON "Build the tandem Python module (pybind11)" ${_tandem_python_default})
if(TANDEM_PYTHON)
  if(NOT Python3_FOUND OR NOT pybind11_FOUND)
    message(FATAL_ERROR "TANDEM_PYTHON needs the Python headers and pybind11 (Debian: "
                        "python3-dev python3-pybind11; scripts/install-deps.sh installs them)")
  endif()
  # The static library goes into a shared module.
  set(CMAKE_POSITION_INDEPENDENT_CODE ON)
endif()
