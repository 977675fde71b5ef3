#pragma once
// PyTorch's own file format (the zip archive of torch.save), written so that Python's
// torch.load reads it with weights_only=True, the default since PyTorch 2.6.
//
// Note [Untagged pickles]: torch::pickle_save wraps every dict and list in a call to
// torch.jit._pickle.restore_type_tag, which records its TorchScript type. Python's
// safe unpickler (weights_only=True) refuses that call, so files written by
// torch::pickle_save only load with weights_only=False. This writer uses the same
// pickler and archive layout without the tags; LibTorch's pickle_load reads both.
#include <ATen/core/ivalue.h>

#include <string>

namespace cohort::checkpoint {

// The bytes of torch.save(value) for dicts, lists, strings, numbers and tensors.
std::string torch_save_bytes(const c10::IValue& value);

// torch.load of such bytes. Throws cohort::DataError naming `source` whatever LibTorch's
// zip reader and unpickler make of bad bytes: they throw c10::Error for most, but
// std::runtime_error and others for some (found by fuzz_checkpoint_pickle). Reads stay
// inside `bytes` (Note [Bounded reads of torch.save files]).
c10::IValue torch_load_bytes(const std::string& bytes, const std::string& source);

}  // namespace cohort::checkpoint
