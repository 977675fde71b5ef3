#include "cohort/checkpoint/torch_format.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>

#include <fmt/format.h>

#include <exception>
#include <vector>

#include "cohort/errors.h"

namespace cohort::checkpoint {

std::string torch_save_bytes(const c10::IValue& value) {
  std::string pickled;
  torch::jit::Pickler pickler([&](const char* data, std::size_t size) { pickled.append(data, size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
                              /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
                              /*tag_aggregates=*/false);  // Note [Untagged pickles]
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();

  std::string archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, std::size_t size) {
    archive.append(static_cast<const char*>(data), size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return archive;
}

c10::IValue torch_load_bytes(const std::string& bytes, const std::string& source) {
  std::string why;
  try {
    return torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const c10::Error& e) {
    why = e.what_without_backtrace();
  } catch (const std::exception& e) {
    why = e.what();
  }
  throw DataError(fmt::format("{}: cannot be read as a file of torch.save ({}); it is corrupt or of another kind",
                              source, why));
}

}  // namespace cohort::checkpoint
