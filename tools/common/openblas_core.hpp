#pragma once
// OpenBLAS chooses its kernels once, when it loads, from the CPU's model
// number. A CPU newer than the OpenBLAS build (Debian 12 ships 0.3.21) gets
// its generic SSE3 kernels, "Prescott": on a Sapphire Rapids-class Xeon the
// trainer then runs 3x slower. OPENBLAS_CORETYPE, read only at load, names
// the kernels instead, so the program restarts itself once with it set.
#include <string>
#include <string_view>

namespace mhla::tools {

struct VectorUnits {
  bool avx2_fma = false;  // what OpenBLAS's Haswell kernels use
  bool avx512 = false;    // F, CD, BW, DQ and VL: what its SkylakeX kernels use
};

// What this CPU runs of the above.
VectorUnits this_cpu_vector_units();

// The OpenBLAS core to restart with, or "" to keep `chosen`: only the SSE3
// fallback is replaced, and never a core the user named in OPENBLAS_CORETYPE
// (`coretype_variable`, null when unset).
std::string openblas_core_to_restart_with(std::string_view chosen, const char* coretype_variable,
                                          VectorUnits cpu);

// Restarts this program with the same arguments and OPENBLAS_CORETYPE set
// when openblas_core_to_restart_with says so; returns when it does not, or
// when the restart fails (the program then runs on the kernels it has).
void restart_on_known_openblas_kernels(char** argv);

// "OpenBLAS 0.3.21, SkylakeX kernels": the version and the kernels in use.
std::string openblas_description();

}  // namespace mhla::tools
