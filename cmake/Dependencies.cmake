# Every dependency comes from a Debian package; scripts/install-deps.sh installs them.
find_package(OpenMP REQUIRED)

# OpenBLAS, OpenMP flavour: its GEMM runs single-threaded when called from inside
# our own OpenMP regions (it checks omp_in_parallel), so the operator owns the
# parallel decomposition and results do not depend on the thread count.
# Debian's paths, also under each CMAKE_PREFIX_PATH entry (an unpacked
# package tree: scripts/gpu_check.sh).
set(openblas_roots /usr)
foreach(prefix IN LISTS CMAKE_PREFIX_PATH)
  list(PREPEND openblas_roots ${prefix})
endforeach()
set(openblas_include_hints "")
set(openblas_library_hints "")
foreach(root IN LISTS openblas_roots)
  foreach(arch x86_64-linux-gnu aarch64-linux-gnu)
    list(APPEND openblas_include_hints ${root}/include/${arch}/openblas-openmp)
    list(APPEND openblas_library_hints ${root}/lib/${arch}/openblas-openmp)
  endforeach()
endforeach()
find_path(OPENBLAS_INCLUDE_DIR cblas.h HINTS ${openblas_include_hints} NO_DEFAULT_PATH)
find_library(OPENBLAS_LIBRARY openblas HINTS ${openblas_library_hints} NO_DEFAULT_PATH)
if(NOT OPENBLAS_INCLUDE_DIR OR NOT OPENBLAS_LIBRARY)
  message(FATAL_ERROR "OpenBLAS (OpenMP flavour) not found: apt-get install libopenblas-openmp-dev")
endif()
add_library(mhla_openblas INTERFACE)
set_target_properties(mhla_openblas PROPERTIES EXPORT_NAME openblas)
target_include_directories(mhla_openblas INTERFACE ${OPENBLAS_INCLUDE_DIR})
# A target that sets MHLA_PRIVATE_BLAS (the Python extension) gets the static
# archive with its symbols hidden instead of libopenblas.so.0. All OpenBLAS
# flavours share that soname, and a process holds one library per soname: once
# torch or NumPy has loaded the pthread flavour, the extension would be handed
# it (or, imported first, would hand them ours, and their libblas.so.3 then
# hangs calling into a core of the other flavour).
find_library(OPENBLAS_STATIC_LIBRARY libopenblas.a HINTS ${openblas_library_hints} NO_DEFAULT_PATH)
target_link_libraries(mhla_openblas INTERFACE
  $<IF:$<BOOL:$<TARGET_PROPERTY:MHLA_PRIVATE_BLAS>>,${OPENBLAS_STATIC_LIBRARY};-Wl$<COMMA>--exclude-libs$<COMMA>ALL,${OPENBLAS_LIBRARY}>
  OpenMP::OpenMP_CXX)

# Google Highway: the float kernels' SIMD code, compiled for each x86
# instruction set (SSE4, AVX2, AVX-512) with the best one chosen at run time.
find_package(hwy CONFIG REQUIRED)
# Highway 1.0.3 (Debian 12) refuses to compile when the build's baseline
# already includes AVX3_DL (-march=native on Ice Lake or Zen 4 and later):
# it admits AVX3_DL among its dispatch targets only on request, then finds
# its static target missing. Ask for it exactly when the baseline needs it.
include(CheckCXXSourceCompiles)
get_target_property(CMAKE_REQUIRED_INCLUDES hwy::hwy INTERFACE_INCLUDE_DIRECTORIES)
set(baseline generic)
if(MHLA_NATIVE AND NOT MHLA_SANITIZE)
  set(baseline native)
  set(CMAKE_REQUIRED_FLAGS -march=native)
endif()
check_cxx_source_compiles("#include <hwy/highway.h>\nint main() { return 0; }"
                          MHLA_HWY_ACCEPTS_${baseline}_BASELINE)
if(NOT MHLA_HWY_ACCEPTS_${baseline}_BASELINE)
  set(MHLA_HWY_DEFINITIONS HWY_WANT_AVX3_DL)
endif()
unset(CMAKE_REQUIRED_FLAGS)
unset(CMAKE_REQUIRED_INCLUDES)

# CRC-32 of the decoder's state files.
find_package(ZLIB REQUIRED)

if(MHLA_BUILD_TOOLS)
  # .npz archives for the command-line tools. Through pkg-config: Debian's CMake
  # config for libzip also demands its command-line tools.
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(LIBZIP REQUIRED IMPORTED_TARGET libzip)

  find_package(CLI11 CONFIG REQUIRED)
endif()
# JSON results of the benchmarks and the tools' reports (header-only).
if(MHLA_BUILD_TOOLS OR (MHLA_BUILD_BENCH AND MHLA_WITH_CUDA))
  find_package(nlohmann_json CONFIG REQUIRED)
endif()
if(MHLA_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()

if(MHLA_BUILD_PYTHON)
  # Debian's interpreter by default: python3-torch and python3-numpy install
  # there, and another python3 may come first on PATH. -DPython_EXECUTABLE=...
  # builds for a different interpreter.
  if(NOT DEFINED Python_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "Interpreter the Python package is built for")
  endif()
  set(PYBIND11_FINDPYTHON ON)
  find_package(Python 3.9 REQUIRED COMPONENTS Interpreter Development.Module)
  set(MHLA_PYTHON_INSTALL_DIR lib/python3/dist-packages CACHE STRING
      "Where `cmake --install` puts the mhla package, relative to the prefix")
endif()

# The context-parallel layer over MPI (Debian's OpenMPI: libopenmpi-dev and
# openmpi-bin for mpirun). Built when MPI is found; everything else builds without it.
find_package(MPI COMPONENTS CXX)
option(MHLA_WITH_MPI "Build the context-parallel layer over MPI" ${MPI_CXX_FOUND})
if(MHLA_WITH_MPI AND NOT MPI_CXX_FOUND)
  message(FATAL_ERROR "MHLA_WITH_MPI is on but MPI was not found: apt-get install libopenmpi-dev openmpi-bin")
endif()
