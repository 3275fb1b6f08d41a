// train_gpt's GPT-2 as Hugging Face's transformers keeps it on disk (--init-from, --export): the
// config.json of a GPT2LMHeadModel, read strictly (what train_gpt cannot represent is refused,
// naming the key), and written back for from_pretrained. The tensors need no translation:
// train_gpt's module names and layouts are GPT2LMHeadModel's.
#pragma once

#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>

#include "../support/file_read.h"  // a file read whole, refusing FIFOs and devices
#include "../support/json.h"       // cpprun's strict JSON reader (the one its safetensors headers use)

namespace examples {

// PyTorch's exact GELU (transformers' "gelu"), or GPT-2's tanh approximation ("gelu_new").
enum class Gelu { kExact, kTanh };

struct Gpt2Config {
  int64_t layers = 0, heads = 0, embed = 0, positions = 0, vocab = 0;
  Gelu gelu = Gelu::kTanh;
  double layer_norm_eps = 1e-5;
  std::string dtype = "float32";  // config.json's "dtype" (transformers 5) or "torch_dtype": the weights'
};

namespace gpt2_detail {

using cpprun::detail::Json;

[[noreturn]] inline void refuse(const std::string& file, const std::string& why) {
  throw std::invalid_argument("--init-from: " + file + " " + why);
}

inline const Json* member(const Json& object, const std::string& key) {
  for (const auto& [name, value] : object.members) {
    if (name == key) return &value;
  }
  return nullptr;
}

inline bool is_null(const Json* value) { return value == nullptr || (value->kind == Json::Kind::kOther && value->text == "null"); }

inline int64_t positive_integer(const Json& config, const std::string& file, const std::string& key) {
  const Json* value = member(config, key);
  if (value == nullptr) refuse(file, "has no \"" + key + "\"; a GPT2Config always writes it");
  if (value->kind != Json::Kind::kNumber || value->text.find_first_of(".eE-") != std::string::npos) {
    refuse(file, "sets \"" + key + "\" to " + value->text + ", not a positive integer");
  }
  if (value->text.size() > 12) refuse(file, "sets \"" + key + "\" to " + value->text + ", far beyond any GPT-2");
  const int64_t n = std::stoll(value->text);
  if (n < 1) refuse(file, "sets \"" + key + "\" to " + value->text + ", not a positive integer");
  return n;
}

// A boolean option train_gpt implements only as `supported` (absent: transformers' default, `fallback`).
inline void require_flag(const Json& config, const std::string& file, const std::string& key, bool supported,
                         bool fallback, const std::string& what) {
  const Json* value = member(config, key);
  const bool on = value == nullptr ? fallback : value->kind == Json::Kind::kOther && value->text == "true";
  if (value != nullptr && (value->kind != Json::Kind::kOther || value->text == "null")) {
    refuse(file, "sets \"" + key + "\" to " + value->text + ", not true or false");
  }
  if (on != supported) {
    refuse(file, "sets \"" + key + "\": " + (on ? "true" : "false") + ", which train_gpt does not implement (" + what +
                     "); it loads GPT-2 models with \"" + key + "\": " + (supported ? "true" : "false"));
  }
}

// The model config.json describes is made before its weights are read: its parameters, at one
// byte each at the least (float8), must fit in the directory's weight files (.safetensors, or
// transformers' older pytorch_model.bin), so that a config.json that does not belong to them
// cannot make train_gpt allocate without bound.
inline void check_weights_hold(const Gpt2Config& c, const std::string& dir, const std::string& file) {
  const double embed = static_cast<double>(c.embed);
  const double parameters = (static_cast<double>(c.vocab) + static_cast<double>(c.positions)) * embed +
                            static_cast<double>(c.layers) * (12 * embed * embed + 13 * embed) + 2 * embed;
  // The files load_state_dict reads there: the .safetensors, else pytorch_model.bin (not a
  // training_args.bin beside it).
  double safetensors = 0, bin = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const auto name = entry.path().filename().string();
    if (!entry.is_regular_file(error)) continue;
    if (entry.path().extension() == ".safetensors") safetensors += static_cast<double>(entry.file_size(error));
    if (name == "pytorch_model.bin") bin += static_cast<double>(entry.file_size(error));
  }
  const double bytes = safetensors > 0 ? safetensors : bin;
  if (bytes < parameters) {
    char count[64];
    std::snprintf(count, sizeof count, "%.4g parameters, %.4g bytes at the least", parameters, parameters);
    refuse(file, "describes a GPT-2 of " + std::string(count) + ", but the weight files in " + dir + " (.safetensors, .bin) hold " +
                     std::to_string(static_cast<int64_t>(bytes)) +
                     " bytes: config.json and the weights beside it are not one model's");
  }
}

}  // namespace gpt2_detail

// DIR/config.json as train_gpt's model, or an error naming the key train_gpt cannot represent.
inline Gpt2Config read_gpt2_config(const std::string& dir) {
  using namespace gpt2_detail;
  const std::string file = dir + "/config.json";
  std::string text;
  try {
    text = cpprun::detail::read_regular_file(file, "--init-from's");
  } catch (const std::system_error& e) {
    throw std::invalid_argument("--init-from " + dir + ": cannot read " + file + " (" + e.code().message() +
                                "; a directory GPT2LMHeadModel.save_pretrained wrote holds config.json)");
  }
  Json config;
  try {
    config = cpprun::detail::parse_json(text, 64);
  } catch (const cpprun::detail::JsonSyntaxError& e) {
    refuse(file, std::string("is not JSON: ") + e.what());
  }
  if (config.kind != Json::Kind::kObject) refuse(file, "is not a JSON object");
  const Json* model_type = member(config, "model_type");
  if (model_type == nullptr || model_type->text != "gpt2") {
    refuse(file, "has \"model_type\": " + (model_type ? "\"" + model_type->text + "\"" : std::string("(none)")) +
                     "; train_gpt loads GPT-2 (\"model_type\": \"gpt2\", GPT2LMHeadModel) only");
  }
  Gpt2Config c;
  c.layers = positive_integer(config, file, "n_layer");
  c.heads = positive_integer(config, file, "n_head");
  c.embed = positive_integer(config, file, "n_embd");
  c.positions = positive_integer(config, file, "n_positions");
  c.vocab = positive_integer(config, file, "vocab_size");
  if (c.embed % c.heads != 0) {
    refuse(file, "sets \"n_embd\" " + std::to_string(c.embed) + ", not a multiple of \"n_head\" " + std::to_string(c.heads));
  }
  if (const Json* inner = member(config, "n_inner"); !is_null(inner)) {
    if (inner->text != std::to_string(4 * c.embed)) {
      refuse(file, "sets \"n_inner\" to " + inner->text + "; train_gpt's MLP is 4 * n_embd = " +
                       std::to_string(4 * c.embed) + " wide (\"n_inner\": null)");
    }
  }
  const Json* act = member(config, "activation_function");
  const std::string activation = act == nullptr ? "gelu_new" : act->text;  // transformers' default
  if (activation == "gelu_new" || activation == "gelu_pytorch_tanh" || activation == "gelu_fast") c.gelu = Gelu::kTanh;
  else if (activation == "gelu") c.gelu = Gelu::kExact;
  else {
    refuse(file, "sets \"activation_function\" to \"" + activation +
                     "\", which train_gpt does not implement (it has \"gelu_new\", \"gelu_pytorch_tanh\", "
                     "\"gelu_fast\": tanh-approximated GELU, and \"gelu\": exact GELU)");
  }
  if (const Json* eps = member(config, "layer_norm_epsilon"); !is_null(eps)) {
    const std::optional<double> value = cpprun::detail::json_double(*eps);
    if (!value || *value < 0) {
      refuse(file, "sets \"layer_norm_epsilon\" to " + eps->text + ", not a finite number from 0 up");
    }
    c.layer_norm_eps = *value;
  }
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (const Json* dtype = member(config, key); !is_null(dtype)) {
      if (dtype->kind != Json::Kind::kString) refuse(file, "sets \"" + std::string(key) + "\" to " + dtype->text + ", not a name");
      c.dtype = dtype->text;
    }
  }
  require_flag(config, file, "scale_attn_weights", true, true, "attention scores unscaled");
  require_flag(config, file, "scale_attn_by_inverse_layer_idx", false, false, "attention scaled by 1/(layer+1)");
  require_flag(config, file, "add_cross_attention", false, false, "cross-attention to an encoder");
  require_flag(config, file, "tie_word_embeddings", true, true, "an output layer apart from the token embedding");
  check_weights_hold(c, dir, file);
  return c;
}

// config.json for the model train_gpt trained, as GPT2Config.to_json_file writes the keys it needs:
// GPT2LMHeadModel.from_pretrained(DIR) builds the same network. Dropout 0: train_gpt has none.
inline std::string gpt2_config_json(const Gpt2Config& c) {
  // GPT-2's end-of-text token where the vocabulary has it; none in a smaller (character) vocabulary.
  const std::string eos = c.vocab > 50256 ? "50256" : "null";
  char eps[32];
  std::snprintf(eps, sizeof eps, "%.9g", c.layer_norm_eps);
  std::ostringstream out;
  out << "{\n"
      << "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
      << "  \"model_type\": \"gpt2\",\n"
      << "  \"vocab_size\": " << c.vocab << ",\n"
      << "  \"n_positions\": " << c.positions << ",\n"
      << "  \"n_embd\": " << c.embed << ",\n"
      << "  \"n_layer\": " << c.layers << ",\n"
      << "  \"n_head\": " << c.heads << ",\n"
      << "  \"n_inner\": null,\n"
      << "  \"activation_function\": \"" << (c.gelu == Gelu::kTanh ? "gelu_new" : "gelu") << "\",\n"
      << "  \"layer_norm_epsilon\": " << eps << ",\n"
      << "  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n"
      << "  \"initializer_range\": 0.02,\n"
      << "  \"scale_attn_weights\": true,\n"
      << "  \"scale_attn_by_inverse_layer_idx\": false,\n"
      << "  \"reorder_and_upcast_attn\": false,\n"
      << "  \"tie_word_embeddings\": true,\n"
      << "  \"bos_token_id\": " << eos << ",\n"
      << "  \"eos_token_id\": " << eos << ",\n"
      << "  \"dtype\": \"" << c.dtype << "\"\n"  // the weights' (a --dtype float64 run's are float64)
      << "}\n";
  return out.str();
}

}  // namespace examples
