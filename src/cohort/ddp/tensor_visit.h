#pragma once
// The tensors inside a forward's arguments or result. DDP checks the inputs'
// devices and walks the outputs' autograd graphs with what this finds.
//
// Known types: tensors; numbers, enums, strings, devices (no tensor); and
// std::vector, std::array, std::deque, std::list, std::map, std::unordered_map,
// std::pair, std::tuple, std::optional (c10::optional) and std::variant of known
// types. For a type of your own, declare in its namespace (found by
// argument-dependent lookup)
//   void collect_tensors(const MyOutput& o, std::vector<at::Tensor>& out) {
//     cohort::ddp::append_tensors(o.logits, out);   // or out.push_back(...)
//   }
// A forward *result* of a type DDP does not know is a compile-time error: DDP would
// otherwise see no tensor in it, and find_unused_parameters would treat every
// parameter as unused. Arguments of unknown types are skipped (they are only
// checked for devices).
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Optional.h>

#include <array>
#include <deque>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace cohort::ddp {
namespace tensor_visit_detail {

// Only argument-dependent lookup finds a collect_tensors from here: the users'.
void collect_tensors() = delete;

template <typename T, typename = void>
struct HasUserOverload : std::false_type {};
template <typename T>
struct HasUserOverload<T, std::void_t<decltype(collect_tensors(std::declval<const T&>(),
                                                                std::declval<std::vector<at::Tensor>&>()))>>
    : std::true_type {};

template <typename T>
constexpr bool is_leaf_v = std::is_arithmetic_v<T> || std::is_enum_v<T> || std::is_same_v<T, std::string> ||
                           std::is_same_v<T, std::string_view> || std::is_same_v<T, const char*> ||
                           std::is_same_v<T, std::nullptr_t> || std::is_same_v<T, std::nullopt_t> ||
                           std::is_same_v<T, c10::nullopt_t> || std::is_same_v<T, c10::Device>;

// std::optional and c10::optional (one type on LibTorch 2.x, two on 1.13).
template <typename T, typename = void>
struct IsOptional : std::false_type {};
template <typename T>
struct IsOptional<T, std::void_t<typename T::value_type>>
    : std::bool_constant<std::is_same_v<T, std::optional<typename T::value_type>> ||
                         std::is_same_v<T, c10::optional<typename T::value_type>>> {};

template <typename T>
struct IsSequence : std::false_type {};
template <typename T, typename A>
struct IsSequence<std::vector<T, A>> : std::true_type {};
template <typename T, std::size_t N>
struct IsSequence<std::array<T, N>> : std::true_type {};
template <typename T, typename A>
struct IsSequence<std::deque<T, A>> : std::true_type {};
template <typename T, typename A>
struct IsSequence<std::list<T, A>> : std::true_type {};

template <typename T>
struct IsMap : std::false_type {};
template <typename K, typename V, typename C, typename A>
struct IsMap<std::map<K, V, C, A>> : std::true_type {};
template <typename K, typename V, typename H, typename E, typename A>
struct IsMap<std::unordered_map<K, V, H, E, A>> : std::true_type {};

template <typename T>
struct IsPair : std::false_type {};
template <typename A, typename B>
struct IsPair<std::pair<A, B>> : std::true_type {};

template <typename T>
struct IsTuple : std::false_type {};
template <typename... Ts>
struct IsTuple<std::tuple<Ts...>> : std::true_type {};

template <typename T>
struct IsVariant : std::false_type {};
template <typename... Ts>
struct IsVariant<std::variant<Ts...>> : std::true_type {};

template <typename T>
constexpr bool knows();

template <typename... Ts>
constexpr bool knows_all(const std::tuple<Ts...>*) {
  return (knows<Ts>() && ...);
}
template <typename... Ts>
constexpr bool knows_all(const std::variant<Ts...>*) {
  return (knows<Ts>() && ...);
}

// True when append() finds every tensor of a T.
template <typename T>
constexpr bool knows() {
  using U = std::remove_cv_t<std::remove_reference_t<T>>;
  if constexpr (HasUserOverload<U>::value || std::is_base_of_v<at::Tensor, U> || is_leaf_v<U>) {
    return true;
  } else if constexpr (std::is_array_v<U>) {
    return knows<std::remove_extent_t<U>>();
  } else if constexpr (IsOptional<U>::value || IsSequence<U>::value) {
    return knows<typename U::value_type>();
  } else if constexpr (IsMap<U>::value) {
    return knows<typename U::mapped_type>();
  } else if constexpr (IsPair<U>::value) {
    return knows<typename U::first_type>() && knows<typename U::second_type>();
  } else if constexpr (IsTuple<U>::value || IsVariant<U>::value) {
    return knows_all(static_cast<const U*>(nullptr));
  } else {
    return false;
  }
}

// Appends the tensors in `x`; a type knows() rejects holds none here.
template <typename T>
void append(const T& x, std::vector<at::Tensor>& out) {
  using U = std::remove_cv_t<std::remove_reference_t<T>>;
  if constexpr (HasUserOverload<U>::value) {
    collect_tensors(x, out);
  } else if constexpr (std::is_base_of_v<at::Tensor, U>) {
    out.push_back(x);
  } else if constexpr (is_leaf_v<U> || !knows<U>()) {
    // no tensor, or a type DDP cannot look into
  } else if constexpr (std::is_array_v<U> || IsSequence<U>::value) {
    for (const auto& item : x) append(item, out);
  } else if constexpr (IsOptional<U>::value) {
    if (x) append(*x, out);
  } else if constexpr (IsMap<U>::value) {
    for (const auto& kv : x) append(kv.second, out);
  } else if constexpr (IsPair<U>::value) {
    append(x.first, out);
    append(x.second, out);
  } else if constexpr (IsTuple<U>::value) {
    std::apply([&out](const auto&... items) { (append(items, out), ...); }, x);
  } else if constexpr (IsVariant<U>::value) {
    std::visit([&out](const auto& item) { append(item, out); }, x);
  }
}

}  // namespace tensor_visit_detail

// Whether DDP finds every tensor in a T (tensor_visit.h's list, or your overload).
template <typename T>
inline constexpr bool knows_tensors_in_v = tensor_visit_detail::knows<T>();

// For overloads of collect_tensors: appends the tensors in a member of a known type.
template <typename T>
void append_tensors(const T& x, std::vector<at::Tensor>& out) {
  tensor_visit_detail::append(x, out);
}

// A forward's arguments: tensors found in known types; other types are skipped.
template <typename... Args>
std::vector<at::Tensor> tensors_in(const Args&... args) {
  std::vector<at::Tensor> out;
  (tensor_visit_detail::append(args, out), ...);
  return out;
}

// A forward's result: every tensor in it. Its type must be one DDP knows.
template <typename T>
std::vector<at::Tensor> tensors_in_result(const T& result) {
  static_assert(knows_tensors_in_v<T>,
                "cohort DDP: the module's forward returns a type in which DDP cannot find the tensors (see the "
                "type in the instantiation above). DDP looks into tensors, std::vector, std::array, std::deque, "
                "std::list, std::map, std::unordered_map, std::pair, std::tuple, std::optional and std::variant "
                "of those. Fix: return one of these, or declare `void collect_tensors(const YourType&, "
                "std::vector<at::Tensor>&)` in your type's namespace (cohort/ddp/tensor_visit.h)");
  std::vector<at::Tensor> out;
  tensor_visit_detail::append(result, out);
  return out;
}

}  // namespace cohort::ddp
