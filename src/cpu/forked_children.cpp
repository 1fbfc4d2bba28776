#include "cpu/forked_children.hpp"

#include <omp.h>
#include <pthread.h>

#include <mutex>

namespace mhla::cpu {

bool run_forked_children_serially() {
  static std::once_flag registered;
  std::call_once(registered,
                 [] { pthread_atfork(nullptr, nullptr, [] { omp_set_num_threads(1); }); });
  return true;
}

}  // namespace mhla::cpu
