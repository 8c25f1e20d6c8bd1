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
