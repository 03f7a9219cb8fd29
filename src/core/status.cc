#include "fc/core/status.h"

#include <cstring>

namespace fc {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kIoError: return "IO_ERROR";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kVerifyFailed: return "VERIFY_FAILED";
    case StatusCode::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

int ExitCodeFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return 0;
    case StatusCode::kInternal: return 1;
    case StatusCode::kInvalidArgument: return 3;
    case StatusCode::kNotFound: return 4;
    case StatusCode::kDataLoss: return 5;
    case StatusCode::kUnimplemented: return 6;
    case StatusCode::kIoError: return 7;
    case StatusCode::kFailedPrecondition: return 8;
    case StatusCode::kOutOfRange: return 9;
    case StatusCode::kResourceExhausted: return 10;
    case StatusCode::kVerifyFailed: return 11;
  }
  return 1;
}

Status Status::With(std::string_view context) const& {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m));
}

Status Status::With(std::string_view context) && {
  if (ok()) return std::move(*this);
  std::string m(context);
  m += ": ";
  m += message_;
  message_ = std::move(m);
  return std::move(*this);
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

Status InvalidArgumentError(std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); }
Status NotFoundError(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
Status DataLossError(std::string m) { return Status(StatusCode::kDataLoss, std::move(m)); }
Status UnimplementedError(std::string m) { return Status(StatusCode::kUnimplemented, std::move(m)); }
Status IoError(std::string m) { return Status(StatusCode::kIoError, std::move(m)); }
Status FailedPreconditionError(std::string m) { return Status(StatusCode::kFailedPrecondition, std::move(m)); }
Status OutOfRangeError(std::string m) { return Status(StatusCode::kOutOfRange, std::move(m)); }
Status ResourceExhaustedError(std::string m) { return Status(StatusCode::kResourceExhausted, std::move(m)); }
Status VerifyFailedError(std::string m) { return Status(StatusCode::kVerifyFailed, std::move(m)); }
Status InternalError(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }

Status ErrnoError(std::string message, int errno_value) {
  message += ": ";
  message += std::strerror(errno_value);
  return Status(StatusCode::kIoError, std::move(message));
}

}  // namespace fc
