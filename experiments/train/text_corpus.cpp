#include "train/text_corpus.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "mhla/error.hpp"
#include "mhla_support/files.hpp"

namespace mhla::train {
namespace {

constexpr int64_t kBooks = 66;
constexpr const char* kInstall =
    "install Debian's bible-kjv and bible-kjv-text (apt-get install bible-kjv bible-kjv-text)";

// "1 Kings 1" -> "1 Kings"; "" when the line is not a chapter heading.
std::string chapter_heading_book(const std::string& line) {
  const size_t space = line.rfind(' ');
  if (line.empty() || line[0] == ' ' || space == std::string::npos || space + 1 == line.size())
    return "";
  if (!std::all_of(line.begin() + long(space) + 1, line.end(),
                   [](char c) { return c >= '0' && c <= '9'; }))
    return "";
  const std::string book = line.substr(0, space);
  const bool letters = std::all_of(book.begin(), book.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '1' && c <= '3') || c == ' ';
  });
  return letters ? book : "";
}

std::string run_bible() {
  FILE* pipe = popen((std::string(kBibleCommand) + " 2>&1").c_str(), "r");
  if (!pipe)
    throw Error("text corpus: cannot run '" + std::string(kBibleCommand) + "'; " + kInstall);
  std::string text;
  char buffer[1 << 16];
  for (size_t got; (got = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;)
    text.append(buffer, got);
  const int status = pclose(pipe);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 127)
    throw Error("text corpus: the 'bible' program is not installed; " + std::string(kInstall));
  if (code != 0)
    throw Error("text corpus: '" + std::string(kBibleCommand) + "' failed (exit " +
                std::to_string(code) + "): " + text.substr(0, 200) + "; " + kInstall +
                ", or pass the text with --data FILE");
  return text;
}

}  // namespace

const std::vector<std::string>& validation_books() {
  static const std::vector<std::string> books{"Ruth", "Ecclesiastes", "Mark", "Galatians"};
  return books;
}

const std::vector<std::string>& test_books() {
  static const std::vector<std::string> books{"Esther", "Amos", "John", "James"};
  return books;
}

std::string read_bible_text(const std::string& path) {
  if (path.empty()) return run_bible();
  try {
    const std::vector<uint8_t> bytes = io::InputFile(path).read_all();
    return std::string(bytes.begin(), bytes.end());
  } catch (const Error& e) {
    throw Error(std::string("text corpus: ") + e.what() + " (expected the text as '" +
                kBibleCommand + "' prints it)");
  }
}

TextCorpus split_bible_text(const std::string& text, const std::string& source) {
  TextCorpus corpus;
  std::vector<std::string> seen;
  std::string current;
  std::string* target = nullptr;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    const std::string line = text.substr(start, end - start);
    const std::string book = chapter_heading_book(line);
    if (!book.empty() && book != current && line == book + " 1") {
      current = book;
      seen.push_back(book);
      auto held = [&](const std::vector<std::string>& list) {
        return std::find(list.begin(), list.end(), book) != list.end();
      };
      if (held(validation_books())) {
        target = &corpus.validation;
        corpus.validation_books.push_back(book);
      } else if (held(test_books())) {
        target = &corpus.test;
        corpus.test_books.push_back(book);
      } else {
        target = &corpus.train;
      }
    }
    if (target) target->append(text, start, end - start + (end < text.size() ? 1 : 0));
    start = end + 1;
  }
  corpus.books = int64_t(seen.size());
  const std::string what = "text corpus " + source + ": ";
  if (corpus.books != kBooks)
    throw Error(what + "found " + std::to_string(corpus.books) + " books, expected " +
                std::to_string(kBooks) + " (is it the text as '" + kBibleCommand + "' prints it? " +
                kInstall + ")");
  for (const auto* list : {&validation_books(), &test_books()})
    for (const std::string& book : *list)
      if (std::find(seen.begin(), seen.end(), book) == seen.end())
        throw Error(what + "the held-out book '" + book + "' is missing");
  return corpus;
}

}  // namespace mhla::train
