// make_chosen_backend: the CPU reference (checkpoint or dequantized prepared weights) or, in CUDA
// builds, the native backend over the prepared store loaded onto the GPU.
#include "cli/backend_choice.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/check.h"
#include "core/parallel.h"
#include "model/load_weights.h"
#include "model/prepare.h"
#include "model/safetensors.h"
#include "model/weight_table.h"
#include "ref/engine.h"
#include "runtime/communicator.h"
#include "runtime/tp_leader.h"
#if M3_WITH_MPI
#include "runtime/mpi/mpi_communicator.h"
#endif
#if M3_WITH_CUDA
#include "mono/mono.h"
#include "native/cuda_backend.h"
#include "native/cuda_check.h"
#include "native/cuda_tp_backend.h"
#include "native/device_comm.h"
#include "native/prepared.h"
#endif

namespace m3::cli {

void validate_backend_choice(const BackendChoice& c, const char* command) {
  M3_CHECK(c.device == "cpu" || c.device == "cuda" || c.device == "auto",
           "{}: --device must be cpu, cuda or auto, got '{}'", command, c.device);
  M3_CHECK(c.weights == "checkpoint" || c.weights == "prepared",
           "{}: --weights must be checkpoint or prepared, got '{}'", command, c.weights);
  M3_CHECK(c.threads >= 0, "{}: --threads must be >= 0, got {}", command, c.threads);
  M3_CHECK(c.tp >= 1 && c.tp <= 64, "{}: --tp must be in [1, 64], got {}", command, c.tp);
  M3_CHECK(c.tp_comm == "auto" || c.tp_comm == "nccl" || c.tp_comm == "host",
           "{}: --tp-comm must be auto, nccl or host, got '{}'", command, c.tp_comm);
  M3_CHECK(c.cache_dtype.empty() || c.cache_dtype == "fp32" || c.cache_dtype == "bf16" || c.cache_dtype == "fp8",
           "{}: --cache-dtype must be fp32, bf16 or fp8, got '{}'", command, c.cache_dtype);
  M3_CHECK(c.router_dtype == "float32" || c.router_dtype == "bfloat16",
           "{}: --router-dtype must be float32 or bfloat16, got '{}'", command, c.router_dtype);
  M3_CHECK(c.tp_launch == "threads" || c.tp_launch == "processes",
           "{}: --tp-launch must be threads or processes, got '{}'", command, c.tp_launch);
}

namespace {
// One line on stderr: the router weight's type and bytes in the prepared store actually built.
void note_router(const PreparedLayout& layout, bool bf16) {
  std::fprintf(stderr, "note: prepared router weight %s (%llu bytes)\n", bf16 ? "bfloat16" : "float32",
               (unsigned long long)layout.family_bytes[size_t(PreparedFamily::Router)]);
}
DType cache_dtype_of(const std::string& s, DType dflt) {
  return s.empty() ? dflt : s == "fp8" ? DType::F8_E4M3 : s == "bf16" ? DType::BF16 : DType::F32;
}

// This process's rank of the mpirun job (one rank per process): the communicator, after checking
// the job has --tp processes; the followers' stdout goes to /dev/null (rank 0 reports).
std::shared_ptr<Communicator> mpi_rank_comm(const BackendChoice& c, const char* command) {
#if M3_WITH_MPI
  std::shared_ptr<Communicator> comm = make_mpi_communicator();
  M3_CHECK(comm->size() == c.tp, "{}: --tp {} under mpirun -np {}: start one process per rank", command, c.tp,
           comm->size());
  if (comm->rank() != 0) {  // rank 0 reports; the others compute beside it (errors still on stderr)
    std::fflush(stdout);
    if (!std::freopen("/dev/null", "w", stdout)) std::fprintf(stderr, "note: rank %d keeps its stdout\n", comm->rank());
  }
  std::fprintf(stderr, "note: tensor-parallel rank %d of %d (mpi)\n", comm->rank(), comm->size());
  return comm;
#else
  M3_FAIL("{}: started by mpirun with --tp {}, but this build has no MPI (install libopenmpi-dev and rebuild); "
          "without mpirun the {} ranks run as threads of one process", command, c.tp, c.tp);
#endif
}

// --tp-launch processes: this very command again as `mpirun -np N <it>` (the process becomes
// mpirun; each rank then finds itself under mpirun and does not relaunch).
[[noreturn]] void relaunch_under_mpirun(const BackendChoice& c, const char* command) {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t i = 0; i < all.size();) {
    const size_t z = all.find('\0', i);
    args.push_back(all.substr(i, z == std::string::npos ? std::string::npos : z - i));
    i = z == std::string::npos ? all.size() : z + 1;
  }
  M3_CHECK(!args.empty(), "{}: --tp-launch processes: cannot read this command's arguments", command);
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  M3_CHECK(n > 0, "{}: --tp-launch processes: cannot find this program's path", command);
  args[0] = std::string(exe, size_t(n));
  std::vector<std::string> full = {"mpirun", "-np", std::to_string(c.tp)};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fprintf(stderr, "note: %s: --tp-launch processes: starting %d rank processes under mpirun\n", command, c.tp);
  std::fflush(nullptr);
  execvp("mpirun", argv.data());
  M3_FAIL("{}: --tp-launch processes needs Open MPI's mpirun on PATH (scripts/install-deps.sh installs it): {}",
          command, std::strerror(errno));
}

// Rank 0 leads: its backend broadcasts every step to the others (runtime/tp_leader.h) and is
// returned to the command. Every other rank follows here until rank 0 closes, then ends the
// process: the command's work (scheduler, server, report) is rank 0's alone.
std::unique_ptr<Backend> lead_or_follow(std::unique_ptr<Backend> be, std::shared_ptr<Communicator> comm,
                                        const char* command) {
  if (comm->rank() == 0) return make_tp_leader(std::move(be), std::move(comm));
  int rc = 0;
  try {
    const int64_t steps = follow_tp_leader(*be, *comm);
    std::fprintf(stderr, "note: %s: rank %d followed %lld steps\n", command, comm->rank(), (long long)steps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s: rank %d: %s\n", command, comm->rank(), e.what());
    comm->fail(e.what());  // the others learn of it (MPI: the job ends)
    rc = 1;
  }
  be.reset();
  comm.reset();
  std::fflush(nullptr);
  std::exit(rc);
}
}  // namespace

bool cuda_usable() {
#if M3_WITH_CUDA
  return native::cuda_device_available();
#else
  return false;
#endif
}

ModelWeights load_prepared_dequantized(const std::string& model_dir, const ModelSpec& spec, bool router_bf16) {
  SafetensorsSet files = SafetensorsSet::open(model_dir);
  WeightTable table = build_checkpoint_table(spec, files, model_dir);
  WeightBinding bind = bind_weights(table, files);
  auto src = make_weight_source(bind);
  PrepareOptions po;
  po.router_bf16 = router_bf16;
  po = prepare_options_for(bind, po);  // the GPU arena's formats (MXFP8 projections as stored)
  PreparedLayout layout = plan_prepared(spec, po);
  std::vector<uint8_t> arena(layout.total_bytes, 0);
  HostArenaSink sink(arena);
  ThreadPool pool(0);
  fill_prepared(layout, *src, sink, pool);
  note_router(layout, router_bf16);
  return dequantize_prepared(layout, host_arena_reader(arena));
}

#if M3_WITH_CUDA
namespace {
// An environment variable's integer value, or -1 when unset.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : -1;
}

// The mono runtime on backend `be`, when every rank of `comm` (null: this rank alone) accepts it:
// each rank creates its own, then all agree (runtime/communicator.h); one refusing rank turns every
// rank down and every rank's reasons are printed.
void add_mono_agreed(native::CudaBackend& be, Communicator* comm) {
  auto r = mono::create(be.model(), mono::MonoOptions{});
  auto* refusal = std::get_if<mono::Refusal>(&r);
  Verdict mine{refusal == nullptr, refusal ? refusal->text() : std::string()};
  const Agreement a = comm ? agree(*comm, mine) : Agreement{mine.ok, {mine}};
  if (!a.ok) {
    if (comm) {  // every rank knows every reason; rank 0 reports them
      if (comm->rank() == 0)
        std::fprintf(stderr, "note: mono refused on %s\n  (every rank runs every step natively)\n",
                     a.refusals().c_str());
    } else {
      std::fprintf(stderr, "note: %s\n  (every step runs natively)\n", mine.reason.c_str());
    }
    return;  // a runner this rank created is destroyed here, before any step
  }
  auto& runner = std::get<std::unique_ptr<mono::MonoRunner>>(r);
  std::fprintf(stderr, "note: %s\n", runner->describe().c_str());
  be.add_layer_range_runner(std::move(runner));
}

// One GPU rank per process of an mpirun job: the process's rank of the MPI communicator, the GPU
// of its local rank, its shard of the prepared weights, NCCL (or host-staged) collectives whose
// choice every rank agrees on, rank 0 leading (lead_or_follow).
std::unique_ptr<Backend> make_cuda_mpi_rank(const BackendChoice& c, const std::string& model_dir,
                                            const PrepareOptions& po, const native::PrepareLoadOptions& lo,
                                            native::CudaBackendOptions o, const char* command) {
  std::shared_ptr<Communicator> comm = mpi_rank_comm(c, command);
  const int rank = comm->rank();
  int gpus = 0;
  M3_CUDA_CHECK(cudaGetDeviceCount(&gpus));
  int local = env_int("OMPI_COMM_WORLD_LOCAL_RANK"), local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (local < 0) local = env_int("MPI_LOCALRANKID");
  if (local < 0) local = env_int("SLURM_LOCALID");
  if (local < 0) local = rank;
  if (local_size < 0) local_size = c.tp;
  const int device = local % gpus;
  M3_CUDA_CHECK(cudaSetDevice(device));
  // which collectives: every rank must make the same choice, so the rank-local facts (GPUs on this
  // host, NCCL in this build) are agreed first
  const bool own_gpu = local_size <= gpus, nccl = native::nccl_available();
  const Verdict can{own_gpu && nccl, !nccl ? std::string("this build has no NCCL")
                                           : own_gpu ? std::string()
                                                     : fmt::format("{} ranks share {} GPU(s) on its host", local_size, gpus)};
  const Agreement all = agree(*comm, can);
  M3_CHECK(c.tp_comm != "nccl" || all.ok, "{}: --tp-comm nccl: not every rank can use NCCL ({})", command,
           all.refusals());
  const bool use_nccl = c.tp_comm != "host" && all.ok;
  if (rank == 0)
    std::fprintf(stderr, "note: tensor parallelism on the GPU under mpirun: %d ranks, %s collectives%s%s\n", c.tp,
                 use_nccl ? "nccl" : "host-staged", all.ok ? "" : ": ", all.ok ? "" : all.refusals().c_str());
  std::fprintf(stderr, "note: rank %d on GPU %d of %d\n", rank, device, gpus);
  PrepareOptions rpo = po;
  rpo.tp_rank = rank;
  rpo.tp_size = c.tp;
  std::shared_ptr<const native::PreparedWeights> pw = native::PreparedWeights::load(model_dir, rpo, lo);
  o.device = device;
  o.comm = use_nccl ? std::shared_ptr<native::DeviceComm>(native::make_nccl_comm(*comm))
                    : std::shared_ptr<native::DeviceComm>(native::make_host_staged_comm(comm));
  auto be = native::make_cuda_backend(std::move(pw), o);
  if (c.mono) add_mono_agreed(*be, comm.get());
  return lead_or_follow(std::move(be), std::move(comm), command);
}
}  // namespace
#endif

std::unique_ptr<Backend> make_chosen_backend(const BackendChoice& c, const std::string& model_dir,
                                             const ModelSpec& spec, const char* command) {
  validate_backend_choice(c, command);
  if (c.tp > 1 && c.tp_launch == "processes" && !mpi_launched()) relaunch_under_mpirun(c, command);
  bool cuda = c.device == "cuda" || (c.device == "auto" && cuda_usable());
#if M3_WITH_CUDA
  if (cuda) {
    M3_CHECK(native::cuda_device_available(), "{}: --device cuda: no CUDA device is visible", command);
    if (c.weights != "checkpoint")
      std::fprintf(stderr, "note: --weights applies to the CPU reference; CUDA always runs the prepared weights\n");
    native::PrepareLoadOptions lo;
    lo.progress = false;
    PrepareOptions po;
    po.router_bf16 = c.router_dtype == "bfloat16";
    native::CudaBackendOptions o;
    M3_CHECK(c.cache_dtype != "fp32", "{}: --cache-dtype fp32 is for the CPU reference; CUDA caches are fp8 or bf16",
             command);
    o.kv_dtype = o.ik_dtype = cache_dtype_of(c.cache_dtype, DType::F8_E4M3);
    o.num_cache_blocks = std::max(c.cache_blocks, 1);
    if (c.max_seq_len > 0) o.max_model_len = std::min(c.max_seq_len, o.num_cache_blocks * spec.index_block);
    if (c.tp > 1 && mpi_launched()) return make_cuda_mpi_rank(c, model_dir, po, lo, o, command);
    if (c.tp > 1) {  // one rank backend per thread, each loading its own shard on its own device
      native::CudaTpOptions to;
      to.tp = c.tp;
      to.comm = c.tp_comm;
      to.backend = o;
      std::string why;
      const std::string engine = native::cuda_tp_comm_choice(to, &why);
      std::fprintf(stderr, "note: tensor parallelism on the GPU: %d ranks, %s collectives%s%s\n", c.tp, engine.c_str(),
                   why.empty() ? "" : ": ", why.c_str());
      if (c.mono) std::fprintf(stderr, "note: --mono serves one rank of 1; at --tp %d every step runs natively\n", c.tp);
      return native::make_cuda_tp_backend(
          [&](int rank) {
            PrepareOptions rpo = po;
            rpo.tp_rank = rank;
            rpo.tp_size = c.tp;
            return std::shared_ptr<const native::PreparedWeights>(native::PreparedWeights::load(model_dir, rpo, lo));
          },
          to);
    }
    std::shared_ptr<const native::PreparedWeights> pw = native::PreparedWeights::load(model_dir, po, lo);
    note_router(pw->layout(), po.router_bf16);
    auto be = native::make_cuda_backend(std::move(pw), o);
    if (c.mono) add_mono_agreed(*be, nullptr);
    return be;
  }
#else
  M3_CHECK(!cuda, "{}: --device cuda: this build has no CUDA (configure with -DM3_CUDA=ON)", command);
#endif
  M3_CHECK(!c.mono || c.device == "auto", "{}: --mono needs the CUDA backend (--device cuda or auto), got --device {}",
           command, c.device);
  if (c.device == "auto") std::fprintf(stderr, "note: no CUDA device available; using the CPU reference\n");
  if (c.mono) std::fprintf(stderr, "note: --mono needs a GPU; the CPU reference runs every step\n");
  if (c.router_dtype != "float32" && c.weights != "prepared")
    std::fprintf(stderr, "note: --router-dtype applies to the prepared weights (CUDA, or --weights prepared)\n");
  ref::RefOptions ro(std::max(c.cache_blocks, 1), c.threads);
  ro.tp = c.tp;
  if (c.tp > 1 && mpi_launched()) ro.comm = mpi_rank_comm(c, command);  // one rank per process of the job
  ro.cache.kv_dtype = ro.cache.ik_dtype = cache_dtype_of(c.cache_dtype, DType::F32);
  std::unique_ptr<Backend> be;
  if (c.tp > 1 && c.weights == "checkpoint") {  // each rank reads only its slices of the files
    SafetensorsSet files = SafetensorsSet::open(model_dir);
    const WeightBinding binding = bind_weights(build_checkpoint_table(spec, files, model_dir), files);
    be = ref::make_ref_backend(spec, *make_weight_source(binding), ro);
  } else {
    ModelWeights w = c.weights == "prepared" ? load_prepared_dequantized(model_dir, spec, c.router_dtype == "bfloat16")
                                             : load_model_weights(model_dir, spec);
    be = ref::make_ref_backend(spec, std::move(w), ro);
  }
  if (ro.comm) return lead_or_follow(std::move(be), ro.comm, command);
  return be;
}

}  // namespace m3::cli
