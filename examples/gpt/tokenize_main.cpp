// gpt_tokenize: trains SentencePiece's BPE vocabulary on the training fortunes and
// encodes both streams, for the GPT trainer's cache (tokenizer.h).
//
// Note [SentencePiece in its own process]
// Debian's libsentencepiece carries its own copy of protobuf 3.14 and exports its
// symbols, while Debian's LibTorch loads libprotobuf 3.21: in one process the two
// copies' symbols interpose and the program crashes before main (or protobuf's
// version check aborts). So SentencePiece runs here, a program without LibTorch,
// which the trainer's local rank 0 starts once per cache entry.
//
//   gpt_tokenize FOLDER VOCAB_SIZE
//
// FOLDER holds train.txt and val.txt, one fortune per line. It writes there
// tokenizer.model, tokenizer.vocab, and train.bin and val.bin: every line's ids then
// the end-of-text id (1), as int32 little-endian.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdint>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace {

bool encode_file(const sentencepiece::SentencePieceProcessor& sp, const std::string& in_path,
                 const std::string& out_path) {
  std::ifstream in(in_path, std::ios::binary);
  std::ofstream out(out_path, std::ios::binary);
  if (!in || !out) {
    std::cerr << "gpt_tokenize: cannot read " << in_path << " or write " << out_path << "\n";
    return false;
  }
  std::string line;
  std::vector<int> ids;
  auto put = [&out](int id) {
    const auto v = static_cast<std::uint32_t>(id);
    const char bytes[4] = {static_cast<char>(v & 0xff), static_cast<char>((v >> 8) & 0xff),
                           static_cast<char>((v >> 16) & 0xff), static_cast<char>((v >> 24) & 0xff)};
    out.write(bytes, 4);
  };
  while (std::getline(in, line)) {
    const auto status = sp.Encode(line, &ids);
    if (!status.ok()) {
      std::cerr << "gpt_tokenize: SentencePiece could not encode a line of " << in_path << ": " << status.ToString()
                << "\n";
      return false;
    }
    for (int id : ids) put(id);
    put(sp.eos_id());
  }
  out.close();
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: gpt_tokenize FOLDER VOCAB_SIZE (FOLDER holds train.txt and val.txt)\n";
    return 2;
  }
  const std::string folder = argv[1], vocab = argv[2];
  // One thread: the same vocabulary on every machine. No BOS or padding pieces; id 0
  // is unknown, 1 the end of a fortune.
  const auto trained = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + folder + "/train.txt --model_prefix=" + folder + "/tokenizer --vocab_size=" + vocab +
      " --model_type=bpe --character_coverage=1.0 --num_threads=1 --unk_id=0 --eos_id=1 --bos_id=-1 --pad_id=-1 "
      "--max_sentence_length=16384 --minloglevel=2");
  if (!trained.ok()) {
    std::cerr << "gpt_tokenize: SentencePiece could not train a vocabulary of " << vocab
              << " pieces: " << trained.ToString() << " (a smaller --vocab-size may fit the corpus)\n";
    return 1;
  }
  sentencepiece::SentencePieceProcessor sp;
  const auto loaded = sp.Load(folder + "/tokenizer.model");
  if (!loaded.ok()) {
    std::cerr << "gpt_tokenize: cannot load the model it trained: " << loaded.ToString() << "\n";
    return 1;
  }
  if (!encode_file(sp, folder + "/train.txt", folder + "/train.bin")) return 1;
  if (!encode_file(sp, folder + "/val.txt", folder + "/val.bin")) return 1;
  return 0;
}
