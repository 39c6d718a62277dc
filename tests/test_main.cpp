#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

// Note [doctest messages name no structured binding]
// doctest's INFO, CAPTURE and *_MESSAGE build their message in a lambda that captures what
// it names. clang 16 with -fopenmp (the sanitizer builds, docs/testing.md) refuses to
// capture a structured binding ("not yet supported in OpenMP"), so a loop over
// `const auto& [key, t]` names its key through a plain reference before a message uses it.
