#include "fc/codec/json_writer.h"

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ostream>

namespace fc {

void AppendJsonString(std::string* out, std::string_view s) {
  out->push_back('"');
  // Runs of characters that need no escape are appended whole: most keys and values are
  // plain ASCII (fc-inspect --json writes about 150 bytes of them per chunk).
  size_t plain = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && c != '"' && c != '\\') continue;
    out->append(s.substr(plain, i - plain));
    plain = i + 1;
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default: {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", u);
        out->append(buf);
      }
    }
  }
  out->append(s.substr(plain));
  out->push_back('"');
}

std::string JsonQuote(std::string_view s) {
  std::string out;
  AppendJsonString(&out, s);
  return out;
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  auto cont = [&](size_t k) { return k < n && (byte(k) & 0xC0) == 0x80; };
  while (i < n) {
    const unsigned char c = byte(i);
    if (c < 0x80) {
      ++i;
    } else if (c >= 0xC2 && c <= 0xDF) {
      if (!cont(i + 1)) return false;
      i += 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      if (!cont(i + 1) || !cont(i + 2)) return false;
      const unsigned char c1 = byte(i + 1);
      if (c == 0xE0 && c1 < 0xA0) return false;  // overlong
      if (c == 0xED && c1 >= 0xA0) return false;  // UTF-16 surrogates
      i += 3;
    } else if (c >= 0xF0 && c <= 0xF4) {
      if (!cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return false;
      const unsigned char c1 = byte(i + 1);
      if (c == 0xF0 && c1 < 0x90) return false;  // overlong
      if (c == 0xF4 && c1 >= 0x90) return false;  // > U+10FFFF
      i += 4;
    } else {
      return false;
    }
  }
  return true;
}

bool JsonWriter::Pretty() const {
  return style_ == Style::kPretty && !stack_.empty() && !stack_.back().is_inline;
}

void JsonWriter::NewlineIndent(size_t depth) {
  out_.push_back('\n');
  out_.append(2 * depth, ' ');
}

void JsonWriter::BeforeValue() {
  if (stack_.empty()) return;
  Frame& top = stack_.back();
  if (top.is_object) {
    assert(top.have_key && "JsonWriter: value without a key inside an object");
    top.have_key = false;
    return;
  }
  if (top.count > 0) out_.push_back(',');
  if (Pretty()) {
    NewlineIndent(stack_.size());
  } else if (style_ == Style::kPretty && top.count > 0) {
    out_.push_back(' ');
  }
  ++top.count;
}

JsonWriter& JsonWriter::Key(std::string_view key) {
  assert(!stack_.empty() && stack_.back().is_object && !stack_.back().have_key);
  Frame& top = stack_.back();
  if (top.count > 0) out_.push_back(',');
  if (Pretty()) {
    NewlineIndent(stack_.size());
  } else if (style_ == Style::kPretty && top.count > 0) {
    out_.push_back(' ');
  }
  ++top.count;
  AppendJsonString(&out_, key);
  out_.push_back(':');
  if (style_ == Style::kPretty) out_.push_back(' ');
  top.have_key = true;
  return *this;
}

void JsonWriter::Open(bool is_object, bool inline_) {
  BeforeValue();
  const bool parent_inline = !stack_.empty() && stack_.back().is_inline;
  out_.push_back(is_object ? '{' : '[');
  stack_.push_back(Frame{is_object, inline_ || parent_inline || style_ == Style::kCompact});
}

void JsonWriter::Close(bool is_object) {
  assert(!stack_.empty() && stack_.back().is_object == is_object && !stack_.back().have_key);
  const bool block = Pretty() && stack_.back().count > 0;
  stack_.pop_back();
  if (block) NewlineIndent(stack_.size());
  out_.push_back(is_object ? '}' : ']');
}

JsonWriter& JsonWriter::BeginObject(bool inline_) {
  Open(true, inline_);
  return *this;
}
JsonWriter& JsonWriter::EndObject() {
  Close(true);
  return *this;
}
JsonWriter& JsonWriter::BeginArray(bool inline_) {
  Open(false, inline_);
  return *this;
}
JsonWriter& JsonWriter::EndArray() {
  Close(false);
  return *this;
}

JsonWriter& JsonWriter::String(std::string_view value) {
  BeforeValue();
  AppendJsonString(&out_, value);
  return *this;
}
JsonWriter& JsonWriter::Int(int64_t value) {
  BeforeValue();
  char buf[24];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  out_.append(buf, static_cast<size_t>(end - buf));
  return *this;
}
JsonWriter& JsonWriter::Uint(uint64_t value) {
  BeforeValue();
  char buf[24];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  out_.append(buf, static_cast<size_t>(end - buf));
  return *this;
}
JsonWriter& JsonWriter::Fixed(double value, int decimals) {
  if (!std::isfinite(value)) return Null();
  BeforeValue();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", std::clamp(decimals, 0, 17), value);
  out_.append(buf);
  return *this;
}
JsonWriter& JsonWriter::RawValue(std::string_view json) {
  BeforeValue();
  while (!json.empty() && (json.back() == '\n' || json.back() == ' ')) json.remove_suffix(1);
  out_.append(json);
  return *this;
}
JsonWriter& JsonWriter::Bool(bool value) {
  BeforeValue();
  out_.append(value ? "true" : "false");
  return *this;
}
JsonWriter& JsonWriter::Null() {
  BeforeValue();
  out_.append("null");
  return *this;
}

void JsonWriter::FlushTo(std::ostream& out) {
  out.write(out_.data(), static_cast<std::streamsize>(out_.size()));
  out_.clear();
}

}  // namespace fc
