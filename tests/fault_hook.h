// Read-fault injection for the C++ tests: while a FaultHook lives, every positioned read of
// io/direct_io goes through its function (which may delay, shorten or fail it).
#pragma once

#include <utility>

#include "io/direct_io.h"

namespace bmoe {

class FaultHook {
 public:
  explicit FaultHook(ReadFaultHook hook) { set_read_fault_hook(std::move(hook)); }
  ~FaultHook() { set_read_fault_hook({}); }
  FaultHook(const FaultHook&) = delete;
  FaultHook& operator=(const FaultHook&) = delete;
};

}  // namespace bmoe
