# TANDEM_SANITIZE instruments the library, the CLI and the tests: address, undefined,
# address,undefined (both at once) or thread. Undefined behaviour is fatal
# (-fno-sanitize-recover), so a test that hits it fails instead of printing and going on.
if(TANDEM_SANITIZE STREQUAL "")
  return()
endif()
if(NOT TANDEM_SANITIZE MATCHES "^(address|undefined|address,undefined|undefined,address|thread)$")
  message(FATAL_ERROR "TANDEM_SANITIZE must be address, undefined, address,undefined or thread "
                      "(got '${TANDEM_SANITIZE}')")
endif()
if(TANDEM_FUZZ)
  message(FATAL_ERROR "TANDEM_FUZZ brings its own sanitizers: leave TANDEM_SANITIZE empty")
endif()
# Line tables (-g1) are what the sanitizers' stacks print; full debug information would
# double the compile time of an instrumented build.
add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${TANDEM_SANITIZE};-fno-omit-frame-pointer;-g1>")
add_link_options(-fsanitize=${TANDEM_SANITIZE})
# GCC 12 with ASan reports -Wmaybe-uninitialized inside libstdc++'s std::regex
# (std::function moved in regex_automaton.h), a false positive of the instrumented build.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-Wno-maybe-uninitialized>")
endif()
if(TANDEM_SANITIZE MATCHES "undefined")
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=undefined>")
endif()
