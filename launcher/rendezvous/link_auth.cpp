// HMAC-SHA-256 through OpenSSL's libcrypto; see Note [Agent authentication] in link_auth.h.
#include "rendezvous/link_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <stdexcept>
#include <system_error>

namespace cpprun::launcher {
namespace {

std::string hex(const unsigned char* bytes, std::size_t size) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * size);
  for (std::size_t i = 0; i < size; ++i) {
    out += digits[bytes[i] >> 4];
    out += digits[bytes[i] & 0xf];
  }
  return out;
}

// The fields are joined with a byte no hex nonce or label contains, so no two different field
// lists hash the same text.
std::string hmac_hex(const std::string& key, const std::string& label, const std::string& a, const std::string& b,
                     std::size_t bytes) {
  const std::string text = label + '\n' + a + '\n' + b;
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  // An empty key (--no_job_secret) is still a key: HMAC pads it with zeros.
  static const unsigned char kNoKey = 0;
  const void* key_bytes = key.empty() ? static_cast<const void*>(&kNoKey) : static_cast<const void*>(key.data());
  if (HMAC(EVP_sha256(), key_bytes, static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(text.data()),
           text.size(), out, &size) == nullptr) {
    throw std::runtime_error("cpprun: OpenSSL's HMAC-SHA-256 failed");
  }
  return hex(out, std::min<std::size_t>(bytes, size));
}

}  // namespace

std::string random_nonce() {
  unsigned char bytes[16];
  std::size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::system_error(errno, std::generic_category(), "cpprun: getrandom() for a link nonce");
    got += static_cast<std::size_t>(n);
  }
  return hex(bytes, sizeof(bytes));
}

std::string member_proof(const std::string& secret, const std::string& host_nonce, const std::string& member_nonce) {
  return hmac_hex(secret, "cpprun member proof", host_nonce, member_nonce, 32);
}

std::string host_proof(const std::string& secret, const std::string& host_nonce, const std::string& member_nonce) {
  return hmac_hex(secret, "cpprun host proof", host_nonce, member_nonce, 32);
}

std::string session_key(const std::string& secret, const std::string& host_nonce, const std::string& member_nonce) {
  return hmac_hex(secret, "cpprun session key", host_nonce, member_nonce, 32);
}

std::string message_tag(const std::string& key, LinkDirection direction, std::uint64_t sequence,
                        const std::string& line) {
  const char* label = direction == LinkDirection::kHostToMember ? "cpprun host to member" : "cpprun member to host";
  return hmac_hex(key, label, std::to_string(sequence), line, 16);
}

bool same_proof(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace cpprun::launcher
