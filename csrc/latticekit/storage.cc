#include "latticekit/storage.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "latticekit/errors.h"

namespace latticekit {

ModelStorage *ModelStorage::Allocate(size_t size) {
  ModelStorage *storage = new ModelStorage();
  storage->owned_.assign((size + 7) / 8 + 8, 0);
  uintptr_t base = reinterpret_cast<uintptr_t>(storage->owned_.data());
  uintptr_t aligned = (base + 63) & ~uintptr_t(63);
  storage->data_ = reinterpret_cast<char *>(aligned);
  storage->size_ = size;
  return storage;
}

ModelStorage *ModelStorage::Map(const std::string &path) {
  // O_NONBLOCK: a FIFO given by mistake is refused below instead of blocking the open.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    throw FileSystemError(path, err, std::string("cannot open: ") + std::strerror(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw FileSystemError(path, err, std::string("cannot stat: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw FileSystemError(path, S_ISDIR(st.st_mode) ? EISDIR : EINVAL, "not a regular file");
  }
  ModelStorage *storage = new ModelStorage();
  storage->size_ = static_cast<size_t>(st.st_size);
  if (storage->size_ == 0) {
    ::close(fd);
    delete storage;
    throw ModelFileError(path + ": empty file, not a latticekit model");
  }
  void *p = ::mmap(nullptr, storage->size_, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    delete storage;
    throw FileSystemError(path, err, std::string("cannot map: ") + std::strerror(err));
  }
  storage->data_ = static_cast<char *>(p);
  storage->mapped_ = true;
  return storage;
}

ModelStorage::~ModelStorage() {
  if (mapped_ && data_ != nullptr) ::munmap(data_, size_);
}

namespace {
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t Round(uint64_t acc, uint64_t v) { return Rotl(acc + v * kP2, 31) * kP1; }
inline uint64_t Load64(const char *p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
}  // namespace

uint64_t Checksum64(const char *data, size_t size) {
  const char *p = data;
  const char *end = data + size;
  uint64_t h;
  if (size >= 32) {
    uint64_t v1 = kP1 + kP2, v2 = kP2, v3 = 0, v4 = 0 - kP1;
    const char *limit = end - 32;
    do {
      v1 = Round(v1, Load64(p));
      v2 = Round(v2, Load64(p + 8));
      v3 = Round(v3, Load64(p + 16));
      v4 = Round(v4, Load64(p + 24));
      p += 32;
    } while (p <= limit);
    h = Rotl(v1, 1) + Rotl(v2, 7) + Rotl(v3, 12) + Rotl(v4, 18);
    for (uint64_t v : {v1, v2, v3, v4}) h = (h ^ Round(0, v)) * kP1 + kP4;
  } else {
    h = kP5;
  }
  h += static_cast<uint64_t>(size);
  for (; p + 8 <= end; p += 8) h = Rotl(h ^ Round(0, Load64(p)), 27) * kP1 + kP4;
  for (; p < end; ++p) h = Rotl(h ^ (static_cast<uint8_t>(*p) * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

}  // namespace latticekit
