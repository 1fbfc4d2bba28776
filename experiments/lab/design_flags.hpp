#pragma once
// The flags that choose the attention design (train::AttentionDesign), shared
// by `mhla-lab train` and `mhla-lab compare`: each is read as text and applied to the
// run's config only when given, so the preset's choice stands otherwise.
#include <CLI/CLI.hpp>
#include <map>
#include <string>

#include "train/run_config.hpp"

namespace mhla::tools {

// flag -> the text given; filled by CLI11.
using DesignFlagValues = std::map<std::string, std::string>;

void add_design_flags(CLI::App& command, DesignFlagValues& values);
// Applies every flag given on `command`; a bad value is an mhla::Error naming the flag.
void apply_design_flags(const CLI::App& command, const DesignFlagValues& values,
                        train::AttentionDesign& design);

}  // namespace mhla::tools
