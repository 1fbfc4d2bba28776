// Writes the fuzzers' starting corpora: valid decoder snapshots (dense and
// Toeplitz, shared and per-head, sequences at different positions) into
// DIR/decoder_state and valid .npy files (float32/float64, several ranks)
// into DIR/npy. (The lab's checkpoint fuzzer has its own seed writer.)
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/npy.hpp"
#include "mhla/decoder.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = std::string(argv[1]) + "/decoder_state";
  std::filesystem::create_directories(dir);
  int written = 0;
  for (mhla::MixingForm mixing : {mhla::MixingForm::dense, mhla::MixingForm::toeplitz})
    for (bool per_head : {false, true})
      for (int64_t tokens : {0, 2, 5}) {
        mhla::DecoderOptions o;
        o.batch = 2;
        o.heads = 2;
        o.dk = 2;
        o.dv = 1;
        o.block = 2;
        o.mixing = mixing;
        std::vector<int64_t> shape = mixing == mhla::MixingForm::toeplitz
                                         ? std::vector<int64_t>{3}
                                         : std::vector<int64_t>{4, 4};
        if (per_head) shape.insert(shape.begin(), o.heads);
        int64_t count = 1;
        for (int64_t e : shape) count *= e;
        const std::vector<float> w(size_t(count), 0.5f);
        mhla::Decoder decoder(o, {w.data(), shape});
        std::vector<float> q(size_t(o.batch * o.heads * o.dk), 0.25f),
            out(size_t(o.batch * o.heads));
        for (int64_t t = 0; t < tokens; ++t)
          decoder.step({q.data(), {2, 1, 2, 2}}, {q.data(), {2, 1, 2, 2}},
                       {out.data(), {2, 1, 2, 1}}, {out.data(), {2, 1, 2, 1}});
        decoder.save(dir + "/seed-" + std::to_string(written++) + ".mhlad");
      }
  std::printf("wrote %d seeds to %s\n", written, dir.c_str());

  const std::string npy_dir = std::string(argv[1]) + "/npy";
  std::filesystem::create_directories(npy_dir);
  int npy_written = 0;
  for (mhla::tools::DType dtype : {mhla::tools::DType::f32, mhla::tools::DType::f64})
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{}, {3}, {2, 1, 2, 3}}) {
      std::vector<double> values(size_t(shape.empty() ? 1 : [&] {
        int64_t n = 1;
        for (int64_t e : shape) n *= e;
        return n;
      }()), 0.5);
      mhla::tools::write_npy(npy_dir + "/seed-" + std::to_string(npy_written++) + ".npy",
                             mhla::tools::NpyArray::of(dtype, shape, values), true);
    }
  std::printf("wrote %d seeds to %s\n", npy_written, npy_dir.c_str());
  return 0;
}
