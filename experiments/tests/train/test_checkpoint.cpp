// safetensors encoding and decoding, and training checkpoints: round trips,
// corrupt files and mismatched runs are named errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "mhla/error.hpp"
#include "mhla_support/files.hpp"
#include "small_runs.hpp"
#include "train/checkpoint.hpp"
#include "train/safetensors.hpp"
#include "train/task.hpp"

namespace mhla::train {
namespace {

using test::small_mqar;

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

SafeTensors sample() {
  SafeTensors f;
  f.tensors["a"] = {{2, 3}, {1, 2, 3, 4, 5, 6}};
  f.tensors["b/c"] = {{1}, {-0.5f}};
  f.tensors["empty"] = {{0}, {}};
  f.metadata["note"] = "hello";
  return f;
}

TEST(TrainSafetensors, RoundTripAndLayout) {
  const std::vector<uint8_t> bytes = encode_safetensors(sample());
  uint64_t header = 0;
  for (int i = 0; i < 8; ++i) header |= uint64_t(bytes[size_t(i)]) << (8 * i);
  EXPECT_EQ(header % 8, 0u) << "data starts 8-byte aligned";
  const auto json = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + long(header));
  EXPECT_EQ(json["a"]["dtype"], "F32");
  EXPECT_EQ(json["a"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(bytes.size(), 8 + header + 28);
  const SafeTensors back = decode_safetensors(bytes, "mem");
  EXPECT_EQ(back.tensors.at("a").data, sample().tensors.at("a").data);
  EXPECT_EQ(back.tensors.at("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(back.tensors.at("b/c").data[0], -0.5f);
  EXPECT_EQ(back.metadata.at("note"), "hello");
}

std::vector<uint8_t> with_header(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> b(8 + header.size() + data_bytes, 0);
  for (int i = 0; i < 8; ++i) b[size_t(i)] = uint8_t(header.size() >> (8 * i));
  std::copy(header.begin(), header.end(), b.begin() + 8);
  return b;
}

TEST(TrainSafetensors, CorruptFilesAreNamedErrors) {
  std::vector<uint8_t> bytes = encode_safetensors(sample());
  auto decode = [](std::vector<uint8_t> b) {
    return [b] { decode_safetensors(b, "ck.safetensors"); };
  };
  EXPECT_THAT(decode({1, 2, 3}), ThrowsMessage<Error>(HasSubstr("ck.safetensors: truncated")));
  EXPECT_THAT(decode(std::vector<uint8_t>(bytes.begin(), bytes.end() - 4)),
              ThrowsMessage<Error>(HasSubstr("truncated file?")));
  std::vector<uint8_t> huge = bytes;
  huge[7] = 0x7f;
  EXPECT_THAT(decode(huge), ThrowsMessage<Error>(HasSubstr("'header' needs")));
  EXPECT_THAT(decode(with_header("{not json", 0)),
              ThrowsMessage<Error>(HasSubstr("not a JSON object")));
  EXPECT_THAT(decode(with_header(R"({"x":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}})", 2)),
              ThrowsMessage<Error>(HasSubstr("tensor 'x': dtype \"F16\" is not supported")));
  EXPECT_THAT(decode(with_header(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)),
              ThrowsMessage<Error>(HasSubstr("shape [3] needs 12")));
  EXPECT_THAT(decode(with_header(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                 R"("y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                 8)),
              ThrowsMessage<Error>(HasSubstr("overlap")));
  EXPECT_THAT(decode(with_header(R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0)),
              ThrowsMessage<Error>(HasSubstr("bad dimension")));
  EXPECT_THAT(decode(with_header(R"({"x":{"dtype":"F32"}})", 0)),
              ThrowsMessage<Error>(HasSubstr("needs dtype, shape and data_offsets")));
}

TEST(TrainCheckpoint, RoundTripRestoresModelOptimizerAndHistory) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "mhla_ck_roundtrip.safetensors").string();
  const RunConfig c = small_mqar({AttentionKind::mhla, AttentionKind::softmax});
  const ModelConfig m = make_task(c, "")->model_config();
  Model<float> a(m, 1), b(m, 2);
  AdamW<float> oa(a.parameters(), {}), ob(b.parameters(), {});
  oa.first_moments()[0][0] = 0.25f;
  TrainingState state;
  state.step = 3;
  state.history.train_loss = {3, 2, 1};
  state.history.train_accuracy = {0, 0.5, 1};
  state.history.eval.push_back({3, 1.5, 0.25});
  save_checkpoint(path, c, a, oa, state);
  const TrainingState back = load_checkpoint(path, c, b, ob);
  EXPECT_EQ(back.step, 3);
  EXPECT_EQ(back.history.train_loss, state.history.train_loss);
  EXPECT_EQ(back.history.eval[0].accuracy, 0.25);
  for (size_t i = 0; i < a.parameters().size(); ++i)
    EXPECT_EQ(a.parameters()[i]->value, b.parameters()[i]->value);
  EXPECT_EQ(ob.first_moments()[0][0], 0.25f);
  EXPECT_EQ(ob.steps_taken(), 3);

  // A different run: the error lists what differs.
  RunConfig other = c;
  other.kv_pairs = 3;
  other.lr = 0.5;
  EXPECT_THAT([&] { load_checkpoint(path, other, b, ob); },
              ThrowsMessage<Error>(AllOf(HasSubstr("different run"), HasSubstr("kv_pairs 4 vs 3"),
                                         HasSubstr("lr "))));

  // A truncated file: named, and the model is left as it was.
  std::vector<uint8_t> bytes = io::InputFile(path).read_all();
  bytes.resize(bytes.size() - 10);
  io::write_file_atomically(path, bytes);
  b.parameters()[0]->value[0] = 42.0f;
  EXPECT_THAT([&] { load_checkpoint(path, c, b, ob); }, ThrowsMessage<Error>(HasSubstr(path)));
  EXPECT_EQ(b.parameters()[0]->value[0], 42.0f);

  // A safetensors file that is not a checkpoint.
  io::write_file_atomically(path, encode_safetensors(SafeTensors{}));
  EXPECT_THAT([&] { load_checkpoint(path, c, b, ob); },
              ThrowsMessage<Error>(HasSubstr("not a training checkpoint")));
  std::filesystem::remove(path);
  EXPECT_THAT([&] { load_checkpoint(path, c, b, ob); }, ThrowsMessage<Error>(HasSubstr(path)));
}

}  // namespace
}  // namespace mhla::train
