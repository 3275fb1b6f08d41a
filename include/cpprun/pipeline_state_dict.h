// State dicts of a model cut into pipeline stages (cpprun/pipeline.h): one checkpoint of the
// whole model, written and read by the ranks of every stage together, as torchtitan saves a
// pipelined model through torch.distributed.checkpoint. The names are the unsplit model's
// ("h3.weight": a stage's module keeps its children's names), so the checkpoint is the one
// save_state_dict(model, PATH) writes of the unsplit model: it loads into that model, into
// PyTorch (torch.load, safetensors, transformers' sharded directories), or into stages cut
// another way, under another data- or tensor-parallel layout. A Sequential assembled from another
// model's modules (a GPT's blocks as children "h0", "h1", ...) saves under that model's names with
// PipelineStage::set_state_dict_prefixes, so that the checkpoint is that model's.
//
//   cpprun::save_state_dict(stage, "run/ckpt/", cpprun::StateDictSaveOptions().step(step));
//   cpprun::load_state_dict(stage, "run/ckpt/");      // any split, any {pp, dp, tp}
//   cpprun::save_state_dict({&stage0, &stage1}, "model.safetensors");  // interleaved: every stage of the rank
//
// Collective over the whole job: every rank calls it with every stage it holds, the same path and
// the same set_state_dict_prefixes; a difference, or one rank's mistake (some of its stages, an
// optimizer over another model's parameters), is refused on every rank: agreed over the pipeline
// group, then over the stages' data- and tensor-parallel groups, which reach the other pipelines
// of a {pp, dp} or {pp, tp} job. Each stage's
// tensors are gathered over its data-parallel wrapper (set_data_parallel: DDP, FSDP at any ZeRO
// stage) and its tensor-parallel splits, as for a model, then:
//   .safetensors, .pt   each stage's tensors go to pipeline rank 0, which writes the file;
//   DIR/                Hugging Face's sharded layout: each stage's ranks write its tensors' files
//                       in parallel, numbered stage after stage; pipeline rank 0 writes the index.
// Loading, each stage reads what it holds (from a directory, only the files that hold its
// tensors). Strict as load_state_dict: a name the checkpoint lacks on any stage, one no stage
// holds, or a shape that differs refuses the load on every rank, nothing changed; every rank
// returns the same report. Files carry the save id and step, and a failed save removes what it
// wrote, as cpprun/state_dict.h says.
//
// The optimizer's state (each rank's optimizer over its stages' parameters) is saved the same way,
// in cpprun/optimizer_state_dict.h's format: "state.<name>.<what>" tensors of the whole
// parameters, and the param groups as the unsplit model's optimizer has them (group g holds every
// stage's group g, whose options must agree), so it loads into the unsplit model's optimizer or
// into stages cut another way. A weight tied across stages has its state once, under the first
// stage's name (its copies are equal after each step's tie sum), as the unsplit optimizer holds it.
//
//   cpprun::save_state_dict(stage, opt, "run/ckpt/", cpprun::StateDictSaveOptions().step(step));
//   cpprun::load_state_dict(stage, opt, "run/ckpt/");   // model and optimizer, one save
//
// In the background, as cpprun::save_async (cpprun/async_save.h): what moves between ranks (each
// stage's gathers, a file's tensors to pipeline rank 0, the index's names) moves before the call
// returns; then each rank writes its files on a background thread, and the handle's wait() returns
// (or throws) alike on every rank once the whole checkpoint is on disk, its index last.
//
//   auto pending = cpprun::save_async(stage, opt, "run/ckpt/", "run/ckpt/", cpprun::StateDictSaveOptions().step(step));
//   ... train on ...
//   pending.wait();
#pragma once

#include <torch/optim/optimizer.h>

#include <map>
#include <string>
#include <vector>

#include "cpprun/async_save.h"
#include "cpprun/pipeline.h"
#include "cpprun/state_dict_options.h"

namespace cpprun {

// By value: a vector lvalue picks this rather than the template of cpprun/state_dict.h.
void save_state_dict(std::vector<PipelineStage*> stages, const std::string& path,
                     const StateDictSaveOptions& options = StateDictSaveOptions());
inline void save_state_dict(PipelineStage& stage, const std::string& path,
                            const StateDictSaveOptions& options = StateDictSaveOptions()) {
  save_state_dict(std::vector<PipelineStage*>{&stage}, path, options);
}

StateDictLoadReport load_state_dict(std::vector<PipelineStage*> stages, const std::string& path,
                                    const StateDictOptions& options = StateDictOptions());
inline StateDictLoadReport load_state_dict(PipelineStage& stage, const std::string& path,
                                           const StateDictOptions& options = StateDictOptions()) {
  return load_state_dict(std::vector<PipelineStage*>{&stage}, path, options);
}

// The optimizer's state for the stages' parameters: .safetensors or a directory (optimizer-*
// files beside a model's).
void save_optimizer_state_dict(std::vector<PipelineStage*> stages, torch::optim::Optimizer& optimizer,
                               const std::string& path, const StateDictSaveOptions& options = StateDictSaveOptions());
inline void save_optimizer_state_dict(PipelineStage& stage, torch::optim::Optimizer& optimizer,
                                      const std::string& path,
                                      const StateDictSaveOptions& options = StateDictSaveOptions()) {
  save_optimizer_state_dict(std::vector<PipelineStage*>{&stage}, optimizer, path, options);
}
void load_optimizer_state_dict(std::vector<PipelineStage*> stages, torch::optim::Optimizer& optimizer,
                               const std::string& path);
inline void load_optimizer_state_dict(PipelineStage& stage, torch::optim::Optimizer& optimizer,
                                      const std::string& path) {
  load_optimizer_state_dict(std::vector<PipelineStage*>{&stage}, optimizer, path);
}

// The model and its optimizer as one checkpoint in the directory DIR, under one save id, and
// `files` with them, as cpprun/optimizer_state_dict.h's save_state_dict(model, optimizer, DIR,
// options, files) does: one save, whose failure puts back every part; and the reverse, refusing a
// model and an optimizer of two saves before loading either, returning the model's report.
void save_state_dict(std::vector<PipelineStage*> stages, torch::optim::Optimizer& optimizer, const std::string& dir,
                     const StateDictSaveOptions& options = StateDictSaveOptions(),
                     const std::map<std::string, std::string>& files = {});
inline void save_state_dict(PipelineStage& stage, torch::optim::Optimizer& optimizer, const std::string& dir,
                            const StateDictSaveOptions& options = StateDictSaveOptions(),
                            const std::map<std::string, std::string>& files = {}) {
  save_state_dict(std::vector<PipelineStage*>{&stage}, optimizer, dir, options, files);
}
StateDictLoadReport load_state_dict(std::vector<PipelineStage*> stages, torch::optim::Optimizer& optimizer,
                                    const std::string& dir, const StateDictOptions& options = StateDictOptions());
inline StateDictLoadReport load_state_dict(PipelineStage& stage, torch::optim::Optimizer& optimizer,
                                           const std::string& dir,
                                           const StateDictOptions& options = StateDictOptions()) {
  return load_state_dict(std::vector<PipelineStage*>{&stage}, optimizer, dir, options);
}

// save_state_dict(stages, PATH) on a background thread (and with an optimizer, model and optimizer
// as one save under one id: MODEL_PATH and OPTIMIZER_PATH one directory, or two files), as
// cpprun/state_dict.h's and cpprun/optimizer_state_dict.h's save_async. Waits for this process's
// previous save first.
[[nodiscard]] AsyncSave save_async(std::vector<PipelineStage*> stages, const std::string& path,
                                   const StateDictSaveOptions& options = StateDictSaveOptions());
[[nodiscard]] inline AsyncSave save_async(PipelineStage& stage, const std::string& path,
                                          const StateDictSaveOptions& options = StateDictSaveOptions()) {
  return save_async(std::vector<PipelineStage*>{&stage}, path, options);
}
[[nodiscard]] AsyncSave save_async(std::vector<PipelineStage*> stages, torch::optim::Optimizer& optimizer,
                                   const std::string& model_path, const std::string& optimizer_path,
                                   const StateDictSaveOptions& options = StateDictSaveOptions());
[[nodiscard]] inline AsyncSave save_async(PipelineStage& stage, torch::optim::Optimizer& optimizer,
                                          const std::string& model_path, const std::string& optimizer_path,
                                          const StateDictSaveOptions& options = StateDictSaveOptions()) {
  return save_async(std::vector<PipelineStage*>{&stage}, optimizer, model_path, optimizer_path, options);
}

}  // namespace cpprun
