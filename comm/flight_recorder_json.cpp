// Writing the flight recorder's JSON. See flight_recorder_json.h.
#include "comm/flight_recorder_json.h"

#include <cstdio>
#include <sstream>

namespace cpprun::detail {
namespace {

// A JSON string literal: quotes, backslashes and control characters escaped (RFC 8259).
void write_string(std::ostringstream& out, const std::string& text) {
  out << '"';
  for (const char c : text) {
    switch (c) {
      case '"': out << "\\\""; break;
      case '\\': out << "\\\\"; break;
      case '\n': out << "\\n"; break;
      case '\r': out << "\\r"; break;
      case '\t': out << "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned>(c));
          out << escaped;
        } else {
          out << c;
        }
    }
  }
  out << '"';
}

template <typename T, typename Write>
void write_optional(std::ostringstream& out, const std::optional<T>& value, Write write) {
  if (value) {
    write(*value);
  } else {
    out << "null";
  }
}

void write_entry(std::ostringstream& out, const FlightRecorderEntry& e) {
  out << "{\"group\":";
  write_string(out, e.group);
  out << ",\"group_ranks\":[";
  for (std::size_t i = 0; i < e.group_ranks.size(); ++i) out << (i ? "," : "") << e.group_ranks[i];
  out << "],\"seq\":" << e.seq << ",\"op\":";
  write_string(out, e.op);
  out << ",\"dtype\":";
  write_optional(out, e.dtype, [&](const std::string& s) { write_string(out, s); });
  out << ",\"shapes\":[";
  for (std::size_t t = 0; t < e.shapes.size(); ++t) {
    out << (t ? "," : "") << "[";
    for (std::size_t d = 0; d < e.shapes[t].size(); ++d) out << (d ? "," : "") << e.shapes[t][d];
    out << "]";
  }
  out << "],\"reduce_op\":";
  write_optional(out, e.reduce_op, [&](const std::string& s) { write_string(out, s); });
  out << ",\"root\":";
  write_optional(out, e.root, [&](int r) { out << r; });
  out << ",\"tag\":";
  write_optional(out, e.tag, [&](int t) { out << t; });
  out << ",\"label\":";
  write_optional(out, e.label, [&](const std::string& s) { write_string(out, s); });
  out << ",\"public_call\":";
  write_optional(out, e.public_call, [&](const std::string& s) { write_string(out, s); });
  out << ",\"state\":";
  write_string(out, to_string(e.state));
  out << ",\"start_unix_ms\":" << e.start_unix_ms << ",\"end_unix_ms\":";
  write_optional(out, e.end_unix_ms, [&](int64_t t) { out << t; });
  out << "}";
}

}  // namespace

const char* to_string(DumpReason reason) {
  switch (reason) {
    case DumpReason::kTimeout: return "timeout";
    case DumpReason::kFailure: return "failure";
    case DumpReason::kRequest: return "request";
    case DumpReason::kTerminate: return "terminate";
    case DumpReason::kExit: return "exit";
  }
  return "?";
}

std::string flight_recorder_json(const DumpHeader& header, const std::vector<FlightRecorderEntry>& entries) {
  std::ostringstream out;
  out << "{\"format\":\"" << contract::kFlightDumpFormat << "\",\"version\":" << kFlightRecorderFormatVersion
      << ",\"rank\":" << header.rank << ",\"world_size\":" << header.world_size << ",\"pid\":" << header.pid
      << ",\"dumped_unix_ms\":" << header.dumped_unix_ms << ",\"reason\":";
  write_string(out, to_string(header.reason));
  out << ",\"entries\":[";
  for (std::size_t i = 0; i < entries.size(); ++i) {
    out << (i ? ",\n" : "\n");
    write_entry(out, entries[i]);
  }
  out << (entries.empty() ? "]}\n" : "\n]}\n");
  return out.str();
}

}  // namespace cpprun::detail
