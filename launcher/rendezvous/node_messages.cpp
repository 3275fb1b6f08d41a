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

  // For visit_words(): each reads the next word into its field.
  void number(int& value) { value = number(); }
  void text(std::string& value) { value = text(); }
  void flag(bool& value) { value = number() != 0; }
  void numbers(std::vector<int>& values) { values = numbers(); }
  // A failure's exit code is 1 to 255 whatever the peer claims: no message can make a failed job
  // look like a success (0), or pass the shell a code it would wrap.
  void end(JobEnd& end, bool failure) {
    end.exit_code = number();
    if (end.exit_code < (failure ? 1 : 0) || end.exit_code > 255) end.exit_code = 1;
    flag(end.restartable);
    text(end.reason);
  }
  // False when the hello is of another protocol: a newer agent's may carry more words.
  bool same_protocol(int protocol) const { return !ok_ || protocol == kNodeProtocolVersion; }

 private:
  std::string fail() {
    ok_ = false;
    return {};
  }
  std::vector<std::string> words_;
  std::size_t next_ = 0;
  bool ok_ = true;
};

// Writes a message's words, escaped, each after a space.
class WordWriter {
 public:
  void number(int value) { out_ << ' ' << value; }
  void text(const std::string& value) { out_ << ' ' << escape(value); }
  void flag(bool value) { number(value ? 1 : 0); }
  void numbers(const std::vector<int>& values) {  // "1,3", or "-" for none
    std::string list;
    for (int v : values) list += (list.empty() ? "" : ",") + std::to_string(v);
    out_ << ' ' << (list.empty() ? "-" : list);
  }
  void end(const JobEnd& end, bool /*failure*/) {
    number(end.exit_code);
    flag(end.restartable);
    text(end.reason);
  }
  bool same_protocol(int /*protocol*/) const { return true; }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

// The words after a message's kind, in order: one list for writing (WordWriter, a const
// NodeMessage) and for reading (WordReader), so that the two cannot drift apart.
template <typename Message, typename Words>
void visit_words(Message& m, Words& w) {
  switch (m.kind) {
    case MessageKind::kHello:
      w.number(m.hello.protocol);
      if (!w.same_protocol(m.hello.protocol)) return;  // the version check comes first
      w.text(m.hello.backend);
      w.number(m.hello.node_rank);
      w.number(m.hello.min_nodes);
      w.number(m.hello.max_nodes);
      w.number(m.hello.shape.local_world_size);
      w.number(m.hello.max_restarts);
      w.text(m.hello.run_id);
      w.text(m.hello.shape.role);
      return;
    case MessageKind::kGathering:
      w.number(m.round);
      w.number(m.nodes);
      w.numbers(m.missing);
      return;
    case MessageKind::kQueued:
      w.number(m.round);
      w.number(m.nodes);
      w.flag(m.restarting);
      return;
    case MessageKind::kStart:
      for (auto* field : {&m.round, &m.restart_count, &m.layout.group_rank, &m.layout.group_world_size,
                          &m.layout.base_rank, &m.layout.world_size, &m.layout.role_base_rank,
                          &m.layout.role_world_size, &m.layout.master_port}) {
        w.number(*field);
      }
      return;
    case MessageKind::kDone:
    case MessageKind::kStopped:
      w.number(m.round);
      return;
    case MessageKind::kFailed:
    case MessageKind::kEnd:
      w.number(m.round);
      w.end(m.end, true);
      return;
    case MessageKind::kExit:
      w.end(m.end, false);
      return;
  }
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
  WordWriter out;
  visit_words(m, out);
  return kind_word(m.kind) + out.str();
}

std::optional<NodeMessage> decode_message(const std::string& line) {
  WordReader in(line);
  const std::optional<MessageKind> kind = kind_from_word(in.text());
  if (!kind) return std::nullopt;
  NodeMessage m;
  m.kind = *kind;
  visit_words(m, in);
  if (m.kind == MessageKind::kHello && !in.same_protocol(m.hello.protocol)) return m;  // refused by version
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
