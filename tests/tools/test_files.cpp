// Writers of one path at the same time (two comparisons sharing an output
// folder): every write is whole, the last rename wins, and no temporary file
// is left behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/gnuplot.hpp"
#include "common/heatmap.hpp"
#include "mhla_support/files.hpp"

namespace mhla::test {
namespace {

namespace fs = std::filesystem;

class ConcurrentWriters : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("mhla-files-test-" +
            std::string(testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The names in the folder: only the written file may be there.
  std::set<std::string> names() const {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.insert(e.path().filename().string());
    return out;
  }

  fs::path dir_;
};

// Runs write(t) on `count` threads at once; a writer's exception fails the test
// (after every thread has joined) instead of ending the process.
template <typename Write>
void run_writers(int count, Write write) {
  std::vector<std::string> errors(static_cast<size_t>(count));
  std::vector<std::thread> threads;
  for (int t = 0; t < count; ++t)
    threads.emplace_back([&, t] {
      try {
        write(t);
      } catch (const std::exception& e) {
        errors[size_t(t)] = e.what();
      }
    });
  for (std::thread& th : threads) th.join();
  for (const std::string& e : errors) EXPECT_EQ(e, "");
}

TEST(TemporaryPath, IsBesideThePathAndNeverRepeats) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string t = io::temporary_path_beside("out/a.json");
    EXPECT_EQ(t.rfind("out/a.json.", 0), 0u) << t;
    EXPECT_TRUE(t.ends_with(".partial")) << t;
    EXPECT_TRUE(seen.insert(t).second) << t;
  }
  EXPECT_TRUE(io::temporary_path_beside("a.png", ".gp").ends_with(".gp"));
}

TEST_F(ConcurrentWriters, EveryWriteIsWholeAndNothingIsLeftBehind) {
  const std::string path = (dir_ / "shared.bin").string();
  constexpr int kThreads = 8, kWrites = 50;
  // Each writer's bytes differ in value and length, so a mix of two is detectable.
  auto payload = [](int t) { return std::vector<uint8_t>(size_t(4096 + 97 * t), uint8_t(t + 1)); };
  run_writers(kThreads, [&](int t) {
    for (int i = 0; i < kWrites; ++i) io::write_file_atomically(path, payload(t));
  });
  const std::vector<uint8_t> back = io::InputFile(path).read_all();
  ASSERT_FALSE(back.empty());
  EXPECT_EQ(back, payload(back[0] - 1));
  EXPECT_EQ(names(), std::set<std::string>{"shared.bin"});
}

TEST_F(ConcurrentWriters, HeatmapsOfOnePathDoNotCollide) {
  const std::string path = (dir_ / "w.png").string();
  run_writers(4, [&](int t) {
    const std::vector<double> m(64, double(t + 1));
    for (int i = 0; i < 20; ++i) tools::write_heatmap_png(path, m, 8, 8, /*overwrite=*/true);
  });
  EXPECT_GT(fs::file_size(path), 0u);
  EXPECT_EQ(names(), std::set<std::string>{"w.png"});
}

TEST_F(ConcurrentWriters, GnuplotDrawingsOfOnePathDoNotCollide) {
  const std::string path = (dir_ / "curve.png").string();
  run_writers(4, [&](int t) {
    for (int i = 0; i < 3; ++i)
      tools::draw_png_with_gnuplot(path, 160, 120, "plot x * " + std::to_string(t + 1));
  });
  EXPECT_GT(fs::file_size(path), 0u);
  EXPECT_EQ(names(), std::set<std::string>{"curve.png"});
}

}  // namespace
}  // namespace mhla::test
