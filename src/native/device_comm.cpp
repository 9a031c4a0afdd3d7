// The host-staged DeviceComm (native/device_comm.h).
#include "native/device_comm.h"

#include <cuda_runtime.h>

#include <vector>

#include "native/cuda_check.h"
#include "runtime/communicator.h"

namespace m3::native {

namespace {

// Pinned host memory that grows to the largest exchange.
class PinnedBuf {
 public:
  ~PinnedBuf() {
    if (p_) cudaFreeHost(p_);
  }
  void* get(size_t bytes) {
    if (bytes > cap_) {
      if (p_) M3_CUDA_CHECK(cudaFreeHost(p_));
      p_ = nullptr;
      M3_CUDA_CHECK(cudaMallocHost(&p_, bytes));
      cap_ = bytes;
    }
    return p_;
  }

 private:
  void* p_ = nullptr;
  size_t cap_ = 0;
};

class HostStagedComm final : public DeviceComm {
 public:
  explicit HostStagedComm(std::shared_ptr<Communicator> host) : host_(std::move(host)) {
    M3_CHECK(host_ != nullptr, "host-staged collectives: no host communicator");
  }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string name() const override { return "host-staged"; }
  void abort(const std::string& why) override { host_->fail(why); }
  bool capturable() const override { return false; }

  void all_gather(const void* in, void* out, size_t bytes, cudaStream_t stream) override {
    const size_t N = size_t(size());
    void* mine = in_.get(bytes);
    void* all = out_.get(bytes * N);
    M3_CUDA_CHECK(cudaMemcpyAsync(mine, in, bytes, cudaMemcpyDeviceToHost, stream));
    M3_CUDA_CHECK(cudaStreamSynchronize(stream));
    host_->all_gather(mine, all, bytes);
    M3_CUDA_CHECK(cudaMemcpyAsync(out, all, bytes * N, cudaMemcpyHostToDevice, stream));
    // the pinned buffer is reused by the next call: the copy must have read it
    M3_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

 private:
  std::shared_ptr<Communicator> host_;
  PinnedBuf in_, out_;
};

}  // namespace

std::unique_ptr<DeviceComm> make_host_staged_comm(std::shared_ptr<Communicator> host) {
  return std::make_unique<HostStagedComm>(std::move(host));
}

}  // namespace m3::native
