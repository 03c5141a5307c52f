// The bytes of a model image: owned (freshly built) or memory-mapped (loaded). Writing an
// image to a file is the Python layer's (latticekit/_files.py: one atomic writer for every
// file latticekit writes).
#ifndef LATTICEKIT_STORAGE_H_
#define LATTICEKIT_STORAGE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace latticekit {

class ModelStorage {
 public:
  // Zero-filled, 64-byte aligned, owned bytes.
  static ModelStorage *Allocate(size_t size);
  // Maps path read-only. Throws FileSystemError when it cannot be opened or mapped, and
  // ModelFileError when it is empty.
  static ModelStorage *Map(const std::string &path);
  ~ModelStorage();
  ModelStorage(const ModelStorage &) = delete;
  ModelStorage &operator=(const ModelStorage &) = delete;

  const char *data() const { return data_; }
  char *mutable_data() { return owned_.empty() ? nullptr : data_; }
  size_t size() const { return size_; }

 private:
  ModelStorage() = default;
  std::vector<uint64_t> owned_;
  char *data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
};

// A fast 64-bit checksum (xxHash64-style rounds) of a byte range.
uint64_t Checksum64(const char *data, size_t size);

}  // namespace latticekit

#endif  // LATTICEKIT_STORAGE_H_
