// The job secret of a multi-node job: where it comes from, and the proofs and tags made with it that
// let the agents of one job trust each other. The proofs are pure, so unit-tested apart from sockets.
//
// Note [Agent authentication]
// Anyone who can reach an agent's port could otherwise take a node's place, end the job with an
// exit code of its choosing, or learn the job's settings from a refusal. So every link starts with
// a challenge-response on the job secret, before a single word of the rendezvous is read:
//   host   -> member  "cpprun-auth 1 Nh"      Nh: 16 random bytes, fresh per connection
//   member -> host    "cpprun-proof Nm Pm"    Pm = HMAC(secret, "member" Nh Nm)
//   host   -> member  "cpprun-auth-ok Ph"     Ph = HMAC(secret, "host" Nh Nm), or "cpprun-auth-refused"
// Neither side sends the secret; a recorded handshake is useless on another connection, whose nonce
// differs. Every later line carries a sequence number and the tag HMAC(K, direction seq line), with
// K = HMAC(secret, "session" Nh Nm), so a message cannot be forged, altered, replayed, reordered or
// reflected back to its sender. HMAC-SHA-256 from OpenSSL's libcrypto; tags cut to 128 bits, as TLS.
//
// In common/ because three layers use it: the command line reads the secret, the workers are kept
// from it (and their job token is a nonce), and the rendezvous's links prove it.
#pragma once

#include <cstdint>
#include <string>

#include "cpprun/env_lookup.h"

namespace cpprun::launcher {

// The environment variable that holds the secret, the same on every node.
inline constexpr const char* kJobSecretVariable = "CPPRUN_JOB_SECRET";

struct JobSecretOptions {
  bool multi_node = false;
  std::string secret_file;     // --job_secret_file: wins over the environment variable
  bool no_job_secret = false;  // --no_job_secret: the user accepts unauthenticated agents
  // Where no secret is given (host_secret.h): a job of one agent makes its own, and one whose
  // endpoint host is the loopback shares this user's for the port and id on this host.
  int max_nodes = 1;
  std::string endpoint_host;
  int port = 0;
  std::string rdzv_id;
};

enum class JobSecretSource {
  kNone,         // one node (no agent listens) or --no_job_secret
  kFile,         // --job_secret_file
  kEnvironment,  // CPPRUN_JOB_SECRET
  kOwnRandom,    // one agent at most: a random secret no other agent needs
  kHostShared,   // every agent on this host: this user's shared secret (host_secret.h)
  kMissing,      // several agents that may be on other hosts, and no secret: refused
};

// Where the secret comes from: a decision apart from reading it, for the unit tests.
JobSecretSource job_secret_source(const JobSecretOptions& options, bool environment_has_secret);

// The secret from job_secret_source()'s choice: "" for kNone; the file's, the environment's, a
// random one or this user's shared one on this host. Throws UsageError when a multi-node job that
// may span hosts has none, or one too short, or a shared one cannot be kept privately.
std::string resolve_job_secret(const JobSecretOptions& options, const EnvLookup& env);

// What --no_job_secret exposes, printed when a multi-node agent starts without a secret.
std::string no_secret_warning(const std::string& endpoint);

// 16 bytes from the kernel's random source, as 32 hex digits: a link's nonce, the job token of
// job_process_tree.h. Throws std::system_error.
std::string random_nonce();

// The member's and the host's proof that they hold `secret`, for one connection's nonces.
std::string member_proof(const std::string& secret, const std::string& host_nonce, const std::string& member_nonce);
std::string host_proof(const std::string& secret, const std::string& host_nonce, const std::string& member_nonce);

// The key that tags the connection's messages.
std::string session_key(const std::string& secret, const std::string& host_nonce, const std::string& member_nonce);

enum class LinkDirection { kHostToMember, kMemberToHost };

// The tag of the `sequence`-th line sent in `direction` (32 hex digits).
std::string message_tag(const std::string& key, LinkDirection direction, std::uint64_t sequence,
                        const std::string& line);

// Compares in time that does not depend on where the texts differ.
bool same_proof(const std::string& a, const std::string& b);

}  // namespace cpprun::launcher
