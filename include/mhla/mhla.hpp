#pragma once
// Umbrella header of the mhla library.
#include "mhla/analysis.hpp"
#include "mhla/baselines.hpp"
#include "mhla/decoder.hpp"
#include "mhla/error.hpp"
#include "mhla/layout.hpp"
#include "mhla/mixing_init.hpp"
#include "mhla/operator.hpp"
#include "mhla/options.hpp"
#include "mhla/phases.hpp"
#include "mhla/reference.hpp"
#include "mhla/tensor.hpp"
#include "mhla/varlen.hpp"
