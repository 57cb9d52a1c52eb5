// Temporary paths for the C++ tests: one folder per test process, removed when it exits.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace bmoe {

inline std::string temp_path(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("bmoe-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  static const struct Cleanup {
    std::filesystem::path d;
    ~Cleanup() { std::filesystem::remove_all(d); }
  } cleanup{dir};
  return (dir / name).string();
}

}  // namespace bmoe
