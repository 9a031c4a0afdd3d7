// Probe: what does one dependent hop cost between two ops on this GPU, with mono's protocol and its
// alternatives, against a kernel boundary inside a CUDA graph? A chain of L ops, each of I items
// (item w of every op on CTA w % grid, as mono's placement keeps an op's items on the same CTAs);
// op o's items wait until every item of op o - 1 has completed. Each item reads its 16 bytes per
// thread of op o - 1's output (the dependency is real) and writes its own; `bytes` per item.
// Persistent variants (one cooperative launch, grid = SMs x 1 CTA of 512 threads, as mono):
//   acq     : mono today: thread 0 polls the producer op's counter with ld.acquire.gpu and
//             __nanosleep(ns) between polls, __syncthreads; after the items __syncthreads, thread 0
//             red.release.gpu adds 1.
//   rlx     : the poll with ld.relaxed.gpu, one fence.acq_rel.gpu once the target is seen.
//   warp    : as acq, but every warp publishes its own part after __syncwarp (no CTA barrier after
//             the items; the target counts warps).
//   fence   : as acq, publishing with __threadfence + red.relaxed.gpu.
//   allpoll : every warp's lane 0 polls (acquire) and the warp goes on alone (no CTA barriers at
//             all; the target counts warps as in warp).
// Native: L kernel launches of I CTAs in a CUDA graph, each item the same work.
// Build: nvcc -O3 -std=c++20 -arch=sm_90a -o hop_probe tools/probes/hop_probe.cu
// Run:   ./hop_probe [reps]   (one line per variant and shape: median us per op over the chain)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CK(x)                                                                         \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kStride = 32;  // counters 256 bytes apart

enum Variant { Acq, Rlx, WarpPub, Fence, AllPoll, kVariants };
const char* kNames[] = {"acq", "rlx", "warp", "fence", "allpoll"};

struct Args {
  unsigned long long* counters;  // [L][kStride]
  float4* buf;                   // [2][I][kThreads]: op o writes half o & 1
  int L, I, grid, vec;           // vec: float4s per thread per item (bytes = vec * 16 * kThreads)
  unsigned long long epoch;
  int ns;
};

__device__ __forceinline__ unsigned long long ld_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long ld_relaxed(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release(unsigned long long* p, unsigned long long v) {
  asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void red_relaxed(unsigned long long* p, unsigned long long v) {
  asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// The item's work: read op o - 1's output at the next item's slot (another CTA's), write op o's (a dependent sum so the
// loads are not dead).
__device__ __forceinline__ void item_work(const Args& a, int o, int w, int tid) {
  const float4* in = a.buf + (size_t((o + 1) & 1) * a.I + (w + 1) % a.I) * kThreads * a.vec;
  float4* out = a.buf + (size_t(o & 1) * a.I + w) * kThreads * a.vec;
  for (int v = 0; v < a.vec; ++v) {
    float4 x = in[v * kThreads + tid];
    x.x += 1.f;
    out[v * kThreads + tid] = x;
  }
}

template <Variant V>
__global__ void __launch_bounds__(kThreads, 1) chain_kernel(const Args a) {
  __shared__ int go;
  const int cta = blockIdx.x, tid = threadIdx.x, lane = tid % 32;
  const bool per_warp = V == WarpPub || V == AllPoll;
  const unsigned long long per_item = per_warp ? kWarps : 1;
  for (int o = 0; o < a.L; ++o) {
    for (int w = cta; w < a.I; w += a.grid) {
      if (o > 0) {
        const unsigned long long* c = a.counters + size_t(o - 1) * kStride;
        const unsigned long long target = a.epoch * a.I * per_item;
        if constexpr (V == AllPoll) {
          if (lane == 0) {
            while (ld_acquire(c) < target) __nanosleep(a.ns);
          }
          __syncwarp();
        } else {
          if (tid == 0) {
            if constexpr (V == Rlx) {
              while (ld_relaxed(c) < target) __nanosleep(a.ns);
              asm volatile("fence.acq_rel.gpu;" ::: "memory");
            } else {
              while (ld_acquire(c) < target) __nanosleep(a.ns);
            }
            go = 1;
          }
          __syncthreads();
        }
      }
      item_work(a, o, w, tid);
      unsigned long long* c = a.counters + size_t(o) * kStride;
      if constexpr (per_warp) {
        __syncwarp();
        if (lane == 0) red_release(c, 1);
      } else {
        __syncthreads();
        if (tid == 0) {
          if constexpr (V == Fence) {
            __threadfence();
            red_relaxed(c, 1);
          } else {
            red_release(c, 1);
          }
        }
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads) op_kernel(const Args a, int o) { item_work(a, o, blockIdx.x, threadIdx.x); }

struct Timer {
  cudaEvent_t b, e;
  Timer() {
    CK(cudaEventCreate(&b));
    CK(cudaEventCreate(&e));
  }
  float ms() {
    float m;
    CK(cudaEventElapsedTime(&m, b, e));
    return m;
  }
};

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 30;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs, %d threads per CTA, reps %d: median us per op over a chain of L ops\n", prop.name, sms,
              kThreads, reps);
  const int L = 800;
  const int item_counts[] = {sms, 32, 1};
  const int vecs[] = {0, 1, 4};
  unsigned long long* counters;
  CK(cudaMalloc(&counters, size_t(L) * kStride * 8));
  float4* buf;
  CK(cudaMalloc(&buf, size_t(2) * sms * kThreads * 4 * sizeof(float4)));
  CK(cudaMemset(buf, 0, size_t(2) * sms * kThreads * 4 * sizeof(float4)));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  Timer tm;
  std::printf("%-9s %5s %8s %6s %9s\n", "variant", "items", "bytes", "ns", "us/op");
  for (int I : item_counts)
    for (int vec : vecs) {
      const int bytes = vec * 16 * kThreads;
      // native: a graph of L launches
      {
        Args a{counters, buf, L, I, sms, vec, 0, 0};
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (int o = 0; o < L; ++o) op_kernel<<<I, kThreads, 0, st>>>(a, o);
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        std::vector<float> t;
        for (int r = 0; r < reps + 3; ++r) {
          CK(cudaEventRecord(tm.b, st));
          CK(cudaGraphLaunch(ge, st));
          CK(cudaEventRecord(tm.e, st));
          CK(cudaStreamSynchronize(st));
          if (r >= 3) t.push_back(tm.ms() * 1000.f / L);
        }
        std::printf("%-9s %5d %8d %6s %9.3f\n", "graph", I, bytes, "-", median(t));
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
      }
      for (int v = 0; v < kVariants; ++v)
        for (int ns : {0, 32, 128}) {
          if (ns != 32 && v != Acq) continue;
          CK(cudaMemset(counters, 0, size_t(L) * kStride * 8));
          std::vector<float> t;
          for (int r = 0; r < reps + 3; ++r) {
            Args a{counters, buf, L, I, sms, vec, (unsigned long long)(r + 1), ns};
            void* args[] = {&a};
            const void* fn = v == Acq       ? (const void*)chain_kernel<Acq>
                             : v == Rlx     ? (const void*)chain_kernel<Rlx>
                             : v == WarpPub ? (const void*)chain_kernel<WarpPub>
                             : v == Fence   ? (const void*)chain_kernel<Fence>
                                            : (const void*)chain_kernel<AllPoll>;
            CK(cudaEventRecord(tm.b, st));
            CK(cudaLaunchCooperativeKernel(fn, dim3(sms), dim3(kThreads), args, 0, st));
            CK(cudaEventRecord(tm.e, st));
            CK(cudaStreamSynchronize(st));
            if (r >= 3) t.push_back(tm.ms() * 1000.f / L);
          }
          std::printf("%-9s %5d %8d %6d %9.3f\n", kNames[v], I, bytes, ns, median(t));
        }
    }
  return 0;
}
