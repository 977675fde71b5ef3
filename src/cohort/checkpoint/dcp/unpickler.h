#pragma once
// Reads a Python pickle (protocols 0 to 5, without out-of-band buffers) into a small
// object model: enough for the `.metadata` of PyTorch's distributed checkpoints, whose
// objects are dataclasses, dtypes and torch.Size, and which Python writes at protocol 4
// with a memo (docs/dcp_format.md). LibTorch's own unpickler reads protocol 2 only and
// refuses torch's globals, so this one builds no Python objects at all: a class is
// its name, an object is its class, the arguments it was made with and the state
// BUILD gave it. Nothing is executed and nothing is looked up.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace cohort::checkpoint::dcp {

struct Pickled {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kBytes, kTuple, kList, kDict, kGlobal, kObject };
  Kind kind = Kind::kNone;
  std::int64_t integer = 0;  // kInt, kBool (0 or 1)
  double real = 0;           // kFloat
  std::string text;          // kString, kBytes; kGlobal and kObject: "module.name" of the class
  std::vector<const Pickled*> items;  // kTuple, kList (sets too); kObject: its arguments
  std::vector<std::pair<const Pickled*, const Pickled*>> entries;  // kDict, in order
  const Pickled* state = nullptr;     // kObject: what BUILD set (a dict or a tuple), or null

  bool is(Kind k) const { return kind == k; }
  // kObject with a dict state, or a kDict: the value under the string `name`, or null.
  const Pickled* find(const std::string& name) const;
  // A short description for error messages ("a dict of 3 entries", "torch.Size(...)").
  std::string describe() const;
};

// The pickle's root value; its nodes live as long as this.
class Unpickled {
 public:
  const Pickled& root() const { return *root_; }

 private:
  friend Unpickled unpickle(const std::string& bytes, const std::string& source);
  std::vector<std::unique_ptr<Pickled>> nodes_;
  const Pickled* root_ = nullptr;
};

// Throws cohort::DataError naming `source` and the byte offset for anything that is
// not a well-formed pickle of this model: a truncated stream, an unknown opcode, a
// memo or mark that is not there, an integer beyond 64 bits.
Unpickled unpickle(const std::string& bytes, const std::string& source);

}  // namespace cohort::checkpoint::dcp
