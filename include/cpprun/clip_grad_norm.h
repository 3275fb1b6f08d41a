// Gradient clipping for a model without a DataParallel wrapper, as Python's
// torch.nn.utils.clip_grad_norm_ computes it: each gradient's norm in its own dtype, the norm of
// those norms, every gradient multiplied by clamp(max_norm / (norm + 1e-6), max=1) in that dtype,
// so that the clipped gradients equal PyTorch's to the bit (LibTorch's own
// torch::nn::utils::clip_grad_norm_ parts from Python's in the last bits). The wrappers'
// model->clip_grad_norm (cpprun/data_parallel.h) and PipelineStage::clip_grad_norm do the same
// over gradients spread across ranks; given a wrapper (DDP, FSDP) as the module, this is its
// model->clip_grad_norm. FSDP's shards (model->parameters()) are refused: their norm would be this
// rank's rows' alone (LibTorch's function, which cannot check, takes it silently). Tensor-parallel
// shards (parallelize_module's layers) in a parameter list count as parts of one gradient, as in
// the module overload and as PyTorch's over DTensor parameters; LibTorch's function takes each
// rank's own norm there too, silently.
//
//   loss.backward();
//   const double norm = cpprun::clip_grad_norm_(*model, 1.0);   // or (model->parameters(), 1.0)
//   optimizer.step();
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace cpprun {

// Returns the norm before clipping. norm_type: 2, 1, any p > 0, or infinity (the largest
// magnitude); error_if_nonfinite: throw, changing nothing, when the norm is NaN or infinite (off:
// every gradient is multiplied by NaN, or by 0, as PyTorch's). max_norm must be positive. Each
// tensor counts once, however often it is listed (LibTorch lists a tied weight under each name). A
// tensor-parallel shard among them (of cpprun's layers, or of a layer of one's own inside a
// parallelize_module'd model) is this rank's part of one gradient, combined over its group: then
// collective over those groups, and every rank of a group must list the same parameters (lists
// that differ are refused on every rank, changing nothing).
double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);
// The module's parameters; a tensor-parallel split one (parallelize_module) is this rank's part
// of one gradient, whose norm is combined over its group: then collective over those groups. A
// DataParallel wrapper: its own clip_grad_norm, over its ranks (collective, the same norm on every
// rank, as PyTorch's over FSDP2's DTensor gradients).
double clip_grad_norm_(torch::nn::Module& module, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

}  // namespace cpprun
