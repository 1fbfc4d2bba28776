// Differential fuzzer of the `mhla` program: the random calls of the API
// fuzzer written as .npy files (float32 or float64, [B, N, H, D] or PyTorch's
// [B, H, N, D] with --order bhnd) and turned into flags; flaws the command line
// cannot express become file-level ones (a missing or truncated file, mixed
// dtypes, a bad flag value, a corrupt .npz member, an input that is /dev/zero
// or a FIFO). Every run must end in exactly one of two ways:
// exit 0 with outputs equal to the double-precision reference, or a non-zero
// exit with a named error line. A crash, a signal, a sanitizer report or a
// timeout (30 s) is a failure.
//
//   mhla_cli_fuzz MHLA_PROGRAM WORK_DIR CASES [FIRST_SEED]
#include <sys/stat.h>
#include <sys/wait.h>
#include <zip.h>

#include <algorithm>
#include <iterator>
#include <stdexcept>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/npy.hpp"
#include "outcomes.hpp"
#include "random_call.hpp"

namespace mhla::fuzz {
namespace {

namespace fs = std::filesystem;
using tools::DType;

struct Run {
  int status;  // exit code, or 128 + signal
  std::string output;
};

Run run_command(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  std::string output;
  char buffer[1024];
  while (fgets(buffer, sizeof buffer, pipe)) output += buffer;
  const int status = pclose(pipe);
  if (WIFSIGNALED(status)) return {128 + WTERMSIG(status), output};
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

// [B, N, H, D] <-> [B, H, N, D] of a rank-4 shape and its values.
std::vector<double> swap_axes_1_2(const std::vector<double>& x, const std::vector<int64_t>& s) {
  std::vector<double> out(x.size());
  for (int64_t i = 0; i < s[0]; ++i)
    for (int64_t j = 0; j < s[1]; ++j)
      for (int64_t k = 0; k < s[2]; ++k)
        for (int64_t e = 0; e < s[3]; ++e)
          out[((i * s[2] + k) * s[1] + j) * s[3] + e] = x[((i * s[1] + j) * s[2] + k) * s[3] + e];
  return out;
}

std::vector<double> sized(std::vector<double> values, const std::vector<int64_t>& shape) {
  values.resize(size_t(std::max<int64_t>(element_count(shape), 0)), 0.5);
  return values;
}

// Every digit, so that the program sees the same double as the reference.
std::string exact(double x) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", x);
  return text;
}

std::string dims(const std::array<int64_t, 3>& a, int rank) {
  std::string text;
  for (int d = 3 - rank; d < 3; ++d) {
    if (!text.empty()) text += 'x';
    text += std::to_string(a[size_t(d)]);
  }
  return text;
}

class CliCase {
 public:
  CliCase(const RandomCall& c, const fs::path& dir, std::mt19937_64& rng) : c_(c), dir_(dir) {
    heads_first_ = std::bernoulli_distribution(0.3)(rng);
    dtype_ = c.single_precision ? DType::f32 : DType::f64;
    const Options& o = c.options;
    // A layout flaw (N + 1 tokens in blocks of 1) needs --grid: --block takes N from q.
    if (o.layout.rank() == 1 && c.flaw != "layout tokens" && !std::bernoulli_distribution(0.3)(rng))
      flags_ += " --block " + std::to_string(o.layout.tile()[2]);
    else
      flags_ += " --grid " + dims(o.layout.grid(), o.layout.rank()) + " --tile " +
                dims(o.layout.tile(), o.layout.rank());
    flags_ += std::string(" --masking ") + to_string(o.masking) + " --feature-map " +
              to_string(o.feature_map);
    if (!o.normalize) flags_ += " --unnormalized";
    if (o.scale) flags_ += " --scale " + exact(*o.scale);
    if (o.eps != 1e-6) flags_ += " --eps " + exact(o.eps);
    if (o.mixing == MixingForm::toeplitz)
      flags_ += " --toeplitz-length " + std::to_string(c.w_shape.back() - 1);
    if (heads_first_) flags_ += " --order bhnd";
    write_inputs(rng);
  }

  std::string command(const std::string& program, const std::string& out) const {
    return "timeout 30 " + program + (c_.backward ? " backward" : " forward") + files_ + flags_ +
           " --out-dir " + out;
  }

  // "" if the outputs in `out` equal the reference, else what differs.
  std::string compare(const fs::path& out) const {
    for (const NamedResult& want : reference_results(c_)) {
      const tools::NpyArray got = tools::read_npy((out / (want.name + ".npy")).string());
      std::vector<double> values = got.widened();
      std::vector<int64_t> shape = want.name == "o"        ? c_.v_shape
                                   : want.name == "grad_v" ? c_.v_shape
                                   : want.name == "grad_w" ? c_.w_shape
                                                           : c_.q_shape;
      if (heads_first_ && want.name != "grad_w") {
        shape = {shape[0], shape[2], shape[1], shape[3]};
        values = swap_axes_1_2(values, shape);
      }
      if (got.dtype() != dtype_ || got.shape != shape)
        return want.name + ".npy has the wrong dtype or shape";
      const std::string problem = compare_result(want, values, dtype_ == DType::f32);
      if (!problem.empty()) return problem;
    }
    return "";
  }

  const std::string& flaw() const { return flaw_; }

 private:
  void write(const std::string& name, DType dtype, std::vector<int64_t> shape,
             std::vector<double> values) {
    values = sized(std::move(values), shape);
    if (heads_first_ && shape.size() == 4) {
      values = swap_axes_1_2(values, shape);
      shape = {shape[0], shape[2], shape[1], shape[3]};
    }
    const std::string path = (dir_ / (name + ".npy")).string();
    tools::write_npy(path, tools::NpyArray::of(dtype, shape, values), true);
    files_ += " --" + std::string(name == "grad_o" ? "grad-o" : name) + " " + path;
  }

  // The API fuzzer's flaws that have no command-line form become file-level
  // ones; the others are already in the shapes, w values or options.
  void write_inputs(std::mt19937_64& rng) {
    flaw_ = c_.flaw;
    DType k_dtype = dtype_;
    if (c_.null_k) flaw_ = "missing k file";
    if (c_.flaw == "o shape") {
      flaw_ = "k dtype differs from q's";
      k_dtype = dtype_ == DType::f32 ? DType::f64 : DType::f32;
    }
    write("q", dtype_, c_.q_shape, c_.q);
    if (c_.null_k)
      files_ += " --k " + (dir_ / "missing.npy").string();
    else
      write("k", k_dtype, c_.k_shape, c_.k);
    write("v", dtype_, c_.v_shape, c_.v);
    write("w", dtype_, c_.w_shape, c_.w);
    if (c_.backward) write("grad_o", dtype_, c_.v_shape, c_.grad_o);
    if (c_.flaw == "grad_q shape") {
      flaw_ = "truncated v file";
      const fs::path v = dir_ / "v.npy";
      fs::resize_file(v, fs::file_size(v) - 3);
    }
    // File-level flaws of their own, on some consistent calls: a corrupt
    // archive member, or an input that is not a regular file.
    if (flaw_.empty() && std::bernoulli_distribution(0.15)(rng)) {
      switch (std::uniform_int_distribution<int>(0, 2)(rng)) {
        case 0:
          write_corrupt_archive(rng);
          break;
        case 1:
          flaw_ = "q is /dev/zero";
          replace_file("q", "/dev/zero");
          break;
        default: {
          flaw_ = "q is a FIFO";
          const fs::path fifo = dir_ / "q.fifo";
          if (mkfifo(fifo.c_str(), 0600) != 0) throw std::runtime_error("mkfifo failed");
          replace_file("q", fifo.string());
        }
      }
    }
    if (c_.flaw == "grad_w shape") {
      const char* bad_flags[] = {" --block 0",  " --masking sideways",
                                 " --eps abc",  " --feature-map softmax",
                                 " --tile 0x1", " --grid 3x3x3x3"};
      const std::string bad = bad_flags[std::uniform_int_distribution<int>(0, 5)(rng)];
      flaw_ = "bad flag value:" + bad;
      flags_ += bad;
    }
  }

  // Points --NAME at another path.
  void replace_file(const std::string& name, const std::string& path) {
    const std::string flag = " --" + std::string(name) + " ";
    const size_t at = files_.find(flag);
    const size_t end = files_.find(' ', at + flag.size());
    files_.replace(at, (end == std::string::npos ? files_.size() : end) - at, flag + path);
  }

  // The .npy files as one .npz of stored members (as np.savez writes it),
  // passed with --inputs, with one byte of one member's data flipped: only
  // the member's CRC-32 can tell.
  void write_corrupt_archive(std::mt19937_64& rng) {
    std::vector<std::string> names = {"q", "k", "v", "w"};
    if (c_.backward) names.push_back("grad_o");
    const fs::path archive = dir_ / "inputs.npz";
    int error = 0;
    zip_t* zip = zip_open(archive.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &error);
    if (!zip) throw std::runtime_error("zip_open failed");
    std::vector<std::vector<char>> contents;
    for (const std::string& name : names) {
      std::ifstream in(dir_ / (name + ".npy"), std::ios::binary);
      contents.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      zip_source_t* source =
          zip_source_buffer(zip, contents.back().data(), contents.back().size(), 0);
      const zip_int64_t index = zip_file_add(zip, (name + ".npy").c_str(), source, 0);
      if (index < 0 || zip_set_file_compression(zip, zip_uint64_t(index), ZIP_CM_STORE, 0) != 0)
        throw std::runtime_error("zip_file_add failed");
    }
    if (zip_close(zip) != 0) throw std::runtime_error("zip_close failed");
    // Flip a byte of the last data value of a random member: find its .npy
    // bytes (stored verbatim) in the archive.
    std::vector<char> bytes;
    {
      std::ifstream in(archive, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    const size_t member = std::uniform_int_distribution<size_t>(0, names.size() - 1)(rng);
    const std::vector<char>& npy = contents[member];
    const auto at = std::search(bytes.begin(), bytes.end(), npy.begin(), npy.end());
    if (at == bytes.end()) throw std::runtime_error("stored member not found in the archive");
    *(at + std::ptrdiff_t(npy.size()) - 2) ^= 0x10;
    std::ofstream(archive, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), std::streamsize(bytes.size()));
    flaw_ = "corrupt " + names[member] + ".npy in the .npz";
    files_ = " --inputs " + archive.string();
  }

  const RandomCall& c_;
  fs::path dir_;
  bool heads_first_ = false;
  DType dtype_ = DType::f64;
  std::string files_, flags_, flaw_;
};

}  // namespace
}  // namespace mhla::fuzz

int main(int argc, char** argv) {
  using namespace mhla::fuzz;
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MHLA_PROGRAM WORK_DIR CASES [FIRST_SEED]\n", argv[0]);
    return 2;
  }
  const std::string program = argv[1];
  const fs::path work = argv[2];
  const long cases = std::atol(argv[3]);
  const unsigned long long first = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 1;
  Outcomes outcomes("mhla program");
  for (long i = 0; i < cases; ++i) {
    RandomCall c = make_random_call(first + uint64_t(i));
    c.stale.clear();  // one process: no state to go stale
    fs::remove_all(work);
    fs::create_directories(work);
    std::mt19937_64 rng(c.seed ^ 0x5eedULL);
    const CliCase cli(c, work, rng);
    c.flaw = cli.flaw();
    const fs::path out = work / "out";
    const std::string command = cli.command(program, out.string());
    const Run r = run_command(command);
    const std::string context = c.describe() + "\n    " + command + "\n    exit " +
                                std::to_string(r.status) + ": " + r.output;
    if (r.output.find("Sanitizer") != std::string::npos || r.status >= 124 || r.status < 0) {
      outcomes.failure(context);
    } else if (r.status == 0) {
      if (!c.flaw.empty()) {
        outcomes.failure(context + "flawed input was accepted");
        continue;
      }
      try {
        const std::string problem = cli.compare(out);
        if (problem.empty())
          outcomes.success("consistent");
        else
          outcomes.failure(context + problem);
      } catch (const std::exception& e) {
        outcomes.failure(context + "reading the outputs: " + e.what());
      }
    } else {
      // A named error: the program's "error: ..." line or CLI11's flag message.
      const size_t at = r.output.find("error: ");
      const bool flag_error = r.output.find("Run with --help") != std::string::npos;
      if (at == std::string::npos && !flag_error) {
        outcomes.failure(context + "non-zero exit without a named error");
        continue;
      }
      if (!flag_error && fs::exists(out / "o.npy")) {
        outcomes.failure(context + "an output was written despite the error");
        continue;
      }
      const std::string line = flag_error ? r.output : r.output.substr(at + 7);
      outcomes.named_error(c, line.substr(0, line.find('\n')));
    }
  }
  fs::remove_all(work);
  return outcomes.report();
}
