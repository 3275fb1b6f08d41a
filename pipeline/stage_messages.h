// What pipeline stages send each other, apart from when they send it (schedule_runtime.cpp): the
// tag of each message, and the shape message a stage sends before its first activation of a step
// so that the next stage can allocate the receive (no shape is declared in advance).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace cpprun::detail {

enum class StageMessage { kShape, kActivation, kGradient };

// The point-to-point tag of a message about `microbatch` sent by (kShape, kActivation) or to
// (kGradient) stage `stage`, in a step of `microbatches`. Pipeline tags live in [2^26, 2^27), above
// the small tags users pick for their own messages on the same group; throws when the step has too
// many stages times micro-batches for them.
int stage_message_tag(StageMessage kind, int stage, int microbatch, int microbatches, int stages);

// What a message carries, for the flight recorder and so the launcher's diagnosis of a hang:
// "pipeline stage 1: the activation of micro-batch 3 from stage 0" (received by stage 1), "pipeline
// stage 1: the gradient of micro-batch 3 to stage 0" (sent by stage 1).
std::string stage_message_label(StageMessage kind, bool sending, int stage, int peer_stage, int microbatch);

// The dtype and sizes of `activation` as a small int64 CPU tensor, and back: an empty tensor of
// that shape on `device`. Activations have at most 16 dimensions.
at::Tensor encode_shape(const at::Tensor& activation);
at::Tensor empty_from_shape(const at::Tensor& encoded, const at::Device& device);
at::Tensor shape_buffer();  // what a shape message is received into
std::string describe_shape(const at::Tensor& encoded);  // "float64[4, 12]"

}  // namespace cpprun::detail
