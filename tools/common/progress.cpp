#include "common/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace mhla::tools {
namespace {

std::string clock_text(double seconds) {
  const long s = long(seconds + 0.5);
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%ld:%02ld", s / 60, s % 60);
  return buffer;
}

}  // namespace

ProgressBar::ProgressBar(double total)
    : total_(std::max(total, 1e-300)),
      enabled_(isatty(fileno(stderr)) != 0),
      start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() {
  if (enabled_) std::fprintf(stderr, "\r\033[K");
}

void ProgressBar::advance(double done, const std::string& label) {
  done_ = std::min(total_, done_ + done);
  draw(label);
}

void ProgressBar::draw(const std::string& label) const {
  if (!enabled_) return;
  constexpr int kWidth = 30;
  const double fraction = done_ / total_;
  const int filled = int(fraction * kWidth);
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const std::string left =
      done_ > 0 ? clock_text(elapsed / done_ * (total_ - done_)) : std::string("?");
  std::fprintf(stderr, "\r\033[K[%s%s] %3.0f%%  elapsed %s  left ~%s  %s",
               std::string(size_t(filled), '#').c_str(),
               std::string(size_t(kWidth - filled), '.').c_str(), fraction * 100,
               clock_text(elapsed).c_str(), left.c_str(), label.c_str());
  std::fflush(stderr);
}

}  // namespace mhla::tools
