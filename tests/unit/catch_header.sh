#!/usr/bin/env bash
# Every test source gets Catch2 through tests/catch.h, so that Catch2's CHECK wins over c10's
# whatever the include order (Note [Catch2's CHECK against c10's] there); none includes
# <catch2/catch.hpp> itself. usage: catch_header.sh TESTS_DIR
set -u
tests=${1:?usage: catch_header.sh TESTS_DIR}
direct=$(grep -rlE '#include[[:space:]]*<catch2/catch\.hpp>' "$tests" --include='*.cpp' --include='*.h' \
         | grep -v '/catch\.h$')
if [ -n "$direct" ]; then
  echo "FAIL: these include <catch2/catch.hpp> directly; include \"catch.h\" instead:"
  echo "$direct"
  exit 1
fi
using=$(grep -rlE '\b(TEST_CASE|SECTION|REQUIRE|CHECK)\(' "$tests" --include='*.cpp' | wc -l)
[ "$using" -gt 0 ] || { echo "FAIL: no test source found under $tests"; exit 1; }
echo "catch_header: $using test sources, none includes <catch2/catch.hpp> directly"
