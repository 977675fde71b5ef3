#pragma once
// A module's weights as PyTorch's state_dict(): parameters and buffers by their dotted
// names. Saved in PyTorch's own zip format, so Python reads them with
//
//   state = torch.load("model.pt")           # dict[str, Tensor]
//   python_model.load_state_dict(state)      # same names as the C++ module
//
// and a state dict saved by Python loads back here when it is saved as a plain dict:
// torch.save(dict(model.state_dict()), path). (model.state_dict() itself is an
// OrderedDict with extra metadata that LibTorch's unpickler does not read.)
#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <string>
#include <utility>
#include <vector>

namespace cohort::checkpoint {

// Detached CPU copies of the module's parameters and buffers, in registration order.
c10::Dict<std::string, at::Tensor> state_dict(const torch::nn::Module& module);

// The bytes of torch.save(state_dict).
std::string state_dict_bytes(const torch::nn::Module& module);
// Writes them to `path` atomically (Note [Atomic replace]).
void save_state_dict(const torch::nn::Module& module, const std::string& path);

// Copies the tensors of a saved state dict into `module`, each to its parameter's
// device. Every parameter and buffer must be present with the same shape and no key
// may be left over; otherwise a cohort::ConfigError names the key, both shapes and
// `source` (a path, for the message), and the module is left unchanged.
void load_state_dict(torch::nn::Module& module, const std::string& bytes, const std::string& source);

// The check of load_state_dict alone: throws as it does and changes nothing; apply()
// then makes the copies. For a caller that must check everything it loads before it
// changes anything (Checkpointer::load_latest).
class CheckedStateDict {
 public:
  void apply() const;

 private:
  friend CheckedStateDict check_state_dict(torch::nn::Module&, const c10::IValue&, const std::string&);
  std::vector<std::pair<at::Tensor, at::Tensor>> copies_;  // (the module's tensor, the saved one)
};
CheckedStateDict check_state_dict(torch::nn::Module& module, const std::string& bytes, const std::string& source);
// The same for a state dict already read (torch_load_bytes), e.g. one sliced for
// tensor parallelism (split_state.h).
CheckedStateDict check_state_dict(torch::nn::Module& module, const c10::IValue& value, const std::string& source);
void load_state_dict_file(torch::nn::Module& module, const std::string& path);

}  // namespace cohort::checkpoint
