// Encoding of the agents' messages: words escaped with %XX so that any run id, role or reason
// fits in one word.
#include "rendezvous/node_messages.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace cpprun::launcher {
namespace {

const char* kind_word(MessageKind kind) {
  switch (kind) {
    case MessageKind::kHello: return "hello";
    case MessageKind::kGathering: return "gathering";
    case MessageKind::kQueued: return "queued";
    case MessageKind::kStart: return "start";
    case MessageKind::kDone: return "done";
    case MessageKind::kFailed: return "failed";
    case MessageKind::kStopped: return "stopped";
    case MessageKind::kEnd: return "end";
    case MessageKind::kExit: return "exit";
  }
  return "?";
}

std::optional<MessageKind> kind_from_word(const std::string& word) {
  for (MessageKind kind : {MessageKind::kHello, MessageKind::kGathering, MessageKind::kQueued,
                           MessageKind::kStart, MessageKind::kDone, MessageKind::kFailed, MessageKind::kStopped,
                           MessageKind::kEnd, MessageKind::kExit}) {
    if (word == kind_word(kind)) return kind;
  }
  return std::nullopt;
}

// "" is "%", so that every word is non-empty.
std::string escape(const std::string& text) {
  if (text.empty()) return "%";
  std::string out;
  for (unsigned char c : text) {
    if (c <= ' ' || c == '%' || c == 0x7f) {
      char hex[4];
      std::snprintf(hex, sizeof(hex), "%%%02X", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::optional<std::string> unescape(const std::string& word) {
  if (word == "%") return std::string();
  std::string out;
  for (std::size_t i = 0; i < word.size(); ++i) {
    if (word[i] != '%') {
      out += word[i];
      continue;
    }
    if (i + 2 >= word.size()) return std::nullopt;  // '%' needs two hex digits after it
    const std::string hex = word.substr(i + 1, 2);
    char* end = nullptr;
    const long value = std::strtol(hex.c_str(), &end, 16);
    if (hex.size() != 2 || end != hex.c_str() + 2) return std::nullopt;
    out += static_cast<char>(value);
    i += 2;
  }
  return out;
}

// Reads the words of one line in order; any failure leaves ok() false.
class WordReader {
 public:
  explicit WordReader(const std::string& line) {
    std::istringstream in(line);
    for (std::string word; in >> word;) words_.push_back(word);
  }
  bool ok() const { return ok_; }
  bool at_end() const { return next_ == words_.size(); }

  std::string text() {
    if (next_ >= words_.size()) return fail();
    std::optional<std::string> value = unescape(words_[next_++]);
    if (!value) return fail();
    return printable(*value);  // a peer's words end up on the console
  }
  int number() {
    const std::string word = text();
    if (!ok_) return 0;
    errno = 0;
    char* end = nullptr;
    const long value = std::strtol(word.c_str(), &end, 10);
    if (word.empty() || errno != 0 || end != word.c_str() + word.size() || value < -(1L << 30) ||
        value > (1L << 30)) {
      fail();
      return 0;
    }
    return static_cast<int>(value);
  }
  std::vector<int> numbers() {  // "1,3", or "-" for none
    const std::string word = text();
    std::vector<int> values;
    if (!ok_ || word == "-") return values;
    std::istringstream in(word);
    for (std::string item; std::getline(in, item, ',');) {
      WordReader one(item);
      values.push_back(one.number());
      if (!one.ok() || !one.at_end()) fail();
    }
    return values;
  }

 private:
  std::string fail() {
    ok_ = false;
    return {};
  }
  std::vector<std::string> words_;
  std::size_t next_ = 0;
  bool ok_ = true;
};

void write_end(std::ostringstream& out, const JobEnd& end) {
  out << ' ' << end.exit_code << ' ' << (end.restartable ? 1 : 0) << ' ' << escape(end.reason);
}

// A failure's exit code is 1 to 255 whatever the peer claims: no message can make a failed job
// look like a success (0), or pass the shell a code it would wrap.
JobEnd read_end(WordReader& in, bool failure) {
  JobEnd end;
  end.exit_code = in.number();
  if (end.exit_code < (failure ? 1 : 0) || end.exit_code > 255) end.exit_code = 1;
  end.restartable = in.number() != 0;
  end.reason = in.text();
  return end;
}

// A message of `kind` about `round`; the make_* below add what their kind carries.
NodeMessage about(MessageKind kind, int round) {
  NodeMessage m;
  m.kind = kind;
  m.round = round;
  return m;
}

}  // namespace

NodeMessage NodeMessage::make_hello(const NodeHello& hello) {
  NodeMessage m = about(MessageKind::kHello, 0);
  m.hello = hello;
  return m;
}

NodeMessage NodeMessage::make_gathering(int round, int nodes, std::vector<int> missing) {
  NodeMessage m = about(MessageKind::kGathering, round);
  m.nodes = nodes;
  m.missing = std::move(missing);
  return m;
}

NodeMessage NodeMessage::make_queued(int round, int nodes, bool restarting) {
  NodeMessage m = about(MessageKind::kQueued, round);
  m.nodes = nodes;
  m.restarting = restarting;
  return m;
}

NodeMessage NodeMessage::make_start(int round, int restart_count, const RankLayout& layout) {
  NodeMessage m = about(MessageKind::kStart, round);
  m.restart_count = restart_count;
  m.layout = layout;
  return m;
}

NodeMessage NodeMessage::make_done(int round) { return about(MessageKind::kDone, round); }
NodeMessage NodeMessage::make_stopped(int round) { return about(MessageKind::kStopped, round); }

NodeMessage NodeMessage::make_failed(int round, JobEnd end) {
  NodeMessage m = about(MessageKind::kFailed, round);
  m.end = std::move(end);
  return m;
}

NodeMessage NodeMessage::make_end(int round, JobEnd end) {
  NodeMessage m = about(MessageKind::kEnd, round);
  m.end = std::move(end);
  return m;
}

NodeMessage NodeMessage::make_exit(JobEnd end) {
  NodeMessage m = about(MessageKind::kExit, 0);
  m.end = std::move(end);
  return m;
}

std::string encode_message(const NodeMessage& m) {
  std::ostringstream out;
  out << kind_word(m.kind);
  switch (m.kind) {
    case MessageKind::kHello:
      out << ' ' << m.hello.protocol << ' ' << escape(m.hello.backend) << ' ' << m.hello.node_rank << ' '
          << m.hello.min_nodes << ' ' << m.hello.max_nodes << ' ' << m.hello.shape.local_world_size << ' '
          << m.hello.max_restarts << ' ' << escape(m.hello.run_id) << ' ' << escape(m.hello.shape.role);
      break;
    case MessageKind::kGathering: {
      std::string list;
      for (int r : m.missing) list += (list.empty() ? "" : ",") + std::to_string(r);
      out << ' ' << m.round << ' ' << m.nodes << ' ' << (list.empty() ? "-" : list);
      break;
    }
    case MessageKind::kQueued:
      out << ' ' << m.round << ' ' << m.nodes << ' ' << (m.restarting ? 1 : 0);
      break;
    case MessageKind::kStart:
      out << ' ' << m.round << ' ' << m.restart_count << ' ' << m.layout.group_rank << ' '
          << m.layout.group_world_size << ' ' << m.layout.base_rank << ' ' << m.layout.world_size << ' '
          << m.layout.role_base_rank << ' ' << m.layout.role_world_size << ' ' << m.layout.master_port;
      break;
    case MessageKind::kDone:
    case MessageKind::kStopped:
      out << ' ' << m.round;
      break;
    case MessageKind::kFailed:
    case MessageKind::kEnd:
      out << ' ' << m.round;
      write_end(out, m.end);
      break;
    case MessageKind::kExit:
      write_end(out, m.end);
      break;
  }
  return out.str();
}

std::optional<NodeMessage> decode_message(const std::string& line) {
  WordReader in(line);
  const std::optional<MessageKind> kind = kind_from_word(in.text());
  if (!kind) return std::nullopt;
  NodeMessage m;
  m.kind = *kind;
  switch (m.kind) {
    case MessageKind::kHello:
      m.hello.protocol = in.number();
      // A newer agent's hello may carry more words; the version check comes first.
      if (in.ok() && m.hello.protocol != kNodeProtocolVersion) return m;
      m.hello.backend = in.text();
      m.hello.node_rank = in.number();
      m.hello.min_nodes = in.number();
      m.hello.max_nodes = in.number();
      m.hello.shape.local_world_size = in.number();
      m.hello.max_restarts = in.number();
      m.hello.run_id = in.text();
      m.hello.shape.role = in.text();
      break;
    case MessageKind::kGathering:
      m.round = in.number();
      m.nodes = in.number();
      m.missing = in.numbers();
      break;
    case MessageKind::kQueued:
      m.round = in.number();
      m.nodes = in.number();
      m.restarting = in.number() != 0;
      break;
    case MessageKind::kStart:
      m.round = in.number();
      m.restart_count = in.number();
      m.layout.group_rank = in.number();
      m.layout.group_world_size = in.number();
      m.layout.base_rank = in.number();
      m.layout.world_size = in.number();
      m.layout.role_base_rank = in.number();
      m.layout.role_world_size = in.number();
      m.layout.master_port = in.number();
      break;
    case MessageKind::kDone:
    case MessageKind::kStopped:
      m.round = in.number();
      break;
    case MessageKind::kFailed:
    case MessageKind::kEnd:
      m.round = in.number();
      m.end = read_end(in, true);
      break;
    case MessageKind::kExit:
      m.end = read_end(in, false);
      break;
  }
  if (!in.ok() || !in.at_end()) return std::nullopt;
  return m;
}

std::string printable(const std::string& text) {
  std::string out = text;
  for (char& c : out) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) c = '?';
  }
  return out;
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

}  // namespace cpprun::launcher
