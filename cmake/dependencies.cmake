# Third-party dependencies, all from distribution packages (see docs/building.md).
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(CLI11 REQUIRED)
find_package(MPI REQUIRED COMPONENTS C)

# OpenBLAS: the cblas.h of the pthread flavour, so GEMMs match the library we link.
find_library(OPENBLAS_LIBRARY NAMES openblas REQUIRED)
find_path(CBLAS_INCLUDE_DIR cblas.h
          PATHS /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/aarch64-linux-gnu/openblas-pthread
                /usr/include/openblas /usr/include/x86_64-linux-gnu /usr/include
          NO_DEFAULT_PATH REQUIRED)

# OpenMP parallelises the CPU kernels; under ThreadSanitizer it is left out, since
# libgomp is not instrumented and would report its own synchronisation as races.
set(TANDEM_OPENMP OFF)
if(NOT TANDEM_SANITIZE STREQUAL "thread")
  find_package(OpenMP)
  if(OpenMP_CXX_FOUND)
    set(TANDEM_OPENMP ON)
  endif()
endif()

# What every target of the build links. Installed (cmake/install.cmake) it becomes
# tandem::deps, whose config file finds the same packages again: there OpenBLAS is the
# imported target tandem::openblas, and the headers of cblas.h and CLI11 stay behind,
# since no installed header includes them.
add_library(tandem_deps INTERFACE)
target_include_directories(tandem_deps SYSTEM INTERFACE $<BUILD_INTERFACE:${CBLAS_INCLUDE_DIR}>)
target_link_libraries(tandem_deps INTERFACE $<BUILD_INTERFACE:${OPENBLAS_LIBRARY}>
                      $<INSTALL_INTERFACE:tandem::openblas> fmt::fmt nlohmann_json::nlohmann_json
                      $<BUILD_INTERFACE:CLI11::CLI11> Threads::Threads MPI::MPI_C)
if(TANDEM_OPENMP)
  target_link_libraries(tandem_deps INTERFACE OpenMP::OpenMP_CXX)
endif()

# MPI: the CPU communicator (src/comm/mpi.cpp), through the C API only (no C++ bindings).
set(MPI_CXX_SKIP_MPICXX ON)
find_package(MPI REQUIRED COMPONENTS CXX)
target_link_libraries(tandem_deps INTERFACE MPI::MPI_CXX)

# Tokenizers (src/io/): PCRE2 runs the pre-tokenizers' regular expressions (Unicode classes
# and look-ahead, with a JIT), SentencePiece reads tokenizer.model files, utf8proc does the
# NFC normalizer (GPT-NeoX / Pythia tokenizers). Each is optional:
# found, it is built in; missing, the tokenizers that need it are compiled out and refused
# at run time with the package to install. TANDEM_REQUIRE_TOKENIZER_DEPS (on in
# scripts/build.sh, which CI runs) makes a missing one a configure error instead.
option(TANDEM_REQUIRE_TOKENIZER_DEPS "Fail when PCRE2, SentencePiece or utf8proc is missing" OFF)
find_package(PkgConfig)
set(TANDEM_PCRE2 OFF)
set(TANDEM_SENTENCEPIECE OFF)
set(TANDEM_UTF8PROC OFF)
if(PkgConfig_FOUND)
  pkg_check_modules(PCRE2 IMPORTED_TARGET libpcre2-8)
  pkg_check_modules(SENTENCEPIECE IMPORTED_TARGET sentencepiece)
  set(TANDEM_PCRE2 ${PCRE2_FOUND})
  set(TANDEM_SENTENCEPIECE ${SENTENCEPIECE_FOUND})
  pkg_check_modules(UTF8PROC IMPORTED_TARGET libutf8proc)
  set(TANDEM_UTF8PROC ${UTF8PROC_FOUND})
endif()
foreach(_dep IN ITEMS "PCRE2;PCRE2;libpcre2-dev" "SENTENCEPIECE;SentencePiece;libsentencepiece-dev"
                      "UTF8PROC;utf8proc;libutf8proc-dev")
  list(GET _dep 0 _var)
  list(GET _dep 1 _name)
  list(GET _dep 2 _package)
  if(NOT TANDEM_${_var})
    if(TANDEM_REQUIRE_TOKENIZER_DEPS)
      message(FATAL_ERROR "${_name} not found (TANDEM_REQUIRE_TOKENIZER_DEPS is on): install ${_package}")
    endif()
    message(STATUS "${_name} not found: its tokenizers are left out (install ${_package})")
  endif()
endforeach()
# Installed, the static library names them by their plain library names.
if(TANDEM_PCRE2)
  target_link_libraries(tandem_deps INTERFACE $<BUILD_INTERFACE:PkgConfig::PCRE2>
                        $<INSTALL_INTERFACE:pcre2-8>)
endif()
if(TANDEM_SENTENCEPIECE)
  target_link_libraries(tandem_deps INTERFACE $<BUILD_INTERFACE:PkgConfig::SENTENCEPIECE>
                        $<INSTALL_INTERFACE:sentencepiece>)
endif()
if(TANDEM_UTF8PROC)
  target_link_libraries(tandem_deps INTERFACE $<BUILD_INTERFACE:PkgConfig::UTF8PROC>
                        $<INSTALL_INTERFACE:utf8proc>)
endif()
