// Catch2 for every test: include this, never <catch2/catch.hpp> directly (unit.catch_header checks;
// scripts/check_no_pch.sh compiles every test without the precompiled header).
//
// Note [Catch2's CHECK against c10's]: without glog, c10/util/logging_is_not_google_glog.h defines a
// one-argument CHECK(cond) that aborts the process. Whichever definition comes last wins, so a test
// that includes <catch2/catch.hpp> before a torch header silently gets c10's: a failed parity CHECK
// kills the rank instead of being counted (or, with two arguments, does not compile). Here c10's
// header (include-guarded, so never read again) comes first and its CHECK is dropped before Catch2
// defines its own; the order of the other includes no longer matters.
#pragma once

#if __has_include(<c10/util/Logging.h>)  // the launcher's tests build without LibTorch
#include <c10/util/Logging.h>
#undef CHECK
#endif
#include <catch2/catch.hpp>
