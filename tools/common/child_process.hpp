#pragma once
// Child processes. Peak-memory measurements need a fresh process per
// measurement (a process's peak RSS never goes down), so the benchmarks re-run
// their own executable with internal arguments and read back what it prints.
#include <string>
#include <vector>

namespace mhla::tools {

// The calling process's peak resident set size so far, in bytes.
double peak_rss_bytes();

// Runs this executable again with `args`, and without the environment
// variables named in `unset`, and returns its standard output; mhla::Error
// with that output if it cannot start or exits non-zero.
std::string run_self(const std::vector<std::string>& args,
                     const std::vector<std::string>& unset = {});

// A shell command's exit status (-1 when it did not exit normally) and what it
// printed on standard output and standard error: the tests run the programs
// as a user runs them.
struct CommandRun {
  int status;
  std::string output;
};
CommandRun run_command(const std::string& command);

}  // namespace mhla::tools
