#pragma once
// JSON lines corpora (*.jsonl) for gpt2-data: each non-blank line is a JSON object whose "text"
// member, a string, is one document (other members are ignored). Contract: a line that is not JSON,
// not an object, lacks "text" or has a non-string "text" is a gpt2::UserError naming
// "<file>:<line>" and what is wrong; blank lines are skipped. The file is streamed line by line.
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace gpt2::data {

// The document text of one line (without its '\n'); nullopt for a blank line. `where` is
// "<file>:<line>", the prefix of every error.
std::optional<std::string> jsonl_document(std::string_view line, const std::string& where);

// Reads a JSON lines file one document at a time. Move-only; closes the file in the destructor.
class JsonlReader {
 public:
  explicit JsonlReader(const std::string& path);
  JsonlReader(JsonlReader&& other) noexcept;
  JsonlReader& operator=(JsonlReader&&) = delete;
  JsonlReader(const JsonlReader&) = delete;
  JsonlReader& operator=(const JsonlReader&) = delete;
  ~JsonlReader();

  // The next document's text into `text`; false at the end of the file.
  bool next(std::string* text);
  int64_t bytes_read() const { return bytes_read_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  char* line_ = nullptr;  // getline(3)'s buffer, grown as needed
  size_t capacity_ = 0;
  int64_t line_number_ = 0;  // of the line just read (errors name it)
  int64_t bytes_read_ = 0;
};

}  // namespace gpt2::data
