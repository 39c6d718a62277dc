// OrderedDict: name -> value in insertion order, with lookup by name, as Python's dict
// (and libtorch's torch::OrderedDict). Modules keep their parameters, buffers and
// children in one; state_dict() returns one of tensors.
//
//   OrderedDict<Tensor> sd = model->state_dict();
//   for (const auto& [name, tensor] : sd) std::cout << name << " " << tensor.shape() << "\n";
//   Tensor w = sd["conv1.weight"];            // a loom::Error naming the key if absent
//
// Order matters: PyTorch's state_dict order is registration order, and loom keeps it so
// that checkpoints, printed models and parameter lists line up with PyTorch's.
#pragma once

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"

namespace loom {

template <typename V>
class OrderedDict {
 public:
  using Item = std::pair<std::string, V>;

  OrderedDict() = default;
  OrderedDict(std::initializer_list<Item> items) {
    for (const Item& item : items) insert(item.first, item.second);
  }

  // Adds a new key at the end, or replaces the value of an existing key in place (its
  // position does not change, as assigning to a Python dict key).
  V& insert(const std::string& key, V value) {
    auto found = index_.find(key);
    if (found != index_.end()) return items_[found->second].second = std::move(value);
    index_.emplace(key, items_.size());
    items_.emplace_back(key, std::move(value));
    return items_.back().second;
  }

  bool contains(const std::string& key) const { return index_.count(key) != 0; }
  const V* find(const std::string& key) const {
    auto found = index_.find(key);
    return found == index_.end() ? nullptr : &items_[found->second].second;
  }
  V* find(const std::string& key) {
    auto found = index_.find(key);
    return found == index_.end() ? nullptr : &items_[found->second].second;
  }
  const V& operator[](const std::string& key) const {
    const V* value = find(key);
    LOOM_CHECK(value, "OrderedDict: no key '", key, "' (", size(), " keys", key_hint(), ")");
    return *value;
  }
  V& operator[](const std::string& key) {
    return const_cast<V&>(static_cast<const OrderedDict&>(*this)[key]);
  }

  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  void clear() {
    items_.clear();
    index_.clear();
  }
  std::vector<std::string> keys() const {
    std::vector<std::string> keys;
    keys.reserve(items_.size());
    for (const Item& item : items_) keys.push_back(item.first);
    return keys;
  }
  std::vector<V> values() const {
    std::vector<V> values;
    values.reserve(items_.size());
    for (const Item& item : items_) values.push_back(item.second);
    return values;
  }

  auto begin() { return items_.begin(); }
  auto end() { return items_.end(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }
  const std::vector<Item>& items() const { return items_; }

 private:
  // The first few keys, so a typo'd lookup shows what was there.
  std::string key_hint() const {
    std::string hint;
    for (size_t i = 0; i < items_.size() && i < 5; ++i) hint += (i ? ", '" : ": '") + items_[i].first + "'";
    if (items_.size() > 5) hint += ", ...";
    return hint;
  }

  std::vector<Item> items_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace loom
