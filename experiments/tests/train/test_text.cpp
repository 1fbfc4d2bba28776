// The byte-level text task: the corpus is split by book (no held-out book
// leaks into training), windows predict their next byte, and a missing or
// damaged corpus is a named error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "mhla/error.hpp"
#include "small_runs.hpp"
#include "train/task.hpp"
#include "train/text_corpus.hpp"
#include "train/trainer.hpp"

namespace mhla::train {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// A text shaped like `bible`'s output: 66 books (the held-out ones among
// them), two chapters each, verses naming their book.
std::string synthetic_bible(int64_t books = 66) {
  std::vector<std::string> names = validation_books();
  names.insert(names.end(), test_books().begin(), test_books().end());
  for (char a = 'A'; int64_t(names.size()) < 66; ++a)
    for (char b = 'a'; b <= 'z' && int64_t(names.size()) < 66; ++b)
      names.push_back(std::string("Book ") + a + b);
  std::string text = "\n";
  for (int64_t i = 0; i < books; ++i)
    for (int chapter = 1; chapter <= 2; ++chapter) {
      text += names[size_t(i)] + " " + std::to_string(chapter) + "\n\n";
      for (int verse = 1; verse <= 6; ++verse)
        text +=
            "  " + std::to_string(verse) + " In " + names[size_t(i)] + " a verse of some length.\n";
    }
  return text;
}

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(TrainText, SplitsByBookWithoutLeaks) {
  const TextCorpus c = split_bible_text(synthetic_bible(), "synthetic");
  EXPECT_EQ(c.books, 66);
  EXPECT_EQ(c.validation_books, validation_books());
  EXPECT_EQ(c.test_books, test_books());
  for (const std::string& book : validation_books()) {
    EXPECT_THAT(c.validation, HasSubstr("In " + book + " a verse"));
    EXPECT_EQ(c.train.find("In " + book + " "), std::string::npos) << book;
    EXPECT_EQ(c.test.find("In " + book + " "), std::string::npos) << book;
  }
  for (const std::string& book : test_books())
    EXPECT_EQ(c.train.find("In " + book + " "), std::string::npos) << book;
  EXPECT_EQ(c.train.size() + c.validation.size() + c.test.size() + 1,
            synthetic_bible().size());  // all but the leading blank line
}

TEST(TrainText, MissingOrDamagedCorpusIsANamedError) {
  EXPECT_THAT([] { read_bible_text("/nonexistent/kjv.txt"); },
              ThrowsMessage<Error>(HasSubstr("cannot open '/nonexistent/kjv.txt'")));
  EXPECT_THAT(
      [] { split_bible_text(synthetic_bible(10), "'cut.txt'"); },
      ThrowsMessage<Error>(HasSubstr("text corpus 'cut.txt': found 10 books, expected 66")));
  std::string renamed = synthetic_bible();
  for (size_t at; (at = renamed.find("Ruth")) != std::string::npos;) renamed.replace(at, 4, "Rath");
  EXPECT_THAT([&] { split_bible_text(renamed, "'renamed.txt'"); },
              ThrowsMessage<Error>(HasSubstr("the held-out book 'Ruth' is missing")));
  EXPECT_THAT([] { split_bible_text("", "'empty.txt'"); },
              ThrowsMessage<Error>(HasSubstr("found 0 books")));
  // Without the `bible` program (here: not on PATH) the message names the packages.
  const std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  setenv("PATH", "/nonexistent", 1);
  EXPECT_THAT([] { read_bible_text(""); },
              ThrowsMessage<Error>(
                  HasSubstr("the 'bible' program is not installed; install Debian's bible-kjv")));
  setenv("PATH", path.c_str(), 1);
}

RunConfig small_text() {
  RunConfig c = test::small_mqar({AttentionKind::mhla, AttentionKind::linear});
  c.task = TaskKind::text;
  c.vocab = 256;
  c.seq_len = 24;
  c.block = 0;
  c.eval_samples = 6;
  return c;
}

TEST(TrainText, WindowsPredictTheNextByteAndSplitsDiffer) {
  const std::string path = write_temp("mhla_text_task.txt", synthetic_bible());
  const RunConfig c = small_text();
  const std::unique_ptr<Task> task = make_task(c, path);
  EXPECT_EQ(task->model_config().layout.num_blocks(), 5);  // block 0: M = round(sqrt(24)) = 5
  const Batch b = task->train_batch(3);
  ASSERT_EQ(b.tokens.size(), size_t(c.batch * c.seq_len));
  for (int64_t s = 0; s < b.size; ++s)
    for (int64_t t = 0; t + 1 < c.seq_len; ++t)
      EXPECT_EQ(b.targets[size_t(s * c.seq_len + t)], b.tokens[size_t(s * c.seq_len + t + 1)]);
  EXPECT_EQ(task->train_batch(3).tokens, b.tokens);  // a function of (seed, step)
  ASSERT_FALSE(task->validation_batches().empty());
  EXPECT_NE(task->validation_batches()[0].tokens, task->test_batches()[0].tokens);
  RunOptions options;
  options.data_dir = path;
  const RunResult r = run_training(c, options);
  EXPECT_TRUE(r.finished);
  EXPECT_NE(r.final_eval.loss, r.final_test.loss);
  EXPECT_LT(r.final_eval.loss, std::log(256.0));  // it has learned something about bytes
  RunConfig bad = c;
  bad.vocab = 100;
  EXPECT_THAT([&] { make_task(bad, path); }, ThrowsMessage<Error>(HasSubstr("vocab must be 256")));
  std::filesystem::remove(path);
}

TEST(TrainText, DebianCorpusLoads) {
  if (!std::filesystem::exists("/usr/lib/bible.data") || !std::filesystem::exists("/usr/bin/bible"))
    GTEST_SKIP() << "bible-kjv / bible-kjv-text are not installed";
  const TextCorpus c = split_bible_text(read_bible_text(""), "Debian");
  EXPECT_EQ(c.books, 66);
  const double total = double(c.train.size() + c.validation.size() + c.test.size());
  EXPECT_GT(total, 4e6);
  EXPECT_NEAR(double(c.validation.size()) / total, 0.033, 0.01);
  EXPECT_NEAR(double(c.test.size()) / total, 0.039, 0.01);
  EXPECT_THAT(c.train, HasSubstr("In the beginning God created the heaven and the earth."));
}

}  // namespace
}  // namespace mhla::train
