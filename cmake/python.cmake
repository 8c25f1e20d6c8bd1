# The `tandem` Python package (python/): the extension _tandem, built from the library API,
# and the package files around it, assembled in BUILD/python/tandem so that
#   PYTHONPATH=BUILD/python /usr/bin/python3 -c "import tandem"
# works from the build tree. `cmake --install` puts the package under
# PREFIX/${TANDEM_PYTHON_INSTALL_DIR} (lib/python3/dist-packages: on the path of Debian's
# interpreter for the prefix /usr/local).
set(TANDEM_PYTHON_INSTALL_DIR "lib/python3/dist-packages" CACHE STRING
    "Where `cmake --install` puts the tandem Python package, relative to the prefix")

set(_tandem_py_dir ${PROJECT_BINARY_DIR}/python/tandem)
pybind11_add_module(tandem_python MODULE NO_EXTRAS ${PROJECT_SOURCE_DIR}/python/tandem_module.cpp)
set_target_properties(tandem_python PROPERTIES OUTPUT_NAME _tandem
                                               LIBRARY_OUTPUT_DIRECTORY ${_tandem_py_dir})
target_link_libraries(tandem_python PRIVATE tandem_lib)
# The module exports PyInit__tandem and nothing of the static libraries inside it: exported
# copies of the C++ library's templates would interpose on the shared libraries the module
# loads (a system SentencePiece's initialiser crashed calling into them when numpy had been
# imported first).
target_link_options(tandem_python PRIVATE "LINKER:--exclude-libs,ALL")

set(_tandem_py_files __init__.py __init__.pyi py.typed)
set(_tandem_py_outputs)
foreach(f ${_tandem_py_files})
  add_custom_command(OUTPUT ${_tandem_py_dir}/${f}
                     COMMAND ${CMAKE_COMMAND} -E copy_if_different
                             ${PROJECT_SOURCE_DIR}/python/tandem/${f} ${_tandem_py_dir}/${f}
                     DEPENDS ${PROJECT_SOURCE_DIR}/python/tandem/${f})
  list(APPEND _tandem_py_outputs ${_tandem_py_dir}/${f})
endforeach()
add_custom_target(tandem_python_files ALL DEPENDS ${_tandem_py_outputs})
add_dependencies(tandem_python tandem_python_files)

install(TARGETS tandem_python LIBRARY DESTINATION ${TANDEM_PYTHON_INSTALL_DIR}/tandem)
foreach(f ${_tandem_py_files})
  install(FILES ${PROJECT_SOURCE_DIR}/python/tandem/${f}
          DESTINATION ${TANDEM_PYTHON_INSTALL_DIR}/tandem)
endforeach()
