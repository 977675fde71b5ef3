#pragma once
// The tensors inside a forward's arguments or result: a tensor, a container of
// tensors, a tuple or pair of those, or an optional. Anything else holds none. DDP
// checks inputs' devices and walks outputs' graphs with what this finds; a forward
// returning a type of your own can be described by overloading collect_tensors in
// your type's namespace (found by argument-dependent lookup).
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <map>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace cohort::ddp {

inline void collect_tensors(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }

template <typename T>
void collect_tensors(const std::vector<T>& items, std::vector<at::Tensor>& out);
template <typename K, typename V>
void collect_tensors(const std::map<K, V>& items, std::vector<at::Tensor>& out);
template <typename K, typename V>
void collect_tensors(const std::unordered_map<K, V>& items, std::vector<at::Tensor>& out);
template <typename A, typename B>
void collect_tensors(const std::pair<A, B>& p, std::vector<at::Tensor>& out);
template <typename... Ts>
void collect_tensors(const std::tuple<Ts...>& t, std::vector<at::Tensor>& out);
template <typename T>
void collect_tensors(const c10::optional<T>& o, std::vector<at::Tensor>& out);

// Scalars, strings and types DDP does not know hold no tensor.
template <typename T, typename = std::enable_if_t<!std::is_base_of_v<at::Tensor, std::decay_t<T>>>>
void collect_tensors(const T&, std::vector<at::Tensor>&) {}

template <typename T>
void collect_tensors(const std::vector<T>& items, std::vector<at::Tensor>& out) {
  for (const auto& item : items) collect_tensors(item, out);
}
template <typename K, typename V>
void collect_tensors(const std::map<K, V>& items, std::vector<at::Tensor>& out) {
  for (const auto& kv : items) collect_tensors(kv.second, out);
}
template <typename K, typename V>
void collect_tensors(const std::unordered_map<K, V>& items, std::vector<at::Tensor>& out) {
  for (const auto& kv : items) collect_tensors(kv.second, out);
}
template <typename A, typename B>
void collect_tensors(const std::pair<A, B>& p, std::vector<at::Tensor>& out) {
  collect_tensors(p.first, out);
  collect_tensors(p.second, out);
}
template <typename... Ts>
void collect_tensors(const std::tuple<Ts...>& t, std::vector<at::Tensor>& out) {
  std::apply([&out](const auto&... items) { (collect_tensors(items, out), ...); }, t);
}
template <typename T>
void collect_tensors(const c10::optional<T>& o, std::vector<at::Tensor>& out) {
  if (o) collect_tensors(*o, out);
}

template <typename... Args>
std::vector<at::Tensor> tensors_in(const Args&... args) {
  std::vector<at::Tensor> out;
  (collect_tensors(args, out), ...);
  return out;
}

}  // namespace cohort::ddp
