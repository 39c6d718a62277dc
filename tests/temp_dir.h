// TempDir: a fresh directory under /tmp for one test, removed with everything in it.
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>  // defines: mkdtemp

#include <filesystem>
#include <string>

namespace loom::testing {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "loom_test") {
    std::string name = "/tmp/" + prefix + ".XXXXXX";
    REQUIRE(::mkdtemp(name.data()) != nullptr);
    path = name;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace loom::testing
