// The bytes of a model image: owned (freshly built) or memory-mapped (loaded).
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
  // Maps path read-only. Throws ModelFileError when it cannot be opened or mapped.
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

// Writes bytes to path through a temporary file in the same folder and an atomic rename.
// Throws ModelFileError on failure; the destination is then untouched.
void WriteFileAtomically(const std::string &path, const char *data, size_t size);

// A fast 64-bit checksum (xxHash64-style rounds) of a byte range.
uint64_t Checksum64(const char *data, size_t size);

}  // namespace latticekit

#endif  // LATTICEKIT_STORAGE_H_
