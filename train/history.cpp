#include "train/history.hpp"

#include "mhla/error.hpp"

namespace mhla::train {

using nlohmann::json;

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
