// Trains a small character-level GPT on a text file with cpprun, then prints tokens/s, the peak
// memory per rank, the held-out loss and a generated sample.
//
//   single process:  ./build/examples/train_gpt
//   two ranks:       ./build/launcher/cpprun --nproc_per_node=2 ./build/examples/train_gpt --mode ddp
//   sharded:         ./build/launcher/cpprun --nproc_per_node=2 ./build/examples/train_gpt --mode fsdp --stage 2
//   tensor parallel: ./build/launcher/cpprun --nproc_per_node=4 ./build/examples/train_gpt --tp 2 --mode fsdp --stage 3
//                    (each pair of ranks splits every block's heads and MLP units; FSDP across the pairs)
//   pipeline:        ./build/launcher/cpprun --nproc_per_node=2 ./build/examples/train_gpt --pp 2 --microbatches 4
//                    (the blocks split between the two ranks, 1F1B over 4 micro-batches a step)
//   3-D:             ./build/launcher/cpprun --nproc_per_node=8 ./build/examples/train_gpt --pp 2 --tp 2 --mode fsdp --stage 3
//                    (two pipelines of two stages, each stage's blocks over two TP ranks, ZeRO-3 across)
//   larger:          ... --mode fsdp --stage 3 --checkpoint-activations --amp fp16
//                    (at stage 3 the model is built with deferred initialisation: FSDP materialises it
//                    block by block, so no rank ever holds all of it)
//   from GPT-2:      ./build/examples/train_gpt --init-from DIR --export OUT
//                    (DIR: what transformers' GPT2LMHeadModel.save_pretrained wrote; OUT loads in Python
//                    with GPT2LMHeadModel.from_pretrained(OUT))
//   stop and resume: ./build/launcher/cpprun --nproc_per_node=2 ./build/examples/train_gpt --steps 300 --stop-after 100 --save ck
//                    ./build/launcher/cpprun --nproc_per_node=4 ./build/examples/train_gpt --steps 300 --resume ck --mode fsdp --stage 3 --batch 8
//                    (steps 101 to 300, under any --mode, --stage, --tp, --pp and number of ranks; with the same
//                    windows a step, 2 x 16 = 4 x 8, the held-out loss of one uninterrupted run of 300 steps)
//   against PyTorch: scripts/bench_gpt.sh (bench/gpt_twin.py: the same model, data and optimizer in
//                    Python; --mode none, --warmup and --losses-out are there for it)
//   options:         ./build/examples/train_gpt --help
//
// The network is GPT-2's, under GPT2LMHeadModel's parameter names and layouts (its linear layers
// are Hugging Face's "Conv1D", weight [in, out]), so its state dict is a GPT-2 checkpoint as it is.
#include <ATen/autocast_mode.h>
#ifdef CPPRUN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif
#include <cpprun/cpprun.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <unistd.h>  // close

#include "../bench/peak_rss.h"  // the memory benchmarks' measure (VmHWM)
#include "flag_value.h"
#include "gpt2_hf.h"
#include "../support/file_read.h"  // a file read whole, refusing FIFOs and devices
#include "../support/safetensors_index.h"  // the model's save id, against trainer.json's
#include "cpprun/detail/replaced_files.h"   // what a killed --save left, named in the refusal

constexpr const char* kUsage = R"(usage: train_gpt [options]
  --text FILE        the text to learn (default /usr/share/common-licenses/GPL-3, on every Debian machine)
  --mode ddp|fsdp|none
                     DistributedDataParallel, or FullyShardedDataParallel with one unit per block, or (one
                     rank) the model without any wrapper, to measure what a wrapper costs (default ddp)
  --stage 1|2|3      ZeRO stage with --mode fsdp (default 2)
  --tp N             tensor parallelism (Megatron's): each group of N consecutive ranks splits every block's
                     attention heads and MLP units among themselves; DDP/FSDP runs across the world/N groups,
                     which each take their own --batch windows (default 1). N must divide the ranks and --heads
  --pp N             pipeline parallelism: the model cut into N stages by its children (embeddings, blocks h0..,
                     ln_f, the tied head), one a rank (2 with interleaved-1f1b or looped-bfs); each step's --batch windows go
                     through them in --microbatches micro-batches; the same losses as one rank. A multiple of N
                     ranks runs that many pipelines, data-parallel with --mode ddp or fsdp (each its own --batch
                     windows, each stage in DDP or FSDP --stage K across them); with --tp, each stage over
                     --tp ranks. --save writes (and --resume reads) the unsplit model's checkpoint, under
                     GPT-2's names, as --export does; --init-from loads into the stages (each its part; the
                     head's copy from the token embedding). Not yet with --grad-accum (default 1)
  --pp-schedule gpipe|1f1b|interleaved-1f1b|looped-bfs|zero-bubble
                     the order of the micro-batches' passes (docs/pipeline_parallel.md) (default 1f1b)
  --microbatches M   micro-batches per step with --pp; --batch must divide by M (default 2 x N)
  --steps N          optimizer steps (default 300)
  --save DIR         after the last step, write a checkpoint to DIR: the model (model-*.safetensors and
                     model.safetensors.index.json, Hugging Face's sharded layout), the optimizer (optimizer-*),
                     and, written last, trainer.json: the step and where the data order stood (grad_scaler.pt
                     too with --amp fp16), all one save: one that fails puts back every earlier file. Every
                     rank writes its share of the tensors; rank 0 writes trainer.json
  --stop-after K     stop after step K of the --steps (1 to --steps), as if the run were to go on (it has no
                     learning-rate schedule to shorten); with --save, a checkpoint --resume continues
  --resume DIR       continue from DIR's checkpoint (--save's) with the step after it, under any --mode, --stage,
                     --tp, --pp and number of ranks; the same --text, --block, model flags (--layers, --embed,
                     --heads, --gelu, --layer-norm-eps) and --dtype; the vocabulary and positions are the
                     checkpoint's (an --init-from run's are its config's). The same global batch (--batch x the
                     data-parallel ranks) continues the saved run exactly (the same held-out loss as one
                     uninterrupted run) to the end of its epoch, and after it where an epoch is as many steps
                     (said if not: DistributedSampler pads an epoch to a multiple of the ranks). --lr is the
                     checkpoint's (its optimizer holds it)
  --batch B          windows per rank and forward pass; with --tp, per group of N ranks (default 16)
  --grad-accum K     forward and backward passes per optimizer step (gradient accumulation), each of --batch
                     windows; the gradients are reduced once, after the last (DDP and FSDP no_sync before).
                     A step takes --batch x K windows per rank, the order --batch x K alone would take, and
                     steps as it would up to rounding (GPT-2's 0.5M-token step on one GPU: --batch 16
                     --block 1024 --grad-accum 32) (default 1)
  --lr X             AdamW's learning rate (default 3e-3)
  --optimizer fused|libtorch
                     AdamW's step: cpprun::FusedAdamW (ATen's fused kernel, PyTorch's AdamW(fused=True): one
                     launch per parameter group) or LibTorch's torch::optim::AdamW (about ten per parameter); the
                     same state and files either way (default fused)
  --attention sdpa|math
                     causal attention through at::scaled_dot_product_attention (flash / memory-efficient /
                     cuDNN kernels on CUDA, the fused one on the CPU), or written out: matmul, a causal mask,
                     softmax, matmul, with the T x T scores in memory (default sdpa)
  --loss auto|fused|aten
                     the training loss: cpprun::fused_cross_entropy (on CUDA two kernels that read the logits
                     once each way and write the gradient in their dtype) or F::cross_entropy(logits.float()),
                     which passes over them about ten times in float32 (GPT-2's vocabulary: about 30 GB a
                     step at batch 16 x 1024). auto: fused on CUDA (aten, saying why, where its kernels
                     cannot compile or load there), aten on the CPU, where fused runs ATen's own operations
                     and gains nothing (default auto)
  --cuda-graph       capture the training step (forward, backward, AdamW) in a CUDA graph after 3 eager steps and
                     replay it: one launch a step instead of LibTorch's one per operation. The same arithmetic;
                     with --mode none on a GPU, --optimizer fused, --amp fp32 or bf16, without --tp and
                     --checkpoint-activations
  --trace FILE       profile the 3 steps after --warmup (PyTorch's profiler, Kineto: host operators and, on a
                     GPU, kernels) and write them to FILE as a Chrome trace (Perfetto and chrome://tracing open it;
                     scripts/bench_gpt.sh --trace compares one with PyTorch's, kernel by kernel). Rank 0 only
  --peak-tflops X    the device's peak for --amp's type, for the MFU each log line prints (default: 989 on an
                     H100 or H200 with --amp bf16, else MFU is not printed)
  --block T          characters per window (default 64)
  --layers L         transformer blocks (default 2)
  --embed C          embedding width, a multiple of --heads (default 64)
  --heads H          attention heads (default 4)
  --gelu exact|tanh  the MLP's GELU: exact (erf, PyTorch's default) or the tanh approximation GPT-2 uses
                     (transformers' "gelu_new") (default exact; with --init-from, config.json's)
  --layer-norm-eps E the layer norms' epsilon (default 1e-5; with --init-from, config.json's)
  --sample N         characters to generate at the end (default 200)
  --log-every K      print the mean loss of every K steps (default 50; 1: each step's loss)
  --losses-out FILE  write every step's loss (averaged over the ranks) to FILE, one a line (%.17g)
  --warmup N         leave the first N steps out of tokens/s (CUDA start-up, first allocations) (default 0)
  --init-from DIR    start from a GPT-2 in Hugging Face's layout (GPT2LMHeadModel.save_pretrained: config.json
                     and model.safetensors, or sharded with model.safetensors.index.json, or an older
                     pytorch_model.bin; float32 weights). The sizes (--layers, --embed, --heads, the
                     vocabulary, the positions) come from its config.json; a conflicting flag is refused, as
                     is a config option train_gpt does not implement. The text is still encoded one character
                     per token (ids in the sorted characters' order), so the model's
                     vocab_size must cover its characters; --block is at most n_positions (default: 64 or less)
  --export DIR       after training, write DIR/model.safetensors and DIR/config.json, which
                     transformers.GPT2LMHeadModel.from_pretrained(DIR) loads (under DDP/FSDP: rank 0 writes)
  --logits-for IDS   after training, the logits for these comma-separated token ids (one sequence) ...
  --logits-out FILE  ... written to FILE, a line per position of the vocabulary's logits (%.9g, space separated;
                     %.17g with --dtype float64)
  --checkpoint-activations
                     recompute each block's activations in backward instead of keeping them
  --amp fp32|bf16|fp16
                     autocast precision (default fp32); fp16 scales the loss (cpprun::GradScaler)
  --dtype float32|float64
                     the parameters', activations' and optimizer's type (default float32); float64 (with --amp
                     fp32) makes a comparison with another implementation independent of how the CPU rounds
                     float32 (scripts/bench_gpt.sh --dtype float64); --init-from's float32 tensors are cast to it;
                     --export writes the run's dtype (config.json's "dtype"), and a float64 export loads back
                     with --dtype float64
  --deferred-init on|off
                     build the model without memory (cpprun::deferred_init) and materialise it block by
                     block while sharding it (FSDP), or at once (DDP); the same values either way
                     (default on with --mode fsdp --stage 3 in float32; else off)
  --straggler-every K
                     every K steps, rank 0 prints each rank's time per step in compute and in waiting for
                     collectives, and names the slowest rank (default 50; 0: never)
  --help             this text
)";

struct Options {
  std::string text = "/usr/share/common-licenses/GPL-3", mode = "ddp";
  std::string init_from, export_dir, logits_for, logits_out;
  std::string save_dir, resume_dir;
  int stop_after = 0;  // 0: run all --steps
  examples::Gelu gelu = examples::Gelu::kExact;
  double layer_norm_eps = 1e-5;
  int64_t positions = 0, vocab = 0;  // 0: --block, and the text's characters (or --init-from's config)
  std::string init_dtype = "float32";  // --init-from's weights', as its config.json says
  bool block_given = false;            // --block on the command line (else at most the model's positions)
  int grad_accum = 1;  // micro-batches per step
  int pp = 1, microbatches = 0;  // --pp: pipeline stages (one per rank); micro-batches per step (0: 2 x pp)
  std::string pp_schedule = "1f1b";
  int steps = 300, batch = 16, sample = 200, stage = 2, straggler_every = 50, tp = 1, log_every = 50, warmup = 0;
  std::string losses_out;
  int64_t block = 64, layers = 2, embed = 64, heads = 4;
  double lr = 3e-3;
  double peak_tflops = 0;  // 0: known devices' own, else no MFU
  bool help = false, checkpoint_activations = false, cuda_graph = false;
  std::string optimizer = "fused", attention = "sdpa", loss = "auto";
  std::string trace;  // --trace FILE
  std::string amp = "fp32", deferred_init = "auto", dtype = "float32";
};

Options parse(int argc, char** argv) {
  Options o;
  std::set<std::string> given;  // the size flags on the command line, which --init-from must not contradict
  std::string gelu;
  for (examples::Flags flags(argc, argv, "train_gpt"); flags.next();) {
    for (const char* size : {"--block", "--layers", "--embed", "--heads"}) {
      if (flags.is(size)) given.insert(size);
    }
    if (flags.is("--help") || flags.is("-h")) o.help = true;
    else if (flags.is("--text")) o.text = flags.value();
    else if (flags.is("--mode")) o.mode = flags.value();
    else if (flags.is("--stage")) o.stage = flags.number(1), given.insert("--stage");
    else if (flags.is("--tp")) o.tp = flags.number(1);
    else if (flags.is("--pp")) o.pp = flags.number(1);
    else if (flags.is("--pp-schedule")) o.pp_schedule = flags.value(), given.insert("--pp-schedule");
    else if (flags.is("--microbatches")) o.microbatches = flags.number(1);
    else if (flags.is("--log-every")) o.log_every = flags.number(1);
    else if (flags.is("--steps")) o.steps = flags.number(0);
    else if (flags.is("--warmup")) o.warmup = flags.number(0);
    else if (flags.is("--losses-out")) o.losses_out = flags.value();
    else if (flags.is("--batch")) o.batch = flags.number(1);
    else if (flags.is("--grad-accum")) o.grad_accum = flags.number(1);
    else if (flags.is("--lr")) o.lr = flags.number(1e-12);
    else if (flags.is("--optimizer")) o.optimizer = flags.value();
    else if (flags.is("--attention")) o.attention = flags.value();
    else if (flags.is("--loss")) o.loss = flags.value();
    else if (flags.is("--peak-tflops")) o.peak_tflops = flags.number(1e-9);
    else if (flags.is("--block")) o.block = flags.number<int64_t>(1);
    else if (flags.is("--layers")) o.layers = flags.number<int64_t>(1);
    else if (flags.is("--embed")) o.embed = flags.number<int64_t>(1);
    else if (flags.is("--heads")) o.heads = flags.number<int64_t>(1);
    else if (flags.is("--sample")) o.sample = flags.number(0);
    else if (flags.is("--straggler-every")) o.straggler_every = flags.number(0);
    else if (flags.is("--checkpoint-activations")) o.checkpoint_activations = true;
    else if (flags.is("--cuda-graph")) o.cuda_graph = true;
    else if (flags.is("--trace")) o.trace = flags.value();
    else if (flags.is("--amp")) o.amp = flags.value();
    else if (flags.is("--dtype")) o.dtype = flags.value();
    else if (flags.is("--deferred-init")) o.deferred_init = flags.value();
    else if (flags.is("--gelu")) gelu = flags.value();
    else if (flags.is("--layer-norm-eps")) o.layer_norm_eps = flags.number(0.0), given.insert("--layer-norm-eps");
    else if (flags.is("--init-from")) o.init_from = flags.value();
    else if (flags.is("--export")) o.export_dir = flags.value();
    else if (flags.is("--save")) o.save_dir = flags.value();
    else if (flags.is("--resume")) o.resume_dir = flags.value();
    else if (flags.is("--stop-after")) o.stop_after = flags.number(1);
    else if (flags.is("--logits-for")) o.logits_for = flags.value();
    else if (flags.is("--logits-out")) o.logits_out = flags.value();
    else flags.unknown();
  }
  if (o.help) return o;
  if (!gelu.empty() && gelu != "exact" && gelu != "tanh") throw std::invalid_argument("--gelu must be exact or tanh, got " + gelu);
  if (!std::isfinite(o.layer_norm_eps) || o.layer_norm_eps <= 0) {
    throw std::invalid_argument("--layer-norm-eps must be a finite number above 0, got " +
                                std::to_string(o.layer_norm_eps));
  }
  if (gelu == "tanh") o.gelu = examples::Gelu::kTanh;
  if (o.optimizer != "fused" && o.optimizer != "libtorch") {
    throw std::invalid_argument("--optimizer must be fused or libtorch, got " + o.optimizer);
  }
  if (o.attention != "sdpa" && o.attention != "math") {
    throw std::invalid_argument("--attention must be sdpa or math, got " + o.attention);
  }
  if (o.loss != "auto" && o.loss != "fused" && o.loss != "aten") {
    throw std::invalid_argument("--loss must be auto, fused or aten, got " + o.loss);
  }
  if (o.cuda_graph) {
    // What a captured step cannot hold: a wrapper's hooks decide on the host each step, fp16's
    // scaler reads the overflow flag on the host, LibTorch's AdamW computes its bias correction
    // on the host from a count the replays would not advance.
    std::string conflict;
    if (o.mode != "none") conflict = "--mode " + o.mode + " (it needs --mode none)";
    else if (o.tp > 1) conflict = "--tp";
    else if (o.optimizer != "fused") conflict = "--optimizer " + o.optimizer + " (it needs --optimizer fused)";
    else if (o.amp == "fp16") conflict = "--amp fp16 (its GradScaler decides on the host)";
    else if (o.checkpoint_activations) conflict = "--checkpoint-activations";
    if (!conflict.empty()) throw std::invalid_argument("--cuda-graph does not go with " + conflict);
#ifndef CPPRUN_WITH_CUDA
    throw std::invalid_argument("--cuda-graph: this train_gpt was built without CUDA");
#endif
  }
  if (o.logits_for.empty() != o.logits_out.empty()) {
    throw std::invalid_argument("--logits-for and --logits-out go together (the token ids, and the file for their logits)");
  }
  if (!o.resume_dir.empty() && !o.init_from.empty()) {
    throw std::invalid_argument("--resume " + o.resume_dir + " and --init-from " + o.init_from +
                                " both give the model to start from: --resume continues a run (model, optimizer, "
                                "data position), --init-from starts one from a GPT-2; give one");
  }
  o.positions = o.block;
  o.block_given = given.count("--block") > 0;
  if (!o.init_from.empty()) {
    // The model's sizes are the checkpoint's; a flag saying otherwise is a mistake, not an override.
    const auto config = examples::read_gpt2_config(o.init_from);
    auto agree = [&](const char* flag, int64_t value, const char* key, int64_t from_file) {
      if (given.count(flag) && value != from_file) {
        throw std::invalid_argument(std::string(flag) + " " + std::to_string(value) + " conflicts with --init-from " +
                                    o.init_from + "/config.json's \"" + key + "\": " + std::to_string(from_file) +
                                    "; the model's sizes come from the file: drop " + flag);
      }
    };
    // float32 weights load into any run (cast for --dtype float64); float64 ones (a --dtype float64
    // run's --export) into a --dtype float64 run.
    if (config.dtype != "float32" && !(config.dtype == "float64" && o.dtype == "float64")) {
      // transformers would load them cast; cpprun's load_state_dict refuses another dtype (more often
      // another model than a wish to convert), so say so once instead of once a tensor.
      const std::string or_train = config.dtype == "float64" ? "Train with --dtype float64, or convert" : "Convert";
      throw std::invalid_argument("--init-from " + o.init_from + ": config.json says the weights are " + config.dtype +
                                  "; train_gpt loads float32 weights (and computes in bf16 or fp16 with --amp). " +
                                  or_train + " them once in Python: GPT2LMHeadModel.from_pretrained(DIR, dtype=torch."
                                  "float32).save_pretrained(OUT) (torch_dtype= before transformers 5)");
    }
    o.init_dtype = config.dtype;
    agree("--layers", o.layers, "n_layer", config.layers);
    agree("--embed", o.embed, "n_embd", config.embed);
    agree("--heads", o.heads, "n_head", config.heads);
    const examples::Gelu file_gelu = config.gelu;
    if (!gelu.empty() && o.gelu != file_gelu) {
      throw std::invalid_argument("--gelu " + gelu + " conflicts with --init-from " + o.init_from +
                                  "/config.json's \"activation_function\"; drop --gelu");
    }
    if (given.count("--layer-norm-eps") && o.layer_norm_eps != config.layer_norm_eps) {
      throw std::invalid_argument("--layer-norm-eps conflicts with --init-from " + o.init_from +
                                  "/config.json's \"layer_norm_epsilon\"; drop --layer-norm-eps");
    }
    o.layers = config.layers, o.embed = config.embed, o.heads = config.heads, o.gelu = file_gelu;
    o.positions = config.positions, o.vocab = config.vocab, o.layer_norm_eps = config.layer_norm_eps;
    if (!given.count("--block")) o.block = std::min<int64_t>(o.block, config.positions);
    if (o.block > config.positions) {
      throw std::invalid_argument("--block " + std::to_string(o.block) + " exceeds --init-from " + o.init_from +
                                  "/config.json's \"n_positions\": " + std::to_string(config.positions) +
                                  " (the model has no position embedding beyond); use --block " +
                                  std::to_string(config.positions) + " or less");
    }
  }
  if (o.mode != "ddp" && o.mode != "fsdp" && o.mode != "none") {
    throw std::invalid_argument("--mode must be ddp, fsdp or none, got " + o.mode);
  }
  if (given.count("--stage") && o.mode != "fsdp") {  // it was ignored, the run training another way
    throw std::invalid_argument("--stage " + std::to_string(o.stage) + " is FSDP's ZeRO stage and goes with --mode "
                                "fsdp; this run's --mode is " + o.mode + ": drop --stage, or add --mode fsdp");
  }
  if (o.mode == "none" && o.tp > 1) {
    throw std::invalid_argument("--mode none does not go with --tp " + std::to_string(o.tp) +
                                ": tensor parallelism runs under DDP or FSDP; use --mode ddp or fsdp");
  }
  if (o.warmup >= o.steps && o.steps > 0) {
    throw std::invalid_argument("--warmup " + std::to_string(o.warmup) + " leaves none of the " +
                                std::to_string(o.steps) + " --steps to time; use a --warmup below --steps");
  }
  if (o.stop_after > o.steps) {
    throw std::invalid_argument("--stop-after " + std::to_string(o.stop_after) + " is beyond --steps " +
                                std::to_string(o.steps) + ": it names the step of the --steps to stop after, 1 to " +
                                std::to_string(o.steps));
  }
  // --export's model.safetensors beside --save's (or --resume's) sharded index would make that
  // directory one --resume refuses (it holds two models).
  const auto canonical = [](const std::string& d) {  // "ck/", "./ck" and "ck" alike
    const std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(d));
    return p.has_filename() ? p : p.parent_path();
  };
  for (const auto& [flag, dir] : {std::pair<const char*, std::string>{"--save", o.save_dir}, {"--resume", o.resume_dir}}) {
    if (o.export_dir.empty() || dir.empty()) continue;
    if (canonical(o.export_dir) == canonical(dir)) {
      throw std::invalid_argument("--export " + o.export_dir + " is " + flag + "'s directory: the export's "
                                  "model.safetensors beside the checkpoint's sharded files would leave a directory "
                                  "--resume refuses; give --export a directory of its own");
    }
  }
  if (o.stop_after && o.save_dir.empty()) {
    throw std::invalid_argument("--stop-after " + std::to_string(o.stop_after) +
                                " without --save would stop and keep nothing: add --save DIR");
  }
  if (o.amp != "fp32" && o.amp != "bf16" && o.amp != "fp16") {
    throw std::invalid_argument("--amp must be fp32, bf16 or fp16, got " + o.amp);
  }
  if (o.dtype != "float32" && o.dtype != "float64") {
    throw std::invalid_argument("--dtype must be float32 or float64, got " + o.dtype);
  }
  if (o.dtype == "float64" && o.amp != "fp32") {
    throw std::invalid_argument("--dtype float64 goes with --amp fp32 only (autocast computes in " + o.amp +
                                "), got --amp " + o.amp);
  }
  if (o.dtype == "float64" && o.deferred_init == "on") {
    throw std::invalid_argument("--deferred-init on does not go with --dtype float64: the float32 model is loaded "
                                "and cast whole before the wrapper sees it; drop --deferred-init (with float64 it is off)");
  }
  if (o.deferred_init != "auto" && o.deferred_init != "on" && o.deferred_init != "off") {
    throw std::invalid_argument("--deferred-init must be on or off, got " + o.deferred_init);
  }
  if (o.tp > 1 && o.deferred_init == "on") {
    throw std::invalid_argument("--deferred-init on does not go with --tp " + std::to_string(o.tp) +
                                ": each rank's tensor-parallel shards are cut from a whole model built first; "
                                "drop --deferred-init (with --tp it is off)");
  }
  if (o.deferred_init == "auto") {
    o.deferred_init = o.mode == "fsdp" && o.stage == 3 && o.tp == 1 && o.dtype == "float32" ? "on" : "off";
  }
  if (o.stage > 3) throw std::invalid_argument("--stage must be 1, 2 or 3, got " + std::to_string(o.stage));
  if (o.embed % o.heads != 0) {
    throw std::invalid_argument("--embed " + std::to_string(o.embed) + " must be a multiple of --heads " +
                                std::to_string(o.heads));
  }
  // Megatron's split needs whole heads (and so whole MLP units) on every tensor-parallel rank;
  // padding would change the model's shapes and its GPT-2 state dict.
  const std::string from = o.init_from.empty() ? "" : " (from --init-from " + o.init_from + "/config.json)";
  if (o.heads % o.tp != 0) {
    throw std::invalid_argument("--tp " + std::to_string(o.tp) + " does not divide --heads " + std::to_string(o.heads) +
                                from + ": each tensor-parallel rank computes heads/tp whole attention heads; "
                                "choose a --tp that divides the number of heads");
  }
  // (4 * embed divides too: embed is a multiple of heads.)
  if (o.pp_schedule != "gpipe" && o.pp_schedule != "1f1b" && o.pp_schedule != "interleaved-1f1b" &&
      o.pp_schedule != "looped-bfs" && o.pp_schedule != "zero-bubble") {
    throw std::invalid_argument("--pp-schedule must be gpipe, 1f1b, interleaved-1f1b, looped-bfs or zero-bubble, got " +
                                o.pp_schedule);
  }
  if (o.pp == 1 && (o.microbatches || given.count("--pp-schedule"))) {
    throw std::invalid_argument(std::string(o.microbatches ? "--microbatches" : "--pp-schedule") +
                                " goes with --pp N (pipeline parallelism); without it, --grad-accum K splits a step");
  }
  if (o.pp > 1) {
    // What pipeline stages do not do yet (issue 42 goes on): each named, none ignored.
    std::string conflict;
    if (o.grad_accum > 1) conflict = "--grad-accum (--microbatches splits a step under --pp)";
    else if (o.cuda_graph) conflict = "--cuda-graph";
    if (!conflict.empty()) throw std::invalid_argument("--pp does not go with " + conflict + " yet");
    if (o.microbatches == 0) o.microbatches = 2 * o.pp;
    if (o.batch % o.microbatches != 0) {
      throw std::invalid_argument("--batch " + std::to_string(o.batch) + " does not split into --microbatches " +
                                  std::to_string(o.microbatches) + " of equal size; choose a --batch divisible by it");
    }
  }
  return o;
}

// GPT-2's linear layer as Hugging Face stores it ("Conv1D"): y = x W + b with W [in, out], the
// transpose of torch::nn::Linear's, so that the state dict is GPT2LMHeadModel's as it is.
//
// With --tp, Megatron's split across the tensor-parallel group, under the same names:
//   kColumns  W's columns (output features) split: W [in, out/tp], b [out/tp]. A fused projection
//             (c_attn: [q | k | v]) is `parts` blocks split block by block, so rank r holds the
//             q, k and v columns of its own heads. Its input enters through
//             copy_to_tensor_parallel_region (whole in forward; its gradient summed over the group).
//   kRows     W's rows (input features) split: W [in/tp, out], b whole. Each rank's partial product
//             is summed by reduce_from_tensor_parallel_region, then b is added once.
// A column-parallel layer followed by a row-parallel one (attention, MLP) costs one all-reduce in
// forward and one in backward, and nothing between them.
enum class Split { kWhole, kColumns, kRows };

struct Conv1DImpl : torch::nn::Module, cpprun::TensorParallelModule {
  torch::Tensor weight, bias;
  Split split = Split::kWhole;
  std::optional<cpprun::ProcessGroup> tp;  // the tensor-parallel group, when split
  int64_t parts = 1;
  Conv1DImpl(int64_t in, int64_t out) {
    weight = register_parameter("weight", torch::empty({in, out}));
    bias = register_parameter("bias", torch::empty({out}));
    // torch::nn::Linear's initialisation, for training from scratch: uniform in +-1/sqrt(in).
    torch::NoGradGuard no_grad;
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    weight.uniform_(-bound, bound);
    bias.uniform_(-bound, bound);
  }
  // This rank's shard of an [in, out] layer, uninitialised: the values are cut from a whole model
  // (shard_from below), so that every TP size starts from the same network.
  Conv1DImpl(int64_t in, int64_t out, Split split, const cpprun::ProcessGroup& group, int64_t parts = 1)
      : split(split), tp(group), parts(parts) {
    const int64_t n = group.size();
    weight = register_parameter("weight", torch::empty({split == Split::kRows ? in / n : in,
                                                        split == Split::kColumns ? out / n : out}));
    bias = register_parameter("bias", torch::empty({split == Split::kColumns ? out / n : out}));
  }
  // at::linear() of the transposed view: y = x W + b. Not addmm(bias, x, weight): autocast caches
  // its cast of a leaf weight, so a checkpointed block's recomputation got a cast made before it,
  // which cpprun::checkpoint refuses (the gradient could not flow); a view's cast is not cached.
  // at::linear, not torch::nn::functional::linear (nor torch::nn::Linear, which calls it): on an
  // input of 3 dimensions LibTorch's C++ functional multiplies (matmul) and then adds the bias as
  // a kernel of its own, forward and backward, where at::linear (Python's F.linear) makes one
  // addmm of the flattened input with the bias in the product: on an H200 at GPT-2's shape the
  // separate adds cost cpprun about a tenth of its tokens/s against PyTorch (docs/speed.md).
  torch::Tensor forward(const torch::Tensor& x) {
    switch (split) {
      case Split::kColumns: return at::linear(cpprun::copy_to_tensor_parallel_region(x, *tp), weight.t(), bias);
      case Split::kRows: return cpprun::reduce_from_tensor_parallel_region(at::linear(x, weight.t()), *tp) + bias;
      case Split::kWhole: break;
    }
    return at::linear(x, weight.t(), bias);
  }
  // What DDP/FSDP (clipping, the overlap check) and tensor_parallel_full_state_dict read.
  std::map<std::string, cpprun::TensorParallelSplit> tensor_parallel_splits() const override {
    switch (split) {
      case Split::kColumns: return {{"weight", {*tp, 1, parts}}, {"bias", {*tp, 0, parts}}};
      case Split::kRows: return {{"weight", {*tp, 0}}};
      case Split::kWhole: break;
    }
    return {};
  }
};
TORCH_MODULE(Conv1D);

// A Conv1D for a block: whole without tensor parallelism, else split as `split` says.
Conv1D make_conv1d(int64_t in, int64_t out, Split split, const std::optional<cpprun::ProcessGroup>& tp,
                   int64_t parts = 1) {
  return tp ? Conv1D(in, out, split, *tp, parts) : Conv1D(in, out);
}

// Causal self-attention: each position attends to itself and the positions before it. With a
// tensor-parallel group of t ranks, rank r computes heads [r*H/t, (r+1)*H/t) only: c_attn gives
// their queries, keys and values, and c_proj's rows for their outputs sum into the whole result.
struct AttentionImpl : torch::nn::Module {
  int64_t heads;  // on this rank
  bool fused;     // --attention sdpa
  Conv1D c_attn{nullptr}, c_proj{nullptr};
  AttentionImpl(int64_t embed, int64_t heads, bool fused, const std::optional<cpprun::ProcessGroup>& tp)
      : heads(tp ? heads / tp->size() : heads), fused(fused) {
    c_attn = register_module("c_attn", make_conv1d(embed, 3 * embed, Split::kColumns, tp, /*parts=*/3));  // q, k, v
    c_proj = register_module("c_proj", make_conv1d(embed, embed, Split::kRows, tp));
  }
  torch::Tensor forward(torch::Tensor x) {
    const int64_t B = x.size(0), T = x.size(1);
    auto qkv = c_attn(x);  // [B, T, 3 * heads * D]
    const int64_t D = qkv.size(2) / (3 * heads);
    auto parts = qkv.view({B, T, 3, heads, D}).permute({2, 0, 3, 1, 4});  // [3, B, heads, T, D]
    // unbind, not parts[0], [1], [2]: each select's backward writes a zero tensor of all of qkv's
    // size and autograd sums the three; unbind's is one stack (what Python's q, k, v = parts does).
    const auto qkv_parts = parts.unbind(0);
    const auto& q = qkv_parts[0];
    const auto& k = qkv_parts[1];
    const auto& v = qkv_parts[2];
    if (fused) {  // the same arithmetic, scale 1/sqrt(D) included, without the T x T scores in memory
      auto y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
      return c_proj(y.transpose(1, 2).reshape({B, T, heads * D}));
    }
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(D));
    auto future = torch::ones({T, T}, x.options().dtype(torch::kBool)).triu(1);
    auto att = torch::softmax(scores.masked_fill(future, -INFINITY), -1);
    return c_proj(torch::matmul(att, v).transpose(1, 2).reshape({B, T, heads * D}));
  }
};
TORCH_MODULE(Attention);

// With tensor parallelism c_fc's output features (the 4C hidden units) are split, and c_proj's
// matching input rows: the GELU runs on this rank's units only.
struct MlpImpl : torch::nn::Module {
  Conv1D c_fc{nullptr}, c_proj{nullptr};
  torch::nn::GELU act{nullptr};
  MlpImpl(int64_t embed, examples::Gelu gelu, const std::optional<cpprun::ProcessGroup>& tp) {
    c_fc = register_module("c_fc", make_conv1d(embed, 4 * embed, Split::kColumns, tp));
    act = register_module("act", torch::nn::GELU(torch::nn::GELUOptions().approximate(
                                     gelu == examples::Gelu::kTanh ? "tanh" : "none")));
    c_proj = register_module("c_proj", make_conv1d(4 * embed, embed, Split::kRows, tp));
  }
  torch::Tensor forward(const torch::Tensor& x) { return c_proj(act(c_fc(x))); }
};
TORCH_MODULE(Mlp);

// LayerNorms stay whole on every tensor-parallel rank (replicated): their inputs and their
// gradients are the same on all of them.
struct BlockImpl : torch::nn::Module {
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  Attention attn{nullptr};
  Mlp mlp{nullptr};
  BlockImpl(const Options& o, const std::optional<cpprun::ProcessGroup>& tp) {
    ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.embed}).eps(o.layer_norm_eps)));
    attn = register_module("attn", Attention(o.embed, o.heads, o.attention == "sdpa", tp));
    ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.embed}).eps(o.layer_norm_eps)));
    mlp = register_module("mlp", Mlp(o.embed, o.gelu, tp));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(ln_1(x));
    return x + mlp(ln_2(x));
  }
};
TORCH_MODULE(Block);

// The output layer is the token embedding, transposed (tied weights, as GPT-2): one tensor under
// the names "transformer.wte.weight" and "lm_head.weight", whose two uses' gradients autograd sums.
struct TiedHeadImpl : torch::nn::Module {
  torch::Tensor weight;
  explicit TiedHeadImpl(const torch::Tensor& embedding) { weight = register_parameter("weight", embedding); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::matmul(x, weight.t()); }
};
TORCH_MODULE(TiedHead);

// GPT2LMHeadModel's "transformer": embeddings, blocks h.0 ... h.(L-1), final LayerNorm. Under --tp
// only the blocks are split: the embeddings, ln_f and the tied head are whole on every rank.
struct TransformerImpl : torch::nn::Module {
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  std::vector<Block> blocks;  // h's, typed
  torch::nn::LayerNorm ln_f{nullptr};
  TransformerImpl(int64_t vocab, const Options& o, const std::optional<cpprun::ProcessGroup>& tp) {
    wte = register_module("wte", torch::nn::Embedding(vocab, o.embed));
    wpe = register_module("wpe", torch::nn::Embedding(o.positions, o.embed));
    h = register_module("h", torch::nn::ModuleList());
    for (int64_t i = 0; i < o.layers; ++i) h->push_back(blocks.emplace_back(o, tp));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.embed}).eps(o.layer_norm_eps)));
  }
};
TORCH_MODULE(Transformer);

struct GptImpl : torch::nn::Module {
  Transformer transformer{nullptr};
  TiedHead lm_head{nullptr};
  bool checkpoint_activations;
  // tp: the tensor-parallel group (--tp > 1), whose ranks each hold a shard of every block; none:
  // the whole model.
  GptImpl(int64_t vocab, const Options& o, const std::optional<cpprun::ProcessGroup>& tp = std::nullopt)
      : checkpoint_activations(o.checkpoint_activations) {
    transformer = register_module("transformer", Transformer(vocab, o, tp));
    lm_head = register_module("lm_head", TiedHead(transformer->wte->weight));
    // Small embeddings (GPT-2's 0.02): the tied head's logits start near zero, not at N(0, embed).
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(transformer->wte->weight, 0, 0.02);
    torch::nn::init::normal_(transformer->wpe->weight, 0, 0.02);
  }
  torch::Tensor forward(torch::Tensor idx) {  // [B, T] -> logits [B, T, vocab]
    auto x = transformer->wte(idx) + transformer->wpe(torch::arange(idx.size(1), idx.options()));
    for (auto& block : transformer->blocks) {
      // Checkpointed, a block keeps only its input for backward, which runs it again (under --tp
      // with its collectives, in the same order on every rank of the group).
      x = checkpoint_activations
              ? cpprun::checkpoint([b = block.ptr()](const torch::Tensor& h) { return b->forward(h); }, x)
              : block(x);
    }
    return lm_head(transformer->ln_f(x));
  }
};
TORCH_MODULE(Gpt);

// --pp: the Gpt as a torch::nn::Sequential of its own modules (the same tensors), which
// cpprun::PipelineStage cuts by child names: "embed" (token and position embeddings), "h0" ...,
// "ln_f", "head" (tied to the token embedding: the first and last stages each hold it, and the
// pipeline sums its two gradients).
struct EmbeddingsImpl : torch::nn::Module {
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  explicit EmbeddingsImpl(const Transformer& t) {
    wte = register_module("wte", t->wte);
    wpe = register_module("wpe", t->wpe);
  }
  torch::Tensor forward(const torch::Tensor& idx) { return wte(idx) + wpe(torch::arange(idx.size(1), idx.options())); }
};
TORCH_MODULE(Embeddings);

struct StageBlockImpl : torch::nn::Module {
  Block block{nullptr};
  bool checkpointed;
  StageBlockImpl(const Block& b, bool checkpoint_activations) : checkpointed(checkpoint_activations) {
    block = register_module("block", b);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return checkpointed ? cpprun::checkpoint([b = block.ptr()](const torch::Tensor& h) { return b->forward(h); }, x)
                        : block(x);
  }
};
TORCH_MODULE(StageBlock);

torch::nn::Sequential as_sequence(const Gpt& gpt, bool checkpoint_activations) {
  torch::nn::Sequential pipe;
  pipe->push_back("embed", Embeddings(gpt->transformer));
  for (size_t i = 0; i < gpt->transformer->blocks.size(); ++i) {
    pipe->push_back("h" + std::to_string(i), StageBlock(gpt->transformer->blocks[i], checkpoint_activations));
  }
  pipe->push_back("ln_f", gpt->transformer->ln_f);
  pipe->push_back("head", gpt->lm_head);
  return pipe;
}

// The names GPT-2's checkpoint gives the sequence's tensors ("h3.block.attn.c_attn.weight" is
// "transformer.h.3.attn.c_attn.weight"), so that the stages' --save is the unsplit Gpt's and
// loads under any layout, with or without --pp.
std::vector<std::pair<std::string, std::string>> gpt_names(int layers) {
  std::vector<std::pair<std::string, std::string>> prefixes{
      {"embed", "transformer"}, {"ln_f", "transformer.ln_f"}, {"head", "lm_head"}};
  for (int i = 0; i < layers; ++i) {
    prefixes.emplace_back("h" + std::to_string(i) + ".block", "transformer.h." + std::to_string(i));
  }
  return prefixes;
}

// After --pp training each rank holds its stages' trained tensors: every rank gets all of them
// (each broadcast from its stage's rank; a tied one from the first stage's), so the whole Gpt
// evaluates and samples as without --pp. Collective.
void gather_stages(torch::nn::Sequential pipe, const cpprun::PipelineSplit& split, const cpprun::ProcessGroup& group) {
  for (const auto& p : pipe->parameters()) {
    if (cpprun::is_deferred(p)) {  // a deferred model's other stages get memory now (their values come next)
      cpprun::materialize(*pipe);
      break;
    }
  }
  std::map<std::string, int> stage_of;
  for (size_t s = 0; s < split.size(); ++s) {
    for (const auto& name : split[s]) stage_of[name] = static_cast<int>(s);
  }
  torch::NoGradGuard no_grad;
  std::set<const c10::TensorImpl*> done;
  for (const auto& child : pipe->named_children()) {
    for (const auto& p : child.value()->parameters()) {
      if (done.insert(p.unsafeGetTensorImpl()).second) cpprun::broadcast(group, p, stage_of.at(child.key()) % group.size());
    }
  }
}

// The GPT-2 checkpoint in DIR (one model.safetensors, or sharded with its index) into the model, by
// name: collective; rank 0 reads, every rank keeps its part. Hugging Face's files leave out the tied
// lm_head.weight, and older ones carry the attention mask as a buffer (attn.bias, attn.masked_bias):
// those differences are expected, any other is refused, listing them all.
// `model`: a DataParallel<GptImpl>, or (under --tp, before it is split) the whole Gpt.
template <typename Model>
void load_gpt2(Model& model, const std::string& dir, const Options& o, int64_t vocab) {
  auto report = cpprun::load_state_dict(model, dir, cpprun::StateDictOptions().strict(false));
  // A GPT2Model's file (the Hub's "gpt2" is one) names the same tensors without "transformer.":
  // read it again under that prefix, as from_pretrained does (nothing of it loaded the first time).
  const auto& unexpected = report.unexpected_keys;
  if (std::find(unexpected.begin(), unexpected.end(), "wte.weight") != unexpected.end()) {
    report = cpprun::load_state_dict(model, dir, cpprun::StateDictOptions().strict(false).file_key_prefix("transformer."));
  }
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  std::string problems;
  for (const auto& key : report.missing_keys) {
    if (key != "lm_head.weight") problems += "\n  missing: " + key;
  }
  for (const auto& key : report.unexpected_keys) {
    if (ends_with(key, ".attn.bias") || ends_with(key, ".attn.masked_bias")) continue;
    problems += "\n  unexpected: " + key;
  }
  for (const auto& what : report.mismatched) problems += "\n  other shape or dtype: " + what;
  if (problems.empty()) return;
  throw std::invalid_argument("--init-from " + dir + ": its tensors are not those of the GPT2LMHeadModel its config.json "
                              "describes (n_layer " + std::to_string(o.layers) + ", n_head " + std::to_string(o.heads) +
                              ", n_embd " + std::to_string(o.embed) + ", n_positions " + std::to_string(o.positions) +
                              ", vocab_size " + std::to_string(vocab) + "; train_gpt's weights float32):" + problems +
                              "\nNothing was trained.");
}

// This rank's part of `whole` under `split`: chunk r of each of its `parts` blocks along its dim
// (what tensor_parallel_full_state_dict gathers back).
torch::Tensor shard_of(const torch::Tensor& whole, const cpprun::TensorParallelSplit& split) {
  std::vector<torch::Tensor> mine;
  for (const auto& block : whole.chunk(split.parts, split.dim)) {
    mine.push_back(block.chunk(split.group.size(), split.dim)[split.group.rank()]);
  }
  return torch::cat(mine, split.dim);
}

// Copies `whole`'s parameters into the tensor-parallel `sharded` (the same names): this rank's
// shard of each split one, the rest as they are.
void shard_from(torch::nn::Module& sharded, torch::nn::Module& whole) {
  const auto splits = cpprun::tensor_parallel_splits(sharded);
  const auto source = whole.named_parameters();
  torch::NoGradGuard no_grad;
  for (const auto& item : sharded.named_parameters()) {
    const auto split = splits.find(item.key());
    const auto& full = source[item.key()];
    item.value().copy_(split == splits.end() ? full : shard_of(full, split->second));
  }
}

// The whole model again from the shards of a tensor-parallel one: collective over the TP group
// (tensor_parallel_full_state_dict gathers each split parameter on every rank).
Gpt unsplit(torch::nn::Module& sharded, int64_t vocab, const Options& o, const torch::Device& device) {
  const auto full = cpprun::tensor_parallel_full_state_dict(sharded);
  Gpt whole(vocab, o);
  whole->to(device, o.dtype == "float64" ? torch::kDouble : torch::kFloat);  // as the shards (--dtype)
  torch::NoGradGuard no_grad;
  for (const auto& item : whole->named_parameters()) item.value().copy_(full[item.key()]);
  return whole;
}

// After --export wrote DIR/model.safetensors: an earlier sharded save's index and shards there
// (model.safetensors.index.json, model-00001-of-00007.safetensors, ...) removed, as
// transformers' save_pretrained cleans the folder of a previous save. Left, the index beside the new
// file made the directory one that from_pretrained and --init-from refuse (or read the old shards).
void remove_earlier_shards(const std::string& dir) {
  std::error_code ignored;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ignored)) {
    const std::string name = entry.path().filename().string();
    const bool shard = name.size() == std::string("model-00001-of-00002.safetensors").size() &&
                       name.rfind("model-", 0) == 0 && name.find("-of-") == 11 &&
                       name.substr(name.size() - 12) == ".safetensors";
    if (name == "model.safetensors.index.json" || shard) std::filesystem::remove(entry.path(), ignored);
  }
}

// Where a run stood when --save wrote its checkpoint: DIR/trainer.json, beside the model's and the
// optimizer's files and written after them, so that a directory holding it holds a whole save.
// train_gpt has no dropout: the only random draws of its training are the sampler's, a permutation
// of the windows drawn from seed + epoch (the seed is DistributedSampler's default, 0), so the epoch
// and how many of its windows were taken say where the data goes on. They are counted over all
// data-parallel ranks, which take the permutation in turn (rank r of n its r-th, (r+n)-th, ...
// window, as PyTorch's DistributedSampler): at any number of ranks the next windows are its next.
struct TrainerState {
  int64_t step = 0, steps = 0;            // the last step done, of the run's --steps
  int64_t epoch = 0, epoch_windows = 0;   // the sampler's epoch, and its windows taken (all ranks)
  int64_t windows = 0, global_batch = 0;  // the training windows (--text, --block); windows per step
  std::string dtype, amp, layout, save_id;  // layout: "--mode fsdp --stage 3 --tp 2, 4 ranks", for the record
  // The model's flags, those its tensors' shapes do not show too ("--layers 2 --embed 32 --heads 4
  // --gelu tanh --layer-norm-eps 1e-05"), and the steps of an epoch (epoch_steps below); "" and 0
  // in a trainer.json written before they were recorded.
  std::string model;
  int64_t epoch_steps = 0;
  // The model's vocabulary and positions: the text's characters and --block, or --init-from's
  // vocab_size and n_positions, which no flag gives a resumed run; 0 in an earlier trainer.json.
  int64_t vocab = 0, positions = 0;
};

// The flags that make the model: another --heads or --gelu gives tensors of the same shapes.
std::string model_flags(const Options& o) {
  char eps[32];
  std::snprintf(eps, sizeof eps, "%.9g", o.layer_norm_eps);
  return "--layers " + std::to_string(o.layers) + " --embed " + std::to_string(o.embed) + " --heads " +
         std::to_string(o.heads) + " --gelu " + (o.gelu == examples::Gelu::kTanh ? "tanh" : "exact") +
         " --layer-norm-eps " + eps;
}

// Steps an epoch lasts: each of `dp` ranks takes ceil(windows / dp) of them (DistributedSampler
// pads the epoch to a multiple of the ranks, as PyTorch's), `rank_batch` a step, and a tail of
// fewer goes unused. It depends on the rank count: where two runs' differ, the data order of the
// epochs after the one a resumed run starts in differs too.
int64_t epoch_steps(int64_t windows, int64_t dp, int64_t rank_batch) { return (windows + dp - 1) / dp / rank_batch; }

std::string trainer_json(const TrainerState& t) {
  auto quoted = [](const std::string& text) {
    std::string json;
    cpprun::detail::append_json_string(json, text);
    return json;
  };
  return "{\"step\": " + std::to_string(t.step) + ", \"steps\": " + std::to_string(t.steps) +
         ", \"epoch\": " + std::to_string(t.epoch) + ", \"epoch_windows\": " + std::to_string(t.epoch_windows) +
         ", \"windows\": " + std::to_string(t.windows) + ", \"global_batch\": " + std::to_string(t.global_batch) +
         ", \"dtype\": " + quoted(t.dtype) + ", \"amp\": " + quoted(t.amp) + ", \"layout\": " + quoted(t.layout) +
         ", \"save_id\": " + quoted(t.save_id) + ", \"model\": " + quoted(t.model) +
         ", \"epoch_steps\": " + std::to_string(t.epoch_steps) + ", \"vocab\": " + std::to_string(t.vocab) +
         ", \"positions\": " + std::to_string(t.positions) + "}\n";
}

TrainerState read_trainer_json(const std::string& text, const std::string& file) {
  using cpprun::detail::Json;
  Json json;
  try {
    json = cpprun::detail::parse_json(text, 4);
  } catch (const cpprun::detail::JsonSyntaxError& e) {
    throw std::invalid_argument("--resume: " + file + " is not JSON: " + e.what());
  }
  auto get = [&](const std::string& key, Json::Kind kind) -> const std::string& {
    for (const auto& [name, value] : json.members) {
      if (name == key && value.kind == kind) return value.text;
    }
    throw std::invalid_argument("--resume: " + file + " has no " + (kind == Json::Kind::kString ? "string" : "integer") +
                                " \"" + key + "\": not a trainer.json train_gpt --save wrote");
  };
  auto integer = [&](const std::string& key) { return examples::number<int64_t>(file + " \"" + key + "\"", get(key, Json::Kind::kNumber), 0); };
  TrainerState t;
  t.step = integer("step"), t.steps = integer("steps"), t.epoch = integer("epoch");
  t.epoch_windows = integer("epoch_windows"), t.windows = integer("windows"), t.global_batch = integer("global_batch");
  t.dtype = get("dtype", Json::Kind::kString), t.amp = get("amp", Json::Kind::kString);
  t.layout = get("layout", Json::Kind::kString), t.save_id = get("save_id", Json::Kind::kString);
  const auto has = [&](const std::string& key) {
    return std::any_of(json.members.begin(), json.members.end(), [&](const auto& m) { return m.first == key; });
  };
  if (has("model")) t.model = get("model", Json::Kind::kString);  // absent before they were recorded
  if (has("epoch_steps")) t.epoch_steps = integer("epoch_steps");
  if (has("vocab")) t.vocab = integer("vocab"), t.positions = integer("positions");
  return t;
}

// PATH's bytes as rank 0 reads them, on every rank (collective, as the checkpoint loads: rank 0
// reads), so that every rank decides alike; nothing where rank 0 has no such file.
// A file that is there but cannot be read (a FIFO, a directory, no permission) is an error on
// every rank, rather than rank 0's alone while the others wait for its bytes.
std::optional<std::string> read_on_rank0(const cpprun::ProcessGroup& group, const std::string& path) {
  std::string bytes;
  int found = 0;  // 1: read; 2: there but unreadable, `bytes` says why
  if (group.rank() == 0) {
    try {
      bytes = cpprun::detail::read_regular_file(path, "checkpoint file");
      found = 1;
    } catch (const std::system_error& e) {
      if (e.code() != std::errc::no_such_file_or_directory) found = 2, bytes = e.what();
    } catch (const std::runtime_error& e) {  // not a regular file (the message names it)
      found = 2, bytes = e.what();
    } catch (const std::exception& e) {  // too large to hold (std::bad_alloc)
      found = 2, bytes = "cannot read " + path + ": " + e.what();
    }
  }
  cpprun::broadcast_object(group, found);
  cpprun::broadcast_object(group, bytes);
  if (found == 2) throw std::runtime_error(bytes);
  if (!found) return std::nullopt;
  return bytes;
}

// "3,1,4" as token ids, each below the vocabulary's size; at most the model's positions.
std::vector<int64_t> parse_token_ids(const std::string& list, int64_t vocab, int64_t positions) {
  std::vector<int64_t> ids;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    const int64_t id = examples::number<int64_t>("--logits-for", item, 0);
    if (id >= vocab) {
      throw std::invalid_argument("--logits-for: token id " + item + " is outside the vocabulary (" +
                                  std::to_string(vocab) + " tokens: 0 to " + std::to_string(vocab - 1) + ")");
    }
    ids.push_back(id);
  }
  if (ids.empty() || static_cast<int64_t>(ids.size()) > positions) {
    throw std::invalid_argument("--logits-for needs 1 to " + std::to_string(positions) +
                                " comma-separated token ids (the model's positions), got \"" + list + "\"");
  }
  return ids;
}

// The training loss of logits [B, T, V] against targets [B, T] (--loss): the fused kernels' loss
// (float32, or float64 for float64 logits) or F::cross_entropy on the logits cast to float32 (or
// float64), as bench/gpt_twin.py computes it. Both compute the same function in the same precision.
torch::Tensor training_loss(const torch::Tensor& logits, const torch::Tensor& targets, bool fused, bool float64) {
  const auto rows = logits.reshape({-1, logits.size(-1)});
  if (fused) return cpprun::fused_cross_entropy(rows, targets.reshape({-1}));
  return torch::nn::functional::cross_entropy(rows.to(float64 ? torch::kDouble : torch::kFloat), targets.reshape({-1}));
}

// --loss: whether the training loss is cpprun::fused_cross_entropy. auto takes it on CUDA where it
// runs (its kernels compiled now, for the dtype the logits will have), and otherwise says why and
// trains with F::cross_entropy; --loss fused where it cannot run is refused before the first step.
bool choose_fused_loss(const Options& o, const torch::Device& device) {
  if (o.loss == "aten" || (o.loss == "auto" && !device.is_cuda())) return false;
  const auto logits_dtype = o.dtype == "float64" ? torch::kDouble
                            : o.amp == "bf16"    ? torch::kBFloat16
                            : o.amp == "fp16"    ? torch::kHalf
                                                 : torch::kFloat;
  std::string why_not;
  if (cpprun::fused_cross_entropy_available(device, logits_dtype, &why_not)) return true;
  if (o.loss == "fused") {
    throw std::invalid_argument("--loss fused cannot run on " + device.str() + ": " + why_not +
                                "\n(--loss aten trains with F::cross_entropy instead)");
  }
  std::fprintf(stderr, "note: --loss auto: the fused loss cannot run on %s, so this trains with F::cross_entropy "
               "(--loss aten): %s\n", device.str().c_str(), why_not.c_str());
  return false;
}

// The device's dense peak in TFLOPS for --amp's type: --peak-tflops, else 989 for bf16 and fp16 on
// an H100 or H200 (SXM), else 0 (unknown: no MFU printed).
double peak_tflops(const Options& o, const torch::Device& device) {
  if (o.peak_tflops > 0) return o.peak_tflops;
#ifdef CPPRUN_WITH_CUDA
  if (device.is_cuda() && o.amp != "fp32") {
    const std::string name = at::cuda::getDeviceProperties(device.index())->name;
    if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) return 989;
  }
#else
  (void)device;
#endif
  return 0;
}

// Note [Outputs checked before the first step]
// What train_gpt writes after training (--save, --export, --losses-out, --logits-out, --trace) is
// tried before it trains, by each rank that will write it: a run that would train for hours and
// then fail to keep anything fails at the start instead, naming the flag. --save and --export's
// directories are made now, as the end would make them; a file is created beside each output
// (where write_file_atomically writes its FILE.tmp) and removed. Tried, not access(): root passes
// access() on a directory nothing can be created in (/proc), and a read-only file system shows
// only when written. mkstemp names the file: ranks on other hosts may share the directory and a pid.
void try_creating_a_file_in(const std::filesystem::path& dir, const std::string& flag_and_value) {
  std::string probe = (dir / ".train_gpt_write_check.XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) {
    throw std::invalid_argument(flag_and_value + ": cannot create a file in " + dir.string() + " (" +
                                std::strerror(errno) + "), so nothing could be written there after training; " +
                                "name a directory this process may write");
  }
  ::close(fd);
  std::error_code ignored;
  std::filesystem::remove(probe, ignored);
}

void check_output_directory(const char* flag, const std::string& dir) {
  if (dir.empty()) return;
  const std::string named = std::string(flag) + " " + dir;
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error || !std::filesystem::is_directory(dir, error)) {
    throw std::invalid_argument(named + ": cannot make that directory (" +
                                (error ? error.message() : std::string("a file of that name is there")) +
                                "); name a directory this process may create or write");
  }
  try_creating_a_file_in(dir, named);
}

void check_output_file(const char* flag, const std::string& path) {
  if (path.empty()) return;
  const std::string named = std::string(flag) + " " + path;
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) throw std::invalid_argument(named + ": that is a directory; name a file");
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::filesystem::path dir = parent.empty() ? std::filesystem::path(".") : parent;
  if (!std::filesystem::is_directory(dir, error)) {
    throw std::invalid_argument(named + ": its directory " + dir.string() +
                                (error && error != std::errc::no_such_file_or_directory
                                     ? " cannot be read (" + error.message() + ")"
                                     : std::string(" does not exist; create it first")));
  }
  try_creating_a_file_in(dir, named);
}

// Each rank checks what it writes: every rank its share of --save; rank 0 the rest, and under
// --pp every rank --export too (the stages write their parts).
void check_outputs(const Options& opt, int rank) {
  check_output_directory("--save", opt.save_dir);
  if (rank == 0 || opt.pp > 1) check_output_directory("--export", opt.export_dir);
  if (rank != 0) return;
  check_output_file("--losses-out", opt.losses_out);
  check_output_file("--logits-out", opt.logits_out);
  check_output_file("--trace", opt.trace);
}

int run(int argc, char** argv) {
  Options opt = parse(argc, argv);  // --resume may give the vocabulary and positions (below)
  if (opt.help) return examples::print_usage(kUsage);
  auto group = cpprun::init_process_group();
  const int rank = group.rank();
  check_outputs(opt, rank);  // Note [Outputs checked before the first step]
  if (group.size() % opt.tp != 0) {
    throw std::invalid_argument("--tp " + std::to_string(opt.tp) + " does not divide the " +
                                std::to_string(group.size()) + " ranks: they form groups of --tp consecutive ranks; run a multiple of " +
                                std::to_string(opt.tp) + " ranks (--nproc_per_node) or choose a --tp that divides " +
                                std::to_string(group.size()));
  }
  std::optional<cpprun::DeviceMesh> mesh;
  std::optional<cpprun::ProcessGroup> tp_group;
  const int pipeline_ranks = opt.pp * opt.tp;  // --pp stages, each over --tp ranks
  if (opt.pp > 1 && (group.size() % pipeline_ranks != 0 || (opt.mode == "none" && group.size() != opt.pp))) {
    const std::string per_stage = opt.tp > 1 ? " x --tp " + std::to_string(opt.tp) : "";
    throw std::invalid_argument("--pp " + std::to_string(opt.pp) + per_stage + " runs pipelines of " +
                                std::to_string(pipeline_ranks) + " ranks (one stage a rank" +
                                (opt.tp > 1 ? " and tensor-parallel rank" : "") +
                                "), data-parallel across them with --mode ddp or fsdp; this job has " +
                                std::to_string(group.size()) + " ranks" +
                                (opt.mode == "none" ? " and --mode none (one pipeline)" : "") + ": run a multiple of " +
                                std::to_string(pipeline_ranks) + " ranks (--mode ddp or fsdp), or --nproc_per_node=" +
                                std::to_string(pipeline_ranks));
  }
  // The ranks as a {dp, pp, tp} grid (the dimensions used), tp innermost: rank = (d * pp + s) * tp + t.
  // Each run of --tp consecutive ranks splits the model's (under --pp: one stage's) layers among
  // themselves (mesh.group("tp")); the ranks with the same d and t, one per stage, are one
  // pipeline (mesh.group("pp")); those differing only in d hold the same part of the model,
  // replicated or sharded by DDP/FSDP over it (mesh.group("dp")), under --pp reduced once a step.
  // Without --tp or --pp, every rank is data-parallel.
  {
    std::vector<int> shape{group.size() / pipeline_ranks};
    std::vector<std::string> names{"dp"};
    if (opt.pp > 1) shape.push_back(opt.pp), names.push_back("pp");
    if (opt.tp > 1) shape.push_back(opt.tp), names.push_back("tp");
    if (shape.size() > 1) mesh.emplace(group, shape, names);
  }
  if (opt.tp > 1) tp_group = mesh->group("tp");
  const cpprun::ProcessGroup& dp_group = mesh ? mesh->group("dp") : group;
  const cpprun::ProcessGroup& pp_group = opt.pp > 1 ? mesh->group("pp") : group;
  if (opt.mode == "none" && group.size() > 1 && opt.pp == 1) {
    throw std::invalid_argument("--mode none trains the model without any wrapper, so its " + std::to_string(group.size()) +
                                " ranks would each train a model of their own: run it on one rank (--nproc_per_node=1), "
                                "or use --mode ddp or fsdp");
  }

  // A regular file's bytes: a FIFO blocked the read for ever, /dev/zero filled the memory, and a
  // directory read as an empty text.
  const std::string text = cpprun::detail::read_regular_file(opt.text, "--text");
  // --resume: the saved model's vocabulary and positions, before the model is built: an --init-from
  // run's are its config.json's, which no flag gives again (the checkpoint then refused a model
  // built for the text's characters and --block). A trainer.json written before they were recorded
  // has none; a missing one is refused below. Read once (collective), here, for the checks below too.
  std::string vocab_source = opt.init_from.empty() ? "" : "--init-from " + opt.init_from + "'s vocab_size";
  std::optional<std::string> trainer_json_bytes;  // --resume's DIR/trainer.json as rank 0 read it
  if (!opt.resume_dir.empty()) {
    trainer_json_bytes = read_on_rank0(group, opt.resume_dir + "/trainer.json");
    if (const auto& json = trainer_json_bytes) {
      const TrainerState saved = read_trainer_json(*json, opt.resume_dir + "/trainer.json");
      if (saved.vocab > 0) {
        if (!opt.block_given) opt.block = std::min<int64_t>(opt.block, saved.positions);  // as --init-from's
        if (opt.block > saved.positions) {
          throw std::invalid_argument("--resume " + opt.resume_dir + ": the checkpoint's model has " +
                                      std::to_string(saved.positions) + " positions, fewer than --block " +
                                      std::to_string(opt.block) + ": resume with the saved run's --block");
        }
        opt.vocab = saved.vocab, opt.positions = saved.positions;
        vocab_source = "the checkpoint's vocabulary";
      }
    }
  }
  // Training windows come from the first nine tenths, held-out windows from the last tenth.
  const int64_t needed = 10 * (opt.block + 2);
  if (static_cast<int64_t>(text.size()) < needed) {
    throw std::invalid_argument("--text " + opt.text + " has " + std::to_string(text.size()) + " characters; --block " +
                                std::to_string(opt.block) + " needs at least " + std::to_string(needed));
  }
  std::string vocab;  // the characters that occur, sorted
  for (int c = 0; c < 256; ++c) {
    if (text.find(static_cast<char>(c)) != std::string::npos) vocab += static_cast<char>(c);
  }
  // The model's vocabulary: the text's characters, or --init-from's vocab_size, which must hold them.
  const int64_t model_vocab = opt.vocab ? opt.vocab : static_cast<int64_t>(vocab.size());
  if (model_vocab < static_cast<int64_t>(vocab.size())) {
    throw std::invalid_argument("--text " + opt.text + " has " + std::to_string(vocab.size()) + " distinct characters, " +
                                "more than " + vocab_source + " of " + std::to_string(model_vocab) +
                                " (train_gpt encodes a character per token)");
  }
  const auto logits_tokens = opt.logits_for.empty() ? std::vector<int64_t>{}
                                                    : parse_token_ids(opt.logits_for, model_vocab, opt.positions);
  std::vector<int64_t> ids;
  for (char c : text) ids.push_back(static_cast<int64_t>(vocab.find(c)));
  auto encoded = torch::tensor(ids, torch::kLong);
  // The last tenth is held out; training windows start anywhere in the rest.
  const int64_t split = encoded.size(0) * 9 / 10, windows = split - opt.block - 1;

  // This rank's GPU where there is one (cuda:LOCAL_RANK), else the CPU: model and data live there.
  const auto device = cpprun::local_device();
  encoded = encoded.to(device);
  torch::manual_seed(0);
  auto build = [&] { return Gpt(model_vocab, opt); };
  // Deferred: the parameters get memory (and the values eager construction gives) only when the
  // wrapper materialises them, under ZeRO-3 one block at a time, keeping only this rank's shard.
  Gpt gpt = opt.deferred_init == "on" ? cpprun::deferred_init(build) : build();
  if (!device.is_cpu()) gpt->to(device);  // on a deferred module, recorded for materialisation
  if (opt.deferred_init == "on" && opt.mode == "ddp" && opt.pp == 1) cpprun::materialize(gpt);
  int64_t params = 0;  // of the whole model
  for (const auto& p : cpprun::unique_parameters(*gpt)) params += p.numel();
  // --tp: every rank built the same whole model (and loads --init-from into it); each keeps its
  // shard of every block. So any --tp starts from the network one process trains.
  // float64 weights (a --dtype float64 run's export) load into a model cast first.
  const bool float64_file = opt.init_dtype == "float64";
  if (tp_group) {
    if (float64_file) gpt->to(torch::kDouble);
    if (!opt.init_from.empty()) load_gpt2(gpt, opt.init_from, opt, model_vocab);
    Gpt sharded(model_vocab, opt, tp_group);
    sharded->to(device);
    if (float64_file) sharded->to(torch::kDouble);
    shard_from(*sharded, *gpt);
    gpt = sharded;
  }
  // --dtype float64: the whole model cast before a wrapper sees it, so --init-from's float32 tensors
  // are loaded first (into a float64 model they would be refused as another dtype).
  const bool float64 = opt.dtype == "float64";
  const bool fused_loss = choose_fused_loss(opt, device);
  if (float64) {
    if (float64_file) gpt->to(torch::kDouble);
    if (!opt.init_from.empty() && !tp_group) load_gpt2(gpt, opt.init_from, opt, model_vocab);
    gpt->to(torch::kDouble);
  }
  // DDP replicates everything; FSDP (ZeRO) shards optimizer state, at stage 2 also gradients and
  // at stage 3 also parameters, one unit per transformer block. Either is a DataParallel<Gpt>:
  // the training loop below is the same for both. Under --tp they run across the data-parallel
  // dimension only, over this rank's shards.
  auto per_block = [](const torch::nn::Module& m) { return dynamic_cast<const BlockImpl*>(&m) != nullptr; };
  auto per_block_fsdp = cpprun::FsdpOptions().stage(opt.stage).wrap_policy(per_block);
  // --mode none: no wrapper (model stays empty); the loop calls gpt itself.
  cpprun::DataParallel<GptImpl> model = nullptr;
  if (opt.pp == 1 && opt.mode == "ddp") model = cpprun::DistributedDataParallel(gpt, dp_group);
  else if (opt.pp == 1 && opt.mode == "fsdp") model = cpprun::FullyShardedDataParallel(gpt, dp_group, per_block_fsdp);
  const bool wrapped = !model.is_empty();
  if (!opt.init_from.empty() && !tp_group && !float64 && opt.pp == 1) {
    if (wrapped) load_gpt2(model, opt.init_from, opt, model_vocab);
    else load_gpt2(gpt, opt.init_from, opt, model_vocab);
  }
  auto forward = [&](const torch::Tensor& x) { return wrapped ? model->forward(x) : gpt->forward(x); };
  // --pp: the model as a sequence of children (the same modules and tensors), cut into one stage
  // per rank; each rank trains its stage only (a deferred model materialises only it).
  torch::nn::Sequential pipe = nullptr;
  std::vector<cpprun::PipelineStage> stages;  // this rank's (2 with interleaved-1f1b, looped-bfs), before the schedule using them
  std::unique_ptr<cpprun::PipelineSchedule> schedule;
  std::vector<cpprun::PipelineStage*> my_stages;
  cpprun::PipelineSplit stage_split;  // the child names of each stage
  if (opt.pp > 1) {
    pipe = as_sequence(gpt, opt.checkpoint_activations);
    const int stages_per_rank = opt.pp_schedule == "interleaved-1f1b" || opt.pp_schedule == "looped-bfs" ? 2 : 1;
    stage_split = cpprun::split_evenly(pipe, opt.pp * stages_per_rank);
    auto loss_of = [float64, fused_loss](const torch::Tensor& logits, const torch::Tensor& targets) {
      return training_loss(logits, targets, fused_loss, float64);
    };
    for (int k = 0; k < stages_per_rank; ++k) stages.emplace_back(pipe, stage_split, pp_group, pp_group.rank() + k * opt.pp);
    for (auto& s : stages) {
      my_stages.push_back(&s);
      s.set_state_dict_prefixes(gpt_names(opt.layers));  // checkpoints under GPT-2's names
      // --tp: a stage of no block ([ln_f..head]) is whole on each rank of its tensor-parallel group.
      if (tp_group) s.set_tensor_parallel_group(*tp_group);
    }
    // --mode fsdp: each stage sharded over its copies in the other pipelines, one unit per block;
    // the optimizer below takes the shards. ZeRO-3 keeps each unit gathered from its first use in
    // a step to the step's reduction, as torchtitan does under PP (no per-micro-batch gathers).
    if (opt.mode == "fsdp") {
      auto stage_fsdp = per_block_fsdp;
      if (opt.stage == 3) stage_fsdp.reshard_after_forward(false).gathered_unit_limit(std::numeric_limits<int>::max());
      for (auto& s : stages) s.set_data_parallel(cpprun::FullyShardedDataParallel(s.module(), dp_group, stage_fsdp));
    }
    // --init-from: into the stages, each its part (a deferred model's only this rank's); the head's
    // copy of the token embedding, which GPT-2's files omit, comes from the first stage's.
    if (!opt.init_from.empty() && !tp_group && !float64) load_gpt2(my_stages, opt.init_from, opt, model_vocab);
    schedule = cpprun::make_schedule(opt.pp_schedule, my_stages, opt.microbatches, loss_of);
    if (opt.mode == "ddp" && dp_group.size() > 1) schedule->set_data_parallel_group(dp_group);
    if (rank == 0) {
      std::printf("pipeline parallel: %zu stages over %d ranks (%s), %s, %d micro-batches of %d windows",
                  stage_split.size(), opt.pp, stages_per_rank > 1 ? "2 a rank" : "1 a rank", opt.pp_schedule.c_str(),
                  opt.microbatches, opt.batch / opt.microbatches);
      if (opt.mode == "fsdp") {
        std::printf(", %d pipelines (FSDP ZeRO-%d over them%s)", dp_group.size(), opt.stage,
                    opt.stage == 3 ? ", units gathered once a step" : "");
      } else if (dp_group.size() > 1) {
        std::printf(", %d pipelines (data parallel)", dp_group.size());
      }
      std::printf(":");
      for (size_t s = 0; s < stage_split.size(); ++s) {
        std::printf(" [%s..%s]", stage_split[s].front().c_str(), stage_split[s].back().c_str());
      }
      std::printf("\n");
    }
  }
  // AdamW as nanoGPT builds it: weight decay on 2-D weights (matmuls, embeddings) only, not on
  // biases and norms. By name and shape, the same under DDP and FSDP (whose parameters are this
  // rank's rows of each, under the model's own names); each tensor once (the tied embedding has
  // two names).
  std::vector<torch::Tensor> decay, no_decay;
  std::set<const c10::TensorImpl*> seen;  // --pp: a rank's two stages (interleaved) give each tensor once
  for (const auto& s : my_stages) {
    // FSDP: this rank's shards (rows of each tensor, so a 2-D weight stays 2-D).
    const torch::nn::Module& trained = s->data_parallel().is_empty() ? static_cast<const torch::nn::Module&>(*s->module())
                                                                      : *s->data_parallel();
    for (const auto& item : cpprun::unique_named_parameters(trained)) {
      if (seen.insert(item.value().unsafeGetTensorImpl()).second) (item.value().dim() >= 2 ? decay : no_decay).push_back(item.value());
    }
  }
  if (opt.pp == 1) {
    for (const auto& item : cpprun::unique_named_parameters(wrapped ? static_cast<torch::nn::Module&>(*model) : *gpt)) {
      (item.value().dim() >= 2 ? decay : no_decay).push_back(item.value());
    }
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(opt.lr).weight_decay(0.1)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(opt.lr).weight_decay(0)));
  // Either is a torch::optim::AdamW: the same state, files and GradScaler path.
  std::unique_ptr<torch::optim::AdamW> optimizer_owned;
  if (opt.optimizer == "fused") optimizer_owned = std::make_unique<cpprun::FusedAdamW>(groups, torch::optim::AdamWOptions(opt.lr));
  else optimizer_owned = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(opt.lr));
  torch::optim::AdamW& optimizer = *optimizer_owned;
  if (opt.cuda_graph && !device.is_cuda()) {
    throw std::invalid_argument("--cuda-graph needs a GPU; this run trains on " + device.str());
  }
  // Mixed precision by autocast (matmuls in bf16 or fp16, parameters and optimizer in fp32); fp16's
  // narrow range needs the loss scaled, and an overflow on any rank skips the step on all.
  const auto device_type = device.type();
  if (opt.amp != "fp32") {
    at::autocast::set_autocast_dtype(device_type, opt.amp == "bf16" ? at::kBFloat16 : at::kHalf);
  }
  cpprun::GradScaler scaler(group, cpprun::GradScalerOptions().enabled(opt.amp == "fp16"));
  // --pp: each micro-batch's loss scaled on the last stage; the overflow check is over every rank,
  // so all stages (and pipelines) skip a step together.
  if (schedule && opt.amp == "fp16") schedule->set_grad_scaler(scaler);
  int skipped = 0;
  const int64_t rank_batch = static_cast<int64_t>(opt.batch) * opt.grad_accum;  // windows per rank and step
  // --pp: every rank of the pipeline takes the same windows (its stage reads what it needs).
  const int dp_size = dp_group.size(), dp_rank = dp_group.rank();
  const int64_t global_batch = rank_batch * dp_size;                              // windows per step
  // A step takes rank_batch windows of the rank's share of an epoch (DistributedSampler's, padded
  // to a multiple of the ranks): a larger batch never fills, and the slice of a short one failed in
  // ATen's words.
  const int64_t rank_windows = (windows + dp_size - 1) / dp_size;
  if (rank_batch > rank_windows) {
    const std::string accum = opt.grad_accum > 1 ? " x --grad-accum " + std::to_string(opt.grad_accum) : "";
    throw std::invalid_argument("--batch " + std::to_string(opt.batch) + accum + " takes " +
                                std::to_string(rank_batch) + " windows a step on each data-parallel rank, more than " +
                                "the " + std::to_string(rank_windows) + " an epoch gives each of the " +
                                std::to_string(dp_size) + " (--text " + opt.text + " holds " + std::to_string(windows) +
                                " training windows of --block " + std::to_string(opt.block) +
                                "): give a smaller --batch, or a longer --text");
  }

  // --resume: where the saved run stood (trainer.json), then its model and optimizer state, each
  // rank taking its part under this run's layout (collective: rank 0 reads the files).
  TrainerState resumed;  // step 0: a new run
  if (!opt.resume_dir.empty()) {
    const std::string dir = opt.resume_dir + "/", what = "--resume " + opt.resume_dir + ": ";
    const auto& json = trainer_json_bytes;  // read above, before the model was built
    if (!json && !std::filesystem::is_directory(opt.resume_dir)) {
      throw std::invalid_argument(what + "no such directory: give the DIR an earlier run's --save wrote");
    }
    if (!json) {
      throw std::invalid_argument(what + "no trainer.json there, so no whole checkpoint of train_gpt --save (which "
                                  "writes it last, after the model's and optimizer's files: a save cut short has none)");
    }
    resumed = read_trainer_json(*json, dir + "trainer.json");
    const std::string saved = " (saved by " + resumed.layout + ")";
    if (resumed.dtype != opt.dtype) {
      throw std::invalid_argument(what + "the checkpoint is in --dtype " + resumed.dtype + saved + ", this run in " +
                                  opt.dtype + ": resume with --dtype " + resumed.dtype);
    }
    if (!resumed.model.empty() && resumed.model != model_flags(opt)) {
      throw std::invalid_argument(what + "the checkpoint's model is " + resumed.model + saved + ", this run's " +
                                  model_flags(opt) + ": resume with the saved run's flags (--heads, --gelu and "
                                  "--layer-norm-eps change the model without changing its tensors' shapes)");
    }
    if (resumed.windows != windows) {
      throw std::invalid_argument(what + "the checkpoint was trained on " + std::to_string(resumed.windows) +
                                  " windows" + saved + ", this run's --text " + opt.text + " and --block " +
                                  std::to_string(opt.block) + " give " + std::to_string(windows) +
                                  ": resume with the saved run's --text and --block");
    }
    if (resumed.step >= opt.steps) {
      throw std::invalid_argument(what + "the checkpoint is at step " + std::to_string(resumed.step) + ", so --steps " +
                                  std::to_string(opt.steps) + " leaves nothing to train: give more --steps than " +
                                  std::to_string(resumed.step) + " (the saved run's were " + std::to_string(resumed.steps) + ")");
    }
    if (opt.stop_after && opt.stop_after <= resumed.step) {
      throw std::invalid_argument(what + "--stop-after " + std::to_string(opt.stop_after) +
                                  " is not after the checkpoint's step " + std::to_string(resumed.step) +
                                  ": give a --stop-after from " + std::to_string(resumed.step + 1) + " to --steps");
    }
    if (resumed.step > resumed.steps || resumed.epoch_windows > resumed.windows) {
      throw std::invalid_argument(what + dir + "trainer.json is at step " + std::to_string(resumed.step) + " of " +
                                  std::to_string(resumed.steps) + ", " + std::to_string(resumed.epoch_windows) +
                                  " windows into an epoch of " + std::to_string(resumed.windows) +
                                  ": not what train_gpt --save writes (edited, or damaged)");
    }
    // trainer.json, the model's and the optimizer's files are one save (the library checks the
    // last two against each other): a trainer.json copied from another save would resume the
    // weights at another step.
    if (const auto index = read_on_rank0(group, dir + "model.safetensors.index.json")) {
      const auto model = cpprun::detail::read_safetensors_index(*index, dir + "model.safetensors.index.json");
      const auto id = model.metadata.find(std::string(cpprun::detail::kSaveIdKey));
      if (id != model.metadata.end() && id->second != resumed.save_id) {
        throw std::invalid_argument(what + dir + "trainer.json is from another save (save id \"" + resumed.save_id +
                                    "\") than the model beside it (\"" + id->second + "\"): resume from one "
                                    "directory train_gpt --save wrote, as it wrote it" +
                                    cpprun::detail::interrupted_save_note(opt.resume_dir));
      }
      // Its step too: trainer.json carries no checksum, and a step edited there resumed the
      // optimizer's state and the data at different steps.
      const auto step = model.metadata.find("cpprun_step");
      if (step != model.metadata.end() && step->second != std::to_string(resumed.step)) {
        throw std::invalid_argument(what + dir + "trainer.json says step " + std::to_string(resumed.step) +
                                    " but the model beside it was saved at step " + step->second +
                                    " (cpprun_step in its index): the directory was edited or damaged; resume "
                                    "from another checkpoint");
      }
    }
    if (resumed.epoch_windows % dp_group.size() != 0) {
      throw std::invalid_argument(what + "the checkpoint stopped " + std::to_string(resumed.epoch_windows) +
                                  " windows into its epoch, which " + std::to_string(dp_group.size()) +
                                  " data-parallel ranks cannot share out evenly: resume on a number of data-parallel "
                                  "ranks that divides it");
    }
    if (schedule) {  // --pp: each stage its own tensors (the stages hold every one between them)
      cpprun::load_state_dict(my_stages, dir);
      cpprun::load_optimizer_state_dict(my_stages, optimizer, dir);
    } else if (wrapped) {
      cpprun::load_state_dict(model, dir);
      cpprun::load_optimizer_state_dict(model, optimizer, dir);
    } else {
      cpprun::load_state_dict(gpt, dir);
      cpprun::load_optimizer_state_dict(gpt, optimizer, dir);
    }
    if (opt.amp == "fp16" && resumed.amp == "fp16") {  // the loss scale and its count of clean steps
      const auto bytes = read_on_rank0(group, dir + "grad_scaler.pt");
      if (!bytes) throw std::invalid_argument(what + "the checkpoint is of an --amp fp16 run but has no grad_scaler.pt");
      torch::serialize::InputArchive archive;
      cpprun::load_archive(archive, *bytes);
      scaler.load(archive);
    }
  }
  const int start = static_cast<int>(resumed.step), last_step = opt.stop_after ? opt.stop_after : opt.steps;
  if (opt.warmup > 0 && opt.warmup >= last_step - start) {
    throw std::invalid_argument("--warmup " + std::to_string(opt.warmup) + " leaves none of the " +
                                std::to_string(last_step - start) + " steps this run trains to time; use a smaller --warmup");
  }
  // Each data-parallel rank its own windows; the ranks of a tensor-parallel group the same ones.
  cpprun::DistributedSampler sampler(static_cast<size_t>(windows), cpprun::DistributedSamplerOptions()
                                                                       .num_replicas(dp_size)
                                                                       .rank(dp_rank));
  auto batch_from = [&](const std::vector<size_t>& starts) {  // inputs and next-character targets
    std::vector<torch::Tensor> x, y;
    for (size_t s : starts) {
      x.push_back(encoded.narrow(0, static_cast<int64_t>(s), opt.block));
      y.push_back(encoded.narrow(0, static_cast<int64_t>(s) + 1, opt.block));
    }
    return std::make_pair(torch::stack(x), torch::stack(y));
  };
  if (rank == 0) {
    if (!opt.init_from.empty()) std::printf("GPT-2 from %s\n", opt.init_from.c_str());
    if (!opt.resume_dir.empty()) {
      std::printf("resumed from %s at step %lld (saved by %s), the data at epoch %lld with %lld of its windows "
                  "taken; training steps %lld to %d of %d\n", opt.resume_dir.c_str(), static_cast<long long>(resumed.step),
                  resumed.layout.c_str(), static_cast<long long>(resumed.epoch),
                  static_cast<long long>(resumed.epoch_windows), static_cast<long long>(resumed.step + 1),
                  last_step, opt.steps);
      const int64_t steps_here = epoch_steps(windows, dp_size, rank_batch);
      if (resumed.epoch_steps != 0 && resumed.epoch_steps != steps_here) {
        std::printf("note: an epoch is %lld steps here (%lld windows over %d data-parallel ranks, padded to a multiple "
                    "of them as DistributedSampler does), %lld in the saved run: the data goes on as the saved run's "
                    "to the end of epoch %lld, in another order after it\n",
                    static_cast<long long>(steps_here), static_cast<long long>(windows), dp_size,
                    static_cast<long long>(resumed.epoch_steps), static_cast<long long>(resumed.epoch));
      }
      if (resumed.global_batch != global_batch) {
        std::printf("note: %lld windows a step here (--batch %d x --grad-accum %d x %d data-parallel ranks), %lld in the "
                    "saved run: the data goes on where it stood, but the training is not the saved run's\n",
                    static_cast<long long>(global_batch), opt.batch, opt.grad_accum, dp_group.size(),
                    static_cast<long long>(resumed.global_batch));
      }
    }
    std::printf("%s: %zu characters, vocabulary %lld, %lld parameters%s, %d ranks x %d windows of %lld%s\n",
                opt.text.c_str(), text.size(), static_cast<long long>(model_vocab), static_cast<long long>(params),
                opt.deferred_init == "on" ? " (deferred initialisation)" : "", group.size(), opt.batch,
                static_cast<long long>(opt.block),
                opt.grad_accum > 1 ? (", " + std::to_string(opt.grad_accum) + " passes a step").c_str() : "");
    if (tp_group) {
      std::printf("tensor parallel: %d x %d ranks (data x tensor), every block's %lld heads and %lld MLP units split "
                  "%d ways; %d x %lld windows per step\n", dp_group.size(), opt.tp, static_cast<long long>(opt.heads),
                  static_cast<long long>(4 * opt.embed), opt.tp, dp_group.size(), static_cast<long long>(rank_batch));
    }
  }

  // The data order where it stood: the saved epoch, less the windows taken of it (none, new).
  sampler.set_epoch(static_cast<uint64_t>(resumed.epoch));
  sampler.reset();
  if (resumed.epoch_windows > 0) sampler.next(static_cast<size_t>(resumed.epoch_windows / dp_size));
  int64_t epoch_windows = resumed.epoch_windows;  // this epoch's, over all data-parallel ranks
  double first_loss = 0, loss_sum = 0;
  int logged = 0;                // steps in loss_sum
  // MFU: model FLOPs per token, forward and backward, over the devices' peak. 6 N for the
  // parameters' matmuls (N: every parameter once, the tied head once; the embeddings' lookups
  // are counted as if they were matmuls, as nanoGPT and PaLM do) plus 12 L C T for attention's
  // two T-long products (scores and weighted values, forward and backward, causal masking not
  // subtracted): PaLM's appendix B, nanoGPT's estimate_mfu.
  const double flops_per_token = 6.0 * static_cast<double>(params) +
                                 12.0 * static_cast<double>(opt.layers * opt.embed * opt.block);
  const double peak_flops = 1e12 * peak_tflops(opt, device) * group.size();  // 0: unknown
  auto logged_since = std::chrono::steady_clock::now();
  std::vector<double> losses;  // every step's, for --losses-out
  // Note [Reading the loss]: each step's loss stays on the device until a log line, the warm-up's
  // end or the last step reads the ones since the last reading, in one copy. Reading it every step
  // (item()) would wait for the device each step, and the device would then idle while the host
  // prepared and launched the next step's first kernels: what nanoGPT avoids the same way. On the
  // CPU, where every operation has finished when it returns, it changes nothing.
  std::vector<torch::Tensor> unread_losses;  // steps since the last reading, on the device
  auto read_losses = [&] {  // waits for those steps' work
    if (unread_losses.empty()) return;
    const auto values = torch::stack(unread_losses).to(torch::kDouble).cpu().contiguous();
    unread_losses.clear();
    for (const double step_loss : c10::ArrayRef<double>(values.data_ptr<double>(), values.numel())) {
      if (losses.empty()) first_loss = step_loss;
      losses.push_back(step_loss);
      loss_sum += step_loss, ++logged;
    }
  };
  auto started = std::chrono::steady_clock::now();
  cpprun::StepTimer step_timer;  // each rank's compute and waiting per step: who holds the others up
  // One step's forward and backward passes. --grad-accum: K micro-batches of --batch windows, each
  // loss a K-th of the step's mean, their gradients summed locally; a wrapper reduces them in the
  // last backward only. Returns the step's loss.
  auto passes = [&](const torch::Tensor& step_x, const torch::Tensor& step_y) {
    torch::Tensor loss;
    for (int micro = 0; micro < opt.grad_accum; ++micro) {
      auto x = step_x.narrow(0, int64_t{micro} * opt.batch, opt.batch);
      auto y = step_y.narrow(0, int64_t{micro} * opt.batch, opt.batch);
      std::optional<cpprun::NoSyncGuard> local_only;
      if (wrapped && micro + 1 < opt.grad_accum) local_only.emplace(model->no_sync());
      at::autocast::set_autocast_enabled(device_type, opt.amp != "fp32");
      auto logits = forward(x);
      at::autocast::set_autocast_enabled(device_type, false);
      at::autocast::clear_cache();  // as leaving torch.autocast does: no cast outlives the forward
      auto micro_loss = training_loss(logits, y, fused_loss, float64);
      if (opt.grad_accum > 1) micro_loss = micro_loss / opt.grad_accum;
      scaler.scale(micro_loss).backward();
      loss = micro == 0 ? micro_loss.detach() : loss + micro_loss.detach();
    }
    return loss;
  };
#ifdef CPPRUN_WITH_CUDA
  // --cuda-graph: three eager steps on a side stream (capture wants the allocator, cuBLAS and the
  // optimizer's state warmed up there), then the fourth captured on copies of its batch that
  // every later step overwrites before it replays the graph. Zeroing the gradients in place
  // (not setting them to none) keeps them at the addresses the graph writes.
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  torch::Tensor graph_x, graph_y, graph_loss;
  int eager_graph_steps = 0;
  int64_t replays = 0;  // after the capture's own run
  auto captured_step = [&](const torch::Tensor& step_x, const torch::Tensor& step_y) -> torch::Tensor {
    auto whole_step = [&](const torch::Tensor& x, const torch::Tensor& y) {
      optimizer.zero_grad(/*set_to_none=*/false);
      auto loss = passes(x, y);
      optimizer.step();
      return loss;
    };
    if (graph) {
      graph_x.copy_(step_x), graph_y.copy_(step_y);
      graph->replay();
      ++replays;
      return graph_loss;
    }
    torch::cuda::synchronize(device.index());  // the batch and the parameters, before the side stream reads them
    c10::cuda::CUDAStreamGuard on_side(c10::cuda::getStreamFromPool(false, device.index()));
    torch::Tensor loss;
    if (++eager_graph_steps <= 3) {
      loss = whole_step(step_x, step_y);
    } else {
      graph_x = step_x.clone(), graph_y = step_y.clone();
      torch::cuda::synchronize(device.index());
      graph = std::make_unique<at::cuda::CUDAGraph>();
      graph->capture_begin();
      graph_loss = whole_step(graph_x, graph_y);
      graph->capture_end();
      graph->replay();  // the captured step itself: capturing ran nothing
      loss = graph_loss;
    }
    torch::cuda::synchronize(device.index());  // before the default stream reads the loss
    return loss;
  };
#endif
  // --trace: steps warmup+1 to warmup+3 under PyTorch's profiler (as torch.profiler.profile
  // with CPU and CUDA activities), on rank 0.
  namespace profiler = torch::autograd::profiler;
  const bool tracing = !opt.trace.empty() && rank == 0;
  const int trace_first = start + opt.warmup + 1, trace_last = std::min(last_step, trace_first + 2);
  const profiler::ProfilerConfig trace_config(torch::profiler::impl::ProfilerState::KINETO);
  std::set<torch::profiler::impl::ActivityType> trace_activities{torch::profiler::impl::ActivityType::CPU};
  if (device.is_cuda()) trace_activities.insert(torch::profiler::impl::ActivityType::CUDA);
  if (tracing) profiler::prepareProfiler(trace_config, trace_activities);
  for (int step = start + 1; step <= last_step; ++step) {
    // The warm-up's losses read first, so that the clock starts once the device has finished them.
    if (step == start + opt.warmup + 1) read_losses(), started = std::chrono::steady_clock::now();
    if (tracing && step == trace_first) profiler::enableProfiler(trace_config, trace_activities);
    auto starts = sampler.next(static_cast<size_t>(rank_batch));
    if (!starts || starts->size() < static_cast<size_t>(rank_batch)) {  // the epoch's tail: the next epoch
      sampler.reset(), starts = sampler.next(static_cast<size_t>(rank_batch)), epoch_windows = 0;
    }
    epoch_windows += global_batch;
    auto [step_x, step_y] = batch_from(*starts);
    torch::Tensor loss;
    if (opt.cuda_graph) {
#ifdef CPPRUN_WITH_CUDA
      loss = captured_step(step_x, step_y);
#endif
    } else if (schedule) {  // --pp: every stage's forward and backward passes, the loss on every rank
      optimizer.zero_grad();
      at::autocast::set_autocast_enabled(device_type, opt.amp != "fp32");
      loss = schedule->step(step_x, step_y);
      at::autocast::set_autocast_enabled(device_type, false);
      at::autocast::clear_cache();
      if (!scaler.step(optimizer)) ++skipped;
      scaler.update();
    } else {
      optimizer.zero_grad();
      loss = passes(step_x, step_y);
      if (!scaler.step(optimizer)) ++skipped;
      scaler.update();
    }
    auto global = loss.detach().clone();
    cpprun::all_reduce(group, global, cpprun::ReduceOp::kAvg);
    unread_losses.push_back(global);
    if (step % opt.log_every == 0 || step == last_step) read_losses();  // Note [Reading the loss]
    if (step % opt.log_every == 0) {
      const auto now = std::chrono::steady_clock::now();
      const double tokens_per_s = static_cast<double>(logged * global_batch * opt.block) /
                                  std::chrono::duration<double>(now - logged_since).count();
      if (rank == 0) {
        std::printf("step %4d/%d  loss %.4f  %.0f tokens/s", step, opt.steps, loss_sum / logged, tokens_per_s);
        if (peak_flops > 0) std::printf("  MFU %.1f%%", 100 * flops_per_token * tokens_per_s / peak_flops);
        std::printf("\n");
        std::fflush(stdout);
      }
      loss_sum = 0, logged = 0, logged_since = now;
    }
    step_timer.step_done();
    if (tracing && step == trace_last) {
      read_losses();  // the traced steps' work finished, so that the trace holds all of it
      // Kineto reports a failed write on its own log and returns as if it had written: an older
      // file at that path goes first, so that "traced" is said only of this run's trace.
      std::error_code ignored;
      std::filesystem::remove(opt.trace, ignored);
      profiler::disableProfiler()->save(opt.trace);
      if (std::filesystem::exists(opt.trace)) {
        std::printf("traced steps %d-%d to %s\n", trace_first, trace_last, opt.trace.c_str());
      } else {
        std::printf("warning: --trace %s was not written (the profiler's message above says why); training goes on\n",
                    opt.trace.c_str());
      }
      std::fflush(stdout);
    }
    if (opt.straggler_every > 0 && step % opt.straggler_every == 0) {
      const auto report = step_timer.report(group);  // a collective: every rank
      if (rank == 0) std::printf("%s\n", cpprun::format_step_report(report).c_str()), std::fflush(stdout);
    }
  }

#ifdef CPPRUN_WITH_CUDA
  // The replays advanced the device's step counts; the state files hold the host's.
  if (graph) static_cast<cpprun::FusedAdamW&>(optimizer).count_replayed_steps(replays);
#endif

  // --save: the model, the optimizer and where the run stands (trainer.json, and grad_scaler.pt
  // with --amp fp16) as one save (collective: each rank writes its share of the tensors, the
  // save's root the two files, last), under one save id (rank 0's). A save that fails (a full disk) puts the
  // earlier checkpoint's files back, every one of them, so the directory holds the earlier save
  // whole; a kill before the ranks agree leaves the earlier files as NAME.prev, which --resume's
  // refusal names with the command that puts them back.
  if (!opt.save_dir.empty()) {
    const std::string dir = opt.save_dir + "/";
    const auto options = cpprun::StateDictSaveOptions().step(last_step).save_id(cpprun::new_save_id());
    std::map<std::string, std::string> files;  // the same on every rank; the save's root writes them
    if (opt.amp == "fp16") {
      torch::serialize::OutputArchive archive;
      scaler.save(archive);
      files["grad_scaler.pt"] = cpprun::archive_bytes(archive);
    }
    std::string layout = "--mode " + opt.mode;
    if (opt.mode == "fsdp") layout += " --stage " + std::to_string(opt.stage);
    if (opt.tp > 1) layout += " --tp " + std::to_string(opt.tp);
    if (opt.pp > 1) layout += " --pp " + std::to_string(opt.pp) + " (" + opt.pp_schedule + ")";
    layout += ", " + std::to_string(group.size()) + (group.size() == 1 ? " rank" : " ranks");
    const TrainerState now{last_step, opt.steps, static_cast<int64_t>(sampler.epoch()), epoch_windows,
                           windows, global_batch, opt.dtype, opt.amp, layout, *options.save_id(),
                           model_flags(opt), epoch_steps(windows, dp_size, rank_batch), model_vocab, opt.positions};
    files["trainer.json"] = trainer_json(now);
    if (schedule) {
      cpprun::save_state_dict(my_stages, optimizer, dir, options, files);
    } else if (wrapped) {
      cpprun::save_state_dict(model, optimizer, dir, options, files);
    } else {
      cpprun::save_state_dict(gpt, optimizer, dir, options, files);
    }
    if (rank == 0) {
      std::printf("saved step %d of %d to %s (model, optimizer, trainer.json): continue with --resume %s\n", last_step,
                  opt.steps, opt.save_dir.c_str(), opt.save_dir.c_str());
    }
  }

  // Throughput over all ranks, and the largest rank's peak memory (a collective: every rank).
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  // This rank's peak resident memory: model, gradients, optimizer state and activations at most
  // (host memory; on a GPU see the CUDA allocator).
  auto peak = torch::tensor({bench::peak_rss() / 1048576.0}, torch::kDouble);
  cpprun::all_reduce(group, peak, cpprun::ReduceOp::kMax);
  const double tokens = static_cast<double>(last_step - start - opt.warmup) * static_cast<double>(global_batch * opt.block);
  // On a GPU, the CUDA allocator's peak (what torch.cuda.max_memory_allocated reports), the largest rank's.
  double gpu_peak_mb = -1;
#ifdef CPPRUN_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    auto gpu_peak = torch::tensor({static_cast<double>(stats.allocated_bytes[0].peak) / 1048576.0}, torch::kDouble);  // [0]: StatType::AGGREGATE
    cpprun::all_reduce(group, gpu_peak, cpprun::ReduceOp::kMax);
    gpu_peak_mb = gpu_peak.item<double>();
  }
#endif
  if (rank == 0 && !opt.losses_out.empty()) {
    std::string lines;
    char number[32];
    for (double l : losses) std::snprintf(number, sizeof number, "%.17g\n", l), lines += number;
    cpprun::write_file_atomically(opt.losses_out, lines);
  }

  // Under --tp no rank holds the whole model: gather it (collective) into an unsplit Gpt on every
  // rank, which then exports, evaluates and samples as the trained module does without --tp.
  Gpt whole = gpt;
  if (schedule) {
    // --pp --mode fsdp: each stage's full parameters from its shards (collective over dp), then
    // every stage's trained tensors on every rank.
    for (auto* s : my_stages) {
      if (!s->data_parallel().is_empty()) s->data_parallel().ptr()->gather_full_parameters();
    }
    gather_stages(pipe, stage_split, pp_group);
  }
  if (tp_group) {
    if (wrapped) model->gather_full_parameters();  // FSDP: this rank's shards made current (--pp: above)
    whole = unsplit(*gpt, model_vocab, opt, device);
  }

  // Export (a collective: FSDP gathers the parameters; rank 0 writes): GPT2LMHeadModel's names and
  // layouts already, so the state dict goes out as it is, with the config.json from_pretrained reads.
  if (!opt.export_dir.empty()) {
    if (rank == 0) std::filesystem::create_directories(opt.export_dir);
    const auto path = opt.export_dir + "/model.safetensors";
    const auto save_options = cpprun::StateDictSaveOptions().step(last_step);
    if (schedule) cpprun::save_state_dict(my_stages, path, save_options);  // under GPT-2's names
    else if (!wrapped) cpprun::save_state_dict(gpt, path, save_options);
    else if (!tp_group) cpprun::save_state_dict(model, path, save_options);
    else if (rank == 0) cpprun::save_state_dict(whole, path, save_options);  // gathered already: one rank writes
    if (rank == 0) {
      examples::Gpt2Config config{opt.layers,    opt.heads, opt.embed, opt.positions, model_vocab,
                                  opt.gelu,      opt.layer_norm_eps, opt.dtype};
      cpprun::write_file_atomically(opt.export_dir + "/config.json", examples::gpt2_config_json(config));
      remove_earlier_shards(opt.export_dir);
      std::printf("exported to %s (model.safetensors, config.json): transformers.GPT2LMHeadModel.from_pretrained loads it\n",
                  opt.export_dir.c_str());
    }
  }

  // Held-out loss, then a sample from rank 0 (greedy decoding would repeat itself: sample).
  if (wrapped) model->gather_full_parameters();  // FSDP: gpt's own weights made current; DDP: they are
  torch::NoGradGuard no_grad;
  whole->eval();
  std::vector<size_t> held_out;
  for (int64_t s = split; s + opt.block + 1 < encoded.size(0) && held_out.size() < 64; s += opt.block) held_out.push_back(s);
  auto [vx, vy] = batch_from(held_out);
  auto vlogits = whole->forward(vx);
  auto val = torch::nn::functional::cross_entropy(vlogits.view({-1, vlogits.size(-1)}), vy.view({-1}));
  if (rank != 0) return 0;
  if (!logits_tokens.empty()) {  // for comparing with another implementation (tests/examples/gpt2_interop.sh)
    auto tokens_in = torch::tensor(logits_tokens, torch::kLong).unsqueeze(0).to(device);
    auto logits = whole->forward(tokens_in)[0].cpu().contiguous();
    std::string lines;
    char number[32];
    for (int64_t t = 0; t < logits.size(0); ++t) {
      for (int64_t v = 0; v < logits.size(1); ++v) {
        // float64 to 17 digits, so that runs that should agree compare to more than float32 shows.
        if (float64) std::snprintf(number, sizeof number, v ? " %.17g" : "%.17g", logits[t][v].item<double>());
        else std::snprintf(number, sizeof number, v ? " %.9g" : "%.9g", logits[t][v].item<float>());
        lines += number;
      }
      lines += '\n';
    }
    cpprun::write_file_atomically(opt.logits_out, lines);
  }
  // float64 to 12 digits, for comparing runs that should agree (a resumed one with one uninterrupted).
  // No step here (--steps 0 to evaluate or export a model, a resume with none left): no first loss
  // to show (it said "first loss 0.0000").
  if (losses.empty()) {
    std::printf(float64 ? "no training step in this run, held-out loss %.12f\n"
                        : "no training step in this run, held-out loss %.4f\n",
                val.item<double>());
  } else {
    std::printf(float64 ? "first loss %.12f, held-out loss %.12f\n" : "first loss %.4f, held-out loss %.4f\n",
                first_loss, val.item<double>());
  }
  std::printf("%.0f tokens/s over %d ranks; peak memory per rank %.0f MB (the largest rank's resident memory)\n",
              tokens / seconds, group.size(), peak.item<double>());
  if (gpu_peak_mb >= 0) std::printf("peak GPU memory per rank %.0f MB (the CUDA allocator's, the largest rank's)\n", gpu_peak_mb);
  if (opt.amp == "fp16") {
    std::printf("fp16: %d of %d steps skipped for overflow, loss scale now %g\n", skipped, last_step - start, scaler.get_scale());
  }
  // A model trained to NaN (too high an --lr) has no distribution to sample from: multinomial ended
  // the run with ATen's "probability tensor contains either inf, nan or element < 0". Without a
  // sample asked for, the run ends as it did, the held-out loss above saying nan.
  if (!std::isfinite(val.item<double>()) && opt.sample > 0) {
    std::fprintf(stderr, "train_gpt: the held-out loss is %g: training diverged (its outputs are not finite), so "
                 "there is no sample; train again with a lower --lr\n", val.item<double>());
    return 1;
  }
  auto context = encoded.narrow(0, split, opt.block).unsqueeze(0);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1);
  std::string sample;
  for (int i = 0; i < opt.sample; ++i) {
    // Over the text's characters only (a GPT-2's vocabulary may be larger).
    auto last = whole->forward(context).select(1, -1).narrow(-1, 0, static_cast<int64_t>(vocab.size()));
    auto probabilities = torch::softmax(last / 0.8, -1);
    auto next = torch::multinomial(probabilities.cpu(), 1, false, generator).to(device);  // a CPU generator
    sample += vocab[static_cast<size_t>(next.item<int64_t>())];
    context = torch::cat({context.narrow(1, 1, opt.block - 1), next}, 1);
  }
  std::printf("sample:\n%s\n", sample.c_str());
  return 0;
}

// Any error (a bad option, an unreadable --text) ends with its message and exit code 1, written
// where cpprun's failure summary shows it (cpprun::record), rather than an abort.
int main(int argc, char** argv) { return cpprun::record([&] { return run(argc, argv); }); }
