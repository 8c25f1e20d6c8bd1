# The CUDA backend: kernels, the CUDA device and the NCCL communicator, compiled for
# TANDEM_CUDA_ARCH (sm_90 by default). CI compiles it (nvcc is there) but runs no GPU code.
enable_language(CUDA)
# CMake 3.25 knows no C++20 dialect for nvcc; device code is C++17.
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_ARCHITECTURES ${TANDEM_CUDA_ARCH})
find_package(CUDAToolkit REQUIRED)
find_library(NCCL_LIBRARY NAMES nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu REQUIRED)
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include REQUIRED)

# Every src/<area>/cuda/ folder: device (kernels, the CUDA device), comm (NCCL), shard (the
# engine's CUDA executor), plan (the CUDA probe backend).
file(GLOB TANDEM_CUDA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/*/cuda/*.cu
     ${PROJECT_SOURCE_DIR}/src/*/cuda/*.cpp)
add_library(tandem_cuda STATIC ${TANDEM_CUDA_SOURCES})
# Kernels on Hopper's warpgroup MMA (src/device/cuda/sm90a/): the wgmma instructions exist only
# in code for sm_90a, which runs on compute capability 9.0 alone, so they are compiled apart for
# that target when the build's architectures include 90, and kernels_flash.cu dispatches to them
# (TANDEM_HAVE_SM90A) after checking the device at run time.
if("90" IN_LIST TANDEM_CUDA_ARCH OR "90-real" IN_LIST TANDEM_CUDA_ARCH)
  file(GLOB TANDEM_CUDA_SM90A_SOURCES CONFIGURE_DEPENDS
       ${PROJECT_SOURCE_DIR}/src/device/cuda/sm90a/*.cu)
  add_library(tandem_cuda_sm90a OBJECT ${TANDEM_CUDA_SM90A_SOURCES})
  set_target_properties(tandem_cuda_sm90a PROPERTIES CUDA_ARCHITECTURES 90a)
  target_include_directories(tandem_cuda_sm90a PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(tandem_cuda_sm90a PRIVATE CUDA::cudart fmt::fmt)
  target_compile_options(tandem_cuda_sm90a PRIVATE
    "--expt-relaxed-constexpr;-lineinfo;-Xcompiler=-Wall")
  target_sources(tandem_cuda PRIVATE $<TARGET_OBJECTS:tandem_cuda_sm90a>)
  target_compile_definitions(tandem_cuda PRIVATE TANDEM_HAVE_SM90A=1)
endif()
# Installed, the library needs no CUDA or NCCL headers (cmake/install.cmake), and NCCL is
# the imported target tandem::nccl of the package's config file.
target_include_directories(tandem_cuda PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/src>)
target_include_directories(tandem_cuda SYSTEM PUBLIC "$<BUILD_INTERFACE:${NCCL_INCLUDE_DIR}>"
                           "$<BUILD_INTERFACE:${CUDAToolkit_INCLUDE_DIRS}>")
target_link_libraries(tandem_cuda PUBLIC CUDA::cudart CUDA::cublasLt
                      $<BUILD_INTERFACE:${NCCL_LIBRARY}> $<INSTALL_INTERFACE:tandem::nccl> fmt::fmt
                      nlohmann_json::nlohmann_json Threads::Threads MPI::MPI_C)
target_compile_options(tandem_cuda PRIVATE
  "$<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr;-lineinfo;-Xcompiler=-Wall>"
  "$<$<COMPILE_LANGUAGE:CXX>:-Wall;-Wextra;-Wshadow;-Wno-unused-parameter>")
target_compile_definitions(tandem_lib PUBLIC TANDEM_HAVE_CUDA=1)
target_link_libraries(tandem_lib PUBLIC tandem_cuda)
# The CUDA objects call back into the library (errors, communicator checks): declare the
# cycle so the linker repeats the two static libraries as needed.
target_link_libraries(tandem_cuda PRIVATE tandem_lib)
set_property(TARGET tandem_cuda PROPERTY LINK_INTERFACE_MULTIPLICITY 3)
