// Parsing torchrun's output options and deciding, per worker stream, console and/or file.
#include "command_line/output_spec.h"

#include <algorithm>
#include <cctype>
#include <optional>

#include "command_line/launch_config.h"  // UsageError, int_in_range

namespace cpprun::launcher {
namespace {

// A whole number in [0, limit), digits only (torchrun's --redirects/--tee pattern); -1 if the text
// is not one.
int read_index(const std::string& text, long limit) {
  if (text.find_first_not_of("0123456789") != std::string::npos) return -1;
  return int_in_range(text, 0, limit - 1).value_or(-1);
}

// The same as torchrun's --local_ranks_filter reads it, with int(): blanks around the number and
// a leading '+' allowed ("0, 1").
int read_int_index(const std::string& text, long limit) {
  const auto first = text.find_first_not_of(" \t\n\r\f\v");
  if (first == std::string::npos) return -1;
  std::string digits = text.substr(first, text.find_last_not_of(" \t\n\r\f\v") + 1 - first);
  if (digits[0] == '+') digits.erase(0, 1);
  return digits.empty() ? -1 : read_index(digits, limit);
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string::size_type start = 0;
  for (;;) {
    const auto end = text.find(separator, start);
    parts.push_back(text.substr(start, end - start));
    if (end == std::string::npos) return parts;
    start = end + 1;
  }
}

bool includes(StdStreams set, StdStreams stream) {
  return (static_cast<unsigned>(set) & static_cast<unsigned>(stream)) != 0;
}

template <typename T>
T at_or(const std::vector<T>& values, int index, T fallback) {
  return index >= 0 && static_cast<std::size_t>(index) < values.size() ? values[index] : fallback;
}

}  // namespace

std::vector<StdStreams> parse_std_spec(const std::string& flag, const std::string& text, int nproc_per_node) {
  const int single = read_index(text, 4);
  if (single >= 0) return std::vector<StdStreams>(nproc_per_node, static_cast<StdStreams>(single));

  std::vector<StdStreams> per_rank(nproc_per_node, StdStreams::kNone);
  for (const std::string& pair : split(text, ',')) {
    const auto colon = pair.find(':');
    const int value = colon == std::string::npos ? -1 : read_index(pair.substr(colon + 1), 4);
    if (value < 0 || read_index(pair.substr(0, colon), 1L << 20) < 0) {
      throw UsageError(flag + "=" + text + ": '" + pair + "' is not LOCAL_RANK:VALUE; expected 0 (console), " +
                       "1 (stdout), 2 (stderr) or 3 (both) for every local rank, or pairs such as " + flag +
                       "=0:1,1:3");
    }
    const int rank = read_index(pair.substr(0, colon), nproc_per_node);
    if (rank < 0) {
      throw UsageError(flag + "=" + text + ": local rank " + pair.substr(0, colon) +
                       " does not exist with --nproc_per_node=" + std::to_string(nproc_per_node) +
                       " (local ranks are 0 to " + std::to_string(nproc_per_node - 1) + ")");
    }
    per_rank[rank] = static_cast<StdStreams>(value);
  }
  return per_rank;
}

std::vector<bool> parse_local_ranks_filter(const std::string& text, int nproc_per_node) {
  if (text.empty()) return std::vector<bool>(nproc_per_node, true);
  std::vector<bool> shown(nproc_per_node, false);
  for (const std::string& item : split(text, ',')) {
    const int rank = read_int_index(item, nproc_per_node);
    if (rank < 0) {
      throw UsageError("--local_ranks_filter=" + text + ": '" + item +
                       "' is not a local rank; expected a comma-separated list of local ranks from 0 "
                       "to " + std::to_string(nproc_per_node - 1) + " (e.g. --local_ranks_filter=0)");
    }
    shown[rank] = true;
  }
  return shown;
}

std::vector<std::string> parse_duplicate_filters(const std::string& text) {
  if (text.empty()) return {};
  std::vector<std::string> needles{""};
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != ',') {
      needles.back() += text[i];
    } else if (i + 1 < text.size() && text[i + 1] == ',') {
      needles.back() += ',';
      ++i;
    } else {
      needles.emplace_back();
    }
  }
  return needles;
}

bool OutputOptions::writes_files() const {
  const auto to_file = [](StdStreams s) { return s != StdStreams::kNone; };
  return std::any_of(redirects.begin(), redirects.end(), to_file) || std::any_of(tee.begin(), tee.end(), to_file) ||
         !duplicate_stdout_filters.empty() || !duplicate_stderr_filters.empty();
}

std::vector<std::string> OutputOptions::filtered_logs() const {
  std::vector<std::string> names;
  if (!duplicate_stdout_filters.empty()) names.emplace_back("filtered_stdout.log");
  if (!duplicate_stderr_filters.empty()) names.emplace_back("filtered_stderr.log");
  return names;
}

std::string render_prefix_template(const std::string& text, const PrefixFields& fields) {
  const auto value = [&](const std::string& name) -> std::optional<std::string> {
    if (name == "role_name") return fields.role_name;
    if (name == "rank") return std::to_string(fields.rank);
    if (name == "local_rank") return std::to_string(fields.local_rank);
    if (name == "hostname") return fields.hostname;
    return std::nullopt;
  };
  const auto identifier_char = [](char c, bool first) {
    const auto u = static_cast<unsigned char>(c);
    return c == '_' || std::isalpha(u) || (!first && std::isdigit(u));
  };
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '$' || i + 1 == text.size()) {
      out += text[i];
      continue;
    }
    if (text[i + 1] == '$') {
      out += '$';
      ++i;
      continue;
    }
    const bool braced = text[i + 1] == '{';
    const std::size_t start = i + (braced ? 2 : 1);
    std::size_t end = start;
    while (end < text.size() && identifier_char(text[end], end == start)) ++end;
    const bool closed = !braced || (end < text.size() && text[end] == '}');
    const std::optional<std::string> replacement = end > start && closed ? value(text.substr(start, end - start))
                                                                         : std::nullopt;
    if (!replacement) {
      out += '$';
      continue;
    }
    out += *replacement;
    i = end + (braced ? 1 : 0) - 1;
  }
  return out;
}

WorkerOutputSpec plan_worker_output(const OutputOptions& options, const std::string& role, int local_rank, int rank,
                                    const std::string& worker_dir) {
  const StdStreams redirect = at_or(options.redirects, local_rank, StdStreams::kNone);
  const StdStreams tee = at_or(options.tee, local_rank, StdStreams::kNone);
  const bool shown = at_or(options.shown, local_rank, true);
  // As in torchrun, --tee implies the file and wins over --redirects for the console.
  const auto target = [&](StdStreams stream, const char* file_name) {
    const bool to_file = includes(redirect, stream) || includes(tee, stream);
    return StreamTarget{shown && (!includes(redirect, stream) || includes(tee, stream)), includes(tee, stream),
                        to_file ? worker_dir + "/" + file_name : std::string(), "", {}};
  };
  const std::string rank_prefix = "[rank" + std::to_string(rank) + "]: ";
  WorkerOutputSpec spec{rank_prefix, "[" + role + std::to_string(local_rank) + "]:", rank_prefix, {}, {}};
  spec.out = target(StdStreams::kOut, "stdout.log");
  spec.err = target(StdStreams::kErr, "stderr.log");
  // torchrun filters what its TailLog copies to the console: the tee'd streams of the shown ranks.
  const std::string attempt_dir = worker_dir.substr(0, worker_dir.rfind('/'));
  const auto filtered = [&](StreamTarget& t, StdStreams stream, const std::vector<std::string>& needles,
                            const char* file_name) {
    if (needles.empty() || !shown || !includes(tee, stream)) return;
    t.filtered_file = attempt_dir + "/" + file_name;
    t.filters = needles;
  };
  filtered(spec.out, StdStreams::kOut, options.duplicate_stdout_filters, "filtered_stdout.log");
  filtered(spec.err, StdStreams::kErr, options.duplicate_stderr_filters, "filtered_stderr.log");
  return spec;
}

}  // namespace cpprun::launcher
