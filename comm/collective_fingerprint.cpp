// Packing a collective call into a fixed-size tensor, comparing ranks' calls, and naming them.
#include "comm/collective_fingerprint.h"

#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>

namespace cpprun::detail {
namespace {

// Layout of a fingerprint. Every slot is an int64; absent values are -1.
constexpr int64_t kMagic = 0x6370707275'6e01;  // "cpprun" v1: tells a fingerprint from stray bytes
constexpr int64_t kMagicSlot = 0, kSequenceSlot = 1, kKindSlot = 2, kDeviceSlot = 3,
                  kDtypeSlot = 4, kRootSlot = 5, kReduceSlot = 6, kTensorCountSlot = 7;
constexpr int64_t kFirstTensorSlot = 8;
constexpr int64_t kMaxDims = 6;                  // a deeper shape folds its tail into the last
constexpr int64_t kTensorSlots = 2 + kMaxDims;   // ndim, numel, dims
constexpr int64_t kMaxTensors = 2;
constexpr int64_t kFirstNameSlot = kFirstTensorSlot + kMaxTensors * kTensorSlots;  // what calls compare ends here
constexpr int64_t kNameBytes = (kFingerprintLength - kFirstNameSlot) * 8;
static_assert(kFirstNameSlot == 24 && kNameBytes == 48);

int64_t tensor_slot(int64_t tensor, int64_t field) {
  return kFirstTensorSlot + tensor * kTensorSlots + field;
}

// The dims from kMaxDims-1 on, as one value: shapes that differ only there still differ.
int64_t fold_tail(at::IntArrayRef sizes) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the dims
  for (std::size_t d = kMaxDims - 1; d < sizes.size(); ++d) {
    hash = (hash ^ static_cast<uint64_t>(sizes[d])) * 1099511628211ull;
  }
  return static_cast<int64_t>(hash >> 1);
}

std::string fingerprint_dtype_name(int64_t dtype) {
  if (dtype < 0 || dtype >= static_cast<int64_t>(c10::ScalarType::NumOptions)) return "?";
  return std::string(c10::getDtypeNames(static_cast<c10::ScalarType>(dtype)).first);
}

std::string reduce_name(int64_t reduce) {
  if (reduce < 0 || reduce > static_cast<int64_t>(ReduceOp::kBXor)) return "?";
  return to_string(static_cast<ReduceOp>(reduce));
}

const int64_t* values(const at::Tensor& fingerprint) {
  TORCH_INTERNAL_ASSERT(fingerprint.numel() == kFingerprintLength &&
                        fingerprint.scalar_type() == at::kLong && fingerprint.is_contiguous());
  return fingerprint.const_data_ptr<int64_t>();
}

bool agree(const at::Tensor& a, const at::Tensor& b, Agreement agreement) {
  const int64_t* x = values(a);
  const int64_t* y = values(b);
  if (agreement == Agreement::kExact) return std::equal(x, x + kFirstNameSlot, y);
  if (!std::equal(x, x + kFirstTensorSlot, y)) return false;
  for (int64_t t = 0; t < kMaxTensors; ++t) {
    if (x[tensor_slot(t, 1)] != y[tensor_slot(t, 1)]) return false;  // numel
  }
  return true;
}

// The public call's name into the name slots: NUL-padded bytes, "..." ending one cut short. The
// slots stay -1 outside any public call.
void pack_name(int64_t* v, const char* name) {
  if (name == nullptr) return;
  char bytes[kNameBytes] = {};
  const std::size_t length = std::strlen(name);
  if (length <= static_cast<std::size_t>(kNameBytes)) {
    std::memcpy(bytes, name, length);
  } else {
    std::memcpy(bytes, name, kNameBytes - 3);
    std::memcpy(bytes + kNameBytes - 3, "...", 3);
  }
  std::memcpy(v + kFirstNameSlot, bytes, kNameBytes);
}

// The name the slots hold, or "" (none, or a peer's bytes that are not a printable name).
std::string unpack_name(const int64_t* v) {
  char bytes[kNameBytes];
  std::memcpy(bytes, v + kFirstNameSlot, kNameBytes);
  std::string name(bytes, strnlen(bytes, kNameBytes));
  for (char c : name) {
    if (c < 0x20 || c > 0x7e) return "";
  }
  return name;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << (ranks.size() == 1 ? "rank " : "ranks ");
  for (std::size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

}  // namespace

const char* to_string(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kAllGatherInto: return "all_gather_into";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kBarrier: return "barrier";
    case CollectiveKind::kAllToAll: return "all_to_all";
    case CollectiveKind::kGather: return "gather";
    case CollectiveKind::kScatter: return "scatter";
    case CollectiveKind::kReduce: return "reduce";
    case CollectiveKind::kSendRecv: return "send/recv";
  }
  return "?";
}

at::Tensor fingerprint(const CollectiveCall& call, uint64_t sequence) {
  TORCH_INTERNAL_ASSERT(static_cast<int64_t>(call.tensors.size()) <= kMaxTensors);
  at::Tensor result = at::full({kFingerprintLength}, -1, at::kLong);
  int64_t* v = result.mutable_data_ptr<int64_t>();
  v[kMagicSlot] = kMagic;
  v[kSequenceSlot] = static_cast<int64_t>(sequence);
  v[kKindSlot] = static_cast<int64_t>(call.kind);
  v[kTensorCountSlot] = static_cast<int64_t>(call.tensors.size());
  if (call.root) v[kRootSlot] = *call.root;
  if (call.reduce) v[kReduceSlot] = static_cast<int64_t>(*call.reduce);
  pack_name(v, call.public_call);
  for (std::size_t t = 0; t < call.tensors.size(); ++t) {
    const at::Tensor& tensor = call.tensors[t];
    // The tensors of one call share dtype and device (checked before the call is packed).
    v[kDtypeSlot] = static_cast<int64_t>(tensor.scalar_type());
    v[kDeviceSlot] = static_cast<int64_t>(tensor.device().type());
    if (call.shapes_vary) continue;  // ndim and numel stay -1: described as "[*]"
    const auto sizes = tensor.sizes();
    const auto ndim = static_cast<int64_t>(sizes.size());
    v[tensor_slot(t, 0)] = ndim;
    v[tensor_slot(t, 1)] = tensor.numel();
    for (int64_t d = 0; d < std::min(ndim, kMaxDims); ++d) v[tensor_slot(t, 2 + d)] = sizes[d];
    if (ndim > kMaxDims) v[tensor_slot(t, 2 + kMaxDims - 1)] = fold_tail(sizes);
  }
  return result;
}

uint64_t sequence_of(const at::Tensor& fingerprint) {
  return static_cast<uint64_t>(values(fingerprint)[kSequenceSlot]);
}

std::optional<int64_t> root_of(const at::Tensor& fingerprint) {
  const int64_t root = values(fingerprint)[kRootSlot];
  return root < 0 ? std::nullopt : std::optional<int64_t>(root);
}

int64_t numel_of(const at::Tensor& fingerprint, int64_t index) {
  TORCH_INTERNAL_ASSERT(index >= 0 && index < kMaxTensors);
  return values(fingerprint)[tensor_slot(index, 1)];
}

at::ScalarType dtype_of(const at::Tensor& fingerprint) {
  const int64_t dtype = values(fingerprint)[kDtypeSlot];
  TORCH_CHECK(dtype >= 0 && dtype < static_cast<int64_t>(c10::ScalarType::NumOptions),
              "cpprun: a peer's message header names no known dtype (", dtype, ").");
  return static_cast<at::ScalarType>(dtype);
}

std::string describe(const at::Tensor& fingerprint) {
  const int64_t* v = values(fingerprint);
  if (v[kMagicSlot] != kMagic) return "something that is not a cpprun collective";
  std::ostringstream out;
  out << to_string(static_cast<CollectiveKind>(v[kKindSlot])) << "(";
  const auto device = static_cast<c10::DeviceType>(v[kDeviceSlot]);
  for (int64_t t = 0; t < v[kTensorCountSlot]; ++t) {
    out << (t ? ", " : "");
    if (v[kDeviceSlot] >= 0 && device != c10::DeviceType::CPU) out << c10::DeviceTypeName(device, true) << " ";
    out << fingerprint_dtype_name(v[kDtypeSlot]) << "[";
    const int64_t ndim = v[tensor_slot(t, 0)];
    if (ndim < 0) out << "*";
    for (int64_t d = 0; d < std::min(ndim, kMaxDims); ++d) {
      out << (d ? ", " : "");
      if (ndim > kMaxDims && d == kMaxDims - 1) {
        out << "...";
      } else {
        out << v[tensor_slot(t, 2 + d)];
      }
    }
    out << "]";
  }
  if (v[kRootSlot] >= 0) {
    const bool message = static_cast<CollectiveKind>(v[kKindSlot]) == CollectiveKind::kSendRecv;
    out << (message ? ", batched message #" : ", root ") << v[kRootSlot];
  }
  if (v[kReduceSlot] >= 0) out << ", " << reduce_name(v[kReduceSlot]);
  out << ")";
  if (const std::string name = unpack_name(v); !name.empty()) out << " in " << name;
  return out.str();
}

std::optional<std::string> mismatch(const at::Tensor& mine, const std::vector<at::Tensor>& fingerprints,
                                    const std::vector<int>& ranks, Agreement agreement) {
  TORCH_INTERNAL_ASSERT(fingerprints.size() == ranks.size());
  bool all_agree = true;
  for (const auto& other : fingerprints) all_agree = all_agree && agree(mine, other, agreement);
  if (all_agree) return std::nullopt;

  // Ranks that made the same call are named together, in rank order of their first member.
  std::map<int, std::vector<int>> groups;  // first rank of a group -> its ranks
  std::vector<std::pair<int, at::Tensor>> firsts;
  std::vector<std::size_t> order(ranks.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return ranks[a] < ranks[b]; });
  for (std::size_t i : order) {
    bool placed = false;
    for (auto& [first, print] : firsts) {
      if (agree(print, fingerprints[i], Agreement::kExact)) {
        groups[first].push_back(ranks[i]);
        placed = true;
        break;
      }
    }
    if (!placed) {
      firsts.emplace_back(ranks[i], fingerprints[i]);
      groups[ranks[i]].push_back(ranks[i]);
    }
  }
  const uint64_t sequence = sequence_of(mine);
  std::ostringstream out;
  out << "cpprun: collective #" << sequence << " mismatch: ";
  for (std::size_t g = 0; g < firsts.size(); ++g) {
    const auto& [first, print] = firsts[g];
    out << (g ? ", " : "") << rank_list(groups[first]) << " called " << describe(print);
    if (sequence_of(print) != sequence) out << " as collective #" << sequence_of(print);
  }
  out << ". Every rank must call the same collectives in the same order, with the same dtypes, "
         "shapes and roots.";
  return out.str();
}

}  // namespace cpprun::detail
