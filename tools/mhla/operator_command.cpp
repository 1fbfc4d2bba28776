#include "operator_command.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <type_traits>
#include <utility>
#include <variant>

#include "common/attention_maps.hpp"
#include "common/cli_checks.hpp"
#include "common/heatmap.hpp"
#include "common/json_file.hpp"
#include "common/npy.hpp"
#include "mhla/mhla.hpp"

namespace mhla::tools {
namespace {

bool backward(const OperatorCommand& c) { return c.kind == OperatorCommand::Kind::backward; }
bool analyze(const OperatorCommand& c) { return c.kind == OperatorCommand::Kind::analyze; }

// "14x14" -> {14, 14}
std::vector<int64_t> parse_dims(const std::string& text, const char* flag) {
  std::vector<int64_t> dims;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = text.find('x', start);
    const std::string part =
        text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    const std::optional<int64_t> value = parse_whole_number(part);
    if (!value || *value <= 0)
      throw Error(std::string(flag) + " '" + text +
                  "' must be positive sizes joined by 'x', e.g. 14x14");
    dims.push_back(*value);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (dims.size() > 3)
    throw Error(std::string(flag) + " '" + text + "' has more than 3 dimensions");
  return dims;
}

TokenLayout make_layout(const OperatorCommand& c, int64_t tokens) {
  if (c.grid.empty()) return TokenLayout::sequence(tokens, c.block);
  const std::vector<int64_t> g = parse_dims(c.grid, "--grid"),
                             t = parse_dims(c.tile.empty() ? c.grid : c.tile, "--tile");
  if (g.size() != t.size())
    throw Error("--grid " + c.grid + " and --tile " + c.tile +
                " must have the same number of dimensions");
  if (g.size() == 1) return TokenLayout::sequence(g[0], t[0]);
  if (g.size() == 2) return TokenLayout::grid2d(g[0], g[1], t[0], t[1]);
  return TokenLayout::grid3d(g[0], g[1], g[2], t[0], t[1], t[2]);
}

// The named inputs: from --inputs (an .npz with members q, k, v, w, grad_o),
// each overridden by its own flag.
std::map<std::string, std::pair<std::string, NpyArray>> load_inputs(const OperatorCommand& c) {
  std::map<std::string, std::pair<std::string, NpyArray>> arrays;
  if (!c.inputs.empty())
    for (auto& [name, array] : read_npz(c.inputs))
      arrays[name] = {c.inputs + "[" + name + ".npy]", std::move(array)};
  const std::pair<const char*, const std::string*> files[] = {
      {"q", &c.q}, {"k", &c.k}, {"v", &c.v}, {"w", &c.w}, {"grad_o", &c.grad_o}};
  for (const auto& [name, path] : files)
    if (!path->empty()) arrays[name] = {*path, read_npy(*path)};
  std::vector<std::string> needed = {"q", "k"};
  if (!analyze(c)) needed.push_back("v");
  if (backward(c)) needed.push_back("grad_o");
  for (const std::string& name : needed)
    if (!arrays.count(name))
      throw Error("missing input '" + name + "': pass --" + (name == "grad_o" ? "grad-o" : name) +
                  " FILE.npy or an --inputs archive with " + name + ".npy");
  return arrays;
}

// [B, H, N, D] <-> [B, N, H, D]: swaps axes 1 and 2 of a rank-4 array, in
// the array's own dtype.
NpyArray swap_axes_1_2(const NpyArray& x) {
  const std::vector<int64_t>& s = x.shape;
  const int64_t a = s[0], b = s[1], c = s[2], d = s[3];
  NpyArray out{{a, c, b, d}, {}};
  std::visit(
      [&](const auto& in) {
        std::remove_cvref_t<decltype(in)> swapped(in.size());
        for (int64_t i = 0; i < a; ++i)
          for (int64_t j = 0; j < b; ++j)
            for (int64_t k = 0; k < c; ++k)
              for (int64_t e = 0; e < d; ++e)
                swapped[((i * c + k) * b + j) * d + e] = in[((i * b + j) * c + k) * d + e];
        out.values = std::move(swapped);
      },
      x.values);
  return out;
}

// An attention input in [B, N, H, D], the order the library reads.
NpyArray attention_tensor(const std::string& source, NpyArray a, bool heads_first) {
  if (a.shape.size() != 4)
    throw Error(source + ": shape " + shape_to_string(a.shape) + " is not rank 4; expected " +
                (heads_first ? "[B, H, N, D] (--order bhnd)"
                             : "[B, N, H, D] (or [B, H, N, D] with --order bhnd)"));
  return heads_first ? swap_axes_1_2(a) : a;
}

// The library's view of one loaded array: always the file's own shape, so a
// file whose shape disagrees with q's reaches the library's shape checks
// instead of being read past its end.
template <typename T>
TensorView<const T> view_of(const NpyArray& a) {
  return {a.as<T>().data(), a.shape};
}
template <typename T>
TensorView<T> view_of(NpyArray& a) {
  return {std::get<std::vector<T>>(a.values).data(), a.shape};
}
template <typename T>
NpyArray zeros_like(const NpyArray& a) {
  return {a.shape, std::vector<T>(size_t(a.size()))};
}

template <typename T>
int run(const OperatorCommand& c, const Options& options, std::map<std::string, NpyArray>& in,
        const NpyArray& w) {
  const bool heads_first = c.order == "bhnd";
  const NpyArray &q = in["q"], &k = in["k"], &v = in["v"];
  std::vector<std::pair<std::string, NpyArray>> outputs = {{"o", zeros_like<T>(v)}};
  NpyArray& o = outputs[0].second;
  forward<T>(options, view_of<T>(q), view_of<T>(k), view_of<T>(v), view_of<T>(w), view_of<T>(o));
  if (backward(c)) {
    NpyArray gq = zeros_like<T>(q), gk = zeros_like<T>(k), gv = zeros_like<T>(v),
             gw = zeros_like<T>(w);
    mhla::backward<T>(options, view_of<T>(q), view_of<T>(k), view_of<T>(v), view_of<T>(w),
                      view_of<T>(std::as_const(o)), view_of<T>(in["grad_o"]), view_of<T>(gq),
                      view_of<T>(gk), view_of<T>(gv), view_of<T>(gw));
    outputs.push_back({"grad_q", std::move(gq)});
    outputs.push_back({"grad_k", std::move(gk)});
    outputs.push_back({"grad_v", std::move(gv)});
    outputs.push_back({"grad_w", std::move(gw)});
  }
  for (auto& [name, t] : outputs) {
    const std::string path = (std::filesystem::path(c.out_dir) / (name + ".npy")).string();
    const bool attention = name != "grad_w";
    if (attention && heads_first) t = swap_axes_1_2(t);
    write_npy(path, t, c.force);
    std::printf("wrote %s %s %s\n", path.c_str(), shape_to_string(t.shape).c_str(),
                to_string(t.dtype()));
  }
  return 0;
}

}  // namespace

CLI::App* add_operator_command(CLI::App& app, OperatorCommand& c) {
  CLI::App* cmd = nullptr;
  switch (c.kind) {
    case OperatorCommand::Kind::forward:
      cmd = app.add_subcommand(
          "forward",
          "MHLA forward on .npy tensors: writes o.npy.\n"
          "Example: mhla forward --inputs qkv.npz --masking causal --block 64 --out-dir out/\n"
          "Example: mhla forward --q q.npy --k k.npy --v v.npy --order bhnd --grid 14x14 --tile "
          "7x7");
      break;
    case OperatorCommand::Kind::backward:
      cmd = app.add_subcommand(
          "backward",
          "MHLA backward on .npy tensors: writes o, grad_q, grad_k, grad_v, grad_w (.npy).\n"
          "Example: mhla backward --q q.npy --k k.npy --v v.npy --grad-o g.npy --grid 14x14 "
          "--tile 7x7 --out-dir grads/");
      break;
    case OperatorCommand::Kind::analyze:
      cmd = app.add_subcommand(
          "analyze",
          "Softmax vs linear attention vs MHLA on one (batch, head) of q, k: the explicit N x N\n"
          "attention matrices as PNG heatmaps, their numerical rank (singular values above\n"
          "N * eps * sigma_max) and mean row entropy in summary.json. N <= 4096.\n"
          "Example: mhla analyze --q q.npy --k k.npy --order bhnd --grid 14x14 --tile 7x7 "
          "--out-dir maps/\n"
          "Example: mhla analyze --out-dir maps/   (built-in random sample, N = 256)");
      break;
  }
  cmd->add_option("--q", c.q, "queries .npy [B, N, H, Dk] (float32 or float64, C order)");
  cmd->add_option("--k", c.k, "keys .npy, q's shape");
  if (!analyze(c)) cmd->add_option("--v", c.v, "values .npy [B, N, H, Dv]");
  cmd->add_option("--w", c.w,
                  "mixing weights .npy ([M, M], [H, M, M]; Toeplitz [L+1], [H, L+1]); "
                  "default: --mixing-init");
  if (backward(c)) cmd->add_option("--grad-o", c.grad_o, "upstream gradient .npy, v's shape");
  cmd->add_option("--inputs", c.inputs,
                  ".npz archive with q, k, v (and w, grad_o); flags override members");
  cmd->add_option("--out-dir", c.out_dir, "directory for the outputs (created if missing)")
      ->capture_default_str();
  cmd->add_flag("--force", c.force, "overwrite existing output files");
  cmd->add_option("--order", c.order,
                  "axis order of the 4D tensors: bnhd or bhnd (PyTorch's usual)")
      ->capture_default_str()
      ->check(CLI::IsMember({"bnhd", "bhnd"}));
  // --block and --grid describe the layout two ways; silently ignoring one of
  // them would compute something the user did not ask for.
  CLI::Option* grid = cmd->add_option(
      "--grid", c.grid, "token grid, e.g. 14x14 or 8x14x14 (default: 1D of N tokens)");
  cmd->add_option("--tile", c.tile, "block tile, e.g. 7x7 (default: the whole grid)")->needs(grid);
  cmd->add_option("--block", c.block, "1D block size when --grid is not given")
      ->capture_default_str()
      ->check(positive_integer())
      ->excludes(grid);
  cmd->add_option("--masking", c.masking, "none, causal (1D) or block_causal")
      ->capture_default_str();
  cmd->add_option("--feature-map", c.feature_map, "identity, relu or elu1")->capture_default_str();
  cmd->add_flag("--unnormalized", c.unnormalized,
                "o = scale * phi(q)^T S~ instead of the normalized form");
  cmd->add_option("--eps", c.eps, "normalizer epsilon")->capture_default_str();
  cmd->add_option("--scale", c.scale, "unnormalized scale (default Dk^-1/2)");
  cmd->add_option("--mixing-init", c.mixing_init, "linear, cos, exp, gaussian, local or uniform")
      ->capture_default_str();
  cmd->add_option("--sigma", c.sigma, "exp init: decay length in blocks")->capture_default_str();
  cmd->add_option("--threshold", c.threshold, "local init: radius in blocks")
      ->capture_default_str();
  cmd->add_option("--toeplitz-length", c.toeplitz_length,
                  "use Toeplitz mixing w[min(i-b, L)] with this L >= 0 (causal/block_causal)")
      ->check(non_negative_integer());
  if (analyze(c)) {
    cmd->add_option("--batch-index", c.batch_index, "which batch entry to analyse")
        ->capture_default_str();
    cmd->add_option("--head-index", c.head_index, "which head to analyse")->capture_default_str();
    cmd->add_option("--sample-tokens", c.sample_tokens, "N of the built-in sample (without --q)")
        ->capture_default_str()
        ->check(CLI::Range(int64_t(2), int64_t(4096)));
  }
  return cmd;
}

namespace {

// Everything a subcommand computes from: inputs in [B, N, H, D] and w, all
// in one dtype; the options.
struct Prepared {
  DType dtype = DType::f32;
  std::map<std::string, NpyArray> in;
  Options options;
  NpyArray w;
};

// The built-in sample of `mhla analyze`: standard normal q, k [1, N, 1, 16].
std::map<std::string, std::pair<std::string, NpyArray>> sample_inputs(int64_t tokens) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::map<std::string, std::pair<std::string, NpyArray>> arrays;
  for (const char* name : {"q", "k"}) {
    std::vector<double> values(size_t(tokens * 16));
    for (double& e : values) e = normal(rng);
    arrays[name] = {std::string("sample ") + name, NpyArray{{1, tokens, 1, 16}, std::move(values)}};
  }
  return arrays;
}

Prepared prepare(const OperatorCommand& c) {
  const bool sample = analyze(c) && c.q.empty() && c.k.empty() && c.inputs.empty();
  auto arrays = sample ? sample_inputs(c.sample_tokens) : load_inputs(c);
  Prepared p;
  const auto& [q_source, q_array] = arrays.at("q");
  p.dtype = q_array.dtype();
  for (const auto& [name, entry] : arrays)
    if (entry.second.dtype() != p.dtype)
      throw Error(entry.first + " is " + to_string(entry.second.dtype()) + " but " + q_source +
                  " is " + to_string(p.dtype) + "; give every input the same dtype");
  const bool heads_first = c.order == "bhnd" && !sample;
  for (const char* name : {"q", "k", "v", "grad_o"})
    if (arrays.count(name))
      p.in[name] =
          attention_tensor(arrays[name].first, std::move(arrays[name].second), heads_first);

  Options& options = p.options;
  options.masking = parse_masking(c.masking);
  options.feature_map = parse_feature_map(c.feature_map);
  options.normalize = !c.unnormalized;
  options.eps = c.eps;
  options.scale = c.scale;
  const int64_t tokens = p.in["q"].shape[1];
  options.layout =
      sample && c.grid.empty() ? TokenLayout::sequence(tokens, 16) : make_layout(c, tokens);
  options.mixing = c.toeplitz_length ? MixingForm::toeplitz : MixingForm::dense;

  if (arrays.count("w")) {
    p.w = std::move(arrays["w"].second);
  } else {
    MixingInit init;
    init.transform = parse_mixing_transform(c.mixing_init);
    init.sigma = c.sigma;
    init.threshold = c.threshold;
    init.causal = options.masking != Masking::none;
    const std::vector<float> w32 = c.toeplitz_length
                                       ? init_toeplitz_mixing(*c.toeplitz_length, init)
                                       : init_mixing(options.layout, init);
    const int64_t m = options.layout.num_blocks();
    p.w = NpyArray::of(p.dtype,
                       c.toeplitz_length ? std::vector<int64_t>{*c.toeplitz_length + 1}
                                         : std::vector<int64_t>{m, m},
                       w32);
  }
  return p;
}

// Creates the output directory and refuses, before any work, to replace files.
void prepare_outputs(const OperatorCommand& c, const std::vector<std::string>& names) {
  std::error_code error;
  std::filesystem::create_directories(c.out_dir, error);
  if (error) throw Error("cannot create --out-dir '" + c.out_dir + "': " + error.message());
  if (c.force) return;
  for (const std::string& name : names) {
    const auto path = std::filesystem::path(c.out_dir) / name;
    if (std::filesystem::exists(path))
      throw Error(path.string() + ": already exists; refusing to overwrite it (pass --force)");
  }
}

int run_analyze(const OperatorCommand& c, Prepared& p) {
  const auto& qs = p.in["q"].shape;
  const int64_t n = qs[1];
  if (n > 4096)
    throw Error("analyze builds N x N matrices; N = " + std::to_string(n) +
                " exceeds 4096 (slice the sequence)");
  if (c.batch_index < 0 || c.batch_index >= qs[0] || c.head_index < 0 || c.head_index >= qs[2])
    throw Error("--batch-index " + std::to_string(c.batch_index) + " / --head-index " +
                std::to_string(c.head_index) + " out of range for q " + shape_to_string(qs) +
                " [B, N, H, D]");
  prepare_outputs(c, {"softmax.png", "linear.png", "mhla.png", "summary.json"});
  // The rank and entropy analysis runs in double whatever the files hold.
  const std::vector<double> q = p.in["q"].widened(), k = p.in["k"].widened(), w = p.w.widened();
  const std::vector<AttentionMap> maps =
      attention_maps(p.options, {q.data(), qs}, {k.data(), p.in["k"].shape}, {w.data(), p.w.shape},
                     c.batch_index, c.head_index);
  nlohmann::json summary = {{"tokens", n},
                            {"head_dim", qs[3]},
                            {"layout", p.options.layout.describe()},
                            {"masking", to_string(p.options.masking)},
                            {"rank_tolerance", "max(N, N) * eps_double * sigma_max"},
                            {"entropy_unit", "nats"},
                            {"uniform_row_entropy", std::log(double(n))}};
  std::printf("%-40s %6s %12s\n", "attention matrix (N x N)", "rank", "row entropy");
  for (const AttentionMap& m : maps) {
    const std::string png = (std::filesystem::path(c.out_dir) / (m.method + ".png")).string();
    write_heatmap_png(png, m.matrix, n, n, c.force);
    std::printf("%-40s %6lld %12.3f  %s\n", m.description.c_str(), (long long)m.rank, m.entropy,
                png.c_str());
    summary["methods"].push_back({{"method", m.method},
                                  {"description", m.description},
                                  {"rank", m.rank},
                                  {"mean_row_entropy", m.entropy},
                                  {"heatmap", png}});
  }
  const std::string json_path = (std::filesystem::path(c.out_dir) / "summary.json").string();
  if (!write_json_file(json_path, summary)) return 1;
  std::printf("wrote %s (N = %lld; a uniform row has entropy ln N = %.3f)\n", json_path.c_str(),
              (long long)n, std::log(double(n)));
  return 0;
}

}  // namespace

int run_operator_command(const OperatorCommand& c) {
  Prepared p = prepare(c);
  if (analyze(c)) return run_analyze(c, p);
  std::vector<std::string> outputs = {"o.npy"};
  if (backward(c))
    outputs.insert(outputs.end(), {"grad_q.npy", "grad_k.npy", "grad_v.npy", "grad_w.npy"});
  prepare_outputs(c, outputs);
  std::printf("MHLA %s: %s, masking %s, %s, %s, %s mixing\n", backward(c) ? "backward" : "forward",
              p.options.layout.describe().c_str(), to_string(p.options.masking),
              to_string(p.options.feature_map), p.options.normalize ? "normalized" : "unnormalized",
              to_string(p.options.mixing));
  return p.dtype == DType::f32 ? run<float>(c, p.options, p.in, p.w)
                               : run<double>(c, p.options, p.in, p.w);
}

}  // namespace mhla::tools
