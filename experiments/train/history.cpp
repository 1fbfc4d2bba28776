#include "train/history.hpp"

#include "mhla/error.hpp"

namespace mhla::train {

using nlohmann::json;

int64_t best_evaluation(const std::vector<EvalPoint>& eval, bool by_loss) {
  int64_t best = -1;
  for (size_t i = 0; i < eval.size(); ++i) {
    const EvalPoint& e = eval[i];
    const bool better =
        best < 0 || (by_loss ? e.loss < eval[best].loss
                             : e.accuracy > eval[best].accuracy ||
                                   (e.accuracy == eval[best].accuracy && e.loss < eval[best].loss));
    if (better) best = int64_t(i);
  }
  return best;
}

json to_json(const History& h) {
  json eval = json::array();
  for (const EvalPoint& e : h.eval)
    eval.push_back({{"step", e.step}, {"loss", e.loss}, {"accuracy", e.accuracy}});
  return {{"train_loss", h.train_loss},
          {"train_accuracy", h.train_accuracy},
          {"eval", eval},
          {"seconds", h.seconds}};
}

History history_from_json(const json& j) {
  History h;
  try {
    j.at("train_loss").get_to(h.train_loss);
    j.at("train_accuracy").get_to(h.train_accuracy);
    j.at("seconds").get_to(h.seconds);
    for (const json& e : j.at("eval"))
      h.eval.push_back({e.at("step").get<int64_t>(), e.at("loss").get<double>(),
                        e.at("accuracy").get<double>()});
  } catch (const json::exception& e) {
    throw Error(std::string("training history: ") + e.what());
  }
  if (h.train_loss.size() != h.train_accuracy.size())
    throw Error("training history: loss and accuracy lengths differ");
  return h;
}

}  // namespace mhla::train
