// The key-value store a group is created with (the c10d Store in the torch glue, a map in tests).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddl {

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  // Keys are private to the group being created.
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until the key exists (or the store's own timeout passes, which throws).
  virtual std::string get(const std::string& key) = 0;
  // Every key's value, in order: one request where the store has it (TCPStore's multi_get).
  virtual std::vector<std::string> multiGet(const std::vector<std::string>& keys) {
    std::vector<std::string> values;
    for (const std::string& key : keys) values.push_back(get(key));
    return values;
  }
  // Adds `delta` to the number stored at `key` (0 when absent) and returns the sum, atomically.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // A number no other group of this job has been given: a counter shared by all groups.
  virtual uint64_t nextGroupNumber() = 0;
};

}  // namespace ddl
