// PowerSGD's state: numpy's RandomState, the file's dict (PyTorch's PowerSGDState's names), the
// checks that a state fits the buckets it meets, and save_powerSGD_state / load_powerSGD_state.
#include "ddp/powersgd_state.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <sstream>
#include <utility>

#include "core/failure_agreement.h"
#include "cpprun/checkpoint_file.h"
#include "cpprun/object_collectives.h"

namespace cpprun {
namespace detail {

NumpyRandomState::NumpyRandomState(uint32_t seed) {
  // numpy's mt19937_seed (init_genrand), as RandomState(int) seeds: pos = 624, so the first
  // draw generates the first block.
  key[0] = seed;
  for (int i = 1; i < kWords; ++i) key[i] = 1812433253u * (key[i - 1] ^ (key[i - 1] >> 30)) + static_cast<uint32_t>(i);
}

uint32_t NumpyRandomState::next_word() {
  constexpr int kShift = 397;
  if (pos >= kWords) {
    for (int i = 0; i < kWords; ++i) {
      const uint32_t y = (key[i] & 0x80000000u) | (key[(i + 1) % kWords] & 0x7fffffffu);
      key[i] = key[(i + kShift) % kWords] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    pos = 0;
  }
  uint32_t y = key[pos++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

int64_t NumpyRandomState::randint_below_one_billion() {
  constexpr uint32_t kMax = 999'999'999, kMask = (1u << 30) - 1;
  uint32_t value;
  do {
    value = next_word() & kMask;
  } while (value > kMax);
  return value;
}

namespace {

// Note [A PowerSGD state fits one layout]
// The state is per bucket index, laid out by the bucket's gradients: the error is the bucket's
// flat buffer, P and Q hold each compressed matrix's factor in bucket order. A state used with
// other buckets (another model, another bucket_cap_mb) would add errors to the wrong gradients
// and warm-start from the wrong factors, silently; the errors are this rank's own, so another
// rank's file, or a file from another world size, is as wrong. PyTorch's pickled PowerSGDState
// checks nothing of this; cpprun's records the group and each compressed bucket's shapes and
// refuses a bucket that differs. The states differ between ranks (each loads its own file, or one
// loads another rank's), so one rank may refuse where the others go on into the bucket's
// all-reduces and wait for it until the timeout. So the first run of each bucket index by a hook
// agrees (agree_state_fits: one all-gather of each rank's verdict and step count, on every rank,
// whether it loaded a state or not, before the bucket's collectives), and every rank throws,
// naming the refusing rank and its reason; a state is loaded only into a hook that has not run.
// After that first run each rank's state holds the same shapes (the buckets are the same on
// every rank), so a later refusal (buckets rebuilt otherwise) comes on every rank alike.
// Checked on every step, not only after a load: a check is a few small vector comparisons per
// bucket.

std::string shapes_text(const std::vector<std::vector<int64_t>>& shapes) {
  constexpr size_t kShown = 16;  // a damaged file's list may be long
  std::ostringstream out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (i == kShown) {
      out << ", ... (" << shapes.size() << " shapes)";
      break;
    }
    out << (i ? ", " : "") << "[";
    for (size_t d = 0; d < shapes[i].size(); ++d) out << (d ? ", " : "") << shapes[i][d];
    out << "]";
  }
  return out.str();
}

std::string origin(const PowerSgdState& state) {
  return state.loaded_from.empty() ? "" : " (loaded from " + state.loaded_from + ")";
}

// A shape list as one int64 tensor: each shape's length, then its sizes.
at::Tensor encode_shapes(const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<int64_t> flat;
  for (const auto& shape : shapes) {
    flat.push_back(static_cast<int64_t>(shape.size()));
    flat.insert(flat.end(), shape.begin(), shape.end());
  }
  return at::tensor(flat, at::kLong);
}

// The dict being read: each key taken once; what is wrong is collected, to be reported at once.
class Reader {
 public:
  explicit Reader(const NamedTensors& tensors) {
    for (const auto& [name, tensor] : tensors) left_[name] = tensor;
  }
  std::vector<std::string> problems;

  at::Tensor take(const std::string& name) {
    auto found = left_.find(name);
    if (found == left_.end()) {
      problems.push_back("no \"" + name + "\"");
      return at::Tensor();
    }
    at::Tensor tensor = found->second;
    left_.erase(found);
    return tensor;
  }
  // A one-element value of one of `kinds`; `fallback` when missing or wrong.
  at::Tensor scalar(const std::string& name, std::initializer_list<at::ScalarType> kinds, double fallback) {
    at::Tensor tensor = take(name);
    if (!tensor.defined()) return at::scalar_tensor(fallback, at::kDouble);
    bool fits = tensor.numel() == 1 && tensor.dim() == 0;
    bool kind = false;
    for (auto k : kinds) kind = kind || tensor.scalar_type() == k;
    if (!fits || !kind) {
      std::ostringstream why;
      why << "\"" << name << "\" is a " << tensor.scalar_type() << " tensor of shape " << tensor.sizes()
          << ", not one number of the expected kind";
      problems.push_back(why.str());
      return at::scalar_tensor(fallback, at::kDouble);
    }
    return tensor;
  }
  // The bucket indices of the keys PREFIX.<index>, taken.
  std::map<int, at::Tensor> take_dict(const std::string& prefix) {
    std::map<int, at::Tensor> dict;
    for (auto it = left_.begin(); it != left_.end();) {
      const std::string& name = it->first;
      if (name.rfind(prefix + ".", 0) != 0) {
        ++it;
        continue;
      }
      const std::string index = name.substr(prefix.size() + 1);
      const bool digits = !index.empty() && index.size() < 9 &&
                          index.find_first_not_of("0123456789") == std::string::npos;
      if (!digits) {
        problems.push_back("\"" + name + "\" is not " + prefix + ".<bucket index>");
      } else {
        dict[std::stoi(index)] = it->second;
      }
      it = left_.erase(it);
    }
    return dict;
  }
  std::vector<std::string> unknown() const {
    std::vector<std::string> names;
    for (const auto& entry : left_) names.push_back(entry.first);
    return names;
  }

 private:
  std::map<std::string, at::Tensor> left_;
};

}  // namespace

NamedTensors powersgd_state_to_tensors(const PowerSgdState& state) {
  const PowerSGDOptions& o = state.options;
  auto integer = [](int64_t v) { return at::scalar_tensor(v, at::kLong); };
  auto real = [](double v) { return at::scalar_tensor(v, at::kDouble); };
  auto flag = [](bool v) { return at::scalar_tensor(v, at::kBool); };
  // PowerSGDState.__getstate__'s slots, in its order, less the compression statistics cpprun
  // does not keep; rng as numpy's get_state(legacy=False)["state"]: key and pos.
  NamedTensors out{{"matrix_approximation_rank", integer(o.matrix_approximation_rank())},
                   {"start_powerSGD_iter", integer(o.start_powerSGD_iter())},
                   {"min_compression_rate", real(o.min_compression_rate())},
                   {"orthogonalization_epsilon", real(o.orthogonalization_epsilon())},
                   {"use_error_feedback", flag(o.use_error_feedback())},
                   {"warm_start", flag(o.warm_start())},
                   {"batch_tensors_with_same_shape", flag(o.batch_tensors_with_same_shape())},
                   {"rng.key", at::from_blob(const_cast<uint32_t*>(state.rng.key.data()), {NumpyRandomState::kWords},
                                             at::kUInt32).clone()},
                   {"rng.pos", integer(state.rng.pos)}};
  using Dict = std::pair<const char*, const std::map<int, at::Tensor>*>;
  for (const auto& [name, dict] : {Dict{"error_dict", &state.error_dict}, Dict{"p_memory_dict", &state.p_memory_dict},
                                   Dict{"q_memory_dict", &state.q_memory_dict}}) {
    for (const auto& [index, tensor] : *dict) out.emplace_back(std::string(name) + "." + std::to_string(index), tensor);
  }
  out.emplace_back("iter", integer(state.iter));
  out.emplace_back("cpprun.world_size", integer(state.world_size));
  out.emplace_back("cpprun.rank", integer(state.rank));
  for (const auto& [index, shapes] : state.bucket_shapes) {
    out.emplace_back("cpprun.bucket_shapes." + std::to_string(index), encode_shapes(shapes));
  }
  return out;
}

void powersgd_state_from_tensors(PowerSgdState& state, const NamedTensors& tensors, const std::string& path) {
  // See Note [A PowerSGD state fits one layout]: the first run's agreement is what checks it.
  TORCH_CHECK(state.agreed_buckets.empty(), "cpprun::load_powerSGD_state: this hook has already run; load ", path,
              " into a new hook (powerSGD_hook with the same options) before registering it.");
  const PowerSGDOptions& mine = state.options;
  Reader file(tensors);
  std::vector<std::string> differ;
  auto same_int = [&](const char* name, int64_t expected) {
    const int64_t saved = file.scalar(name, {at::kLong, at::kInt}, static_cast<double>(expected)).item<int64_t>();
    if (saved != expected) differ.push_back(std::string(name) + " " + std::to_string(saved) + " (this hook: " +
                                            std::to_string(expected) + ")");
  };
  auto same_real = [&](const char* name, double expected) {
    const double saved = file.scalar(name, {at::kDouble, at::kFloat, at::kLong}, expected).item<double>();
    if (saved != expected) {
      std::ostringstream text;
      text << name << " " << saved << " (this hook: " << expected << ")";
      differ.push_back(text.str());
    }
  };
  auto same_flag = [&](const char* name, bool expected) {
    const bool saved = file.scalar(name, {at::kBool}, expected).item<bool>();
    if (saved != expected) differ.push_back(std::string(name) + " " + (saved ? "true" : "false") + " (this hook: " +
                                            (expected ? "true" : "false") + ")");
  };
  same_int("matrix_approximation_rank", mine.matrix_approximation_rank());
  same_int("start_powerSGD_iter", mine.start_powerSGD_iter());
  same_real("min_compression_rate", mine.min_compression_rate());
  same_real("orthogonalization_epsilon", mine.orthogonalization_epsilon());
  same_flag("use_error_feedback", mine.use_error_feedback());
  same_flag("warm_start", mine.warm_start());
  same_flag("batch_tensors_with_same_shape", mine.batch_tensors_with_same_shape());

  PowerSgdState loaded(mine);
  loaded.loaded_from = path;
  const at::Tensor key = file.take("rng.key");
  if (key.defined()) {
    if (key.scalar_type() == at::kUInt32 && key.dim() == 1 && key.numel() == NumpyRandomState::kWords) {
      std::memcpy(loaded.rng.key.data(), key.contiguous().data_ptr(), sizeof(uint32_t) * NumpyRandomState::kWords);
    } else {
      file.problems.push_back("\"rng.key\" is not 624 uint32 words");
    }
  }
  loaded.rng.pos = file.scalar("rng.pos", {at::kLong}, 0).item<int64_t>();
  if (loaded.rng.pos < 0 || loaded.rng.pos > NumpyRandomState::kWords) {
    file.problems.push_back("\"rng.pos\" " + std::to_string(loaded.rng.pos) + " is outside 0..624");
  }
  loaded.iter = file.scalar("iter", {at::kLong}, 0).item<int64_t>();
  if (loaded.iter < 0) file.problems.push_back("\"iter\" " + std::to_string(loaded.iter) + " is negative");
  loaded.world_size = static_cast<int>(file.scalar("cpprun.world_size", {at::kLong}, 0).item<int64_t>());
  loaded.rank = static_cast<int>(file.scalar("cpprun.rank", {at::kLong}, -1).item<int64_t>());
  // A file torch.save wrote may hold any view of a storage: an expanded tensor (a stride of 0,
  // fewer bytes of storage than elements), a strided one, two entries sharing one storage. Each
  // is read as its elements in order, into memory of its own that the hook may write in place.
  auto own = [](const at::Tensor& tensor) { return tensor.clone(at::MemoryFormat::Contiguous); };
  for (auto [name, dict] : {std::pair{"error_dict", &loaded.error_dict}, std::pair{"p_memory_dict", &loaded.p_memory_dict},
                            std::pair{"q_memory_dict", &loaded.q_memory_dict}}) {
    for (auto& [index, tensor] : file.take_dict(name)) {
      if (tensor.dim() != 1) {
        std::ostringstream why;
        why << "\"" << name << "." << index << "\" is a tensor of shape " << tensor.sizes() << ", not a flat (1-D) one";
        file.problems.push_back(why.str());
      }
      (*dict)[index] = own(tensor);
    }
  }
  for (const auto& [index, saved] : file.take_dict("cpprun.bucket_shapes")) {
    const at::Tensor flat = own(saved);
    const int64_t* v = flat.scalar_type() == at::kLong && flat.dim() == 1 ? flat.data_ptr<int64_t>() : nullptr;
    std::vector<std::vector<int64_t>> shapes;
    for (int64_t at = 0; v && at < flat.numel();) {
      const int64_t dims = v[at++];
      if (dims < 0 || at + dims > flat.numel()) v = nullptr;
      else shapes.emplace_back(v + at, v + at + dims), at += dims;
    }
    if (!v) file.problems.push_back("\"cpprun.bucket_shapes." + std::to_string(index) + "\" is not a list of shapes");
    loaded.bucket_shapes[index] = std::move(shapes);
  }
  // Every bucket with a tensor has its shapes, else the state could not be checked against its bucket.
  for (const auto* dict : {&loaded.error_dict, &loaded.p_memory_dict, &loaded.q_memory_dict}) {
    for (const auto& [index, tensor] : *dict) {
      if (!loaded.bucket_shapes.count(index)) {
        file.problems.push_back("bucket " + std::to_string(index) + " has tensors but no \"cpprun.bucket_shapes." +
                                std::to_string(index) + "\"");
      }
    }
  }
  for (const auto& name : file.unknown()) file.problems.push_back("an unknown entry \"" + name + "\"");

  auto joined = [](const std::vector<std::string>& items) {
    std::string text;
    for (const auto& item : items) text += (text.empty() ? "" : "; ") + item;
    return text;
  };
  TORCH_CHECK(file.problems.empty(), "cpprun::load_powerSGD_state: ", path, " is not a PowerSGD state that "
              "save_powerSGD_state wrote: ", joined(file.problems), ".");
  TORCH_CHECK(differ.empty(), "cpprun::load_powerSGD_state: ", path, " was saved by a PowerSGD hook with other "
              "options: ", joined(differ), ". Its errors and P/Q memory fit only those; make the hook with the "
              "options it was saved with (PowerSGDOptions), or start without the state.");
  state = std::move(loaded);
}

void check_state_fits(PowerSgdState& state, int rank, int world_size, const GradBucket& bucket, bool compressing,
                      FactorSizes factors) {
  // See Note [A PowerSGD state fits one layout].
  TORCH_CHECK(state.world_size == 0 || (state.world_size == world_size && state.rank == rank),
              "cpprun::powerSGD_hook: its state", origin(state), " was made on rank ", state.rank, " of ",
              state.world_size, "; this is rank ", rank, " of ", world_size, ". The error feedback is the saving "
              "rank's own: each rank loads the file that its own rank saved, at the world size it was saved at.");
  state.world_size = world_size;
  state.rank = rank;
  if (bucket.is_last && !state.bucket_shapes.empty()) {
    const int last = state.bucket_shapes.rbegin()->first;
    TORCH_CHECK(last <= bucket.index, "cpprun::powerSGD_hook: its state", origin(state), " holds bucket ", last,
                " but this DistributedDataParallel has ", bucket.index + 1, " buckets. The state fits only the model "
                "and bucket sizes (bucket_cap_mb, first_bucket_cap_mb) it was saved with.");
  }
  if (!compressing) return;
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& p : bucket.parameters) shapes.push_back(p.sizes().vec());
  auto saved = state.bucket_shapes.find(bucket.index);
  if (saved == state.bucket_shapes.end()) {
    state.bucket_shapes[bucket.index] = std::move(shapes);
    return;
  }
  TORCH_CHECK(saved->second == shapes, "cpprun::powerSGD_hook: bucket ", bucket.index, " holds gradients of shapes ",
              shapes_text(shapes), ", but its state", origin(state), " was made for a bucket ", bucket.index,
              " of shapes ", shapes_text(saved->second), ". The state fits only the model and bucket sizes "
              "(bucket_cap_mb, first_bucket_cap_mb) it was saved with.");
  for (auto* dict : {&state.error_dict, &state.p_memory_dict, &state.q_memory_dict}) {
    auto found = dict->find(bucket.index);
    if (found == dict->end()) continue;
    at::Tensor& tensor = found->second;
    TORCH_CHECK(tensor.scalar_type() == bucket.buffer.scalar_type(), "cpprun::powerSGD_hook: bucket ", bucket.index,
                " holds ", bucket.buffer.scalar_type(), " gradients, but its state", origin(state), " holds ",
                tensor.scalar_type(), " ones. Load it into the model in the dtype it was saved from.");
    if (tensor.device() != bucket.buffer.device()) tensor = tensor.to(bucket.buffer.device());
  }
  auto error = state.error_dict.find(bucket.index);
  TORCH_CHECK(error == state.error_dict.end() || error->second.numel() == bucket.buffer.numel(),
              "cpprun::powerSGD_hook: bucket ", bucket.index, " holds ", bucket.buffer.numel(),
              " gradient elements, but its state's error", origin(state), " has ", error->second.numel(), ".");
  // Warm-started P and Q are used as they are; without warm_start the hook makes new ones.
  auto p = state.p_memory_dict.find(bucket.index), q = state.q_memory_dict.find(bucket.index);
  if (!state.options.warm_start() || p == state.p_memory_dict.end()) return;
  TORCH_CHECK(q != state.q_memory_dict.end() && p->second.numel() == factors.p && q->second.numel() == factors.q,
              "cpprun::powerSGD_hook: bucket ", bucket.index, " needs P and Q memory of ", factors.p, " and ",
              factors.q, " elements, but its state", origin(state), " holds ", p->second.numel(), " and ",
              q == state.q_memory_dict.end() ? int64_t{0} : q->second.numel(), ".");
}

void agree_state_fits(PowerSgdState& state, const ProcessGroup& group, const GradBucket& bucket, bool compressing,
                      FactorSizes factors) {
  // See Note [A PowerSGD state fits one layout].
  std::exception_ptr failure;
  try {
    check_state_fits(state, group.rank(), group.size(), bucket, compressing, factors);
  } catch (...) {
    failure = std::current_exception();
  }
  state.agreed_buckets.insert(bucket.index);
  // Each rank's step count, then its failure's message (empty: none).
  std::string mine = std::to_string(state.iter) + "\n";
  if (failure) mine += describe_failure(failure).substr(1);  // less its kind's letter
  const std::vector<std::string> verdicts = all_gather_object(group, mine);
  std::vector<int64_t> iters;
  std::string refused_on, first_reason, steps;
  for (int r = 0; r < group.size(); ++r) {
    const std::string& verdict = verdicts[r];
    const auto newline = verdict.find('\n');
    iters.push_back(std::stoll(verdict.substr(0, newline)));
    steps += (r ? ", " : "") + std::string("rank ") + std::to_string(r) + " at " + verdict.substr(0, newline);
    if (newline + 1 == verdict.size()) continue;
    refused_on += (refused_on.empty() ? "" : ", ") + std::to_string(r);
    if (first_reason.empty()) first_reason = "Rank " + std::to_string(r) + " said: " + verdict.substr(newline + 1);
  }
  if (failure) std::rethrow_exception(failure);
  TORCH_CHECK(refused_on.empty(), "cpprun::powerSGD_hook: the PowerSGD state of rank ", refused_on, " does not fit "
              "its buckets, so rank ", group.rank(), " stops too, before bucket ", bucket.index, "'s collectives. ",
              first_reason);
  TORCH_CHECK(std::adjacent_find(iters.begin(), iters.end(), std::not_equal_to<>()) == iters.end(),
              "cpprun::powerSGD_hook: the ranks' PowerSGD states are at different steps (", steps, "), so they would "
              "not compress the same steps. Load each rank's own file, saved at the same step, on every rank, or "
              "none.");
}

}  // namespace detail

void save_powerSGD_state(const CommHook& hook, const std::string& path) {
  const auto& state = detail::powersgd_state_of(const_cast<CommHook&>(hook), "cpprun::save_powerSGD_state");
  write_checkpoint_file(path, detail::encode_torch_save(detail::powersgd_state_to_tensors(state)));
}

void load_powerSGD_state(CommHook& hook, const std::string& path) {
  auto& state = detail::powersgd_state_of(hook, "cpprun::load_powerSGD_state");
  const std::string bytes = read_checkpoint_file(path, UncheckedFiles::kAccept);
  detail::powersgd_state_from_tensors(state, detail::decode_torch_save(bytes, path), path);
}

}  // namespace cpprun
