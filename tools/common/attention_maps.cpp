#include "common/attention_maps.hpp"

namespace mhla::tools {

std::vector<AttentionMap> attention_maps(const Options& mhla, TensorView<const double> q,
                                         TensorView<const double> k, TensorView<const double> w,
                                         int64_t batch, int64_t head) {
  const int64_t n = q.shape.size() == 4 ? q.shape[1] : 0;
  const bool causal = mhla.masking == Masking::causal;
  std::vector<AttentionMap> maps(3);

  SoftmaxOptions soft;
  soft.causal = causal;
  maps[0] = {"softmax", "softmax(q k^T / sqrt(D))",
             reference::softmax_attention_matrix(soft, q, k, batch, head)};

  Options linear = mhla;
  linear.layout = TokenLayout::sequence(n, n);
  linear.masking = causal ? Masking::causal : Masking::none;
  linear.mixing = MixingForm::dense;
  const std::vector<double> one = {1.0};
  maps[1] = {"linear", std::string("linear attention, ") + to_string(mhla.feature_map),
             reference::mhla_attention_matrix(linear, q, k, {one.data(), {1, 1}}, batch, head)};

  maps[2] = {"mhla",
             std::string("MHLA, ") + to_string(mhla.feature_map) + ", " +
                 std::to_string(mhla.layout.num_blocks()) + " blocks",
             reference::mhla_attention_matrix(mhla, q, k, w, batch, head)};
  for (AttentionMap& m : maps) {
    m.rank = numerical_rank(m.matrix, n, n);
    m.entropy = mean_row_entropy(m.matrix, n, n);
  }
  return maps;
}

}  // namespace mhla::tools
