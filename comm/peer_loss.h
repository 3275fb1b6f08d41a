// What a failed wait on peers means, in words: a peer's process gone (Gloo says so at once,
// "Connection closed by peer", when a rank exits or dies, long before any timeout; a message
// saying "within 1800000 ms" would then send the reader looking for a hang that never was), a
// timeout, or a group that timed out before. And c10d's text without LibTorch's C++ backtrace.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <stdexcept>
#include <string>

namespace cpprun::detail {

inline bool peer_connection_lost(const std::string& c10d_error) {
  for (const char* sign : {"Connection closed by peer", "Connection reset by peer", "Broken pipe"}) {
    if (c10d_error.find(sign) != std::string::npos) return true;
  }
  return false;
}

// Gloo closes a group's connections when one of its calls times out; every later call on the
// group then fails at once with this.
inline bool closed_by_earlier_timeout(const std::string& c10d_error) {
  return c10d_error.find("Application timeout caused pair closure") != std::string::npos;
}

// A c10d failure's text for our messages: a c10::Error's without its C++ frames.
inline std::string c10d_text(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) return error->what_without_backtrace();
  return e.what();
}

// What a c10d failure means, when Gloo's words say it; empty when they do not.
inline std::string c10d_meaning(const std::string& text) {
  if (closed_by_earlier_timeout(text)) {
    return "this group timed out in an earlier call, and Gloo closed its connections: a group cannot be used "
           "after a timeout (in PyTorch neither); end the job, or make a new group";
  }
  if (peer_connection_lost(text)) {
    return "a rank's process ended before this call completed (its connection closed): its own output and "
           "cpprun's diagnosis say why";
  }
  if (text.find("Timed out") != std::string::npos) {
    return "not every rank took part within the group's timeout: a rank may have stopped, failed, or be in "
           "another call";
  }
  return "";
}

// Gloo posts a message at once, and throws its own bare exception where it cannot (after a
// timeout closed the group's connections: every later message). `post()`'s result, or that
// failure said as a c10::Error naming the message, as a failed wait says it.
template <typename Post>
auto post_message(const char* what, int rank, int peer, int tag, Post post) -> decltype(post()) {
  try {
    return post();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string said = c10d_text(e);
    const std::string meaning = c10d_meaning(said);
    TORCH_CHECK(false, "cpprun: rank ", rank, " could not post ", what, " (peer ", peer, ", tag ", tag, ")",
                meaning.empty() ? std::string(" in Gloo") : ": " + meaning, ".\nc10d said: ", said);
  }
  throw std::logic_error("unreachable");  // TORCH_CHECK(false) threw
}

}  // namespace cpprun::detail
