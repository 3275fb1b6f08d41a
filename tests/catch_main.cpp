// The one Catch2 main every test binary links.
#define CATCH_CONFIG_MAIN
#include "catch.h"
