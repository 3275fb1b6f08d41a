// See cpprun/record.h. The error file has the layout torch.distributed.elastic's ErrorHandler
// writes (torchrun's agent and cpprun read "message" and extraInfo's "timestamp"):
//   {"message": {"message": "TYPE: WHAT", "extraInfo": {"py_callstack": ..., "timestamp": "SECONDS"}}}
// plus "rank" and "cpprun_failed_at_ms" (launcher_contract.h) in extraInfo. C++ has no call stack
// once an exception has unwound to main; for a c10::Error, "py_callstack" holds its full what(),
// which includes the stack where it was thrown.
#include "cpprun/record.h"

#include <c10/util/Exception.h>
#include <cxxabi.h>

#include <atomic>
#include <chrono>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "cpprun/atomic_file.h"
#include "cpprun/launcher_contract.h"
#include "support/error_report_hook.h"

namespace cpprun {
namespace {

// The C++ type of the exception being handled, demangled ("std::invalid_argument").
std::string current_exception_type() {
  const std::type_info* type = abi::__cxa_current_exception_type();
  if (!type) return "unknown exception";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(type->name(), nullptr, nullptr, &status), std::free);
  return status == 0 && name ? name.get() : type->name();
}

// Length of the valid UTF-8 sequence at text[i], or 0 when the bytes there are not one.
std::size_t utf8_sequence(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  std::size_t length = 0;
  std::uint32_t code = 0;
  if (lead >= 0xC2 && lead <= 0xDF) length = 2, code = lead & 0x1F;
  else if (lead >= 0xE0 && lead <= 0xEF) length = 3, code = lead & 0x0F;
  else if (lead >= 0xF0 && lead <= 0xF4) length = 4, code = lead & 0x07;
  else return 0;
  if (i + length > text.size()) return 0;
  for (std::size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    code = code << 6 | (byte(i + k) & 0x3F);
  }
  const bool overlong = (length == 3 && code < 0x800) || (length == 4 && code < 0x10000);
  const bool surrogate = code >= 0xD800 && code <= 0xDFFF;
  return overlong || surrogate || code > 0x10FFFF ? 0 : length;
}

// `text` as a JSON string literal. Bytes that are not UTF-8 (a file name in another encoding)
// become U+FFFD: JSON readers refuse them, and the whole report would be lost.
std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (std::size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {
      const std::size_t length = utf8_sequence(text, i);
      out += length ? std::string(text.substr(i, length)) : "\\ufffd";
      i += length ? length : 1;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char escaped[7];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
          out += escaped;
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
  return out + "\"";
}

struct Report {
  std::string type, message, callstack;
};

Report report_of(std::exception_ptr error) {
  Report r;
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    r.type = current_exception_type();
    r.message = e.what_without_backtrace();
    r.callstack = r.type + ": " + e.what();
  } catch (const std::exception& e) {
    r.type = current_exception_type();
    r.message = e.what();
    r.callstack = r.type + ": " + r.message + "\n(no C++ call stack: the exception had unwound to main)";
  } catch (...) {
    r.type = current_exception_type();
    r.message = "(an exception of type " + r.type + ", which does not derive from std::exception)";
    r.callstack = r.message;
  }
  return r;
}

}  // namespace

namespace detail {
namespace {
constinit std::atomic<ErrorReportHook> error_report_hook{nullptr};
}  // namespace

void set_error_report_hook(ErrorReportHook hook) noexcept { error_report_hook.store(hook); }
}  // namespace detail

int report_exception(std::exception_ptr error) noexcept {
  try {
    // One reading for torch's whole seconds and cpprun's milliseconds, so that they agree.
    const auto failed_at_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::system_clock::now().time_since_epoch()).count();
    const Report report = report_of(error);
    const char* rank = std::getenv("RANK");
    // The message on stderr first: it must not depend on the error file being writable.
    std::fprintf(stderr, "error%s%s: %s: %s\n", rank ? " on rank " : "", rank ? rank : "", report.type.c_str(),
                 report.message.c_str());
    std::fflush(stderr);
    if (const auto hook = detail::error_report_hook.load()) hook();  // comm/: the flight recorder's dump
    const char* file = std::getenv(contract::kErrorFileVariable);
    if (!file || !*file) return kRecordedErrorExitCode;
    // The keys the launcher reads: cpprun/launcher_contract.h.
    const auto key = [](const char* name) { return "\"" + std::string(name) + "\": "; };
    const std::string json =
        "{\n"
        "  " + key(contract::kErrorFileMessageKey) + "{\n"
        "    " + key(contract::kErrorFileMessageKey) + json_string(report.type + ": " + report.message) + ",\n"
        "    " + key(contract::kErrorFileExtraInfoKey) + "{\n"
        "      " + key(contract::kErrorFileTimestampKey) + "\"" +
        std::to_string(static_cast<long long>(failed_at_ms / 1000)) + "\",\n"
        "      " + key(contract::kErrorFileFailedAtMsKey) + "\"" + std::to_string(static_cast<long long>(failed_at_ms)) + "\",\n"
        "      \"rank\": " + json_string(rank ? rank : "0") + ",\n"
        "      " + key(contract::kErrorFileCallstackKey) + json_string(report.callstack) + "\n"
        "    }\n"
        "  }\n"
        "}\n";
    try {
      write_file_atomically(file, json);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cpprun::record: could not write the error file (TORCHELASTIC_ERROR_FILE): %s\n", e.what());
    }
  } catch (...) {  // out of memory while reporting: still end with the error's exit code
    std::fputs("cpprun::record: the worker failed with an exception, which could not be reported\n", stderr);
  }
  return kRecordedErrorExitCode;
}

}  // namespace cpprun
