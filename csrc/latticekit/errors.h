// Typed exceptions thrown by the latticekit core. The Cython binding translates each into the
// matching class of latticekit.errors; nothing here aborts on user input.
#ifndef LATTICEKIT_ERRORS_H_
#define LATTICEKIT_ERRORS_H_

#include <new>
#include <stdexcept>
#include <string>

namespace latticekit {

// A malformed ARPA file. line is 1-based; 0 means the file as a whole (e.g. it ends early).
class ArpaError : public std::runtime_error {
 public:
  ArpaError(const std::string &path, long line, const std::string &what)
      : std::runtime_error(Format(path, line, what)), path_(path), line_(line) {}
  const std::string &path() const { return path_; }
  long line() const { return line_; }

 private:
  static std::string Format(const std::string &path, long line, const std::string &what) {
    std::string where = path.empty() ? std::string("<arpa>") : path;
    if (line > 0) where += ":" + std::to_string(line);
    return where + ": " + what;
  }
  std::string path_;
  long line_;
};

// A binary model file that is truncated, corrupted, or of another format or version.
class ModelFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An argument that does not fit the model or the search (bad shape, id, value).
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A file that cannot be opened, read, written or mapped: a problem of the file system, not
// of the file's content. code is the errno value (0 when there is none).
class FileSystemError : public std::runtime_error {
 public:
  FileSystemError(const std::string &path, int code, const std::string &what)
      : std::runtime_error(path + ": " + what), path_(path), code_(code) {}
  const std::string &path() const { return path_; }
  int code() const { return code_; }

 private:
  std::string path_;
  int code_;
};

// The operating system refused a worker thread (a thread, memory or pids limit). code is
// the errno value.
class ThreadStartError : public std::runtime_error {
 public:
  ThreadStartError(int code, const std::string &what) : std::runtime_error(what), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// What the exception being handled is, for bindings that translate it. Call it only
// inside a catch block.
struct ErrorInfo {
  // latticekit/_cpp.pxd declares this enum by name: its values are not repeated there.
  enum Kind {
    kOther = 0,  // a bug of latticekit's, not the input's
    kArpa = 1,
    kModelFile = 2,
    kInvalidArgument = 3,
    kNoMemory = 4,
    kFileSystem = 5,
    kThreadStart = 6,
  };
  Kind kind = kOther;
  std::string message;
  std::string path;
  long line = 0;
  int code = 0;  // errno, for kFileSystem and kThreadStart
};

inline ErrorInfo CurrentError() {
  ErrorInfo info;
  try {
    throw;
  } catch (const ArpaError &e) {
    info.kind = ErrorInfo::kArpa;
    info.message = e.what();
    info.path = e.path();
    info.line = e.line();
  } catch (const ModelFileError &e) {
    info.kind = ErrorInfo::kModelFile;
    info.message = e.what();
  } catch (const InvalidArgument &e) {
    info.kind = ErrorInfo::kInvalidArgument;
    info.message = e.what();
  } catch (const FileSystemError &e) {
    info.kind = ErrorInfo::kFileSystem;
    info.message = e.what();
    info.path = e.path();
    info.code = e.code();
  } catch (const ThreadStartError &e) {
    info.kind = ErrorInfo::kThreadStart;
    info.message = e.what();
    info.code = e.code();
  } catch (const std::bad_alloc &) {
    info.kind = ErrorInfo::kNoMemory;
    info.message = "out of memory";
  } catch (const std::length_error &e) {  // a size beyond what a container can hold
    info.kind = ErrorInfo::kNoMemory;
    info.message = std::string("out of memory: a requested size is too large (") + e.what() + ")";
  } catch (const std::exception &e) {
    info.message = e.what();
  } catch (...) {
    info.message = "unknown C++ exception";
  }
  return info;
}

}  // namespace latticekit

#endif  // LATTICEKIT_ERRORS_H_
