// Reading and checking the job secret, and HMAC-SHA-256 through OpenSSL's libcrypto for the proofs
// made with it; see Note [Agent authentication] in job_secret.h.
#include "common/job_secret.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "common/errors.h"
#include "common/host_secret.h"

namespace cpprun::launcher {
namespace {

// Shorter secrets could be guessed offline from one recorded handshake.
constexpr std::size_t kMinJobSecretBytes = 16;

const char* const kHowToMakeOne =
    "give every node the same secret of at least 16 characters, e.g. `export CPPRUN_JOB_SECRET=$(openssl rand "
    "-hex 32)` before starting cpprun on each node, or --job_secret_file=PATH naming a file that holds it";

std::string read_secret_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw UsageError("--job_secret_file=" + path + ": cannot read it (" + std::strerror(errno) +
                     "); give a file that holds the job's secret, readable by the user running cpprun");
  }
  std::ostringstream text;
  text << in.rdbuf();
  // A file written by `echo` or an editor ends in a newline that is not part of the secret.
  std::string secret = text.str();
  return secret.erase(secret.find_last_not_of(" \t\r\n") + 1);
}

std::string hex(const unsigned char* bytes, std::size_t size) {
  constexpr const char* kDigits = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < size; ++i) out += {kDigits[bytes[i] >> 4], kDigits[bytes[i] & 0xf]};
  return out;
}

// Joined with a byte no hex nonce or label contains: different field lists never hash the same text.
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

JobSecretSource job_secret_source(const JobSecretOptions& options, bool environment_has_secret) {
  if (options.no_job_secret || !options.multi_node) return JobSecretSource::kNone;
  if (!options.secret_file.empty()) return JobSecretSource::kFile;
  if (environment_has_secret) return JobSecretSource::kEnvironment;
  if (options.max_nodes <= 1) return JobSecretSource::kOwnRandom;
  if (is_loopback_endpoint_host(options.endpoint_host)) return JobSecretSource::kHostShared;
  return JobSecretSource::kMissing;
}

std::string resolve_job_secret(const JobSecretOptions& options, const EnvLookup& env) {
  if (options.no_job_secret && !options.secret_file.empty()) {
    throw UsageError("--no_job_secret and --job_secret_file contradict each other; give one");
  }
  const std::optional<std::string> from_env = env(kJobSecretVariable);
  std::string secret;
  std::string source;
  switch (job_secret_source(options, from_env && !from_env->empty())) {
    case JobSecretSource::kNone:
      return {};
    case JobSecretSource::kOwnRandom:
      return random_nonce() + random_nonce();
    case JobSecretSource::kHostShared:
      return shared_host_secret(host_secret_folder(env), options.port, options.rdzv_id);
    case JobSecretSource::kFile:
      secret = read_secret_file(options.secret_file);
      source = "--job_secret_file=" + options.secret_file;
      break;
    case JobSecretSource::kEnvironment:
      secret = *from_env;
      source = kJobSecretVariable;
      break;
    case JobSecretSource::kMissing:
      throw UsageError(
          "a multi-node job needs a job secret, so that only its own agents can join it or steer it (its endpoint " +
          options.endpoint_host + " is not this host's loopback, where this user's agents would share one by "
          "themselves): " + std::string(kHowToMakeOne) +
          ". To run without one, pass --no_job_secret (then anyone who can reach the rendezvous port can take a "
          "node's place, stop the job or choose its exit code)");
  }
  if (secret.size() < kMinJobSecretBytes) {
    throw UsageError(source + " holds a secret of " + std::to_string(secret.size()) +
                     " characters; it needs at least " + std::to_string(kMinJobSecretBytes) + ": " + kHowToMakeOne);
  }
  return secret;
}

std::string no_secret_warning(const std::string& endpoint) {
  return "cpprun: warning: --no_job_secret: the agents do not authenticate each other; anyone who can reach " +
         endpoint + " can join the job in a node's place, stop it, or choose its exit "
         "code; and the workers' c10d store (node 0's, at MASTER_ADDR:MASTER_PORT) is reachable directly "
         "from the network, not through the agents. Set CPPRUN_JOB_SECRET on every node to prevent that.";
}

std::string random_nonce() {
  unsigned char bytes[16];
  ssize_t n = 0;
  do {
    n = getrandom(bytes, sizeof(bytes), 0);  // up to 256 bytes come whole; a signal may end the wait
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof(bytes))) {
    throw std::system_error(errno, std::generic_category(), "cpprun: getrandom() for a link nonce");
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
