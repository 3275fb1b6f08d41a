// new_group() and split_group(): subgroups of a group, created collectively over it.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <numeric>
#include <sstream>

#include "comm/public_call.h"
#include "comm/backends.h"
#include "comm/collective_support.h"
#include "cpprun/collectives.h"

namespace cpprun {
namespace {

enum class Creation : int64_t { kNewGroup = 1, kSplit = 2 };

// What one rank asks for: exchanged before anything is made.
struct Request {
  Creation how;
  uint32_t index;          // the parent's subgroup count: agrees when ranks create in one order
  int colour = kNoColour;  // split
  int key = 0;             // split
  std::vector<int> ranks;  // new_group, sorted
};

std::string list(const std::vector<int>& ranks) { return "[" + c10::Join(", ", ranks) + "]"; }

int64_t hash_of(const std::vector<int>& ranks) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (int r : ranks) hash = (hash ^ static_cast<uint64_t>(r)) * 1099511628211ull;
  return static_cast<int64_t>(hash >> 1);
}

std::string describe(const Request& request) {
  std::ostringstream out;
  if (request.how == Creation::kNewGroup) {
    out << "new_group(" << list(request.ranks) << ")";
  } else {
    out << "split_group(colour " << request.colour << ", key " << request.key << ")";
  }
  out << " as subgroup #" << request.index;
  return out.str();
}

// Every rank's request, after checking that all ranks make the same kind of call as the same
// subgroup (and new_group with the same ranks). A disagreement throws the same message on every
// rank: the rows are the same everywhere, and the lists for the message are gathered by all.
std::vector<Request> exchange_requests(const ProcessGroup& parent, const Request& mine) {
  const int n = parent.size();
  at::Tensor row = at::tensor({static_cast<int64_t>(mine.how), static_cast<int64_t>(mine.index),
                               static_cast<int64_t>(mine.colour), static_cast<int64_t>(mine.key),
                               static_cast<int64_t>(mine.ranks.size()), hash_of(mine.ranks)},
                              at::kLong);
  at::Tensor rows = at::empty({n, row.numel()}, at::kLong);
  all_gather_into(parent, rows, row);
  const auto v = rows.accessor<int64_t, 2>();
  bool agree = true;
  for (int r = 0; r < n; ++r) {
    const bool same_call = v[r][0] == v[0][0] && v[r][1] == v[0][1];
    const bool same_ranks = v[r][4] == v[0][4] && v[r][5] == v[0][5];
    agree = agree && same_call && (mine.how == Creation::kSplit || same_ranks);
  }
  std::vector<Request> all(n);
  if (agree && mine.how == Creation::kSplit) {
    for (int r = 0; r < n; ++r) {
      all[r] = Request{mine.how, mine.index, static_cast<int>(v[r][2]), static_cast<int>(v[r][3]), {}};
    }
    return all;
  }
  if (agree) {
    for (int r = 0; r < n; ++r) all[r] = mine;
    return all;
  }
  // Every rank is here: gather the lists, to name each rank's call.
  std::vector<at::Tensor> lists;
  for (int r = 0; r < n; ++r) lists.push_back(at::empty({v[r][4]}, at::kInt));
  all_gather(parent, lists, at::tensor(std::vector<int>(mine.ranks), at::kInt));
  std::ostringstream message;
  message << "cpprun: ranks disagree on creating a subgroup: ";
  for (int r = 0; r < n; ++r) {
    Request theirs{static_cast<Creation>(v[r][0]), static_cast<uint32_t>(v[r][1]), static_cast<int>(v[r][2]),
                   static_cast<int>(v[r][3]), {}};
    const int* data = lists[r].const_data_ptr<int>();
    theirs.ranks.assign(data, data + lists[r].numel());
    message << (r ? ", " : "") << "rank " << r << " called " << describe(theirs);
  }
  message << " (found on rank " << parent.rank() << "). Creating a subgroup is collective: every rank "
          << "of the parent group calls new_group / split_group in the same order, and new_group "
          << "with the same ranks.";
  TORCH_CHECK(false, message.str());
}

// The subgroup of `members` (ranks of `parent`, in subgroup rank order); `name` keeps its keys
// in the parent's store apart from every other subgroup's.
// `call` names the creating call in errors.
ProcessGroup make_subgroup(const ProcessGroup& parent, const std::vector<int>& members, const std::string& name,
                           const std::string& call) {
  const auto& up = detail::impl_of(parent);
  auto impl = std::make_shared<detail::GroupImpl>();
  impl->env = up.env;
  impl->timeout = up.timeout;
  impl->backend = up.backend;
  impl->debug_level = up.debug_level;
  impl->check_collectives = up.check_collectives;
  impl->global_ranks = members;
  impl->parent_rank = parent.rank();
  const auto me = std::find(members.begin(), members.end(), parent.rank());
  impl->member = me != members.end();
  impl->env.rank = impl->member ? static_cast<int>(me - members.begin()) : -1;
  // A non-member's rank and size are -1, as PyTorch's get_rank and get_world_size of a group
  // the rank is not in: a size of the members' count let a wrapper that missed the check run alone.
  impl->env.world_size = impl->member ? static_cast<int>(members.size()) : -1;
  impl->store = c10::make_intrusive<c10d::PrefixStore>(name, up.store);
  impl->recorded = detail::recorded_subgroup(up.recorded ? *up.recorded : detail::RecordedGroup{}, name, members);
  if (impl->member) {
    // Gloo's constructor connects the members through the store; each may return before its
    // peers have (Note [Members wait for each other after connecting] in process_group.cpp).
    impl->gloo = detail::make_gloo(impl->store, up.env, impl->env.rank, impl->env.world_size, up.timeout);
    if (up.nccl) {
      impl->nccl = detail::make_nccl(impl->store, up.env, impl->env.rank, impl->env.world_size, up.timeout);
    }
    detail::wait_for_every_member(*impl->store, impl->env.world_size, up.timeout, call);
  }
  return detail::GroupAccess::make(std::move(impl));
}

}  // namespace

ProcessGroup new_group(const ProcessGroup& parent, std::vector<int> ranks) {
  detail::PublicCallScope call("cpprun::new_group");  // its exchange of requests is its own
  detail::check_member("new_group", parent);
  std::sort(ranks.begin(), ranks.end());
  TORCH_CHECK(!ranks.empty(), "cpprun::new_group: the list of ranks is empty; a group needs at least one.");
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    TORCH_CHECK(ranks[i] >= 0 && ranks[i] < parent.size(), "cpprun::new_group: rank ", ranks[i],
                " is not a rank of the parent group (0..", parent.size() - 1, ").");
    TORCH_CHECK(i == 0 || ranks[i] != ranks[i - 1], "cpprun::new_group: rank ", ranks[i],
                " is listed twice in ", list(ranks), ".");
  }
  const uint32_t index = detail::impl_of(parent).subgroups_created++;
  const Request mine{Creation::kNewGroup, index, kNoColour, 0, ranks};
  if (parent.size() > 1) exchange_requests(parent, mine);
  return make_subgroup(parent, ranks, "sub" + std::to_string(index), "new_group(" + list(ranks) + ")");
}

ProcessGroup new_group(std::vector<int> ranks) { return new_group(default_group(), std::move(ranks)); }

ProcessGroup split_group(const ProcessGroup& parent, int colour, int key) {
  detail::PublicCallScope call("cpprun::split_group");
  detail::check_member("split_group", parent);
  TORCH_CHECK(colour >= 0 || colour == kNoColour, "cpprun::split_group: colour ", colour,
              " is negative; use a colour >= 0, or kNoColour to join no group.");
  const uint32_t index = detail::impl_of(parent).subgroups_created++;
  const Request mine{Creation::kSplit, index, colour, key, {}};
  std::vector<Request> all = parent.size() > 1 ? exchange_requests(parent, mine) : std::vector<Request>{mine};
  std::vector<int> members;
  if (colour != kNoColour) {
    for (int r = 0; r < parent.size(); ++r) {
      if (all[r].colour == colour) members.push_back(r);
    }
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return all[a].key < all[b].key; });
  }
  return make_subgroup(parent, members, "sub" + std::to_string(index) + "/" + std::to_string(colour),
                       "split_group(colour " + std::to_string(colour) + ") of ranks " + list(members));
}

std::vector<int> get_process_group_ranks(const ProcessGroup& group) {
  const auto& impl = detail::GroupAccess::impl(group);
  if (!impl.member || !impl.recorded) return {};
  return impl.recorded->ranks;  // the job's ranks, composed through every level of subgroup
}

}  // namespace cpprun
