// The proofs and tags that let the agents of one job trust each other's messages. Pure functions
// over the job secret and the nonces of one connection, so they are unit-tested apart from sockets.
//
// Note [Agent authentication]
// Anyone who can reach an agent's port could otherwise take a node's place, end the job with an
// exit code of its choosing, or learn the job's settings from a refusal. So every link starts with
// a challenge-response on the job secret (CPPRUN_JOB_SECRET or --job_secret_file), before a single
// word of the rendezvous is read:
//   host   -> member  "cpprun-auth 1 Nh"           Nh: 16 random bytes, fresh per connection
//   member -> host    "cpprun-proof Nm Pm"         Pm = HMAC(secret, "member" Nh Nm)
//   host   -> member  "cpprun-auth-ok Ph"          Ph = HMAC(secret, "host" Nh Nm)   (or
//                                                  "cpprun-auth-refused", and the link closes)
// Both sides prove the secret without sending it; a recorded handshake is useless on another
// connection because the peer's nonce differs. Every later line carries a sequence number and a
// tag, HMAC(K, direction seq line) with the session key K = HMAC(secret, "session" Nh Nm), so a
// message cannot be forged, altered, replayed, reordered or reflected back to its sender.
// HMAC-SHA-256 from OpenSSL's libcrypto; tags are cut to 128 bits, as TLS does with its own.
#pragma once

#include <cstdint>
#include <string>

namespace cpprun::launcher {

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
