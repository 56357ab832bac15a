// Result<T> and Error: errors are values (docs/architecture.md).
//
// An Error carries a small code that maps onto an HTTP status, the errno of the
// failed call when there was one, and a human context ("mount(overlay, /x): ...").
// Header-only and free of other dependencies so that tp-agent can use it.
// Thread rules: plain values, safe to copy between threads.
#pragma once

#include <cerrno>
#include <cstring>
#include <expected>
#include <string>
#include <string_view>

namespace tp {

enum class Code {
  kOk = 0,
  kInvalidArgument,      // 400
  kUnauthenticated,      // 401
  kPermissionDenied,     // 403
  kNotFound,             // 404
  kConflict,             // 409 (wrong state, e.g. exec on a stopped sandbox)
  kPayloadTooLarge,      // 413
  kResourceExhausted,    // 429 (quota, capacity)
  kInternal,             // 500
  kUnavailable,          // 503
  kDeadlineExceeded,     // 504
  kInsufficientStorage,  // 507 (disk limit of a sandbox reached)
};

// Stable wire name of a code ("not_found"); used in JSON errors and the agent protocol.
constexpr std::string_view code_name(Code c) {
  switch (c) {
    case Code::kOk:
      return "ok";
    case Code::kInvalidArgument:
      return "invalid_argument";
    case Code::kUnauthenticated:
      return "unauthenticated";
    case Code::kPermissionDenied:
      return "permission_denied";
    case Code::kNotFound:
      return "not_found";
    case Code::kConflict:
      return "conflict";
    case Code::kPayloadTooLarge:
      return "payload_too_large";
    case Code::kResourceExhausted:
      return "resource_exhausted";
    case Code::kInternal:
      return "internal";
    case Code::kUnavailable:
      return "unavailable";
    case Code::kDeadlineExceeded:
      return "deadline_exceeded";
    case Code::kInsufficientStorage:
      return "insufficient_storage";
  }
  return "internal";
}

constexpr Code code_from_name(std::string_view n) {
  for (int i = 0; i <= static_cast<int>(Code::kInsufficientStorage); ++i) {
    if (code_name(static_cast<Code>(i)) == n) return static_cast<Code>(i);
  }
  return Code::kInternal;
}

constexpr int http_status(Code c) {
  switch (c) {
    case Code::kOk:
      return 200;
    case Code::kInvalidArgument:
      return 400;
    case Code::kUnauthenticated:
      return 401;
    case Code::kPermissionDenied:
      return 403;
    case Code::kNotFound:
      return 404;
    case Code::kConflict:
      return 409;
    case Code::kPayloadTooLarge:
      return 413;
    case Code::kResourceExhausted:
      return 429;
    case Code::kInternal:
      return 500;
    case Code::kUnavailable:
      return 503;
    case Code::kDeadlineExceeded:
      return 504;
    case Code::kInsufficientStorage:
      return 507;
  }
  return 500;
}

// Maps an errno from a file or process operation to the closest code.
constexpr Code code_from_errno(int e) {
  switch (e) {
    case ENOENT:
    case ENOTDIR:
    case ESRCH:
      return Code::kNotFound;
    case EINVAL:
    case ENAMETOOLONG:
    case ELOOP:
    case EISDIR:
    case EXDEV:
      return Code::kInvalidArgument;
    case EACCES:
    case EPERM:
    case EROFS:
      return Code::kPermissionDenied;
    case EEXIST:
    case ENOTEMPTY:
    case EBUSY:
    case ETXTBSY:
      return Code::kConflict;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return Code::kInsufficientStorage;
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case EAGAIN:
      return Code::kResourceExhausted;
    case ETIMEDOUT:
      return Code::kDeadlineExceeded;
    default:
      return Code::kInternal;
  }
}

struct Error {
  Code code = Code::kInternal;
  int sys_errno = 0;    // errno of the failed call, 0 if none
  std::string context;  // what failed, with its arguments

  // "mount(overlay, /x): Permission denied" style message.
  std::string message() const {
    if (sys_errno == 0) return context;
    return context + ": " + std::strerror(sys_errno);
  }
};

template <typename T = void>
using Result = std::expected<T, Error>;

inline std::unexpected<Error> fail(Code code, std::string context) {
  return std::unexpected(Error{code, 0, std::move(context)});
}

// Error from the current errno of a failed syscall; context names the call and arguments.
inline std::unexpected<Error> sys_fail(std::string context, int e = errno) {
  return std::unexpected(Error{code_from_errno(e), e, std::move(context)});
}

}  // namespace tp

// Propagates an error from an expression returning Result<...>.
#define TP_TRY(expr)                                           \
  do {                                                         \
    auto tp_try_r_ = (expr);                                   \
    if (!tp_try_r_) return std::unexpected(tp_try_r_.error()); \
  } while (0)
