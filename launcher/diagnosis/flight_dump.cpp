#include "diagnosis/flight_dump.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include "common/formatting.h"
#include "cpprun/launcher_contract.h"
#include "support/json.h"

namespace cpprun::launcher {
namespace {

using detail::Json;

constexpr const char* kFormat = contract::kFlightDumpFormat;
constexpr int kVersion = contract::kFlightDumpFormatVersion;
// 2,000 entries of a few hundred bytes each are well under this; a larger file is not ours.
constexpr std::streamoff kMaxDumpBytes = 64LL << 20;
// A dump nests four deep (document, entries, entry, shapes); anything deeper is not ours.
constexpr int kMaxDepth = 8;

[[noreturn]] void bad(const std::string& what) { throw std::runtime_error("flight-recorder dump: " + what); }

bool is_null(const Json& value) { return value.kind == Json::Kind::kOther && value.text == "null"; }

const Json* find(const Json& object, const std::string& key) {
  for (const auto& [name, value] : object.members) {
    if (name == key) return &value;
  }
  return nullptr;
}

const Json& member(const Json& object, const std::string& key, Json::Kind kind, const std::string& where) {
  const Json* value = find(object, key);
  if (value == nullptr) bad(where + " has no \"" + key + "\"");
  if (value->kind != kind) bad(where + "'s \"" + key + "\" has the wrong type");
  return *value;
}

int64_t integer_of(const Json& number, const std::string& what) {
  if (number.kind != Json::Kind::kNumber) bad(what + " is not a number");
  try {
    std::size_t used = 0;
    const long long value = std::stoll(number.text, &used);
    if (used != number.text.size()) bad(what + " is not an integer");
    return value;
  } catch (const std::logic_error&) {
    bad(what + " is not an integer in range");
  }
}

int64_t integer(const Json& object, const std::string& key, const std::string& where) {
  return integer_of(member(object, key, Json::Kind::kNumber, where), where + "'s \"" + key + "\"");
}

// Every string a dump gives is printed by the diagnosis: cut and cleaned as labels are, so that a
// worker's file cannot write escape sequences to the launcher's console (op, group, reason,
// dtype and reduce op were printed as read).
std::string clean(const std::string& read) { return printable(read.substr(0, kMaxLabelBytes)); }

std::string text(const Json& object, const std::string& key, const std::string& where) {
  return clean(member(object, key, Json::Kind::kString, where).text);
}

std::string shapes_text(const Json& shapes, const std::string& where) {
  if (shapes.kind != Json::Kind::kArray) bad(where + "'s \"shapes\" is not a list");
  std::string out;
  for (const Json& shape : shapes.items) {
    if (shape.kind != Json::Kind::kArray) bad(where + "'s \"shapes\" holds a shape that is not a list");
    out += out.empty() ? "[" : ", [";
    for (std::size_t i = 0; i < shape.items.size(); ++i) {
      out += (i ? ", " : "") + std::to_string(integer_of(shape.items[i], where + "'s size"));
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

std::string CollectiveRecord::call() const {
  std::string args = dtype + shapes;
  if (!reduce_op.empty()) args += ", " + reduce_op;
  if (root) args += ", root " + std::to_string(*root);
  return op + " #" + std::to_string(seq) + " (" + args + ")";
}

std::string CollectiveRecord::compared() const {
  if (op == "all_to_all") return op + " #" + std::to_string(seq) + " (" + dtype + ")";
  return call();
}

std::string CollectiveRecord::describe() const { return call() + (public_call.empty() ? "" : " in " + public_call); }

FlightDump parse_flight_dump(const std::string& json) {
  Json doc;
  try {
    doc = detail::parse_json(json, kMaxDepth);
  } catch (const detail::JsonSyntaxError& e) {
    bad(std::string("invalid JSON: ") + e.what());
  }
  if (doc.kind != Json::Kind::kObject) bad("not a JSON object");
  const Json* format = find(doc, "format");
  if (format == nullptr || format->kind != Json::Kind::kString || format->text != kFormat) {
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
  const Json& entries = member(doc, "entries", Json::Kind::kArray, "the dump");
  for (std::size_t i = 0; i < entries.items.size(); ++i) {
    const Json& e = entries.items[i];
    const std::string where = "entry " + std::to_string(i);
    if (e.kind != Json::Kind::kObject) bad(where + " is not an object");
    CollectiveRecord record;
    record.group = text(e, "group", where);
    for (const Json& r : member(e, "group_ranks", Json::Kind::kArray, where).items) {
      record.group_ranks.push_back(static_cast<int>(integer_of(r, where + "'s \"group_ranks\"")));
    }
    record.seq = integer(e, "seq", where);
    record.op = text(e, "op", where);
    if (const Json* dtype = find(e, "dtype"); dtype != nullptr && !is_null(*dtype)) {
      if (dtype->kind != Json::Kind::kString) bad(where + "'s \"dtype\" is not a string");
      record.dtype = clean(dtype->text);
    }
    const Json* shapes = find(e, "shapes");
    if (shapes == nullptr) bad(where + " has no \"shapes\"");
    record.shapes = shapes_text(*shapes, where);
    if (const Json* reduce = find(e, "reduce_op"); reduce != nullptr && !is_null(*reduce)) {
      if (reduce->kind != Json::Kind::kString) bad(where + "'s \"reduce_op\" is not a string");
      record.reduce_op = clean(reduce->text);
    }
    if (const Json* root = find(e, "root"); root != nullptr && !is_null(*root)) {
      record.root = static_cast<int>(integer_of(*root, where + "'s \"root\""));
    }
    // "tag" and "label": send/recv entries of dumps since 2026-12 (optional, as the contract says).
    if (const Json* tag = find(e, "tag"); tag != nullptr && !is_null(*tag)) {
      record.tag = static_cast<int>(integer_of(*tag, where + "'s \"tag\""));
    }
    if (const Json* label = find(e, "label"); label != nullptr && !is_null(*label)) {
      if (label->kind != Json::Kind::kString) bad(where + "'s \"label\" is not a string");
      record.label = clean(label->text);
    }
    // "public_call": dumps since 2026-12-05 (optional).
    if (const Json* call = find(e, "public_call"); call != nullptr && !is_null(*call)) {
      if (call->kind != Json::Kind::kString) bad(where + "'s \"public_call\" is not a string");
      record.public_call = clean(call->text);
    }
    record.state = state_of(text(e, "state", where), where);
    record.start_unix_ms = integer(e, "start_unix_ms", where);
    if (const Json* end = find(e, "end_unix_ms"); end != nullptr && !is_null(*end)) {
      record.end_unix_ms = integer_of(*end, where + "'s \"end_unix_ms\"");
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
    error = path + " is larger than " + std::to_string(kMaxDumpBytes >> 20) + " MiB, the most the launcher reads "
            "(CPPRUN_FLIGHT_RECORDER_ENTRIES keeps fewer collectives)";
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
