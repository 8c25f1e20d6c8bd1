# The CMake package: `cmake --install build --prefix P` puts the public headers under
# P/include/tandem/, the static libraries under P/lib/, the tandem command under P/bin/ and
# the package files under P/lib/cmake/tandem/, so that a project links the library with
#   find_package(tandem REQUIRED)
#   target_link_libraries(app PRIVATE tandem::tandem)
# Exported names: tandem_lib is tandem::tandem, tandem_deps (the third-party libraries)
# tandem::deps and, in CUDA builds, tandem_cuda tandem::cuda.
include(CMakePackageConfigHelpers)

set(TANDEM_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/tandem)
set(_tandem_exported tandem_lib tandem_deps)
set_target_properties(tandem_deps PROPERTIES EXPORT_NAME deps)
if(TANDEM_CUDA)
  set_target_properties(tandem_cuda PROPERTIES EXPORT_NAME cuda)
  list(APPEND _tandem_exported tandem_cuda)
endif()

install(TARGETS ${_tandem_exported} EXPORT tandemTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS tandem RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tandem DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(EXPORT tandemTargets NAMESPACE tandem:: DESTINATION ${TANDEM_INSTALL_CMAKEDIR})

# What the config file needs to find the link dependencies again: whether CUDA and OpenMP
# were built in, and where OpenBLAS and NCCL were found (as hints; it searches anew).
get_filename_component(TANDEM_OPENBLAS_HINT "${OPENBLAS_LIBRARY}" DIRECTORY)
if(TANDEM_CUDA)
  get_filename_component(TANDEM_NCCL_HINT "${NCCL_LIBRARY}" DIRECTORY)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tandemConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/tandemConfig.cmake
                              INSTALL_DESTINATION ${TANDEM_INSTALL_CMAKEDIR})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/tandemConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/tandemConfig.cmake
              ${PROJECT_BINARY_DIR}/tandemConfigVersion.cmake
        DESTINATION ${TANDEM_INSTALL_CMAKEDIR})
