// Note [Reading a hang from flight-recorder dumps]
// Every rank numbers its collectives per group (seq). A rank that skipped one, stopped calling them
// or is slow sits at a lower seq than the others, who wait in the next one; a rank that called a
// different collective shows it under the same seq. So per group: the frontier (the highest seq any
// rank started), the ranks behind it and where each one is, the ranks waiting at it, and the lowest
// seq at which two ranks recorded different calls. A dump holds only the last N collectives, so a
// rank whose dump lacks a seq says nothing about it.
#include "diagnosis/hang_diagnosis.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "support/json.h"

namespace cpprun::launcher {
namespace {

using detail::json_string;

std::string seconds(int64_t ms) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", static_cast<double>(std::max<int64_t>(ms, 0)) / 1000.0);
  return text;
}

std::string who(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + rank_ranges(ranks);
}

// Where a rank stands in one group: its last recorded collective there, and how long ago it began.
struct Position {
  const CollectiveRecord* last = nullptr;
  int64_t since_ms = 0;  // from its start (started) or its end (completed) to the dump
};

std::string where_text(const Position& p, bool at_frontier) {
  const CollectiveRecord& r = *p.last;
  switch (r.state) {
    case CollectiveRecord::State::kStarted:
      return std::string(at_frontier ? "wait" : "is") + " in " + r.describe() + " since " + seconds(p.since_ms);
    case CollectiveRecord::State::kFailed: return "failed in " + r.describe();
    case CollectiveRecord::State::kCompleted:
      return "finished " + r.describe() + " and called no collective in the " + seconds(p.since_ms) + " after it";
  }
  return "";
}

// Point-to-point messages (a pipeline's activations and gradients) are numbered per group apart
// from the collectives, and differ from rank to rank by design: they are read on their own.
bool is_message(const CollectiveRecord& c) { return c.op == "send" || c.op == "recv"; }

// "recv #5 (float32[2, 8]) from rank 0": the record's root is the peer, a rank of the group. With
// the label the library gave it, said after the time: see message_label().
std::string describe_message(const CollectiveRecord& c, const std::vector<int>& members) {
  std::string text = c.op + " #" + std::to_string(c.seq) + " (" + c.dtype + c.shapes + ")";
  std::string peer = "any rank";
  if (c.root) {
    const int r = *c.root;
    peer = "rank " + std::to_string(!members.empty() && r >= 0 && r < static_cast<int>(members.size()) ? members[r] : r);
  }
  return text + (c.op == "send" ? " to " : " from ") + peer;
}

// " (pipeline stage 1: the activation of micro-batch 3 from stage 0)", or "" without a label.
std::string message_label(const CollectiveRecord& c) { return c.label.empty() ? "" : " (" + c.label + ")"; }

// Fixes "is" / "wait" to agree with the number of ranks named.
std::string verb_for(const std::vector<int>& ranks, std::string text) {
  if (ranks.size() == 1 && text.rfind("wait ", 0) == 0) return "waits " + text.substr(5);
  if (ranks.size() > 1 && text.rfind("is ", 0) == 0) return "are " + text.substr(3);
  return text;
}

}  // namespace

std::string rank_ranges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

Diagnosis diagnose(const std::vector<RankEvidence>& ranks, const std::string& why) {
  Diagnosis d;
  std::vector<int> dumped;
  // "(fate): why there is no dump" -> the ranks it applies to, so that a node's ranks share one line.
  std::vector<std::pair<std::string, std::vector<int>>> missing;
  // group name -> its members (as the dumps say) and each dumped member's records in it
  struct GroupView {
    std::vector<int> members;
    std::map<int, std::vector<const CollectiveRecord*>> records;   // rank -> oldest first
    std::map<int, std::vector<const CollectiveRecord*>> messages;  // the same for send and recv
    std::map<int, int64_t> dumped_at;
  };
  std::map<std::string, GroupView> groups;
  std::map<int, std::string> fates;  // of the ranks that no longer run: said beside where they were
  for (const RankEvidence& r : ranks) {
    if (r.fate != kStillRunning) fates[r.rank] = r.fate;
    if (!r.dump) {
      const std::string text = " (" + r.fate + "): " + r.no_dump_reason;
      auto same = std::find_if(missing.begin(), missing.end(), [&](const auto& m) { return m.first == text; });
      if (same == missing.end()) same = missing.insert(missing.end(), {text, {}});
      same->second.push_back(r.rank);
      continue;
    }
    dumped.push_back(r.rank);
    for (const CollectiveRecord& c : r.dump->entries) {
      GroupView& g = groups[c.group];
      if (g.members.empty()) g.members = c.group_ranks;
      (is_message(c) ? g.messages : g.records)[r.rank].push_back(&c);
      g.dumped_at[r.rank] = r.dump->dumped_unix_ms;
    }
  }
  // A group that names no members (the world) has every rank given here: all of the job's, or one
  // node's when that node diagnoses its own part.
  std::vector<int> every_rank;
  for (const RankEvidence& r : ranks) every_rank.push_back(r.rank);
  std::sort(every_rank.begin(), every_rank.end());
  if (dumped.empty()) {
    d.lines.push_back("no rank left a flight-recorder dump (programs not linked with cpprun's library, or "
                      "killed before they could write one)");
  }
  std::string groups_json;
  for (auto& [name, g] : groups) {
    const std::vector<int> members = g.members.empty() ? every_rank : g.members;
    std::map<int, Position> at;
    int64_t frontier = -1;
    for (const auto& [rank, records] : g.records) {
      const CollectiveRecord* last = records.back();
      for (const CollectiveRecord* c : records) {
        if (c->seq >= last->seq) last = c;
      }
      const int64_t dumped_ms = g.dumped_at[rank];
      const int64_t from = last->state == CollectiveRecord::State::kCompleted && last->end_unix_ms
                               ? *last->end_unix_ms
                               : last->start_unix_ms;
      at[rank] = {last, dumped_ms - from};
      frontier = std::max(frontier, last->seq);
    }
    // The lowest seq at which two ranks recorded different calls (the library call each ran for is
    // said, never compared: Note [The public call of a collective] in comm/public_call.h).
    std::map<int64_t, std::map<std::string, std::vector<int>>> calls;  // seq -> call as described -> ranks
    std::map<int64_t, std::map<std::string, std::string>> described;   // seq -> compared() -> its first describe()
    for (const auto& [rank, records] : g.records) {
      for (const CollectiveRecord* c : records) {
        const std::string& call = described[c->seq].try_emplace(c->compared(), c->describe()).first->second;
        calls[c->seq][call].push_back(rank);
      }
    }
    std::vector<std::string> group_lines;
    for (const auto& [seq, by_call] : calls) {
      if (by_call.size() < 2) continue;
      std::string line = "ranks disagree at collective #" + std::to_string(seq) + ":";
      bool first = true;
      for (const auto& [call, callers] : by_call) {
        line += std::string(first ? " " : "; ") + who(callers) + " called " + call;
        first = false;
      }
      group_lines.push_back(line);
      break;
    }
    // Ranks grouped by where they are: behind the frontier first, then at it.
    std::map<std::string, std::vector<int>> behind;
    std::map<std::string, std::vector<int>> at_front;
    bool pending = false;
    for (const auto& [rank, p] : at) {
      const bool front = p.last->seq == frontier;
      if (!front || p.last->state != CollectiveRecord::State::kCompleted) pending = true;
      const auto fate = fates.find(rank);
      const std::string ended = fate == fates.end() ? "" : " (then " + fate->second + ")";
      (front ? at_front : behind)[where_text(p, front) + ended].push_back(rank);
    }
    std::vector<int> silent;  // members with a dump but nothing in this group
    for (int m : members) {
      if (!g.records.empty() && g.records.count(m) == 0 && std::find(dumped.begin(), dumped.end(), m) != dumped.end()) {
        silent.push_back(m);
      }
    }
    if (!silent.empty()) pending = true;
    if (pending || !group_lines.empty()) {
      std::vector<std::string> parts;
      for (const auto& [text, rs] : behind) parts.push_back(who(rs) + " " + verb_for(rs, text));
      if (!silent.empty()) parts.push_back(who(silent) + " recorded no collective in this group");
      for (const auto& [text, rs] : at_front) parts.push_back(who(rs) + " " + verb_for(rs, text));
      std::string line = "group " + name + " (" + who(members) + "): ";
      for (std::size_t i = 0; i < parts.size(); ++i) line += (i ? "; " : "") + parts[i];
      d.lines.push_back(line);
      for (const std::string& l : group_lines) d.lines.push_back("group " + name + ": " + l);
    }
    // Messages: each rank's last one, said when one of them has not completed (a rank waiting for a
    // peer's send or receive, e.g. a pipeline stage for its neighbour).
    std::vector<std::string> message_parts;
    bool message_pending = false;
    for (const auto& [rank, list] : g.messages) {
      const CollectiveRecord* last = list.back();
      for (const CollectiveRecord* c : list) {
        if (c->seq >= last->seq) last = c;
      }
      const std::string what = describe_message(*last, g.members);
      const int64_t since = g.dumped_at[rank] - last->start_unix_ms;
      switch (last->state) {
        case CollectiveRecord::State::kStarted:
          message_pending = true;
          message_parts.push_back(who({rank}) + " waits in " + what + " since " + seconds(since) + message_label(*last));
          break;
        case CollectiveRecord::State::kFailed:
          message_pending = true;
          message_parts.push_back(who({rank}) + " failed in " + what + message_label(*last));
          break;
        case CollectiveRecord::State::kCompleted:
          message_parts.push_back(who({rank}) + " last finished " + what + message_label(*last));
          break;
      }
    }
    if (message_pending) {
      std::string line = "group " + name + " point-to-point: ";
      for (std::size_t i = 0; i < message_parts.size(); ++i) line += (i ? "; " : "") + message_parts[i];
      d.lines.push_back(line);
    }
    std::string ranks_json;
    for (const auto& [rank, p] : at) {
      const CollectiveRecord& c = *p.last;
      ranks_json += std::string(ranks_json.empty() ? "" : ",") + "{\"rank\":" + std::to_string(rank) +
                    ",\"seq\":" + std::to_string(c.seq) + ",\"op\":" + json_string(c.op) +
                    ",\"call\":" + json_string(c.describe()) + ",\"state\":" +
                    json_string(c.state == CollectiveRecord::State::kStarted     ? "started"
                                : c.state == CollectiveRecord::State::kCompleted ? "completed"
                                                                                 : "failed") +
                    ",\"since_ms\":" + std::to_string(p.since_ms) + "}";
    }
    groups_json += std::string(groups_json.empty() ? "" : ",") + "{\"group\":" + json_string(name) +
                   ",\"frontier_seq\":" + std::to_string(frontier) + ",\"ranks\":[" + ranks_json + "]}";
  }
  if (!dumped.empty() && d.lines.empty() && groups.empty()) {
    // Said apart: "every rank's last collective completed" would claim collectives that never ran.
    d.lines.push_back("no rank recorded a collective or message before the dumps (" + who(dumped) +
                      " dumped): the job stopped before its first one, so none is stuck in one");
  } else if (!dumped.empty() && d.lines.empty()) {
    d.lines.push_back("every rank's last collective completed: none is stuck in one (" + who(dumped) + " dumped)");
  }
  for (const auto& [text, rs] : missing) d.lines.push_back("no dump from " + who(rs) + text);
  std::string lines_json;
  for (const std::string& l : d.lines) lines_json += std::string(lines_json.empty() ? "" : ",") + json_string(l);
  std::string fates_json;
  for (const RankEvidence& r : ranks) {
    fates_json += std::string(fates_json.empty() ? "" : ",") + "{\"rank\":" + std::to_string(r.rank) +
                  ",\"fate\":" + json_string(r.fate) + ",\"dumped\":" + (r.dump ? "true" : "false") + "}";
  }
  d.json = "{\"format\":\"cpprun-hang-diagnosis\",\"version\":1,\"why\":" + json_string(why) + ",\"summary\":[" +
           lines_json + "],\"groups\":[" + groups_json + "],\"workers\":[" + fates_json + "]}\n";
  return d;
}

}  // namespace cpprun::launcher
