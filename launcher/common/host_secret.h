// The job secret when the user gives none and no other host could need it: a job whose agents all
// run on this host (a loopback rendezvous endpoint) shares one kept in a file only this user can
// read; a job of one agent (--nnodes=1, c10d) makes one that never leaves the process. So that
// `cpprun --rdzv_backend=c10d --nnodes=1:2 ...` on one machine runs as torchrun's does, with the
// agents still proving a secret to each other. See Note [A job on one host] in host_secret.cpp.
#pragma once

#include <string>

#include "cpprun/env_lookup.h"

namespace cpprun::launcher {

// Every agent of a job whose endpoint is `host` is on this host: "localhost", 127.0.0.0/8 or ::1
// written as numbers. (No name is resolved: a name that resolves to the loopback elsewhere is not
// taken as one, and that job then needs CPPRUN_JOB_SECRET as any multi-node job does.)
bool is_loopback_endpoint_host(const std::string& host);

// The folder of this user's job secrets: $XDG_RUNTIME_DIR/cpprun when that variable names a folder
// this user owns with mode 0700 (what the XDG spec promises; a stale or shared value is passed
// over), else /tmp/cpprun-UID (UID the effective user id).
std::string host_secret_folder(const EnvLookup& env);

// Where shared_host_secret() keeps the secret of the job at `port` with `rdzv_id`.
std::string host_secret_path(const std::string& folder, int port, const std::string& rdzv_id);

// The secret of the job at loopback port `port` with rendezvous id `rdzv_id`, shared by this user's
// agents on this host: read from FOLDER/job-<hash of port and id>, which the first agent writes (32
// random bytes as hex, mode 0600, in a folder of mode 0700 it creates). Throws UsageError, naming
// the path and CPPRUN_JOB_SECRET as the way out, when the folder or file is not this user's alone
// (another owner, group or other permissions, a symbolic link) or cannot be made.
std::string shared_host_secret(const std::string& folder, int port, const std::string& rdzv_id);

}  // namespace cpprun::launcher
