// The one Catch2 main every test binary links.
#define CATCH_CONFIG_RUNNER
#include "catch.h"

int main(int argc, char* argv[]) {
  Catch::Session session;
  // Catch2 v2 exits 0 when a tag or name filter matches no test case: a ctest entry whose filter
  // went stale would pass having run nothing. Warning about "no tests" makes that run fail (exit 2);
  // a `-w NoTests` on the command line only repeats it.
  session.configData().warnings = Catch::WarnAbout::NoTests;
  if (int status = session.applyCommandLine(argc, argv); status != 0) return status;
  return session.run();
}
