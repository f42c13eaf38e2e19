// The bytes of creation messages (bootstrap.h, agreement.h): numbers (8 bytes) and texts (a
// length, then the bytes), read back with a check that everything was there.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace ddl {

class Writer {
 public:
  void number(uint64_t value) { bytes_.append(reinterpret_cast<const char*>(&value), 8); }
  void text(const std::string& value) {
    number(value.size());
    bytes_ += value;
  }
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

class Reader {
 public:
  explicit Reader(const std::string& bytes) : at_(bytes.data()), left_(bytes.size()) {}
  uint64_t number() {
    uint64_t value = 0;
    if (left_ < 8) {
      ok_ = false;
      return 0;
    }
    std::memcpy(&value, at_, 8);
    at_ += 8;
    left_ -= 8;
    return value;
  }
  std::string text() {
    const uint64_t length = number();
    if (length > left_) {
      ok_ = false;
      return "";
    }
    std::string value(at_, length);
    at_ += length;
    left_ -= length;
    return value;
  }
  // Whether everything read so far was there, and (with `whole`) nothing is left.
  bool ok(bool whole = false) const { return ok_ && (!whole || left_ == 0); }

 private:
  const char* at_;
  size_t left_;
  bool ok_ = true;
};

}  // namespace ddl
