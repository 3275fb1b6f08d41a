// What cpprun::record (cpprun/record.h) runs when it reports an error, before it writes the error
// file: a hook a higher layer installs, so that support/, the library's bottom layer, includes
// nothing above it. comm/ installs the flight recorder's dump (comm/flight_recorder.cpp), so that
// a failing rank leaves its last collectives for the launcher's diagnosis.
#pragma once

namespace cpprun::detail {

using ErrorReportHook = void (*)() noexcept;  // must catch what it throws: record() exits with the error's code

// Replaces the hook (nullptr: none). Safe from any thread; the last one set runs.
void set_error_report_hook(ErrorReportHook hook) noexcept;

}  // namespace cpprun::detail
