// Writes the safetensors fuzzer's starting corpus into DIR/safetensors: a
// tiny training checkpoint, an empty file and a scalar.
#include <cstdio>
#include <filesystem>
#include <string>

#include "mhla_support/files.hpp"
#include "train/checkpoint.hpp"
#include "train/safetensors.hpp"
#include "train/task.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string safetensors_dir = std::string(argv[1]) + "/safetensors";
  std::filesystem::create_directories(safetensors_dir);
  mhla::train::RunConfig config;
  config.attention = {mhla::train::AttentionKind::mhla};
  config.dim = 4;
  config.heads = 1;
  config.mlp_hidden = 4;
  config.conv_kernel = 2;
  config.vocab = 8;
  config.seq_len = 8;
  config.kv_pairs = 2;
  config.block = 4;
  mhla::train::Model<float> model(mhla::train::make_task(config, "")->model_config(), 0);
  mhla::train::AdamW<float> optimizer(model.parameters(), {});
  mhla::train::save_checkpoint(safetensors_dir + "/checkpoint.safetensors", config, model,
                               optimizer, {});
  mhla::io::write_file_atomically(safetensors_dir + "/empty.safetensors",
                                  mhla::train::encode_safetensors(mhla::train::SafeTensors{}));
  mhla::train::SafeTensors scalar;
  scalar.tensors["x"] = {{}, {1.5f}};
  scalar.metadata["k"] = "v";
  mhla::io::write_file_atomically(safetensors_dir + "/scalar.safetensors",
                                  mhla::train::encode_safetensors(scalar));
  std::printf("wrote 3 seeds to %s\n", safetensors_dir.c_str());
  return 0;
}
