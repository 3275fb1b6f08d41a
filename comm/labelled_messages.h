// Point-to-point messages that say what they carry: the flight recorder keeps the label beside
// the send or receive, so that a dump, and the launcher's diagnosis of a hang, names it ("recv #5
// (float32[2, 8]) from rank 0: pipeline stage 1: the activation of micro-batch 3 from stage 0")
// where a tag alone means nothing to a reader. cpprun/point_to_point.h's calls are these with no
// label. Internal: the pipeline's schedules use them.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "cpprun/collectives.h"
#include "cpprun/point_to_point.h"
#include "cpprun/process_group.h"

namespace cpprun::detail {

Work isend_labelled(const ProcessGroup& group, at::Tensor tensor, int dst, int tag, std::string label);
Work irecv_labelled(const ProcessGroup& group, at::Tensor tensor, int src, int tag, std::string label,
                    int* source = nullptr);
// batch_isend_irecv with one label per op (none: empty), in the ops' order.
std::vector<Work> batch_isend_irecv_labelled(const ProcessGroup& group, std::vector<P2POp> ops,
                                             std::vector<std::string> labels);
// The same for messages whose dtype and size both ends already agree on (the pipeline's within a
// step, after its checked shape message): on Gloo each op is posted as it is, without the header,
// acknowledgement and thread of a checked message; on NCCL, as batch_isend_irecv_labelled. A
// mismatch is the caller's bug and is not caught. See Note [Messages of agreed size].
std::vector<Work> batch_isend_irecv_agreed(const ProcessGroup& group, std::vector<P2POp> ops,
                                           std::vector<std::string> labels);

}  // namespace cpprun::detail
