#include "cohort/store/base64.h"

#include <openssl/evp.h>

#include <limits>

namespace cohort::store {

std::string base64_encode(const std::uint8_t* data, std::size_t size) {
  std::string out;
  // OpenSSL takes an int length; etcd refuses requests over a few MiB long before.
  if (size == 0 || size > static_cast<std::size_t>(std::numeric_limits<int>::max() / 4 * 3)) return out;
  out.resize(4 * ((size + 2) / 3) + 1);  // and EVP_EncodeBlock's NUL
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), data, static_cast<int>(size));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

std::optional<std::vector<std::uint8_t>> base64_decode(const std::string& text) {
  std::vector<std::uint8_t> out;
  if (text.empty()) return out;
  if (text.size() % 4 != 0 || text.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    return std::nullopt;
  out.resize(text.size() / 4 * 3);
  const int n = EVP_DecodeBlock(out.data(), reinterpret_cast<const unsigned char*>(text.data()),
                                static_cast<int>(text.size()));
  if (n < 0) return std::nullopt;
  // EVP_DecodeBlock counts the padding as zero bytes.
  std::size_t size = static_cast<std::size_t>(n);
  for (std::size_t i = text.size(); i > text.size() - 2 && text[i - 1] == '='; --i) --size;
  out.resize(size);
  return out;
}

}  // namespace cohort::store
