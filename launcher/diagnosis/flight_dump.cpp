#include "diagnosis/flight_dump.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include "diagnosis/json_reader.h"

namespace cpprun::launcher {
namespace {

constexpr const char* kFormat = "cpprun-flight-recorder";
constexpr int kVersion = 1;
// 2,000 entries of a few hundred bytes each are well under this; a larger file is not ours.
constexpr std::streamoff kMaxDumpBytes = 64LL << 20;

[[noreturn]] void bad(const std::string& what) { throw std::runtime_error("flight-recorder dump: " + what); }

const JsonValue& member(const JsonValue& object, const std::string& key, JsonValue::Kind kind, const std::string& where) {
  const JsonValue* value = object.find(key);
  if (value == nullptr) bad(where + " has no \"" + key + "\"");
  if (value->kind != kind) bad(where + "'s \"" + key + "\" has the wrong type");
  return *value;
}

int64_t integer(const JsonValue& object, const std::string& key, const std::string& where) {
  const double n = member(object, key, JsonValue::Kind::kNumber, where).number;
  if (n != static_cast<double>(static_cast<int64_t>(n))) bad(where + "'s \"" + key + "\" is not an integer");
  return static_cast<int64_t>(n);
}

std::string text(const JsonValue& object, const std::string& key, const std::string& where) {
  return member(object, key, JsonValue::Kind::kString, where).string;
}

std::string shapes_text(const JsonValue& shapes, const std::string& where) {
  if (shapes.kind != JsonValue::Kind::kArray) bad(where + "'s \"shapes\" is not a list");
  std::string out;
  for (const JsonValue& shape : shapes.array) {
    if (shape.kind != JsonValue::Kind::kArray) bad(where + "'s \"shapes\" holds a shape that is not a list");
    out += out.empty() ? "[" : ", [";
    for (std::size_t i = 0; i < shape.array.size(); ++i) {
      if (shape.array[i].kind != JsonValue::Kind::kNumber) bad(where + " has a non-numeric size");
      out += (i ? ", " : "") + std::to_string(static_cast<int64_t>(shape.array[i].number));
    }
    out += "]";
  }
  return out;
}

CollectiveRecord::State state_of(const std::string& state, const std::string& where) {
  if (state == "started") return CollectiveRecord::State::kStarted;
  if (state == "completed") return CollectiveRecord::State::kCompleted;
  if (state == "failed") return CollectiveRecord::State::kFailed;
  bad(where + " has an unknown state '" + state + "'");
}

}  // namespace

std::string CollectiveRecord::describe() const {
  std::string args = dtype + shapes;
  if (!reduce_op.empty()) args += ", " + reduce_op;
  if (root) args += ", root " + std::to_string(*root);
  return op + " #" + std::to_string(seq) + " (" + args + ")";
}

FlightDump parse_flight_dump(const std::string& json) {
  JsonValue doc;
  try {
    doc = parse_json(json);
  } catch (const JsonError& e) {
    bad(e.what());
  }
  if (doc.kind != JsonValue::Kind::kObject) bad("not a JSON object");
  const JsonValue* format = doc.find("format");
  if (format == nullptr || format->kind != JsonValue::Kind::kString || format->string != kFormat) {
    bad(std::string("not a cpprun flight-recorder dump (no \"format\": \"") + kFormat + "\")");
  }
  const int64_t version = integer(doc, "version", "the dump");
  if (version != kVersion) {
    bad("version " + std::to_string(version) + ", this cpprun reads version " + std::to_string(kVersion) +
        ": are the workers linked with another cpprun release?");
  }
  FlightDump dump;
  dump.rank = static_cast<int>(integer(doc, "rank", "the dump"));
  dump.world_size = static_cast<int>(integer(doc, "world_size", "the dump"));
  dump.pid = integer(doc, "pid", "the dump");
  dump.dumped_unix_ms = integer(doc, "dumped_unix_ms", "the dump");
  dump.reason = text(doc, "reason", "the dump");
  const JsonValue& entries = member(doc, "entries", JsonValue::Kind::kArray, "the dump");
  for (std::size_t i = 0; i < entries.array.size(); ++i) {
    const JsonValue& e = entries.array[i];
    const std::string where = "entry " + std::to_string(i);
    if (e.kind != JsonValue::Kind::kObject) bad(where + " is not an object");
    CollectiveRecord record;
    record.group = text(e, "group", where);
    for (const JsonValue& r : member(e, "group_ranks", JsonValue::Kind::kArray, where).array) {
      if (r.kind != JsonValue::Kind::kNumber) bad(where + "'s \"group_ranks\" holds a non-number");
      record.group_ranks.push_back(static_cast<int>(r.number));
    }
    record.seq = integer(e, "seq", where);
    record.op = text(e, "op", where);
    record.dtype = text(e, "dtype", where);
    const JsonValue* shapes = e.find("shapes");
    if (shapes == nullptr) bad(where + " has no \"shapes\"");
    record.shapes = shapes_text(*shapes, where);
    if (const JsonValue* reduce = e.find("reduce_op"); reduce != nullptr && !reduce->is_null()) {
      if (reduce->kind != JsonValue::Kind::kString) bad(where + "'s \"reduce_op\" is not a string");
      record.reduce_op = reduce->string;
    }
    if (const JsonValue* root = e.find("root"); root != nullptr && !root->is_null()) {
      if (root->kind != JsonValue::Kind::kNumber) bad(where + "'s \"root\" is not a number");
      record.root = static_cast<int>(root->number);
    }
    record.state = state_of(text(e, "state", where), where);
    record.start_unix_ms = integer(e, "start_unix_ms", where);
    if (const JsonValue* end = e.find("end_unix_ms"); end != nullptr && !end->is_null()) {
      record.end_unix_ms = integer(e, "end_unix_ms", where);
    }
    dump.entries.push_back(std::move(record));
  }
  return dump;
}

std::optional<FlightDump> read_flight_dump(const std::string& path, std::string& error) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    error = "no dump at " + path;
    return std::nullopt;
  }
  const std::streamoff size = in.tellg();
  if (size < 0 || size > kMaxDumpBytes) {
    error = path + " is larger than " + std::to_string(kMaxDumpBytes >> 20) + " MiB: not a dump of ours";
    return std::nullopt;
  }
  in.seekg(0);
  std::string json(static_cast<std::size_t>(size), '\0');
  if (!in.read(json.data(), size)) {
    error = "cannot read " + path;
    return std::nullopt;
  }
  try {
    return parse_flight_dump(json);
  } catch (const std::exception& e) {
    error = path + ": " + e.what();
    return std::nullopt;
  }
}

}  // namespace cpprun::launcher
