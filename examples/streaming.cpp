// Streaming causal MHLA: prefill a prompt with the chunkwise kernels, decode
// token by token, save the decoder to a file and resume from it. Built and run
// by the tests.
#include <cstdio>
#include <filesystem>
#include <vector>

#include "mhla/mhla.hpp"

int main() {
  mhla::DecoderOptions opts;
  opts.heads = 4;
  opts.dk = opts.dv = 32;
  opts.block = 64;                // C tokens per block
  const int64_t max_blocks = 32;  // context: 32 * 64 = 2048 tokens
  mhla::MixingInit init;
  init.causal = true;  // lower-triangular, locality-biased
  const std::vector<float> w =
      mhla::init_mixing(mhla::TokenLayout::sequence(max_blocks * opts.block, opts.block), init);
  mhla::Decoder decoder(opts, {w.data(), {max_blocks, max_blocks}});

  // Prompt of 100 tokens: q, k, v [1, 100, H, D].
  const int64_t prompt = 100, row = opts.heads * opts.dk;
  std::vector<float> q(prompt * row, 0.1f), k(prompt * row, 0.2f), v(prompt * row, 0.3f),
      o(prompt * row);
  const std::vector<int64_t> ps = {1, prompt, opts.heads, opts.dk};
  decoder.prefill(0, {q.data(), ps}, {k.data(), ps}, {v.data(), ps}, {o.data(), ps});

  // Then one token at a time: [B = 1, 1, H, D].
  std::vector<float> qt(row, 0.1f), kt(row, 0.2f), vt(row, 0.3f), ot(row);
  const std::vector<int64_t> ts = {1, 1, opts.heads, opts.dk};
  for (int step = 0; step < 10; ++step)
    decoder.step({qt.data(), ts}, {kt.data(), ts}, {vt.data(), ts}, {ot.data(), ts});
  std::printf("position %lld, o[0] = %.4f, state %lld bytes\n", (long long)decoder.position(0),
              ot[0], (long long)decoder.state_bytes());

  // Save, resume (the file must hold a decoder with these options), continue.
  const std::string path =
      (std::filesystem::temp_directory_path() / "mhla-streaming.mhlad").string();
  decoder.save(path);
  mhla::Decoder resumed = mhla::Decoder::load(path, opts);
  std::filesystem::remove(path);
  std::vector<float> original_out(row), resumed_out(row);
  decoder.step({qt.data(), ts}, {kt.data(), ts}, {vt.data(), ts}, {original_out.data(), ts});
  resumed.step({qt.data(), ts}, {kt.data(), ts}, {vt.data(), ts}, {resumed_out.data(), ts});
  std::printf("resumed at position %lld, same output: %s\n", (long long)resumed.position(0),
              resumed_out == original_out ? "yes" : "no");
  // Constant inputs give constant outputs: every value row is 0.3.
  return (decoder.position(0) == 111 && ot[0] > 0.2999f && ot[0] < 0.3001f &&
          resumed_out == original_out)
             ? 0
             : 1;
}
