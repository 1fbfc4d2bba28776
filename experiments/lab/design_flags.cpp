#include "design_flags.hpp"

#include "common/cli_checks.hpp"
#include "mhla/error.hpp"

namespace mhla::tools {
namespace {

using train::AttentionDesign;

bool parse_switch(const std::string& text) {
  if (text == "on" || text == "true" || text == "1") return true;
  if (text == "off" || text == "false" || text == "0") return false;
  throw Error("expected on or off, got '" + text + "'");
}

int64_t parse_count(const std::string& text) {
  const std::optional<int64_t> value = parse_whole_number(text);
  if (!value || *value < 0) throw Error("expected an integer >= 0, got '" + text + "'");
  return *value;
}

double parse_positive(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
  }
  if (used != text.size() || !(value > 0)) throw Error("expected a number > 0, got '" + text + "'");
  return value;
}

struct DesignFlag {
  const char* flag;
  const char* help;
  void (*apply)(AttentionDesign&, const std::string&);
};

const DesignFlag kDesignFlags[] = {
    {"--mixing-init",
     "MHLA's initial W: linear (the paper's locality init), cos, exp, gaussian, local or uniform "
     "(causal: 1/(i+1) over b <= i, the authors' language-model init)",
     [](AttentionDesign& d, const std::string& t) { d.mixing_init = parse_mixing_transform(t); }},
    {"--mixing-param",
     "softmax (W = row softmax of logits) or clamp (W learned directly, clamped to [1e-5, 1])",
     [](AttentionDesign& d, const std::string& t) {
       d.mixing_param = train::parse_mixing_param(t);
     }},
    {"--mixing-shared", "on: one W per layer shared by its heads; off: one per head",
     [](AttentionDesign& d, const std::string& t) { d.mixing_shared = parse_switch(t); }},
    {"--mixing-lr-scale", "learning rate of the mixing parameters / the others'",
     [](AttentionDesign& d, const std::string& t) { d.mixing_lr_scale = parse_positive(t); }},
    {"--feature-map", "phi of linear attention and MHLA: relu or elu1",
     [](AttentionDesign& d, const std::string& t) { d.feature_map = parse_feature_map(t); }},
    {"--gated-head",
     "on: the authors' language-model head (unnormalised, per-head RMSNorm, swish gate)",
     [](AttentionDesign& d, const std::string& t) { d.gated_head = parse_switch(t); }},
    {"--rope", "on: rotary position embeddings on q and k",
     [](AttentionDesign& d, const std::string& t) { d.rope = parse_switch(t); }},
    {"--value-conv",
     "kernel of the depthwise positional convolution added from v (CPE/LePE; 0: none)",
     [](AttentionDesign& d, const std::string& t) { d.value_conv = parse_count(t); }},
};

}  // namespace

void add_design_flags(CLI::App& command, DesignFlagValues& values) {
  for (const DesignFlag& f : kDesignFlags) command.add_option(f.flag, values[f.flag], f.help);
}

void apply_design_flags(const CLI::App& command, const DesignFlagValues& values,
                        AttentionDesign& design) {
  for (const DesignFlag& f : kDesignFlags) {
    if (command.count(f.flag) == 0) continue;
    try {
      f.apply(design, values.at(f.flag));
    } catch (const Error& e) {
      throw Error(std::string(f.flag) + ": " + e.what());
    }
  }
}

}  // namespace mhla::tools
