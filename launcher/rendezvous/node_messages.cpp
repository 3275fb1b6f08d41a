// Encoding of the agents' messages: words escaped with %XX so that any run id, role or reason
// fits in one word; a tunnel's bytes in base64 (RFC 4648, padded), read strictly.
#include "rendezvous/node_messages.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <sstream>
#include <type_traits>

namespace cpprun::launcher {
namespace {

// Indexed by MessageKind.
constexpr const char* kKindWords[] = {"hello", "gathering", "queued", "start", "done", "failed", "stopped", "end",
                                      "exit",  "evidence",  "ask",    "open",  "data", "credit", "close"};
static_assert(std::size(kKindWords) == static_cast<std::size_t>(MessageKind::kClose) + 1);

// Indexed by CollectiveRecord::State.
constexpr const char* kStateWords[] = {"started", "completed", "failed"};

// The longest text about a rank (its fate, why it has no dump) that an evidence message carries.
constexpr std::size_t kMaxEvidenceText = 1024;

constexpr char kBase64Digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    const std::size_t n = std::min<std::size_t>(3, bytes.size() - i);
    uint32_t group = 0;
    for (std::size_t k = 0; k < 3; ++k) group = (group << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0);
    for (std::size_t k = 0; k < 4; ++k) out += k <= n ? kBase64Digits[(group >> (18 - 6 * k)) & 0x3f] : '=';
  }
  return out;
}

// Strict: padded to a multiple of 4, '=' only at the end, and no bits set beyond the last byte, so
// that every byte string has exactly one spelling.
std::optional<std::string> base64_decode(const std::string& text) {
  if (text.size() % 4 != 0) return std::nullopt;
  const std::size_t padding = text.size() - std::min(text.find_last_not_of('=') + 1, text.size());
  const std::size_t first_pad = text.find('=');
  if (padding > 2 || (first_pad != std::string::npos && first_pad != text.size() - padding)) return std::nullopt;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    uint32_t group = 0;
    const std::size_t digits = i + 4 == text.size() ? 4 - padding : 4;
    for (std::size_t k = 0; k < 4; ++k) {
      uint32_t value = 0;
      if (k < digits) {
        const char* at = std::strchr(kBase64Digits, text[i + k]);
        if (text[i + k] == '\0' || at == nullptr) return std::nullopt;
        value = static_cast<uint32_t>(at - kBase64Digits);
      }
      group = (group << 6) | value;
    }
    const std::size_t n = digits - 1;  // 4 digits are 3 bytes, 3 are 2, 2 are 1
    if ((group & ((1u << (8 * (3 - n))) - 1)) != 0) return std::nullopt;  // bits beyond the last byte
    for (std::size_t k = 0; k < n; ++k) out += static_cast<char>((group >> (16 - 8 * k)) & 0xff);
  }
  return out;
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

// A decimal 64-bit number that is the whole of `word` (times in ms, sequence numbers, pids).
bool parse_number64(const std::string& word, int64_t& value) {
  errno = 0;
  char* end = nullptr;
  const long long parsed = std::strtoll(word.c_str(), &end, 10);
  if (word.empty() || errno != 0 || *end != '\0') return false;
  value = parsed;
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
  void number64(int64_t& value) {
    std::string word;
    text(word);
    if (ok_ && !parse_number64(word, value)) fail();
  }
  void optional_number(std::optional<int>& value) {  // "-" for none
    std::string word;
    text(word);
    if (!ok_ || word == "-") return;
    if (!parse_number(word, value.emplace())) fail();
  }
  void optional_number64(std::optional<int64_t>& value) {  // "-" for none
    std::string word;
    text(word);
    if (!ok_ || word == "-") return;
    if (!parse_number64(word, value.emplace())) fail();
  }
  // How many items follow; more than `max` is not our message (Note [Bounding a peer's evidence]).
  void count(std::size_t& value, std::size_t max) {
    int n = 0;
    number(n);
    if (ok_ && (n < 0 || static_cast<std::size_t>(n) > max)) fail();
    value = ok_ ? static_cast<std::size_t>(n) : 0;
  }
  void state(CollectiveRecord::State& value) {
    std::string word;
    text(word);
    const auto it = std::find(std::begin(kStateWords), std::end(kStateWords), word);
    if (it == std::end(kStateWords)) return fail();
    value = static_cast<CollectiveRecord::State>(it - std::begin(kStateWords));
  }
  // A tunnel's bytes: base64 of 1 to kMaxTunnelChunkBytes bytes (a word is never empty, nor its bytes).
  void bytes(std::string& value) {
    if (!ok_ || next_ == words_.size()) return fail();
    std::optional<std::string> decoded = base64_decode(words_[next_++]);
    if (!decoded) return fail("that is not base64");
    if (decoded->size() > kMaxTunnelChunkBytes) {
      return fail("of " + std::to_string(decoded->size()) + " bytes, more than the " +
                  std::to_string(kMaxTunnelChunkBytes) + " one message may carry");
    }
    value = std::move(*decoded);
  }
  // False when the hello is of another protocol: a newer agent's may carry more words.
  bool same_protocol(int protocol) const { return !ok_ || protocol == kNodeProtocolVersion; }
  // What was wrong, when a word said more than "not our protocol"; else empty.
  const std::string& why() const { return why_; }

 private:
  void fail(std::string why = {}) {
    if (ok_) why_ = std::move(why);
    ok_ = false;
  }
  std::vector<std::string> words_;
  std::size_t next_ = 0;
  bool ok_ = true;
  std::string why_;
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
  void number64(int64_t value) { out_ << ' ' << value; }
  void optional_number(const std::optional<int>& value) {
    if (value) return number(*value);
    out_ << " -";
  }
  void optional_number64(const std::optional<int64_t>& value) {
    if (value) return number64(*value);
    out_ << " -";
  }
  void count(std::size_t value, std::size_t /*max*/) { out_ << ' ' << value; }
  void state(CollectiveRecord::State value) { out_ << ' ' << kStateWords[static_cast<int>(value)]; }
  void bytes(const std::string& value) { out_ << ' ' << base64_encode(value); }
  bool ok() const { return true; }
  bool same_protocol(int /*protocol*/) const { return true; }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

// An evidence message's words after its round: the rank, its fate, then its dump if it has one.
// `Evidence` is const when writing; reading fills the optional dump and sizes the entries.
template <typename Evidence, typename Words>
void evidence_words(Evidence& e, Words& w) {
  constexpr bool kReading = !std::is_const_v<Evidence>;
  w.number(e.rank);
  w.text(e.fate);
  w.text(e.no_dump_reason);
  bool has_dump = e.dump.has_value();
  w.flag(has_dump);
  if (!has_dump || !w.ok()) return;
  if constexpr (kReading) e.dump.emplace();
  auto& d = *e.dump;
  w.number(d.rank);
  w.number(d.world_size);
  w.number64(d.pid);
  w.number64(d.dumped_unix_ms);
  w.text(d.reason);
  std::size_t entries = d.entries.size();
  w.count(entries, kMaxEvidenceEntries);
  if (!w.ok()) return;
  if constexpr (kReading) d.entries.resize(entries);
  for (auto& c : d.entries) {
    w.text(c.group);
    w.numbers(c.group_ranks);
    w.number64(c.seq);
    w.text(c.op);
    w.text(c.dtype);
    w.text(c.shapes);
    w.text(c.reduce_op);
    w.optional_number(c.root);
    w.optional_number(c.tag);
    w.text(c.label);
    if constexpr (kReading) {
      if (c.label.size() > kMaxLabelBytes) c.label.resize(kMaxLabelBytes);  // as a dump's: one line's worth
    }
    w.state(c.state);
    w.number64(c.start_unix_ms);
    w.optional_number64(c.end_unix_ms);
    if (!w.ok()) return;
  }
}

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
      w.flag(m.layout.store_tunnelled);
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
    case MessageKind::kEvidence:
      w.number(m.round);
      w.number(m.request);
      evidence_words(m.evidence, w);
      return;
    case MessageKind::kAsk:
      w.number(m.round);
      w.number(m.request);
      return;
    case MessageKind::kOpen:
      w.number(m.round);
      w.number(m.channel);
      return;
    case MessageKind::kData:
      w.number(m.channel);
      w.bytes(m.bytes);
      return;
    case MessageKind::kCredit:
      w.number(m.channel);
      w.number(m.credit);
      return;
    case MessageKind::kClose:
      w.number(m.channel);
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

NodeMessage NodeMessage::make_ask(int round, int request) {
  NodeMessage m{MessageKind::kAsk, round};
  m.request = request;
  return m;
}

NodeMessage NodeMessage::make_evidence(int round, RankEvidence evidence, int request) {
  NodeMessage m{MessageKind::kEvidence, round};
  m.evidence = std::move(evidence);
  m.request = request;
  for (std::string* text : {&m.evidence.fate, &m.evidence.no_dump_reason}) {
    if (text->size() > kMaxEvidenceText) text->resize(kMaxEvidenceText);
  }
  if (!m.evidence.dump) return m;
  FlightDump& dump = *m.evidence.dump;
  if (dump.reason.size() > kMaxEvidenceText) dump.reason.resize(kMaxEvidenceText);
  std::vector<CollectiveRecord>& entries = dump.entries;
  if (entries.size() > kMaxEvidenceEntries) {
    entries.erase(entries.begin(), entries.end() - static_cast<long>(kMaxEvidenceEntries));
  }
  // Oldest first: drop at least the excess's share of the entries, until the line fits.
  for (std::size_t size; !entries.empty() && (size = encode_message(m).size()) > kMaxEvidenceBytes;) {
    const std::size_t drop = entries.size() * (size - kMaxEvidenceBytes) / size + 1;
    entries.erase(entries.begin(), entries.begin() + static_cast<long>(std::min(drop, entries.size())));
  }
  return m;
}

NodeMessage NodeMessage::make_open(int round, int channel) {
  NodeMessage m{MessageKind::kOpen, round};
  m.channel = channel;
  return m;
}

NodeMessage NodeMessage::make_data(int channel, std::string bytes) {
  NodeMessage m{MessageKind::kData};
  m.channel = channel;
  m.bytes = std::move(bytes);
  return m;
}

NodeMessage NodeMessage::make_credit(int channel, int credit) {
  NodeMessage m{MessageKind::kCredit};
  m.channel = channel;
  m.credit = credit;
  return m;
}

NodeMessage NodeMessage::make_close(int channel) {
  NodeMessage m{MessageKind::kClose};
  m.channel = channel;
  return m;
}

std::string encode_message(const NodeMessage& m) {
  WordWriter out;
  visit_words(m, out);
  return message_word(m.kind) + out.str();
}

std::optional<NodeMessage> decode_message(const std::string& line, std::string* why) {
  const auto refuse = [why](std::string reason) -> std::optional<NodeMessage> {
    if (why) *why = reason.empty() ? "sent a line that is not a cpprun agent message" : std::move(reason);
    return std::nullopt;
  };
  if (line.size() > kMaxEvidenceBytes) {  // the longest message: Note [Bounding a peer's evidence]
    return refuse("sent a line of " + std::to_string(line.size()) + " bytes, longer than any cpprun agent message");
  }
  WordReader in(line);
  std::string word;
  in.text(word);
  const auto kind = std::find(std::begin(kKindWords), std::end(kKindWords), word);
  if (kind == std::end(kKindWords)) return refuse({});
  NodeMessage m;
  m.kind = static_cast<MessageKind>(kind - std::begin(kKindWords));
  visit_words(m, in);
  if (m.kind == MessageKind::kHello && !in.same_protocol(m.hello.protocol)) return m;  // refused by version
  if (m.kind == MessageKind::kData && !in.why().empty()) {
    return refuse("sent data for channel " + std::to_string(m.channel) + " " + in.why());
  }
  if (!in.ok() || !in.at_end()) return refuse({});
  if (m.kind == MessageKind::kEvidence && (m.evidence.rank < 0 || m.request < 0)) return refuse({});
  if (m.kind == MessageKind::kAsk && m.request < 1) return refuse({});  // requests count from 1
  if (is_tunnel_kind(m.kind) && m.channel < 1) {
    return refuse("sent `" + word + "` for channel " + std::to_string(m.channel) + "; channels are numbered from 1");
  }
  if (m.kind == MessageKind::kOpen && m.round < 0) return refuse({});
  if (m.kind == MessageKind::kCredit && m.credit < 1) {
    return refuse("sent `credit` of " + std::to_string(m.credit) + " bytes for channel " + std::to_string(m.channel) +
                  "; credit is at least 1 byte");
  }
  // A failure's exit code is 1 to 255 whatever the peer claims: no message can make a failed job
  // look like a success (0), or pass the shell a code it would wrap.
  if (m.end.exit_code < (m.kind == MessageKind::kExit ? 0 : 1) || m.end.exit_code > 255) m.end.exit_code = 1;
  return m;
}

const char* message_word(MessageKind kind) { return kKindWords[static_cast<int>(kind)]; }

std::vector<std::string> split_words(const std::string& line) {
  std::vector<std::string> words;
  std::istringstream in(line);
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

std::string join_ranks(const std::vector<int>& ranks, const char* separator) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : separator) + std::to_string(r);
  return text;
}

}  // namespace cpprun::launcher
