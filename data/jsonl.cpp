// JSON lines reader (see jsonl.h).
#include "data/jsonl.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "src/base/errors.h"
#include "src/base/json.h"

namespace gpt2::data {

std::optional<std::string> jsonl_document(std::string_view line, const std::string& where) {
  if (line.find_first_not_of(" \t\r") == std::string_view::npos) return std::nullopt;
  json::Value value;
  try {
    value = json::parse(line, where);
  } catch (const UserError& e) {
    // json::parse counts lines inside its input; a JSONL line is one line, so drop "line 1, ".
    std::string msg = e.what();
    const std::string redundant = where + ": line 1, ";
    if (msg.compare(0, redundant.size(), redundant) == 0) msg = where + ": " + msg.substr(redundant.size());
    throw UserError(msg + " (not a JSON line)");
  }
  if (!value.is_object()) {
    const char* got = value.is_array()     ? "an array"
                      : value.is_string()  ? "a string"
                      : value.is_number()  ? "a number"
                      : value.is_boolean() ? "a boolean"
                                           : "null";
    throw UserError(where + ": expected a JSON object with a \"text\" string, got " + got);
  }
  const json::Value* text = json::find(value, "text");
  if (text == nullptr) throw UserError(where + ": the object has no \"text\" member");
  if (!text->is_string()) throw UserError(where + ": \"text\" is not a string");
  return json::as_string(*text, "value");
}

JsonlReader::JsonlReader(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "rb");
  if (file_ == nullptr) throw UserError(path + ": cannot open: " + std::strerror(errno));
}

JsonlReader::JsonlReader(JsonlReader&& other) noexcept
    : path_(std::move(other.path_)),
      file_(std::exchange(other.file_, nullptr)),
      line_(std::exchange(other.line_, nullptr)),
      capacity_(std::exchange(other.capacity_, 0)),
      line_number_(other.line_number_),
      bytes_read_(other.bytes_read_) {}

JsonlReader::~JsonlReader() {
  if (file_ != nullptr) std::fclose(file_);
  std::free(line_);
}

bool JsonlReader::next(std::string* text) {
  while (true) {
    errno = 0;
    const ssize_t n = ::getline(&line_, &capacity_, file_);
    if (n < 0) {
      if (std::ferror(file_)) throw UserError(path_ + ": read failed: " + std::strerror(errno));
      return false;
    }
    ++line_number_;
    bytes_read_ += n;
    std::string_view line(line_, static_cast<size_t>(n));
    if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
    std::optional<std::string> doc = jsonl_document(line, path_ + ":" + std::to_string(line_number_));
    if (doc) {
      *text = std::move(*doc);
      return true;
    }
  }
}

}  // namespace gpt2::data
