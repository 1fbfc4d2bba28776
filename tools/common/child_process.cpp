#include "common/child_process.hpp"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "mhla/error.hpp"

namespace mhla::tools {

double peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_maxrss) * 1024.0;
}

std::string run_self(const std::vector<std::string>& args, const std::vector<std::string>& unset) {
  char self[4096] = {};
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) throw Error("cannot locate this program's executable for a child measurement");
  // Arguments are the program's own (numbers and fixed words); quote them anyway.
  std::string command;
  if (!unset.empty()) {
    command = "env";
    for (const std::string& name : unset) command.append(" -u '").append(name).append("'");
    command += " ";
  }
  command += "'";
  command += self;
  command += "'";
  for (const std::string& a : args) command.append(" '").append(a).append("'");
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) throw Error("cannot start the child measurement: " + command);
  std::string text;
  char buffer[512];
  while (fgets(buffer, sizeof(buffer), pipe)) text += buffer;
  if (pclose(pipe) != 0) throw Error("child measurement failed (" + command + "): " + text);
  return text;
}

CommandRun run_command(const std::string& command) {
  const std::string merged = command + " 2>&1";
  FILE* pipe = popen(merged.c_str(), "r");
  if (!pipe) throw Error("cannot start: " + command);
  std::string output;
  char buffer[1024];
  while (fgets(buffer, sizeof buffer, pipe)) output += buffer;
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

}  // namespace mhla::tools
