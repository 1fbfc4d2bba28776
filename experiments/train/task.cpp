#include "train/task.hpp"

#include <algorithm>
#include <numeric>

#include "mhla/error.hpp"
#include "train/fashion_mnist.hpp"
#include "train/mqar.hpp"
#include "train/text_corpus.hpp"

namespace mhla::train {
namespace {

// Streams of stream_seed(): training batches use the step number, these sit far above.
constexpr uint64_t kEvalStream = ~0ull, kShuffleStream = 1ull << 62;
// MQAR's evaluation sets are the same for every run, so seeds differ only in training.
constexpr uint64_t kMqarValidationSeed = 20260122, kMqarTestSeed = 20260123;

ModelConfig common(const RunConfig& c) {
  ModelConfig m;
  m.dim = c.dim;
  m.heads = c.heads;
  m.mlp_hidden = c.mlp_hidden;
  m.conv_kernel = c.conv_kernel;
  m.design = c.design;
  m.attention = c.attention;
  return m;
}

ModelConfig causal_language_model(const RunConfig& c) {
  ModelConfig m = common(c);
  m.vocab = c.vocab;
  m.classes = c.vocab;
  m.causal = true;
  m.layout = TokenLayout::sequence(c.seq_len, sequence_block(c));
  return m;
}

class MqarTask : public Task {
 public:
  explicit MqarTask(const RunConfig& c) : run_(c), data_{c.vocab, c.seq_len, c.kv_pairs} {
    check_mqar_config(data_);
    for (auto [seed, batches] :
         {std::pair{kMqarValidationSeed, &validation_}, std::pair{kMqarTestSeed, &test_}})
      for (int64_t first = 0; first < c.eval_samples; first += c.batch)
        batches->push_back(make_mqar_batch(data_, std::min(c.batch, c.eval_samples - first),
                                           stream_seed(seed, kEvalStream - uint64_t(first))));
  }
  ModelConfig model_config() const override { return causal_language_model(run_); }
  Batch train_batch(int64_t step) override {
    return make_mqar_batch(data_, run_.batch, stream_seed(run_.seed, uint64_t(step)));
  }
  const std::vector<Batch>& validation_batches() const override { return validation_; }
  const std::vector<Batch>& test_batches() const override { return test_; }
  int64_t tokens_per_sample() const override { return run_.seq_len; }

 private:
  RunConfig run_;
  MqarConfig data_;
  std::vector<Batch> validation_, test_;
};

// Byte-level language modelling: predict every next byte of a seq_len window.
class TextTask : public Task {
 public:
  TextTask(const RunConfig& c, const std::string& path) : run_(c) {
    corpus_ = split_bible_text(
        read_bible_text(path),
        path.empty() ? "from '" + std::string(kBibleCommand) + "'" : "'" + path + "'");
    const int64_t span = c.seq_len + 1;
    for (auto [text, batches] :
         {std::pair{&corpus_.validation, &validation_}, std::pair{&corpus_.test, &test_}}) {
      // eval_samples windows spread evenly over the held-out text.
      const int64_t room = int64_t(text->size()) - span;
      if (room < 0)
        throw Error("text corpus: held-out text shorter than one window of " +
                    std::to_string(span) + " bytes");
      std::vector<int64_t> starts;
      for (int64_t i = 0; i < c.eval_samples; ++i)
        starts.push_back(c.eval_samples > 1 ? room * i / (c.eval_samples - 1) : 0);
      for (size_t first = 0; first < starts.size(); first += size_t(c.batch)) {
        const size_t last = std::min(starts.size(), first + size_t(c.batch));
        batches->push_back(
            windows(*text, {starts.begin() + long(first), starts.begin() + long(last)}));
      }
    }
    if (int64_t(corpus_.train.size()) <= span)
      throw Error("text corpus: training text shorter than one window");
  }
  ModelConfig model_config() const override { return causal_language_model(run_); }
  Batch train_batch(int64_t step) override {
    Rng rng(stream_seed(run_.seed, uint64_t(step)));
    std::uniform_int_distribution<int64_t> start(0,
                                                 int64_t(corpus_.train.size()) - run_.seq_len - 1);
    std::vector<int64_t> starts(size_t(run_.batch));
    for (int64_t& s : starts) s = start(rng);
    return windows(corpus_.train, starts);
  }
  const std::vector<Batch>& validation_batches() const override { return validation_; }
  const std::vector<Batch>& test_batches() const override { return test_; }
  int64_t tokens_per_sample() const override { return run_.seq_len; }

 private:
  Batch windows(const std::string& text, const std::vector<int64_t>& starts) const {
    const int64_t n = run_.seq_len;
    Batch b;
    b.size = int64_t(starts.size());
    for (int64_t s : starts)
      for (int64_t t = 0; t < n; ++t) {
        b.tokens.push_back(int32_t(static_cast<unsigned char>(text[size_t(s + t)])));
        b.targets.push_back(int32_t(static_cast<unsigned char>(text[size_t(s + t + 1)])));
      }
    return b;
  }

  RunConfig run_;
  TextCorpus corpus_;
  std::vector<Batch> validation_, test_;
};

class FashionMnistTask : public Task {
 public:
  FashionMnistTask(const RunConfig& c, const std::string& dir) : run_(c) {
    train_ = load_fashion_mnist(dir, true);
    const ImageSet test = load_fashion_mnist(dir, false);
    const int64_t trainable = train_.count - kFashionValidationImages;
    if (c.train_images > trainable)
      throw Error("train_images " + std::to_string(c.train_images) + " exceeds the " +
                  std::to_string(trainable) + " training images (the last " +
                  std::to_string(kFashionValidationImages) + " are for validation)");
    train_count_ = c.train_images > 0 ? c.train_images : trainable;
    if (train_count_ < c.batch) throw Error("fewer training images than one batch");
    auto add = [&](const ImageSet& set, int64_t first_image, int64_t available,
                   std::vector<Batch>& batches) {
      const int64_t count = c.eval_images > 0 ? std::min(c.eval_images, available) : available;
      std::vector<int64_t> order(size_t(set.count));
      std::iota(order.begin(), order.end(), 0);
      for (int64_t first = 0; first < count; first += c.batch)
        batches.push_back(make_image_batch(set, order, first_image + first,
                                           std::min(c.batch, count - first), c.patch));
    };
    add(train_, trainable, kFashionValidationImages, validation_);
    add(test, 0, test.count, test_);
    grid_h_ = train_.height / c.patch;
    grid_w_ = train_.width / c.patch;
  }
  ModelConfig model_config() const override {
    ModelConfig m = common(run_);
    m.patch_dim = run_.patch * run_.patch;
    m.classes = 10;
    m.pool = true;
    m.layout = TokenLayout::grid2d(grid_h_, grid_w_, run_.tile, run_.tile);
    return m;
  }
  // Epoch e visits the first train_images images in an order drawn from (seed, e).
  Batch train_batch(int64_t step) override {
    const int64_t per_epoch = train_count_ / run_.batch, epoch = step / per_epoch;
    if (epoch != epoch_) {
      order_.resize(size_t(train_count_));
      std::iota(order_.begin(), order_.end(), 0);
      Rng rng(stream_seed(run_.seed, kShuffleStream + uint64_t(epoch)));
      std::shuffle(order_.begin(), order_.end(), rng);
      epoch_ = epoch;
    }
    return make_image_batch(train_, order_, (step % per_epoch) * run_.batch, run_.batch,
                            run_.patch);
  }
  const std::vector<Batch>& validation_batches() const override { return validation_; }
  const std::vector<Batch>& test_batches() const override { return test_; }
  int64_t tokens_per_sample() const override { return grid_h_ * grid_w_; }

 private:
  RunConfig run_;
  ImageSet train_;
  int64_t train_count_ = 0, grid_h_ = 0, grid_w_ = 0, epoch_ = -1;
  std::vector<int64_t> order_;
  std::vector<Batch> validation_, test_;
};

}  // namespace

std::unique_ptr<Task> make_task(const RunConfig& config, const std::string& data_dir) {
  check_run_config(config);
  switch (config.task) {
    case TaskKind::mqar:
      return std::make_unique<MqarTask>(config);
    case TaskKind::text:
      return std::make_unique<TextTask>(config, data_dir);
    case TaskKind::fashion_mnist:
      break;
  }
  return std::make_unique<FashionMnistTask>(config, data_dir.empty() ? kFashionMnistDir : data_dir);
}

}  // namespace mhla::train
