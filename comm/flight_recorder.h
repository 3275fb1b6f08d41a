// This process's flight recorder (cpprun/flight_recorder.h): the ring buffer every collective is
// recorded in, its settings from the environment, and what dumps it (a failed or timed-out
// collective, a request byte on CPPRUN_FLIGHT_RECORDER_REQUEST_FD, std::terminate). Internal to
// comm/. See Note [Flight recorder].
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>

#include "comm/flight_recorder_json.h"
#include "comm/flight_recorder_ring.h"
#include "cpprun/env.h"

namespace cpprun::detail {

// CPPRUN_FLIGHT_RECORDER_ENTRIES: unset means 2000 (as PyTorch's TORCH_FR_BUFFER_SIZE), 0 turns
// the recorder off; anything but a whole number from 0 to 1,000,000 throws, naming the value.
std::size_t parse_flight_recorder_entries(const std::optional<std::string>& value);

// The process's ring, made on first use from CPPRUN_FLIGHT_RECORDER_ENTRIES (a bad value throws
// there, and again on the next use). Never destroyed: threads may dump while the process exits.
FlightRecorderRing& flight_recorder();

// Called by init_process_group() with the job's environment: checks the recorder's environment
// variables (a bad value throws, naming it), takes this process's global rank for its dumps and,
// once per process, installs the std::terminate handler and starts the request listener.
void start_flight_recorder(const DistEnv& env);

// The group every collective of the world group `index` (0 for the first init_process_group)
// records, and a subgroup's: `name` under its parent's, its members mapped to global ranks.
std::shared_ptr<const RecordedGroup> recorded_world_group(int index, int world_size);
std::shared_ptr<const RecordedGroup> recorded_subgroup(const RecordedGroup& parent, const std::string& name,
                                                       const std::vector<int>& members_in_parent);

// Records a collective as started; returns its id for the calls below (0 when the recorder is
// off, which they ignore). `tensors`: at most two, the output first.
uint64_t record_issued(const std::shared_ptr<const RecordedGroup>& group, uint64_t seq, const char* op,
                       c10::ArrayRef<at::Tensor> tensors, std::optional<ReduceOp> reduce,
                       std::optional<int> root);
// The same for a send or receive: `peer` (none: any source), its tag, and what it carries when the
// caller said (empty: nothing said).
uint64_t record_message(const std::shared_ptr<const RecordedGroup>& group, uint64_t seq, const char* op,
                        const at::Tensor& tensor, std::optional<int> peer, int tag, std::string label);
void record_completed(uint64_t id);
// Marks the collective failed and dumps (reason "timeout" when it failed after the group's
// `timeout` or says it timed out, else "failure"; see dump_after_failure). Call before the error
// propagates; never throws.
void record_failed(uint64_t id, std::chrono::milliseconds timeout, std::exception_ptr error);

// Writes the dump to $CPPRUN_FLIGHT_RECORDER_DIR/rank_<rank>.json when that is set and no failure
// has dumped yet (Note [First failure dump]); false when it did not write (a write that fails is
// said on stderr). Never throws.
bool dump_after_failure(DumpReason reason);

}  // namespace cpprun::detail
