# The C++ compiler's flags from MHLA_SANITIZE, MHLA_BUILD_FUZZERS and
# MHLA_NATIVE, and the warnings: the library's build and the lab's
# (experiments/) include this file, so both compile their code alike. nvcc's
# flags are set on the CUDA sources (src/CMakeLists.txt).
if(MHLA_SANITIZE)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined;-fno-omit-frame-pointer;-fno-sanitize-recover=all>")
  add_link_options(-fsanitize=address,undefined)
endif()
if(MHLA_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "MHLA_BUILD_FUZZERS needs clang (libFuzzer): configure with CXX=clang++")
  endif()
  # Coverage instrumentation plus sanitizers for the library and the targets.
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=all)
  add_link_options(-fsanitize=address,undefined)
endif()
if(MHLA_NATIVE AND NOT MHLA_SANITIZE)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-march=native>)
endif()
add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-Wall;-Wextra;-Wpedantic>")
