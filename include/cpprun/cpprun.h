// The whole cpprun API: #include <cpprun/cpprun.h>.
#pragma once

#include "cpprun/collectives.h"
#include "cpprun/env.h"
#include "cpprun/process_group.h"
