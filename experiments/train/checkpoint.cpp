#include "train/checkpoint.hpp"

#include "mhla/error.hpp"
#include "mhla/tensor.hpp"
#include "mhla_support/files.hpp"
#include "train/safetensors.hpp"

namespace mhla::train {

using nlohmann::json;

namespace {
constexpr const char* kFormat = "mhla-train-checkpoint/1";
}

void save_checkpoint(const std::string& path, const RunConfig& config, const Model<float>& model,
                     AdamW<float>& optimizer, const TrainingState& state) {
  SafeTensors file;
  const ParameterList<float>& params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const Parameter<float>& p = *params[i];
    file.tensors["model/" + p.name] = {p.shape, p.value};
    file.tensors["adam_m/" + p.name] = {p.shape, optimizer.first_moments()[i]};
    file.tensors["adam_v/" + p.name] = {p.shape, optimizer.second_moments()[i]};
    if (!state.best_parameters.empty())
      file.tensors["best/" + p.name] = {p.shape, state.best_parameters[i]};
  }
  file.metadata["format"] = kFormat;
  file.metadata["config"] = to_json(config).dump();
  file.metadata["step"] = std::to_string(state.step);
  file.metadata["history"] = to_json(state.history).dump();
  io::write_file_atomically(path, encode_safetensors(file));
}

TrainingState load_checkpoint(const std::string& path, const RunConfig& config, Model<float>& model,
                              AdamW<float>& optimizer) {
  const io::InputFile input(path);
  // The header's length first: another kind of file is refused before it is read whole.
  check_safetensors_preamble(input.head(9), input.size(), path);
  const std::vector<uint8_t> bytes = input.read_all();
  const SafeTensors file = decode_safetensors(bytes, path);
  auto meta = [&](const char* key) -> const std::string& {
    auto it = file.metadata.find(key);
    if (it == file.metadata.end())
      throw Error(path + ": not a training checkpoint (no '" + key + "' metadata)");
    return it->second;
  };
  if (meta("format") != kFormat)
    throw Error(path + ": checkpoint format '" + meta("format") + "', expected '" + kFormat + "'");

  const json saved = json::parse(meta("config"), nullptr, false);
  if (saved.is_discarded()) throw Error(path + ": the stored run config is not valid JSON");
  const json wanted = to_json(config);
  std::string differences;
  for (const auto& [key, value] : wanted.items()) {
    const json other = saved.contains(key) ? saved[key] : json();
    if (other != value)
      differences.append(differences.empty() ? "" : ", ")
          .append(key + " " + other.dump() + " vs " + value.dump());
  }
  if (!differences.empty())
    throw Error(path + " was written by a different run (checkpoint vs this run: " + differences +
                "); resume needs the same settings");

  TrainingState state;
  try {
    state.step = std::stoll(meta("step"));
  } catch (const std::exception&) {
    throw Error(path + ": bad step '" + meta("step") + "'");
  }
  if (state.step < 0 || state.step > config.steps)
    throw Error(path + ": step " + std::to_string(state.step) + " outside [0, " +
                std::to_string(config.steps) + "]");
  const json history = json::parse(meta("history"), nullptr, false);
  if (history.is_discarded()) throw Error(path + ": the stored history is not valid JSON");
  state.history = history_from_json(history);
  if (int64_t(state.history.train_loss.size()) != state.step)
    throw Error(path + ": history has " + std::to_string(state.history.train_loss.size()) +
                " steps, checkpoint says " + std::to_string(state.step));

  // Check every tensor before changing anything, so a bad file leaves the model untouched.
  const ParameterList<float>& params = model.parameters();
  auto find = [&](const std::string& key, const Parameter<float>& p) -> const SafeTensor& {
    auto it = file.tensors.find(key);
    if (it == file.tensors.end()) throw Error(path + ": tensor '" + key + "' is missing");
    if (it->second.shape != p.shape)
      throw Error(path + ": tensor '" + key + "' has shape " + shape_to_string(it->second.shape) +
                  ", the model needs " + shape_to_string(p.shape));
    return it->second;
  };
  // Early stopping keeps the best evaluation's parameters once there is an evaluation.
  const bool has_best = config.patience > 0 && !state.history.eval.empty();
  std::vector<const char*> prefixes = {"model/", "adam_m/", "adam_v/"};
  if (has_best) prefixes.push_back("best/");
  for (const Parameter<float>* p : params)
    for (const char* prefix : prefixes) find(prefix + p->name, *p);
  if (file.tensors.size() != prefixes.size() * params.size())
    throw Error(path + ": " + std::to_string(file.tensors.size()) + " tensors, this model has " +
                std::to_string(prefixes.size() * params.size()));
  for (size_t i = 0; i < params.size(); ++i) {
    Parameter<float>& p = *params[i];
    p.value = find("model/" + p.name, p).data;
    optimizer.first_moments()[i] = find("adam_m/" + p.name, p).data;
    optimizer.second_moments()[i] = find("adam_v/" + p.name, p).data;
    if (has_best) state.best_parameters.push_back(find("best/" + p.name, p).data);
  }
  optimizer.set_steps_taken(state.step);
  return state;
}

}  // namespace mhla::train
