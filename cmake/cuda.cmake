# The CUDA backend. Until its kernels land it builds a stub device that fails loudly.
enable_language(CUDA)
# CMake 3.25 knows no C++20 dialect for nvcc; device code is C++17.
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_ARCHITECTURES ${TANDEM_CUDA_ARCH})
find_package(CUDAToolkit REQUIRED)
file(GLOB TANDEM_CUDA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/device/cuda/*.cu)
add_library(tandem_cuda STATIC ${TANDEM_CUDA_SOURCES})
target_include_directories(tandem_cuda PUBLIC ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(tandem_cuda PUBLIC CUDA::cudart fmt::fmt)
target_compile_definitions(tandem_lib PUBLIC TANDEM_HAVE_CUDA=1)
target_link_libraries(tandem_lib PUBLIC tandem_cuda)
