// The one assertion of the fuzz targets: prints the broken invariant, then traps, which
// libFuzzer reports as a crash and saves the input as a reproducer.
#pragma once

#include <cstdio>

#define FUZZ_CHECK(cond)                                                                \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond); \
      __builtin_trap();                                                                 \
    }                                                                                   \
  } while (0)
