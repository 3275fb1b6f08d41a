// See stage_messages.h.
#include "pipeline/stage_messages.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <sstream>

namespace cpprun::detail {

namespace {
constexpr int kMaxMessageDims = 16;
constexpr int64_t kTagBase = int64_t{1} << 26;
}  // namespace

int stage_message_tag(StageMessage kind, int stage, int microbatch, int microbatches, int stages) {
  // Room for a shape message per stage besides the micro-batches' activations and gradients.
  const int64_t per_stage = 3 * (int64_t{microbatches} + 1);
  TORCH_CHECK(per_stage * stages < kTagBase, "pipeline: ", stages, " stages times ", microbatches,
              " micro-batches is more messages per step than point-to-point tags can tell apart; use fewer "
              "micro-batches.");
  const int64_t slot = kind == StageMessage::kShape ? microbatches : microbatch;
  return static_cast<int>(kTagBase + stage * per_stage + slot * 3 + static_cast<int>(kind));
}

std::string stage_message_label(StageMessage kind, bool sending, int stage, int peer_stage, int microbatch) {
  std::string what;
  switch (kind) {
    case StageMessage::kShape: what = "the shape of this step's activations"; break;
    case StageMessage::kActivation: what = "the activation of micro-batch " + std::to_string(microbatch); break;
    case StageMessage::kGradient: what = "the gradient of micro-batch " + std::to_string(microbatch); break;
  }
  return "pipeline stage " + std::to_string(stage) + ": " + what + (sending ? " to stage " : " from stage ") +
         std::to_string(peer_stage);
}

at::Tensor shape_buffer() { return at::zeros({kMaxMessageDims + 2}, at::kLong); }

at::Tensor encode_shape(const at::Tensor& activation) {
  TORCH_CHECK(activation.dim() <= kMaxMessageDims, "pipeline: a stage's output has ", activation.dim(),
              " dimensions; at most ", kMaxMessageDims, " travel between stages.");
  at::Tensor encoded = shape_buffer();
  auto* out = encoded.data_ptr<int64_t>();
  out[0] = static_cast<int64_t>(activation.scalar_type());
  out[1] = activation.dim();
  for (int64_t d = 0; d < activation.dim(); ++d) out[2 + d] = activation.size(d);
  return encoded;
}

at::Tensor empty_from_shape(const at::Tensor& encoded, const at::Device& device) {
  const auto* in = encoded.data_ptr<int64_t>();
  TORCH_CHECK(in[1] >= 0 && in[1] <= kMaxMessageDims && in[0] >= 0 &&
                  in[0] < static_cast<int64_t>(at::ScalarType::NumOptions),
              "pipeline: a shape message that does not decode (", encoded, ")");
  std::vector<int64_t> sizes(in + 2, in + 2 + in[1]);
  return at::empty(sizes, at::TensorOptions().dtype(static_cast<at::ScalarType>(in[0])).device(device));
}

std::string describe_shape(const at::Tensor& encoded) {
  const auto* in = encoded.data_ptr<int64_t>();
  std::ostringstream out;
  out << c10::toString(static_cast<at::ScalarType>(in[0])) << '[';
  for (int64_t d = 0; d < in[1]; ++d) out << (d ? ", " : "") << in[2 + d];
  out << ']';
  return out.str();
}

}  // namespace cpprun::detail
