// The whole cpprun API: #include <cpprun/cpprun.h>.
#pragma once

#include "cpprun/activation_checkpoint.h"
#include "cpprun/atomic_file.h"
#include "cpprun/checkpoint_file.h"
#include "cpprun/collectives.h"
#include "cpprun/comm_hooks.h"
#include "cpprun/data_parallel.h"
#include "cpprun/ddp.h"
#include "cpprun/env.h"
#include "cpprun/fsdp.h"
#include "cpprun/fsdp_stats.h"
#include "cpprun/grad_scaler.h"
#include "cpprun/no_sync.h"
#include "cpprun/process_group.h"
#include "cpprun/record.h"
#include "cpprun/sampler.h"
#include "cpprun/unique_parameters.h"
