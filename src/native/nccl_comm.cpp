// The NCCL DeviceComm (native/device_comm.h); without NCCL in the build, make_nccl_comm says so.
#include <cuda_runtime.h>

#include <atomic>

#include "native/cuda_check.h"
#include "native/device_comm.h"
#include "runtime/communicator.h"
#if M3_WITH_NCCL
#include <nccl.h>
#endif

namespace m3::native {

#if M3_WITH_NCCL
namespace {

#define M3_NCCL_CHECK(call, what)                                                                             \
  do {                                                                                                        \
    const ncclResult_t r_ = (call);                                                                           \
    M3_CHECK(r_ == ncclSuccess, "nccl: {} failed: {} ({})", what, ncclGetErrorString(r_), ncclGetLastError(nullptr)); \
  } while (0)

class NcclComm final : public DeviceComm {
 public:
  explicit NcclComm(Communicator& boot) : rank_(boot.rank()), size_(boot.size()) {
    ncclUniqueId id{};
    if (rank_ == 0) M3_NCCL_CHECK(ncclGetUniqueId(&id), "ncclGetUniqueId");
    boot.broadcast(&id, sizeof id, 0);
    M3_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
  }
  ~NcclComm() override {
    if (comm_ && !aborted_) ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  void abort(const std::string&) override {
    bool expected = false;
    if (aborted_.compare_exchange_strong(expected, true)) ncclCommAbort(comm_);  // unblocks its kernels
  }
  bool capturable() const override { return true; }
  void all_gather(const void* in, void* out, size_t bytes, cudaStream_t stream) override {
    M3_NCCL_CHECK(ncclAllGather(in, out, bytes, ncclUint8, comm_, stream), "ncclAllGather");
  }

 private:
  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> aborted_{false};
};

}  // namespace

bool nccl_available() { return true; }
std::unique_ptr<DeviceComm> make_nccl_comm(Communicator& bootstrap) { return std::make_unique<NcclComm>(bootstrap); }
#else
bool nccl_available() { return false; }
std::unique_ptr<DeviceComm> make_nccl_comm(Communicator&) {
  M3_FAIL("nccl: this build has no NCCL (the CUDA toolkit's libnccl was not found at configure time)");
}
#endif

}  // namespace m3::native
