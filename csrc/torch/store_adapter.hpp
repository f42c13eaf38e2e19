// The core's KeyValueStore over torch's c10d::Store (the group's prefixed store; group numbers
// come from the root store, shared by every group of the job).
#pragma once

#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "../core/group/store.h"
#include "compat.hpp"

namespace ddl {

class StoreAdapter : public KeyValueStore {
 public:
  explicit StoreAdapter(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::string get(const std::string& key) override {
    std::vector<uint8_t> value = store_->get(key);
    return std::string(value.begin(), value.end());
  }
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override {
    std::vector<std::string> values;
    for (const std::vector<uint8_t>& value : store_->multiGet(keys)) {
      values.emplace_back(value.begin(), value.end());
    }
    return values;
  }
  int64_t add(const std::string& key, int64_t delta) override { return store_->add(key, delta); }
  uint64_t nextGroupNumber() override {
    return static_cast<uint64_t>(
        torch_compat::rootStore(store_)->add("torch_ddl/group_counter", 1) - 1);
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace ddl
