// File access: read lanes (priorities, cancel and promote on threads; io_uring's reads, its cap
// on reads ahead and its short-read errors).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "fault_hook.h"
#include "io/direct_io.h"
#include "io/read_lanes.h"
#include "test_temp.h"

namespace bmoe {
namespace {

TEST(ReadLanes, UrgentFirstCancelAndPromote) {
  const std::string path = temp_path("lanes.bin");
  {
    std::ofstream f(path, std::ios::binary);
    const std::string block(1 << 16, 'x');
    f << block;
  }
  DirectFile file(path, false);
  ReadLanes lanes(1);
  std::vector<uint8_t> buf(5 << 12);
  // Hold the only lane so everything below queues.
  std::atomic<bool> release{false};
  FaultHook hook([&](const std::string&, uint64_t offset, uint64_t length) -> uint64_t {
    while (offset == 0 && !release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return length;
  });
  auto request = [&](int i, int priority) {
    ReadRequest r;
    r.file = &file;
    r.offset = static_cast<uint64_t>(i) << 12;
    r.length = r.required = 1 << 12;
    r.dst = buf.data() + (static_cast<size_t>(i) << 12);
    r.priority = priority;
    return r;
  };
  ReadTicket blocker, spec_a, spec_b, urgent;
  blocker.add(1);
  lanes.submit(request(0, 0), &blocker);
  spec_a.add(1);
  lanes.submit(request(1, 1), &spec_a);
  spec_b.add(1);
  lanes.submit(request(2, 1), &spec_b);
  urgent.add(1);
  lanes.submit(request(3, 0), &urgent);
  EXPECT_EQ(lanes.cancel(&spec_a), 1);  // still queued: dropped
  EXPECT_TRUE(spec_a.done());
  EXPECT_EQ(lanes.promote(&spec_b), 1);  // moves behind the urgent read
  EXPECT_EQ(lanes.cancel(&spec_b), 0);   // urgent reads are not cancellable
  EXPECT_EQ(lanes.cancel(&urgent), 0);
  release = true;
  EXPECT_TRUE(lanes.wait(urgent));
  EXPECT_TRUE(lanes.wait(spec_b));
  EXPECT_TRUE(lanes.wait(blocker));
  EXPECT_EQ(buf[2 << 12], 'x');
  EXPECT_EQ(buf[1 << 12], 0);  // the cancelled read never ran
}

// io_uring lanes read the same bytes as a plain read, start urgent reads at once but reads
// ahead only while fewer than `lanes` reads are in flight, accept a window that runs past the
// end of the file, and report a short read as an error naming the file.
TEST(ReadLanes, IoUringReadsCapsReadsAheadAndReportsShortReads) {
  if (!io_uring_built()) GTEST_SKIP() << "built without liburing";
  const std::string path = temp_path("uring.bin");
  const size_t size = (16 << 12) + 100;  // 16 blocks and a short tail
  auto pattern = [](size_t i) { return static_cast<char>((i * 7 + i / 4096) % 251); };
  {
    std::string bytes(size, '\0');
    for (size_t i = 0; i < size; ++i) bytes[i] = pattern(i);
    std::ofstream(path, std::ios::binary) << bytes;
  }
  DirectFile file(path, true);
  ReadLanes lanes(1, IoEngine::Uring);
  if (!lanes.uring()) GTEST_SKIP() << lanes.note();
  EXPECT_EQ(lanes.lanes(), 1);
  AlignedBuffer buf = allocate_aligned(20 << 12);
  std::memset(buf.get(), 0, 20 << 12);
  auto request = [&](size_t block, int priority, uint64_t required = 1 << 12) {
    ReadRequest r;
    r.file = &file;
    r.offset = block << 12;
    r.length = 1 << 12;
    r.required = required;
    r.dst = buf.get() + (block << 12);
    r.priority = priority;
    return r;
  };
  ReadTicket urgent, ahead, later_ahead, tail;
  urgent.add(8);
  for (size_t b = 0; b < 8; ++b) lanes.submit(request(b, 0), &urgent);
  ahead.add(2);
  lanes.submit(request(8, 1), &ahead);
  lanes.submit(request(9, 1), &ahead);
  // Eight urgent reads are in flight (nothing is collected until poll or wait), so with one
  // lane the reads ahead are still queued and can be dropped.
  EXPECT_EQ(lanes.cancel(&ahead), 2);
  EXPECT_TRUE(ahead.done());
  later_ahead.add(2);
  lanes.submit(request(10, 1), &later_ahead);
  lanes.submit(request(11, 1), &later_ahead);
  tail.add(1);
  lanes.submit(request(16, 0, 100), &tail);  // past the end of the file: 100 bytes required
  EXPECT_TRUE(lanes.wait(urgent));
  EXPECT_TRUE(lanes.wait(later_ahead));  // started once the urgent reads were collected
  EXPECT_TRUE(lanes.wait(tail));
  EXPECT_GT(lanes.busy_seconds(), 0.0);
  auto read_back = [&](size_t block, size_t n) {
    for (size_t i = block << 12; i < (block << 12) + n; ++i) {
      if (buf.get()[i] != static_cast<uint8_t>(pattern(i))) return false;
    }
    return true;
  };
  for (size_t b : {0, 5, 7, 10, 11}) EXPECT_TRUE(read_back(b, 1 << 12)) << "block " << b;
  EXPECT_TRUE(read_back(16, 100));
  EXPECT_EQ(buf.get()[8 << 12], 0);  // the cancelled reads never ran
  EXPECT_EQ(buf.get()[9 << 12], 0);
  // A read that needs bytes the file does not have is an error, not zeros.
  ReadTicket short_read;
  short_read.add(1);
  lanes.submit(request(16, 0), &short_read);
  EXPECT_FALSE(lanes.wait(short_read));
  EXPECT_NE(short_read.error().find("short read"), std::string::npos) << short_read.error();
  EXPECT_NE(short_read.error().find(path), std::string::npos);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace bmoe
