#pragma once

namespace mhla::cpu {

// GNU libgomp keeps its worker threads in a pool that fork() does not copy:
// in a child of a process that has run a parallel region, the next region
// waits forever for workers that do not exist. Python forks workers that way
// (multiprocessing, torch's DataLoader), and torch's own OpenMP runtime, which
// the Python extension shares once torch is imported, has the same limit.
// Registers, once per process, a fork handler that sets the child's OpenMP
// thread count to one, so that a forked child computes the same results
// serially instead of hanging. Returns true; called by a static initialiser of
// the CPU backend, which every entry point links.
bool run_forked_children_serially();

}  // namespace mhla::cpu
