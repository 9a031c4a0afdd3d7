// Names of finish reasons (API and metrics labels).
#include "runtime/request.h"

namespace m3 {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "none";
    case FinishReason::Length: return "length";
    case FinishReason::Stop: return "stop";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "none";
}

}  // namespace m3
