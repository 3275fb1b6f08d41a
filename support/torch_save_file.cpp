// See torch_save_file.h. The pickle is what Python's torch.save(dict) emits (protocol 2, as
// pickletools.dis shows it), less the memo, which pickle does not require.
#include "support/torch_save_file.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <memory>
#include <unordered_map>

#include "cpprun/checkpoint_file.h"
#include "cpprun/state_dict_options.h"

namespace cpprun::detail {
namespace {

static_assert(std::endian::native == std::endian::little, "torch.save files hold little-endian data");

// torch.save names a storage's dtype by its legacy class (torch.FloatStorage, ...) where the dtype
// has one, and rebuilds the tensor with _rebuild_tensor_v2.
constexpr std::pair<at::ScalarType, const char*> kStorageClasses[] = {
    {at::kFloat, "FloatStorage"}, {at::kDouble, "DoubleStorage"}, {at::kHalf, "HalfStorage"},
    {at::kBFloat16, "BFloat16Storage"}, {at::kLong, "LongStorage"}, {at::kInt, "IntStorage"},
    {at::kShort, "ShortStorage"}, {at::kChar, "CharStorage"}, {at::kByte, "ByteStorage"},
    {at::kBool, "BoolStorage"}, {at::kComplexFloat, "ComplexFloatStorage"},
    {at::kComplexDouble, "ComplexDoubleStorage"}};

// A dtype as a pickle names it (the global torch.<name>). The dtypes without a legacy class
// (uint16 on, PyTorch 2.1 on) torch.save writes as a torch.storage.UntypedStorage of bytes, the
// dtype the last argument of _rebuild_tensor_v3.
constexpr std::pair<at::ScalarType, const char*> kPickleDtypeNames[] = {
    {at::kFloat, "float32"}, {at::kDouble, "float64"}, {at::kHalf, "float16"}, {at::kBFloat16, "bfloat16"},
    {at::kLong, "int64"}, {at::kInt, "int32"}, {at::kShort, "int16"}, {at::kChar, "int8"}, {at::kByte, "uint8"},
    {at::kBool, "bool"}, {at::kComplexFloat, "complex64"}, {at::kComplexDouble, "complex128"},
    {at::kUInt16, "uint16"}, {at::kUInt32, "uint32"}, {at::kUInt64, "uint64"},
    {at::kFloat8_e4m3fn, "float8_e4m3fn"}, {at::kFloat8_e5m2, "float8_e5m2"},
    {at::kFloat8_e4m3fnuz, "float8_e4m3fnuz"}, {at::kFloat8_e5m2fnuz, "float8_e5m2fnuz"},
    {at::kFloat8_e8m0fnu, "float8_e8m0fnu"}};

constexpr const char* kUntypedStorage = "torch.storage.UntypedStorage";

const char* pickle_dtype_name(at::ScalarType type) {
  for (const auto& [t, name] : kPickleDtypeNames) {
    if (t == type) return name;
  }
  return nullptr;
}

[[noreturn]] void bad_pt_file(const std::string& path, const std::string& why) {
  throw CorruptCheckpointError("cpprun: " + path + " is not a torch.save file of a dict of tensors: " + why + ".");
}

// Note [Whole files that are not state dicts]
// torch.save takes any Python object: a training loop's {"model": model.state_dict(), "epoch": 3,
// "optimizer": ...}, or the model itself (torch.save(model)). Such files are sound, so they are
// not CorruptCheckpointError: they hold something else than load_state_dict reads, which the error
// type says (StateDictMismatchError) and the message explains, with the Python line that makes a
// state dict of them.
[[noreturn]] void not_a_state_dict(const std::string& path, const std::string& what) {
  throw StateDictMismatchError("cpprun: " + path + " is a torch.save file, but not of a state dict (a dict whose "
                               "every value is a tensor, as torch.save(model.state_dict(), path) writes): " + what);
}

// ---- writing ----

class PickleWriter {
 public:
  std::string bytes = std::string("\x80\x02", 2);  // PROTO 2

  void op(char code) { bytes.push_back(code); }
  void global(std::string_view module, std::string_view name) {
    op('c');
    bytes.append(module).push_back('\n');
    bytes.append(name).push_back('\n');
  }
  void string(std::string_view text) {
    op('X');  // BINUNICODE: u32 length, UTF-8
    put_le(text.size(), 4);
    bytes.append(text);
  }
  void integer(int64_t value) {
    if (value >= 0 && value < 256) {
      op('K');
      put_le(value, 1);
    } else if (value >= INT32_MIN && value <= INT32_MAX) {
      op('J');
      put_le(static_cast<uint32_t>(value), 4);
    } else {
      op('\x8a');  // LONG1: 8 bytes, two's complement
      put_le(1 * 8, 1);
      put_le(static_cast<uint64_t>(value), 8);
    }
  }
  void int_tuple(at::IntArrayRef values) {
    op('(');
    for (const int64_t v : values) integer(v);
    op('t');
  }
  void empty_ordered_dict() {
    global("collections", "OrderedDict");
    op(')');
    op('R');
  }

 private:
  void put_le(uint64_t value, int count) {
    for (int i = 0; i < count; ++i) bytes.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
  }
};

const char* storage_class(at::ScalarType type) {
  for (const auto& [t, cls] : kStorageClasses) {
    if (t == type) return cls;
  }
  return nullptr;
}

// ---- reading: a stack machine for the opcodes torch.save emits ----

struct Value;
using ValuePtr = std::shared_ptr<Value>;
struct Value {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kTuple, kList, kDict, kGlobal, kStorage, kTensor };
  Kind kind = Kind::kNone;
  int64_t integer = 0;
  std::string text;   // a string; a global's "module.name"
  std::vector<ValuePtr> items;
  std::vector<std::pair<ValuePtr, ValuePtr>> entries;
  at::Tensor tensor;  // a tensor; a storage as an empty-shaped tensor over it
  int depth = 1;        // 1 + the deepest value inside it
  bool placed = false;  // inside another value: it may not change any more (PickleReader::adopt)
};

// A dict of tensors nests values about five deep (the dict, _rebuild_tensor_v2's arguments, a
// size tuple); far deeper is a crafted file, whose values freed one inside the other would
// overflow the stack.
constexpr int kMaxPickleDepth = 64;
// Note [Bounded unpickling]: each value the pickle pushes costs this reader ~150 bytes, so a
// pickle of 60 million one-byte opcodes (58 KB deflated) asked for gigabytes. torch.save writes
// ~25 pushes a tensor; 4M pushes is 160,000 tensors' worth, more than any state dict holds, and at
// most ~600 MB. data.pkl itself and each storage are sized from the zip's directory before they
// are read (or inflated).
constexpr std::size_t kMaxPicklePushes = std::size_t{1} << 22;
constexpr std::size_t kMaxOpenMarks = 4 * kMaxPickleDepth;
constexpr std::size_t kMaxPickleBytes = std::size_t{1} << 30;

ValuePtr make(Value::Kind kind) {
  auto v = std::make_shared<Value>();
  v->kind = kind;
  return v;
}

class PickleReader {
 public:
  PickleReader(std::string_view pickle, caffe2::serialize::PyTorchStreamReader& zip, const std::string& path)
      : in_(pickle), zip_(zip), path_(path) {}

  ValuePtr run() {
    while (true) {
      const char code = static_cast<char>(byte());
      switch (code) {
        case '\x80': byte(); break;                  // PROTO
        case '\x95': take(8); break;                 // FRAME (protocol 4)
        case '.': return pop();                      // STOP
        case '(': mark(); break;
        case ')': push(make(Value::Kind::kTuple)); break;
        case 't': push(collect(Value::Kind::kTuple)); break;
        case '\x85': tuple_of(1); break;
        case '\x86': tuple_of(2); break;
        case '\x87': tuple_of(3); break;
        case ']': push(make(Value::Kind::kList)); break;
        case 'a': { auto item = pop(); auto list = expect(top(), Value::Kind::kList, "APPEND");
                    adopt(*list, *item); list->items.push_back(item); break; }
        case 'e': { auto items = collect(Value::Kind::kList);
                    auto list = expect(top(), Value::Kind::kList, "APPENDS");
                    for (const auto& item : items->items) adopt(*list, *item);
                    list->items.insert(list->items.end(), items->items.begin(), items->items.end()); break; }
        case '}': push(make(Value::Kind::kDict)); break;
        case 's': { auto value = pop(); auto key = pop(); auto dict = expect(top(), Value::Kind::kDict, "SETITEM");
                    adopt(*dict, *key); adopt(*dict, *value); dict->entries.emplace_back(key, value); break; }
        case 'u': { auto items = collect(Value::Kind::kList);
                    if (items->items.size() % 2 != 0) fail("SETITEMS with an odd number of items");
                    auto dict = expect(top(), Value::Kind::kDict, "SETITEMS");
                    for (std::size_t i = 0; i < items->items.size(); i += 2) {
                      adopt(*dict, *items->items[i]); adopt(*dict, *items->items[i + 1]);
                      dict->entries.emplace_back(items->items[i], items->items[i + 1]);
                    }
                    break; }
        case 'X': string_of(le(4)); break;           // BINUNICODE
        case '\x8c': string_of(le(1)); break;        // SHORT_BINUNICODE
        case '\x8d': string_of(le(8)); break;        // BINUNICODE8
        case 'K': integer(le(1)); break;             // BININT1
        case 'M': integer(le(2)); break;             // BININT2
        case 'J': integer(static_cast<int32_t>(le(4))); break;  // BININT
        case '\x8a': long1(); break;
        case 'G': { uint64_t bits = 0; for (int i = 0; i < 8; ++i) bits = bits << 8 | byte();  // big-endian double
                    auto v = make(Value::Kind::kFloat); v->text = std::to_string(std::bit_cast<double>(bits));
                    push(v); break; }
        case 'N': push(make(Value::Kind::kNone)); break;
        case '\x88': case '\x89': { auto v = make(Value::Kind::kBool); v->integer = code == '\x88'; push(v); break; }
        case 'c': { std::string module = line(); std::string name = line(); global(module + "." + name); break; }
        case '\x93': { auto name = pop(); auto module = pop();
                       global(expect(module, Value::Kind::kString, "STACK_GLOBAL")->text + "." +
                              expect(name, Value::Kind::kString, "STACK_GLOBAL")->text); break; }
        case 'q': memoize(le(1)); break;             // BINPUT
        case 'r': memoize(le(4)); break;             // LONG_BINPUT
        case '\x94': memoize(memo_.size()); break;   // MEMOIZE
        case 'h': push(memo(le(1))); break;          // BINGET
        case 'j': push(memo(le(4))); break;          // LONG_BINGET
        case 'R': reduce(); break;
        case 'b': build(); break;
        case 'Q': push(storage(pop())); break;       // BINPERSID
        default: fail("the pickle opcode 0x" + hex(code) + " at byte " + std::to_string(pos_ - 1) +
                      " is not one torch.save writes for a dict of tensors");
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& why) { bad_pt_file(path_, "data.pkl: " + why); }
  static std::string hex(char c) {
    const char* digits = "0123456789abcdef";
    return {digits[(c >> 4) & 0xF], digits[c & 0xF]};
  }
  uint8_t byte() { return static_cast<uint8_t>(take(1)[0]); }
  std::string_view take(uint64_t count) {
    if (count > in_.size() - pos_) fail("it ends early");
    const auto out = in_.substr(pos_, count);
    pos_ += count;
    return out;
  }
  uint64_t le(int count) {
    const auto raw = take(count);
    uint64_t value = 0;
    for (int i = count - 1; i >= 0; --i) value = value << 8 | static_cast<uint8_t>(raw[i]);
    return value;
  }
  std::string line() {
    const auto end = in_.find('\n', pos_);
    if (end == std::string_view::npos) fail("a GLOBAL is not ended");
    std::string out(in_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return out;
  }
  void push(ValuePtr v) {
    if (++pushes_ > kMaxPicklePushes) {
      fail("it pushes more than " + std::to_string(kMaxPicklePushes) +
           " values (a dict of tensors takes ~25 a tensor); refusing it rather than growing without bound");
    }
    stack_.push_back(std::move(v));
  }
  // Note [Bounded unpickling]: the memo and the open marks grow too. A value is memoized once (torch.save
  // stores about one in three pushes), so no more entries than values pushed; and a MARK is closed
  // before its values nest deeper than kMaxPickleDepth, so no more open marks than that allows.
  void memoize(uint64_t key) {
    if (memo_.size() >= pushes_ && memo_.find(key) == memo_.end()) {
      fail("it stores more memo entries (" + std::to_string(memo_.size() + 1) + ") than it pushed values (" +
           std::to_string(pushes_) + "); torch.save memoizes each value once at most");
    }
    memo_[key] = top();
  }
  void mark() {
    if (marks_.size() >= kMaxOpenMarks) {
      fail("it opens more than " + std::to_string(kMaxOpenMarks) + " MARKs at once (torch.save nests a few)");
    }
    marks_.push_back(stack_.size());
  }
  ValuePtr pop() {
    if (stack_.empty() || (!marks_.empty() && marks_.back() == stack_.size())) fail("its stack runs empty");
    auto v = stack_.back();
    stack_.pop_back();
    return v;
  }
  ValuePtr top() {
    if (stack_.empty()) fail("its stack runs empty");
    return stack_.back();
  }
  ValuePtr expect(const ValuePtr& v, Value::Kind kind, const char* what) {
    if (v->kind != kind) fail(std::string(what) + " on a value of the wrong kind");
    return v;
  }
  // Puts `child` inside `parent`. What is inside another value may not change afterwards (torch.save,
  // like any pickler, finishes a value before placing it), so depths stay true and no value can
  // come to hold itself: a nesting deeper than kMaxPickleDepth is refused as it is built.
  void adopt(Value& parent, Value& child) {
    if (parent.placed) fail("it changes a value after placing it inside another");
    if (&parent == &child) fail("a value holds itself");
    if (child.depth >= kMaxPickleDepth) {
      fail("its values nest more than " + std::to_string(kMaxPickleDepth) + " deep (a dict of tensors needs about 5)");
    }
    child.placed = true;
    parent.depth = std::max(parent.depth, child.depth + 1);
  }
  ValuePtr memo(uint64_t key) {
    const auto found = memo_.find(key);
    if (found == memo_.end()) fail("it refers to memo entry " + std::to_string(key) + ", never stored");
    return found->second;
  }
  // The items since the last MARK, as one value of `kind`.
  ValuePtr collect(Value::Kind kind) {
    if (marks_.empty()) fail("a MARK is missing");
    auto v = make(kind);
    v->items.assign(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()), stack_.end());
    for (const auto& item : v->items) adopt(*v, *item);
    stack_.resize(marks_.back());
    marks_.pop_back();
    return v;
  }
  void tuple_of(int count) {
    auto v = make(Value::Kind::kTuple);
    v->items.resize(count);
    for (int i = count - 1; i >= 0; --i) v->items[i] = pop();
    for (const auto& item : v->items) adopt(*v, *item);
    push(v);
  }
  void string_of(uint64_t size) {
    auto v = make(Value::Kind::kString);
    v->text = std::string(take(size));
    push(v);
  }
  void integer(int64_t value) {
    auto v = make(Value::Kind::kInt);
    v->integer = value;
    push(v);
  }
  void long1() {
    const auto size = byte();
    if (size > 8) fail("an integer wider than 64 bits");
    uint64_t value = size ? le(size) : 0;
    if (size && size < 8 && (value >> (8 * size - 1)) & 1) value |= ~uint64_t{0} << (8 * size);  // sign
    integer(static_cast<int64_t>(value));
  }
  void global(const std::string& name) {
    static const char* const allowed[] = {"collections.OrderedDict", "torch._utils._rebuild_tensor_v2",
                                          "torch._utils._rebuild_tensor_v3", "torch._utils._rebuild_parameter",
                                          kUntypedStorage};
    bool ok = false;
    for (const char* a : allowed) ok = ok || name == a;
    for (const auto& [type, cls] : kStorageClasses) ok = ok || name == std::string("torch.") + cls;
    for (const auto& [type, dtype] : kPickleDtypeNames) ok = ok || name == std::string("torch.") + dtype;
    if (!ok) {  // See Note [Whole files that are not state dicts]
      not_a_state_dict(path_, "its pickle names the Python class or function " + name + ", which a dict of tensors "
                       "does not (cpprun's reader takes dicts of tensors, their storages and dtypes, and calls nothing "
                       "else). torch.save(model) saves the whole module, its class included; a checkpoint dict may "
                       "hold other Python objects. Save the state dict alone, in Python: torch.save(model."
                       "state_dict(), \"model.pt\"); from this file: torch.save(torch.load(\"" + path_ +
                       "\", weights_only=False).state_dict(), \"model.pt\") for a whole module, or [\"model\"] "
                       "for the model's entry of a checkpoint dict.");
    }
    auto v = make(Value::Kind::kGlobal);
    v->text = name;
    push(v);
  }
  int64_t as_int(const ValuePtr& v, const char* what) {
    if (v->kind != Value::Kind::kInt) fail(std::string(what) + " is not an integer");
    return v->integer;
  }
  std::vector<int64_t> as_ints(const ValuePtr& v, const char* what) {
    if (v->kind != Value::Kind::kTuple) fail(std::string(what) + " is not a tuple");
    std::vector<int64_t> out;
    for (const auto& item : v->items) out.push_back(as_int(item, what));
    return out;
  }
  void reduce() {
    auto args = expect(pop(), Value::Kind::kTuple, "REDUCE");
    auto callable = expect(pop(), Value::Kind::kGlobal, "REDUCE");
    const auto& a = args->items;
    if (callable->text == "collections.OrderedDict") {
      if (!a.empty()) fail("OrderedDict called with arguments");
      push(make(Value::Kind::kDict));
    } else if (callable->text == "torch._utils._rebuild_tensor_v2" ||
               callable->text == "torch._utils._rebuild_tensor_v3") {
      // v2: (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata]), the
      // dtype the storage's; v3: (..., backward_hooks, dtype[, metadata]), the storage untyped bytes.
      const bool v3 = callable->text.back() == '3';
      const std::size_t metadata_at = v3 ? 7 : 6;
      if (a.size() < (v3 ? 7u : 4u) || a.size() > metadata_at + 1 || a[0]->kind != Value::Kind::kStorage) {
        fail(callable->text + " with other arguments");
      }
      const auto sizes = as_ints(a[2], "a tensor's size");
      const auto strides = as_ints(a[3], "a tensor's stride");
      const int64_t offset = as_int(a[1], "a tensor's storage offset");
      if (sizes.size() != strides.size()) fail("a tensor's size and stride differ in length");
      const at::ScalarType dtype = v3 ? dtype_of(a[6]) : a[0]->tensor.scalar_type();
      auto v = make(Value::Kind::kTensor);
      try {
        v->tensor = at::empty({0}, at::TensorOptions().dtype(dtype)).set_(a[0]->tensor.storage(), offset, sizes, strides);
      } catch (const c10::Error& e) {
        fail(std::string("a tensor does not fit its storage: ") + e.what_without_backtrace());
      }
      if (a.size() > metadata_at) v->tensor = with_metadata(v->tensor, a[metadata_at]);
      push(v);
    } else if (callable->text == "torch._utils._rebuild_parameter") {
      if (a.empty() || a[0]->kind != Value::Kind::kTensor) fail("_rebuild_parameter with other arguments");
      push(a[0]);
    } else {
      fail(callable->text + " called");
    }
  }
  at::ScalarType dtype_of(const ValuePtr& v) {
    if (v->kind == Value::Kind::kGlobal) {
      for (const auto& [type, name] : kPickleDtypeNames) {
        if (v->text == std::string("torch.") + name) return type;
      }
    }
    fail("_rebuild_tensor_v3's dtype is not one cpprun reads");
  }
  // torch.save records a view's lazy negation or conjugation (a.conj().imag, ...) as metadata
  // {'neg': True} / {'conj': True} over the stored, not yet negated, values: applied here, so the
  // tensor holds what PyTorch's torch.load gives.
  at::Tensor with_metadata(at::Tensor tensor, const ValuePtr& metadata) {
    if (metadata->kind == Value::Kind::kNone) return tensor;
    if (metadata->kind != Value::Kind::kDict) fail("a tensor's metadata is not a dict");
    for (const auto& [key, value] : metadata->entries) {
      const bool set = value->kind == Value::Kind::kBool && value->integer != 0;
      if (key->kind != Value::Kind::kString || value->kind != Value::Kind::kBool) {
        fail("a tensor's metadata holds other than names and true / false");
      }
      if (key->text == "neg") {
        if (set) tensor = at::neg(tensor);
      } else if (key->text == "conj") {
        if (set && !tensor.is_complex()) fail("a tensor of dtype " + std::string(c10::toString(tensor.scalar_type())) +
                                              " is marked conjugated");
        if (set) tensor = at::conj_physical(tensor);
      } else {
        fail("a tensor's metadata \"" + key->text + "\" is not one cpprun knows (it applies 'neg' and 'conj')");
      }
    }
    return tensor;
  }
  // An OrderedDict's state (a state dict's _metadata: version numbers) means nothing here.
  void build() {
    pop();
    if (top()->kind != Value::Kind::kDict) fail("BUILD on something other than a dict");
  }
  // ('storage', torch.<Type>Storage, key, location, numel): data/<key>'s bytes, read once.
  ValuePtr storage(const ValuePtr& id) {
    const auto& a = expect(id, Value::Kind::kTuple, "a persistent id")->items;
    if (a.size() != 5 || a[0]->kind != Value::Kind::kString || a[0]->text != "storage" ||
        a[1]->kind != Value::Kind::kGlobal || a[2]->kind != Value::Kind::kString) {
      fail("a persistent id other than ('storage', type, key, location, numel)");
    }
    at::ScalarType type = at::kByte;  // an UntypedStorage: its numel counts bytes
    bool found = a[1]->text == kUntypedStorage;
    for (const auto& [t, cls] : kStorageClasses) {
      if (a[1]->text == std::string("torch.") + cls) type = t, found = true;
    }
    if (!found) fail("a storage of type " + a[1]->text);
    const int64_t numel = as_int(a[4], "a storage's size");
    const std::string& key = a[2]->text;
    auto& cached = storages_[key];
    if (!cached) {
      const std::string record = "data/" + key;
      if (!zip_.hasRecord(record)) fail("its storage " + key + " is missing from the zip");
      // Sized from the zip's directory first: a deflated record is inflated only when it fits.
      const std::size_t declared = zip_.getRecordSize(record);
      const auto holds_numel = [&](std::size_t bytes) {
        return numel >= 0 && bytes % at::elementSize(type) == 0 &&
               bytes / at::elementSize(type) == static_cast<std::size_t>(numel);
      };
      if (!holds_numel(declared)) {
        fail("storage " + key + " holds " + std::to_string(declared) + " bytes, not " + std::to_string(numel) +
             " elements of " + c10::toString(type));
      }
      auto [data, size] = zip_.getRecord(record);
      if (!holds_numel(size)) {
        fail("storage " + key + " holds " + std::to_string(size) + " bytes, not " + std::to_string(numel) +
             " elements of " + c10::toString(type));
      }
      c10::Storage storage(c10::Storage::use_byte_size_t(), size, std::move(data), nullptr, false);
      cached = make(Value::Kind::kStorage);
      cached->tensor = at::empty({0}, at::TensorOptions().dtype(type)).set_(storage);
    }
    return cached;
  }

  std::string_view in_;
  caffe2::serialize::PyTorchStreamReader& zip_;
  const std::string& path_;
  std::size_t pos_ = 0;
  std::size_t pushes_ = 0;
  std::vector<ValuePtr> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<uint64_t, ValuePtr> memo_;
  std::map<std::string, ValuePtr> storages_;
};

// What a value is, in Python's words, for messages.
std::string kind_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return "a bool";
    case Value::Kind::kInt: return "an int";
    case Value::Kind::kFloat: return "a float";
    case Value::Kind::kString: return "a str";
    case Value::Kind::kTuple: return "a tuple";
    case Value::Kind::kList: return "a list";
    case Value::Kind::kDict: return "a dict";
    case Value::Kind::kTensor: return "a tensor";
    default: return "another object";
  }
}

// Whether `v` is a non-empty dict of string keys and tensor values: a state dict.
bool is_state_dict(const Value& v) {
  if (v.kind != Value::Kind::kDict || v.entries.empty()) return false;
  return std::all_of(v.entries.begin(), v.entries.end(), [](const auto& entry) {
    return entry.first->kind == Value::Kind::kString && entry.second->kind == Value::Kind::kTensor;
  });
}

// A checkpoint dict ({"model": state_dict, "epoch": 3, ...}) described: its keys and what each
// holds, the keys holding a state dict, and how to load one of them.
std::string describe_checkpoint_dict(const Value& root, const std::string& path) {
  std::string listed;
  std::vector<std::string> state_dicts;
  std::size_t shown = 0;
  for (const auto& [key, value] : root.entries) {
    const std::string name = key->kind == Value::Kind::kString ? "\"" + key->text + "\"" : kind_name(*key);
    const bool nested = is_state_dict(*value);
    if (nested && key->kind == Value::Kind::kString) state_dicts.push_back(key->text);
    if (shown++ < 20) {
      listed += (listed.empty() ? "" : ", ") + name + " (" +
                (nested ? "a state dict of " + std::to_string(value->entries.size()) + " tensors" : kind_name(*value)) +
                ")";
    }
  }
  if (shown > 20) listed += ", ... and " + std::to_string(shown - 20) + " more";
  std::string out = "it holds a dict of " + listed + ". ";
  if (state_dicts.empty()) {
    return out + "Save the model's state dict alone, in Python: torch.save(model.state_dict(), \"model.pt\").";
  }
  std::string keys;
  for (std::size_t i = 0; i < state_dicts.size(); ++i) keys += (i ? ", \"" : "\"") + state_dicts[i] + "\"";
  const std::string& first = state_dicts.front();
  return out + "A checkpoint dict: the state dict" + (state_dicts.size() > 1 ? "s are under " : " is under ") + keys +
         ". Save it alone, once, in Python: torch.save(torch.load(\"" + path + "\")[\"" + first +
         "\"], \"model.pt\"), and load model.pt.";
}

}  // namespace

std::string encode_torch_save(const NamedTensors& tensors) {
  std::string out;
  caffe2::serialize::PyTorchStreamWriter zip([&out](const void* data, std::size_t size) {
    out.append(static_cast<const char*>(data), size);
    return size;
  });
  PickleWriter pickle;
  pickle.empty_ordered_dict();
  pickle.op('(');
  std::unordered_map<const void*, std::pair<std::string, at::Tensor>> written;  // tensor -> key, CPU copy
  for (const auto& [name, tensor] : tensors) {
    auto& entry = written[tensor.unsafeGetTensorImpl()];
    if (entry.first.empty()) {
      entry.first = std::to_string(written.size() - 1);
      // A lazily conjugated or negated view (z.conj()) holds its values un-applied: applied here,
      // since the file carries no such flag (torch.load would read the stored values as they are).
      entry.second = tensor.detach().to(at::kCPU).resolve_conj().resolve_neg().contiguous();
      zip.writeRecord("data/" + entry.first, entry.second.data_ptr(), entry.second.nbytes());
    }
    const at::Tensor& cpu = entry.second;
    // As torch.save: a legacy storage class and _rebuild_tensor_v2 where the dtype has one, else
    // an UntypedStorage of bytes and _rebuild_tensor_v3 naming the dtype.
    const char* typed = storage_class(cpu.scalar_type());
    const char* untyped = typed ? nullptr : pickle_dtype_name(cpu.scalar_type());
    TORCH_CHECK(typed || untyped, "cpprun: cannot write tensor \"", name, "\" of dtype ", cpu.scalar_type(),
                " to a .pt state dict: torch.save has no storage for it. Save it as .safetensors, or convert it first.");
    pickle.string(name);
    pickle.global("torch._utils", typed ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3");
    pickle.op('(');
    pickle.op('(');  // the persistent id of its storage
    pickle.string("storage");
    if (typed) pickle.global("torch", typed);
    else pickle.global("torch.storage", "UntypedStorage");
    pickle.string(entry.first);
    pickle.string("cpu");
    pickle.integer(typed ? cpu.numel() : static_cast<int64_t>(cpu.nbytes()));
    pickle.op('t');
    pickle.op('Q');
    pickle.integer(0);  // storage offset
    pickle.int_tuple(cpu.sizes());
    pickle.int_tuple(cpu.strides());
    pickle.op('\x89');  // requires_grad=False, as state_dict() detaches
    pickle.empty_ordered_dict();  // backward hooks
    if (untyped) pickle.global("torch", untyped);
    pickle.op('t');
    pickle.op('R');
  }
  pickle.op('u');
  pickle.op('.');
  zip.writeRecord("data.pkl", pickle.bytes.data(), pickle.bytes.size());
  zip.writeRecord("byteorder", "little", 6);
  zip.writeRecord(".format_version", "1", 1);
  zip.writeEndOfFile();
  return out;
}

bool is_legacy_torch_save(std::string_view head) {
  // Protocols 0 and 1 (no PROTO) write the magic number 0x1950a86a20f9469cfc6c as a text LONG.
  static constexpr std::string_view kTextMagic("L119547037146038801333356L\n");
  const std::size_t text_bytes = std::min(head.size(), kTextMagic.size());
  if (text_bytes >= 8 && head.substr(0, text_bytes) == kTextMagic.substr(0, text_bytes)) return true;
  // PROTO 2 by default, any of 2-5 with pickle_protocol=; from protocol 4 a FRAME (an opcode and
  // 8 bytes) next; then the magic number as a 10-byte LONG1, as much of it as `head` holds.
  static constexpr std::string_view kMagic("\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 12);
  if (head.size() < 4 || head[0] != '\x80' || head[1] < 2 || head[1] > 5) return false;
  std::string_view rest = head.substr(2);
  if (!rest.empty() && rest[0] == '\x95') rest = rest.size() > 9 ? rest.substr(9) : std::string_view();
  const std::size_t compared = std::min(rest.size(), kMagic.size());
  return compared >= 2 && rest.substr(0, compared) == kMagic.substr(0, compared);
}

NamedTensors decode_torch_save(std::string_view bytes, const std::string& path) {
  // torch.save's format before PyTorch 1.6 (and with _use_new_zipfile_serialization=False): a
  // pickle of its magic number, not a zip.
  if (is_legacy_torch_save(bytes)) {
    bad_pt_file(path, "it is in torch.save's legacy format (PyTorch before 1.6, or _use_new_zipfile_serialization="
                      "False), which cpprun does not read; load it in PyTorch and torch.save it again with the defaults");
  }
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> zip;
  try {
    zip = std::make_unique<caffe2::serialize::PyTorchStreamReader>(
        std::make_shared<caffe2::serialize::MemoryReadAdapter>(bytes.data(), static_cast<off_t>(bytes.size())));
  } catch (const c10::Error& e) {
    bad_pt_file(path, std::string("it is not a zip archive (") + e.what_without_backtrace() + ")");
  }
  try {
    if (zip->hasRecord("byteorder")) {
      auto [order, size] = zip->getRecord("byteorder");
      if (std::string_view(static_cast<const char*>(order.get()), size) != "little") {
        bad_pt_file(path, "its data is big-endian, which cpprun does not read; re-save it on a little-endian machine");
      }
    }
    if (!zip->hasRecord("data.pkl"))
      bad_pt_file(path, "it has no data.pkl (a TorchScript archive? Load it with torch::load)");
    if (zip->getRecordSize("data.pkl") > kMaxPickleBytes) {
      bad_pt_file(path, "its data.pkl declares " + std::to_string(zip->getRecordSize("data.pkl")) +
                            " bytes, more than a dict of tensors' pickle takes (see Note [Bounded unpickling])");
    }
    auto [pickle_data, pickle_size] = zip->getRecord("data.pkl");
    const std::string_view pickle(static_cast<const char*>(pickle_data.get()), pickle_size);
    const ValuePtr root = PickleReader(pickle, *zip, path).run();
    if (root->kind != Value::Kind::kDict) not_a_state_dict(path, "it holds " + kind_name(*root) + ", not a dict.");
    NamedTensors out;
    for (const auto& [key, value] : root->entries) {
      if (key->kind != Value::Kind::kString) bad_pt_file(path, "a key of its dict is not a string");
      if (value->kind != Value::Kind::kTensor) not_a_state_dict(path, describe_checkpoint_dict(*root, path));
      out.emplace_back(key->text, value->tensor);
    }
    return out;
  } catch (const c10::Error& e) {
    bad_pt_file(path, std::string("it cannot be read as torch.save's dict of tensors (") + e.what_without_backtrace() +
                          ")");
  } catch (const std::bad_alloc&) {
    bad_pt_file(path, "reading it needs more memory than this process can have");
  }
}

}  // namespace cpprun::detail
