#include "parallel/comm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <fstream>
#include <random>
#include <utility>

#include "core/error.h"
#include "parallel/system_error.h"  // defines: LOOM_CHECK_ERRNO

namespace loom::distributed {

namespace {

// Closes a descriptor on every path out of create/open; the mapping does not need it.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

void* map_shared(int fd, size_t bytes, const std::string& name) {
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  LOOM_CHECK_ERRNO(data != MAP_FAILED, "mmap of shared-memory segment ", name, " (", bytes, " bytes)");
  return data;
}

}  // namespace

SharedMemorySegment SharedMemorySegment::create(const std::string& name, size_t bytes) {
  LOOM_CHECK(bytes > 0, "SharedMemorySegment::create(", name, "): expected a positive size");
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  LOOM_CHECK_ERRNO(fd >= 0, "shm_open(\"", name, "\", O_CREAT | O_EXCL)");
  FdCloser closer{fd};
  SharedMemorySegment seg;
  seg.name_ = name;
  seg.owner_ = true;
  seg.linked_ = true;  // from here on, the destructor unlinks on any failure
  // See Note [Reserve the memory up front]. posix_fallocate returns the error itself.
  if (int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    errno = err;
    LOOM_CHECK_ERRNO(false, "reserving ", bytes, " bytes for shared-memory segment ", name,
                     " (posix_fallocate; is /dev/shm large enough? `df -h /dev/shm`; in Docker, --shm-size)");
  }
  seg.data_ = map_shared(fd, bytes, name);
  seg.size_ = bytes;
  return seg;
}

SharedMemorySegment SharedMemorySegment::open(const std::string& name, size_t bytes) {
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  LOOM_CHECK_ERRNO(fd >= 0, "shm_open(\"", name, "\") of the segment rank 0 created (is this rank in the same "
                   "container, with the same /dev/shm?)");
  FdCloser closer{fd};
  struct stat st {};
  LOOM_CHECK_ERRNO(::fstat(fd, &st) == 0, "fstat of shared-memory segment ", name);
  LOOM_CHECK(static_cast<size_t>(st.st_size) == bytes, "shared-memory segment ", name, " holds ", st.st_size,
             " bytes, expected ", bytes, " (ranks built with different loom versions?)");
  SharedMemorySegment seg;
  seg.name_ = name;
  seg.data_ = map_shared(fd, bytes, name);
  seg.size_ = bytes;
  return seg;
}

SharedMemorySegment::~SharedMemorySegment() { release(); }

SharedMemorySegment::SharedMemorySegment(SharedMemorySegment&& other) noexcept { *this = std::move(other); }

SharedMemorySegment& SharedMemorySegment::operator=(SharedMemorySegment&& other) noexcept {
  if (this != &other) {
    release();
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    owner_ = std::exchange(other.owner_, false);
    linked_ = std::exchange(other.linked_, false);
  }
  return *this;
}

void SharedMemorySegment::unlink() noexcept {
  if (owner_ && linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

void SharedMemorySegment::release() noexcept {
  unlink();
  if (data_) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

std::string unique_segment_name(const std::string& tag) {
  std::random_device device;
  const uint64_t random = (uint64_t(device()) << 32) | device();
  std::string clean;
  for (char c : tag) clean += (std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  if (clean.size() > 64) clean.resize(64);  // NAME_MAX is 255; stay far below it
  char random_hex[17];
  std::snprintf(random_hex, sizeof(random_hex), "%016llx", static_cast<unsigned long long>(random));
  return detail::str("/loom-", ::getpid(), "-", random_hex, "-", clean);
}

std::string host_identity() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;  // empty where /proc lacks it
  return std::string(host) + "/" + boot_id;
}

}  // namespace loom::distributed
