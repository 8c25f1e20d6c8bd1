# TANDEM_FUZZ builds the libFuzzer harnesses of tests/fuzz/ (clang only). Everything is
# compiled with the fuzzer's coverage instrumentation and AddressSanitizer plus
# UndefinedBehaviorSanitizer (UB fatal), so a harness fails on a crash, an out-of-bounds
# access, a leak or undefined behaviour in the library code it reaches; each harness then
# links libFuzzer's main (-fsanitize=fuzzer, in tests/fuzz/CMakeLists.txt).
if(NOT TANDEM_FUZZ)
  return()
endif()
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "TANDEM_FUZZ needs clang (libFuzzer), e.g. -DCMAKE_CXX_COMPILER=clang++ "
                      "-DCMAKE_C_COMPILER=clang; this build uses ${CMAKE_CXX_COMPILER_ID}")
endif()
if(TANDEM_CUDA)
  message(FATAL_ERROR "TANDEM_FUZZ builds the host code only: configure with -DTANDEM_CUDA=OFF")
endif()
add_compile_options(
  "$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link,address,undefined;-fno-sanitize-recover=undefined;-fno-omit-frame-pointer;-g>")
add_link_options(-fsanitize=address,undefined)
