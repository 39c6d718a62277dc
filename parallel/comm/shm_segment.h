// SharedMemorySegment: one POSIX shared-memory object (shm_open + mmap) that every
// rank on a host maps, and host_identity(), which tells whether ranks share a host.
//
//   // rank 0
//   auto seg = SharedMemorySegment::create(unique_name("group0"), bytes);
//   store.set("segment", seg.name());
//   // every other rank
//   auto seg = SharedMemorySegment::open(store.get("segment"), bytes);
//   // once every rank has mapped it (rank 0, after a store counter says so)
//   seg.unlink();
//
// Note [Unlink as soon as everyone has mapped]
// A POSIX shm object lives in /dev/shm until it is unlinked, even after every process
// that mapped it has died: a crashed job would leak its memory until reboot. A mapping,
// though, keeps the memory alive on its own. So the creator unlinks the name as soon
// as every rank has mapped it (and also when the rendezvous fails, and in its
// destructor if it never got that far); from then on the memory is freed by the kernel
// when the last process holding a mapping exits, however it exits.
//
// Note [Reserve the memory up front]
// ftruncate makes a sparse object: pages are allocated on first touch, and when
// /dev/shm is full (Docker's default is 64 MiB) that first touch is a SIGBUS in the
// middle of a collective. create() calls posix_fallocate instead, so a too-small
// /dev/shm is an error at setup, where the communicator can fall back to TCP.
#pragma once

#include <cstddef>
#include <string>

namespace loom::distributed {

class SharedMemorySegment {
 public:
  SharedMemorySegment() = default;
  // Creates the object `name` ("/loom-..."), reserves `bytes` (zero-filled) and maps it.
  static SharedMemorySegment create(const std::string& name, size_t bytes);
  // Maps an existing object; its size must be `bytes`.
  static SharedMemorySegment open(const std::string& name, size_t bytes);
  ~SharedMemorySegment();
  SharedMemorySegment(SharedMemorySegment&& other) noexcept;
  SharedMemorySegment& operator=(SharedMemorySegment&& other) noexcept;
  SharedMemorySegment(const SharedMemorySegment&) = delete;
  SharedMemorySegment& operator=(const SharedMemorySegment&) = delete;

  // Removes the name; the mapping stays valid. Idempotent. See Note [Unlink as soon as
  // everyone has mapped].
  void unlink() noexcept;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  bool mapped() const { return data_ != nullptr; }

 private:
  void release() noexcept;

  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool owner_ = false;  // created it: unlinks it if nobody did
  bool linked_ = false;
};

// `bytes` rounded up to whole 4 KiB pages, at least one page: segment sizes and the
// offsets of per-rank areas inside a segment, so that no two ranks' areas share a page
// (nor a cache line) and vector loads stay aligned.
constexpr size_t whole_pages(size_t bytes) {
  constexpr size_t kPage = 4096;
  return bytes == 0 ? kPage : (bytes + kPage - 1) / kPage * kPage;
}

// A name no other segment on this host has: "/loom-<pid>-<random>-<tag>", tag cut to
// what shm names allow.
std::string unique_segment_name(const std::string& tag);

// Identifies this host's memory: hostname + the kernel's boot id. Two processes with the
// same identity can map the same shm object (unless they live in separate containers
// with separate /dev/shm; that case is caught when the open fails).
std::string host_identity();

}  // namespace loom::distributed
