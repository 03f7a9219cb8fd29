// fc::Status and fc::Result<T>: the one error vocabulary of the fc library.
//
// Library code never throws. A function that can fail returns `Status` (no value) or
// `Result<T>` (a value or an error). Errors carry a closed `StatusCode`, which the tools map
// to a fixed exit-code table (see ExitCodeFor and man/fc-inspect.1, EXIT STATUS), and a
// message built up as the error travels outwards:
//
//   reading __3_0.distcp: tensor 'wq' chunk (0, 64): expected 8192 bytes, file has 4096
//
// Context is prepended with `status.With("reading {}", path)`-style calls: the innermost
// cause stays at the end of the line, the outermost context at the start.
//
// Thread-safety: values; no shared state.
#ifndef FC_CORE_STATUS_H_
#define FC_CORE_STATUS_H_

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace fc {

// The closed set of error kinds. Add a code only together with an exit code below.
enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // bad flags, bad AOA program, inconsistent request from the user
  kNotFound,            // missing file, missing tensor, missing chunk
  kDataLoss,            // corrupt or truncated input: bad magic, bad pickle, sizes that lie
  kUnimplemented,       // a valid input that fc does not support (yet)
  kIoError,             // the OS refused: open/read/write/rename failed, disk full
  kFailedPrecondition,  // e.g. output directory exists and is not empty
  kOutOfRange,          // a size or index beyond what fc or the platform can represent
  kResourceExhausted,   // memory budget too small for the smallest unit of work
  kVerifyFailed,        // --verify found coverage, overlap or checksum problems
  kInternal,            // a bug in fc
};

// Name of the code, e.g. "DATA_LOSS".
std::string_view StatusCodeName(StatusCode code);

// The process exit code for a final status. Stable; documented in the man pages.
//   0 ok, 1 internal error, 2 usage (CLI parse errors, set by the tools), 3 invalid argument,
//   4 not found, 5 corrupt input, 6 unsupported, 7 I/O error, 8 failed precondition,
//   9 out of range, 10 resource exhausted, 11 verification failed.
int ExitCodeFor(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {
    assert(code != StatusCode::kOk);
  }

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Returns this error with `context + ": "` prepended. No-op on OK.
  Status With(std::string_view context) const&;
  Status With(std::string_view context) &&;

  // "DATA_LOSS: reading x: ..." (or "OK").
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Named constructors, one per code.
Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status DataLossError(std::string message);
Status UnimplementedError(std::string message);
Status IoError(std::string message);
Status FailedPreconditionError(std::string message);
Status OutOfRangeError(std::string message);
Status ResourceExhaustedError(std::string message);
Status VerifyFailedError(std::string message);
Status InternalError(std::string message);

// An IoError whose message ends with strerror(errno_value).
Status ErrnoError(std::string message, int errno_value);

// A value of type T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : storage_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : storage_(std::move(status)) {  // NOLINT: implicit by design
    assert(!std::get<Status>(storage_).ok() && "Result constructed from OK status");
    if (std::get<Status>(storage_).ok()) {
      storage_ = Status(StatusCode::kInternal, "Result constructed from OK status");
    }
  }

  bool ok() const { return std::holds_alternative<T>(storage_); }
  // The error; OK when a value is held.
  Status status() const { return ok() ? Status() : std::get<Status>(storage_); }

  // Preconditions: ok().
  T& value() & { assert(ok()); return std::get<T>(storage_); }
  const T& value() const& { assert(ok()); return std::get<T>(storage_); }
  T&& value() && { assert(ok()); return std::get<T>(std::move(storage_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  // Adds context to the error (no-op on a value).
  Result With(std::string_view context) && {
    if (ok()) return std::move(*this);
    return std::get<Status>(storage_).With(context);
  }

 private:
  std::variant<T, Status> storage_;
};

namespace internal {
inline Status AsStatus(const Status& s) { return s; }
template <typename T>
Status AsStatus(const Result<T>& r) { return r.status(); }
}  // namespace internal

}  // namespace fc

#define FC_STATUS_CONCAT_INNER_(a, b) a##b
#define FC_STATUS_CONCAT_(a, b) FC_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status or Result) is an error.
#define FC_RETURN_IF_ERROR(expr)                                   \
  do {                                                             \
    ::fc::Status fc_status_ = ::fc::internal::AsStatus((expr));    \
    if (!fc_status_.ok()) return fc_status_;                       \
  } while (0)

// Like FC_RETURN_IF_ERROR, prefixing `context` to the message.
#define FC_RETURN_IF_ERROR_WITH(expr, context)                     \
  do {                                                             \
    ::fc::Status fc_status_ = ::fc::internal::AsStatus((expr));    \
    if (!fc_status_.ok()) return std::move(fc_status_).With(context); \
  } while (0)

#define FC_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr)  \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

// `FC_ASSIGN_OR_RETURN(auto x, ComputeX());` declares x from a Result or returns its error.
#define FC_ASSIGN_OR_RETURN(lhs, expr) \
  FC_ASSIGN_OR_RETURN_IMPL_(FC_STATUS_CONCAT_(fc_result_, __LINE__), lhs, expr)

#endif  // FC_CORE_STATUS_H_
