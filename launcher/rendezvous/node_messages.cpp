// Encoding of the agents' messages: words escaped with %XX so that any run id, role or reason
// fits in one word.
#include "rendezvous/node_messages.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <sstream>

namespace cpprun::launcher {
namespace {

// Indexed by MessageKind.
constexpr const char* kKindWords[] = {"hello", "gathering", "queued", "start", "done",
                                      "failed", "stopped", "end",    "exit"};
static_assert(std::size(kKindWords) == static_cast<std::size_t>(MessageKind::kExit) + 1);

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
    } else if (i + 2 < word.size() && std::isxdigit(static_cast<unsigned char>(word[i + 1])) &&
               std::isxdigit(static_cast<unsigned char>(word[i + 2]))) {  // '%' needs two hex digits
      out += static_cast<char>(std::stoi(word.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      return std::nullopt;
    }
  }
  return out;
}

// A decimal number within +-2^30 that is the whole of `word`.
bool parse_number(const std::string& word, int& value) {
  errno = 0;
  char* end = nullptr;
  const long parsed = std::strtol(word.c_str(), &end, 10);
  if (word.empty() || errno != 0 || *end != '\0' || std::labs(parsed) > (1L << 30)) return false;
  value = static_cast<int>(parsed);
  return true;
}

// Reads the words of one line in order, each into its field; any failure leaves ok() false.
class WordReader {
 public:
  explicit WordReader(const std::string& line) : words_(split_words(line)) {}
  bool ok() const { return ok_; }
  bool at_end() const { return next_ == words_.size(); }

  void text(std::string& value) {
    std::optional<std::string> word;
    if (next_ < words_.size()) word = unescape(words_[next_++]);
    if (!word) return fail();
    value = printable(*word);  // a peer's words end up on the console
  }
  void number(int& value) {
    std::string word;
    text(word);
    if (ok_ && !parse_number(word, value)) fail();
  }
  void flag(bool& value) {
    int number_value = 0;
    number(number_value);
    value = number_value != 0;
  }
  void numbers(std::vector<int>& values) {  // "1,3", or "-" for none
    std::string word;
    text(word);
    if (!ok_ || word == "-") return;
    std::istringstream in(word);
    for (std::string item; std::getline(in, item, ',');) {
      if (!parse_number(item, values.emplace_back())) fail();
    }
  }
  // False when the hello is of another protocol: a newer agent's may carry more words.
  bool same_protocol(int protocol) const { return !ok_ || protocol == kNodeProtocolVersion; }

 private:
  void fail() { ok_ = false; }
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
    out_ << ' ' << (values.empty() ? "-" : join_ranks(values, ","));
  }
  bool same_protocol(int /*protocol*/) const { return true; }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

// The words after a message's kind: one list for writing and for reading, so they cannot drift apart.
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
      w.text(m.layout.master_addr);
      return;
    case MessageKind::kDone:
    case MessageKind::kStopped:
      w.number(m.round);
      return;
    case MessageKind::kFailed:
    case MessageKind::kEnd:
      w.number(m.round);
      [[fallthrough]];
    case MessageKind::kExit:
      w.number(m.end.exit_code);
      w.flag(m.end.restartable);
      w.text(m.end.reason);
      return;
  }
}

}  // namespace

NodeMessage NodeMessage::make_hello(const NodeHello& hello) { return {MessageKind::kHello, 0, {}, hello}; }

NodeMessage NodeMessage::make_gathering(int round, int nodes, std::vector<int> missing) {
  return {MessageKind::kGathering, round, {}, {}, std::move(missing), nodes};
}

NodeMessage NodeMessage::make_queued(int round, int nodes, bool restarting) {
  return {MessageKind::kQueued, round, {}, {}, {}, nodes, restarting};
}

NodeMessage NodeMessage::make_start(int round, int restart_count, const RankLayout& layout) {
  return {MessageKind::kStart, round, {}, {}, {}, 0, false, restart_count, layout};
}

NodeMessage NodeMessage::make_done(int round) { return {MessageKind::kDone, round}; }
NodeMessage NodeMessage::make_stopped(int round) { return {MessageKind::kStopped, round}; }
NodeMessage NodeMessage::make_failed(int round, JobEnd end) { return {MessageKind::kFailed, round, std::move(end)}; }
NodeMessage NodeMessage::make_end(int round, JobEnd end) { return {MessageKind::kEnd, round, std::move(end)}; }
NodeMessage NodeMessage::make_exit(JobEnd end) { return {MessageKind::kExit, 0, std::move(end)}; }

std::string encode_message(const NodeMessage& m) {
  WordWriter out;
  visit_words(m, out);
  return kKindWords[static_cast<int>(m.kind)] + out.str();
}

std::optional<NodeMessage> decode_message(const std::string& line) {
  WordReader in(line);
  std::string word;
  in.text(word);
  const auto kind = std::find(std::begin(kKindWords), std::end(kKindWords), word);
  if (kind == std::end(kKindWords)) return std::nullopt;
  NodeMessage m;
  m.kind = static_cast<MessageKind>(kind - std::begin(kKindWords));
  visit_words(m, in);
  if (m.kind == MessageKind::kHello && !in.same_protocol(m.hello.protocol)) return m;  // refused by version
  if (!in.ok() || !in.at_end()) return std::nullopt;
  // A failure's exit code is 1 to 255 whatever the peer claims: no message can make a failed job
  // look like a success (0), or pass the shell a code it would wrap.
  if (m.end.exit_code < (m.kind == MessageKind::kExit ? 0 : 1) || m.end.exit_code > 255) m.end.exit_code = 1;
  return m;
}

std::vector<std::string> split_words(const std::string& line) {
  std::vector<std::string> words;
  std::istringstream in(line);
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

std::string printable(std::string text) {
  std::replace_if(text.begin(), text.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; }, '?');
  return text;
}

std::string join_ranks(const std::vector<int>& ranks, const char* separator) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : separator) + std::to_string(r);
  return text;
}

}  // namespace cpprun::launcher
