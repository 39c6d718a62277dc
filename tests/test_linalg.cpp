// PLACEHOLDER: replaced by this module's tests.
#include <doctest/doctest.h>
