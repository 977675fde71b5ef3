#pragma once
// Python values as a pickle holds them, for the one pickle LibTorch cannot write:
// the `.metadata` of PyTorch's distributed checkpoints, whose objects are Python
// dataclasses, dtypes and torch.Size (docs/dcp_format.md). Written as protocol 2 with
// GLOBAL opcodes and no memo, which Python's pickle.load reads.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cohort::checkpoint::dcp {

class PyValue {
 public:
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kTuple, kList, kDict, kGlobal, kCall, kObject };

  static PyValue none() { return PyValue(Kind::kNone); }
  static PyValue boolean(bool v) {
    PyValue p(Kind::kBool);
    p.int_ = v ? 1 : 0;
    return p;
  }
  static PyValue integer(std::int64_t v) {
    PyValue p(Kind::kInt);
    p.int_ = v;
    return p;
  }
  static PyValue floating(double v) {
    PyValue p(Kind::kFloat);
    p.float_ = v;
    return p;
  }
  static PyValue string(std::string v) {
    PyValue p(Kind::kString);
    p.text_ = std::move(v);
    return p;
  }
  static PyValue tuple(std::vector<PyValue> items) { return sequence(Kind::kTuple, std::move(items)); }
  static PyValue list(std::vector<PyValue> items) { return sequence(Kind::kList, std::move(items)); }
  // In this order (stored as k0, v0, k1, v1, ...).
  static PyValue dict(std::vector<std::pair<PyValue, PyValue>> entries) {
    PyValue p(Kind::kDict);
    for (auto& [k, v] : entries) {
      p.items_.push_back(std::move(k));
      p.items_.push_back(std::move(v));
    }
    return p;
  }
  // A module attribute: `torch.float32`.
  static PyValue global(std::string module, std::string name) {
    PyValue p(Kind::kGlobal);
    p.text_ = std::move(module);
    p.name_ = std::move(name);
    return p;
  }
  // module.name(*args)
  static PyValue call(std::string module, std::string name, std::vector<PyValue> args) {
    PyValue p = global(std::move(module), std::move(name));
    p.kind_ = Kind::kCall;
    p.items_ = std::move(args);
    return p;
  }
  // cls.__new__(cls), then its state set as pickle's BUILD sets it (a dict into
  // __dict__, a tuple through __setstate__); no state: no BUILD.
  static PyValue object(std::string module, std::string name, std::vector<PyValue> state = {}) {
    PyValue p = global(std::move(module), std::move(name));
    p.kind_ = Kind::kObject;
    p.items_ = std::move(state);  // zero or one value
    return p;
  }

  // The pickle (protocol 2) of this value.
  std::string pickle() const;

 private:
  explicit PyValue(Kind kind) : kind_(kind) {}
  static PyValue sequence(Kind kind, std::vector<PyValue> items) {
    PyValue p(kind);
    p.items_ = std::move(items);
    return p;
  }
  void write(std::string& out) const;

  Kind kind_;
  std::int64_t int_ = 0;
  double float_ = 0;
  std::string text_;  // a string, or a global's module
  std::string name_;  // a global's name
  std::vector<PyValue> items_;
};

}  // namespace cohort::checkpoint::dcp
