// The whole cpprun API: #include <cpprun/cpprun.h>.
#pragma once

#include "cpprun/atomic_file.h"
#include "cpprun/checkpoint_file.h"
#include "cpprun/collectives.h"
#include "cpprun/comm_hooks.h"
#include "cpprun/ddp.h"
#include "cpprun/device_mesh.h"
#include "cpprun/env.h"
#include "cpprun/fsdp.h"
#include "cpprun/no_sync.h"
#include "cpprun/object_collectives.h"
#include "cpprun/point_to_point.h"
#include "cpprun/process_group.h"
#include "cpprun/record.h"
#include "cpprun/sampler.h"
#include "cpprun/sync_batch_norm.h"
