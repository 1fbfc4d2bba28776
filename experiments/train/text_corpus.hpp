#pragma once
// The King James Bible as a byte-level language-modelling corpus, from
// Debian's bible-kjv-text (its compressed data is read by the package's own
// `bible` program), split into training, validation and test text by book so
// that held-out text is never seen in training, not even as a neighbouring verse.
#include <string>
#include <vector>

namespace mhla::train {

// The command that prints the whole text, one verse per line (no wrapping).
inline constexpr const char* kBibleCommand = "bible -l100000 gen1:1-rev22:21";

struct TextCorpus {
  std::string train, validation, test;
  std::vector<std::string> validation_books, test_books;
  int64_t books = 0;
};

// Books held out, chosen to mix Old and New Testament, prose, poetry and letters
// (about 3.5% of the bytes each).
const std::vector<std::string>& validation_books();
const std::vector<std::string>& test_books();

// The text as `bible` prints it: from `path` when not empty, else by running
// kBibleCommand. A missing file or program, or a failing program, is an
// mhla::Error that names it and the Debian packages to install.
std::string read_bible_text(const std::string& path);

// Splits the text at its book headings ("Genesis 1", "1 Kings 1", a line of its
// own that starts a book's first chapter). A text that does not hold the 66
// books, or lacks a held-out book, is an mhla::Error naming `source` and what is wrong.
TextCorpus split_bible_text(const std::string& text, const std::string& source);

}  // namespace mhla::train
