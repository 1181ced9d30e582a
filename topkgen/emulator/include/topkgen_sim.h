// topkgen SIMT emulator: runs CUDA C++ kernels on the CPU.
//
// The same kernel source that NVRTC compiles is compiled here by the host C++ compiler,
// with this header providing the CUDA built-ins. Each CUDA thread is a fiber with its own
// stack; the threads of a block run cooperatively and switch only at barriers, warp
// collectives and __nanosleep, where values are exchanged among the lanes that arrive.
// Blocks are independent and run on several OS threads. A kernel must not spin-wait on
// another CTA: the watchdog reports it as a timeout.
//
// Faults are reported, never silently tolerated: partial or divergent __syncthreads,
// deadlocks, warp collectives whose mask disagrees with the lanes that arrive, reads and
// writes outside the buffers passed to the launch (guard pages and checked guard zones),
// misaligned vector accesses (the alignment sanitizer in trap mode),
// out-of-range dynamic shared memory, stack overflow, and launches that outlive the
// watchdog.
//
// Traffic counters (a launch with counting on; see count_* below): bytes loaded and stored
// through the kernels' global-memory helpers (templates/topk_memory.cuh), global and shared
// atomics, shared-memory bank lanes per warp atomic instruction, block barriers, warp
// shuffles and votes, in total and per phase a kernel marks. Counting off costs one test of
// a pointer per counted operation; TK_COUNTERS=0 compiles the hooks out altogether.
#pragma once

#define TOPKGEN_EMULATOR 1
#ifndef TK_COUNTERS
#define TK_COUNTERS 1
#endif

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <vector_types.h>
#include <vector_functions.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <csetjmp>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

// ------------------------------------------------------------------ CUDA qualifiers
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __constant__
#undef __forceinline__
#undef __noinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __constant__
// Static shared memory is per block; a block runs on one OS thread at a time.
#define __shared__ static thread_local
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#ifndef __restrict__
#define __restrict__ __restrict
#endif

namespace tk {

constexpr int kWarp = 32;

enum class State : uint8_t { Runnable, Barrier, Warp, Done };
enum WarpOp : uint8_t { kShflIdx, kShflUp, kShflDown, kShflXor, kBallot, kAny, kAll, kMatchAny, kMatchAll, kSyncWarp };
static const char* const kWarpOpNames[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                           "__shfl_xor_sync", "__ballot_sync", "__any_sync",
                                           "__all_sync", "__match_any_sync", "__match_all_sync",
                                           "__syncwarp"};

struct Thread {
  void* sp = nullptr;
  uint3 tid{};
  unsigned linear = 0, lane = 0, warp = 0;
  State state = State::Runnable;
  // __syncthreads
  int bar_site = 0, bar_kind = 0, bar_pred = 0, bar_result = 0;
  // warp collectives
  WarpOp op = kSyncWarp;
  unsigned mask = 0;
  uint64_t value = 0, result = 0;
  int arg = 0, width = kWarp;
  // traffic counters: synchronisation points passed, current phase, and how often this
  // thread reached each atomic call site since its last synchronisation point
  uint32_t sync_epoch = 0;
  uint8_t phase = 0, nsites = 0;
  struct SiteCount {
    const char* file;
    uint32_t line, epoch, count;
  } sites[16];
  struct WarpSite* site_top = nullptr;  // the innermost live counting site (instruction counts)
};

using Invoker = void (*)(void* fn, void** args);

struct Kernel {
  void* fn;
  Invoker invoke;
  const char* signature;  // one character per parameter (see code_of)
  const char* display;    // the name in the source
};

inline std::vector<Kernel>& registry() {
  static std::vector<Kernel> r;
  return r;
}

struct Launch;

struct OrderWrite {  // the ordering check: who wrote a byte of global memory, and as which of its stores
  uint64_t block, store;
};

struct Block {
  Launch* launch = nullptr;
  uint3 bid{};
  Thread* threads = nullptr;
  unsigned nthreads = 0;
  void* sched_sp = nullptr;
  Thread* cur = nullptr;
  unsigned char* dyn_shared = nullptr;
  size_t dyn_bytes = 0;
  const struct Region* shared_region = nullptr;
  uint64_t rng = 0;
  bool aborted = false;
  unsigned exited_at_sync[32] = {};  // per warp: lanes that had returned when it last synchronised
  struct BlockCounters* counters = nullptr;  // null unless the launch counts
  uint32_t polls = 0;                        // watchdog calls: the clock is read every 1024th
  // the ordering check (Launch::check_order): the block's linear id, its global stores so far,
  // how many of them its last __threadfence() covered, and whether it has acquired (a
  // __threadfence() after a global atomic of its own)
  uint64_t id = 0, stores = 0, fenced = 0;
  bool atomic_since_fence = false, acquired = false;
};

struct Region {  // a guarded allocation: [guard page][front zone | data | back zone][guard page]
  unsigned char* map;
  size_t map_len;
  unsigned char* data;
  size_t nbytes;
  unsigned char* zone_lo;
  unsigned char* zone_hi;  // end of the back zone (start of the high guard page)
  const char* what;        // filled in by the launch: "argument #2", "dynamic shared memory"
  int index;
};

// ------------------------------------------------------------------ traffic counters
// What one launch moved and how, per phase (a label the kernel sets with counter_phase;
// phase 0 is unlabelled). The C layout is read by the Python side (emulator/counters.py).
constexpr int kMaxPhases = 16;
constexpr int kMaxAtomicSites = 16;

// Shared atomics by kind (bank lanes per kind): a warp instruction is kInc when every lane
// added 1 and dropped the result (sm_70+ compile it to ATOMS.POPC.INC, whose same-address
// lanes the shared-memory unit merges), kAdd any other atomicAdd (a result used or another
// operand), kMinMax atomicMin/Max, kOther the rest (sub, and/or/xor, exch, cas).
enum AtomicKind : uint8_t { kInc, kAdd, kMinMax, kOther, kAtomicKinds };

struct PhaseStats {
  const char* label;
  uint64_t global_load_bytes, global_store_bytes, global_atomics, shared_atomics, shared_atomic_instructions,
      bank_lanes_sum, bank_lanes_max, barriers, shuffles, votes;
  uint64_t kind_instructions[kAtomicKinds], kind_lanes_sum[kAtomicKinds], kind_lanes_max[kAtomicKinds];
};

inline void add_stats(PhaseStats& into, const PhaseStats& s) {
  into.global_load_bytes += s.global_load_bytes;
  into.global_store_bytes += s.global_store_bytes;
  into.global_atomics += s.global_atomics;
  into.shared_atomics += s.shared_atomics;
  into.shared_atomic_instructions += s.shared_atomic_instructions;
  into.bank_lanes_sum += s.bank_lanes_sum;
  into.bank_lanes_max = std::max(into.bank_lanes_max, s.bank_lanes_max);
  into.barriers += s.barriers;
  into.shuffles += s.shuffles;
  into.votes += s.votes;
  for (int k = 0; k < kAtomicKinds; ++k) {
    into.kind_instructions[k] += s.kind_instructions[k];
    into.kind_lanes_sum[k] += s.kind_lanes_sum[k];
    into.kind_lanes_max[k] = std::max(into.kind_lanes_max[k], s.kind_lanes_max[k]);
  }
}

// One warp-wide shared atomic instruction as the emulator reconstructs it: how many lanes
// hit each of the 32 banks. Threads of a warp run one after another, so the lanes of one
// instruction are found by key: the call site, the thread's count of synchronisation
// points passed (barriers and warp collectives it took part in), and how often the thread
// reached that site since then. In converged code (every lane reaches the site equally
// often between two synchronisation points) that is exactly the hardware's grouping;
// where lanes skip the site in some loop iterations, their k-th arrivals are grouped
// together, as if the warp had packed them into one instruction.
// Its bank lanes: for kInc the distinct words each bank holds (same-address lanes merge),
// for every other kind the lanes on each bank (a GPU serialises same-address lanes there).
struct AtomicInstruction {
  uint8_t lanes[32];
  uint8_t phase;
  uint8_t kind = kInc;  // kInc until a lane adds another value, uses the result or runs another op
  uint32_t present = 0;  // lanes that took part, and the word each one hit
  uint32_t word[32] = {};

  uint64_t most() const {
    if (kind != kInc) return *std::max_element(lanes, lanes + 32);
    uint8_t distinct[32] = {};
    for (unsigned l = 0; l < 32; ++l) {
      if (!(present >> l & 1u)) continue;
      bool seen = false;
      for (unsigned m = 0; m < l && !seen; ++m) seen = (present >> m & 1u) && word[m] == word[l];
      if (!seen) ++distinct[word[l] & 31];
    }
    return *std::max_element(distinct, distinct + 32);
  }
};
struct OpenSite {  // the instructions of one call site in one synchronisation epoch
  const char* file;
  uint32_t line, epoch;
  std::vector<AtomicInstruction> instructions;
};

// Counting sites (emulator/instructions.py inserts one at the start of every code block of a
// kernel's source, for the emulator only): a site's path is the sequence of sites live when it
// is entered (the blocks around it, the call sites of the inlined functions it is in), and a
// warp executes a path once per distinct instance of it among its lanes: the same path
// reached under the same instances of every enclosing site, the k-th time under its parent.
// A lane that skips a block (a branch, an early exit, a shorter loop) adds nothing; a warp
// whose lanes take a block in different iterations executes it once per iteration.
struct SiteTotal {
  uint64_t parent;  // the path of the enclosing site (0: none)
  uint32_t id;      // the site's number in the instrumented source
  uint64_t count;   // warp executions
  uint64_t lane_entries, lane_firsts;  // lanes' entries, and those that were a lane's first under its parent's instance
  uint64_t full;    // warp executions all 32 lanes entered (a full warp: what ptxas's warp-aggregated atomics test)
};

struct BlockCounters {
  int nphases = 1;
  std::unordered_map<uint64_t, uint32_t> site_instances[32];  // per warp: the lanes that entered each site instance
  std::unordered_map<uint64_t, SiteTotal> sites;
  PhaseStats phases[kMaxPhases] = {};
  std::vector<OpenSite> open[32];  // per warp; entries [0, nopen[w]) are live, the rest keep capacity
  unsigned nopen[32] = {};

  void reset() {
    nphases = 1;
    for (auto& seen : site_instances) seen.clear();
    sites.clear();
    for (PhaseStats& p : phases) p = PhaseStats{};
    phases[0].label = "";
    for (unsigned& n : nopen) n = 0;
  }

  OpenSite& site_of(unsigned warp, const char* file, uint32_t line, uint32_t epoch) {
    std::vector<OpenSite>& list = open[warp];
    for (unsigned i = 0; i < nopen[warp]; ++i)
      if (list[i].line == line && list[i].file == file && list[i].epoch == epoch) return list[i];
    if (nopen[warp] == list.size()) list.emplace_back();
    OpenSite& o = list[nopen[warp]++];
    o.file = file;
    o.line = line;
    o.epoch = epoch;
    o.instructions.clear();
    return o;
  }

  // The warp's open instructions are complete: fold them into the phase counts.
  void close_warp(unsigned warp) {
    for (unsigned i = 0; i < nopen[warp]; ++i) {
      for (const AtomicInstruction& ins : open[warp][i].instructions) {
        if (!ins.present) continue;
        const uint64_t most = ins.most();
        PhaseStats& st = phases[ins.phase];
        ++st.shared_atomic_instructions;
        st.bank_lanes_sum += most;
        st.bank_lanes_max = std::max(st.bank_lanes_max, most);
        ++st.kind_instructions[ins.kind];
        st.kind_lanes_sum[ins.kind] += most;
        st.kind_lanes_max[ins.kind] = std::max(st.kind_lanes_max[ins.kind], most);
      }
    }
    nopen[warp] = 0;
  }

  void close_all() {
    for (unsigned w = 0; w < 32; ++w) close_warp(w);
  }
};

struct Launch {
  const Kernel* kernel = nullptr;
  uint3 grid{}, block{};
  void** args = nullptr;
  size_t shared_bytes = 0;
  bool shuffle = false;
  uint64_t seed = 0;
  std::chrono::steady_clock::time_point deadline;
  double timeout_s = 0;
  std::atomic<bool> failed{false};
  std::mutex err_mu;
  std::string error;
  std::vector<Region*> regions;
  std::atomic<uint64_t> next_block{0};
  // traffic counters, merged from every block at its end (by phase label)
  bool counting = false;
  std::mutex stats_mu;
  int nphases = 0;
  PhaseStats phases[kMaxPhases] = {};
  std::unordered_map<uint64_t, struct SiteTotal> sites;  // counting sites: warp executions by path
  // the ordering check (tk_launch's check_order; order_* below): blocks run one at a time, in
  // `block_order` (a permutation of the grid when the launch is shuffled, else empty: in order)
  bool check_order = false;
  std::mutex order_mu;
  std::unordered_map<uintptr_t, OrderWrite> order_writes;  // per byte written in this launch
  std::vector<uint64_t> released;                          // per block: its stores [1, released[b]]
  std::vector<uint64_t> block_order;
  // the module's own, for the runtime: its cancel flag (tk_cancel) and the poisoning of its
  // static __shared__ memory at each block's start
  std::atomic<int>* cancel = nullptr;
  void (*poison)() = nullptr;
};

// ------------------------------------------------------------------ module and process state
// Every CUDA source becomes one shared object, loaded with RTLD_LOCAL; a process loads many
// (topkgen's runtime one per kernel), and one more, the emulator's runtime (TK_RUNTIME below),
// that runs their launches. What belongs to each module and what to the process:
//
// Per module, as a CUDA module's own globals: the kernel registry, the TLS span and TLS touch
// that poison static __shared__ memory at each block's start (module_tls, t_tls_touch), and
// every static __shared__ array, those of template and inline functions that several modules
// instantiate too. GCC gives such objects (vague linkage) STB_GNU_UNIQUE binding, which the
// dynamic linker unifies across the whole process even under RTLD_LOCAL: a later module would
// list the first one's kernels and poison the first one's memory. Modules are therefore
// compiled with -fno-gnu-unique (emulator/__init__.py), and each binds to its own copies.
//
// Per process: the block each OS thread runs and its fault jump buffer (t_block, t_fault_jmp),
// which the emulator's runtime sets and every module's kernel code reads, and the fault
// handlers' state: one set is installed while launches overlap (from several host threads),
// so the count of launches in flight and the actions to restore when the last one ends must be
// one (process_signals). These are defined in assembly below with explicit STB_GNU_UNIQUE
// binding, the one way to share them between the runtime and the modules under
// -fno-gnu-unique (it also keeps every module loaded for good). The runtime thus reads
// Block, Thread, Launch and Region objects a module made: the runtime and all modules of a
// process are compiled from this very header (its text is in every cache key), and these
// structures must not depend on TK_COUNTERS or other defines. The watchdog needs nothing
// more: it reads t_block, and the deadline and poll count are the Launch's and the Block's.
struct ProcessSignals {
  int lock;                 // a spin lock, held while handlers are installed or removed
  int users;                // launches in flight in the process, all modules together
  struct sigaction old[3];  // SIGSEGV, SIGBUS and SIGILL as they were before the first launch
};
static_assert(std::is_trivial_v<ProcessSignals> && sizeof(ProcessSignals) <= 1024 && alignof(ProcessSignals) <= 64,
              "tk_process_signals starts as 1024 zero bytes (below)");
extern __thread Block* t_block asm("tk_process_t_block");
extern __thread sigjmp_buf* t_fault_jmp asm("tk_process_t_fault_jmp");
extern ProcessSignals process_signals asm("tk_process_signals");
asm(R"(
  .pushsection .tbss.tk_process,"awT",@nobits
  .balign 8
  .globl tk_process_t_block
  .type tk_process_t_block, @gnu_unique_object
  .size tk_process_t_block, 8
tk_process_t_block:
  .zero 8
  .globl tk_process_t_fault_jmp
  .type tk_process_t_fault_jmp, @gnu_unique_object
  .size tk_process_t_fault_jmp, 8
tk_process_t_fault_jmp:
  .zero 8
  .popsection
  .pushsection .bss.tk_process,"aw",@nobits
  .balign 64
  .globl tk_process_signals
  .type tk_process_signals, @gnu_unique_object
  .size tk_process_signals, 1024
tk_process_signals:
  .zero 1024
  .popsection
)");
inline thread_local uint32_t t_tls_touch = 0;  // per module: see poison_static_shared

// ------------------------------------------------------------------ context switching
#if defined(__x86_64__)
extern "C" void tk_swap_context(void** save_sp, void* new_sp);
asm(R"(
.text
.globl tk_swap_context
.type tk_swap_context,@function
tk_swap_context:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size tk_swap_context,.-tk_swap_context
)");
#else
#error "the topkgen emulator's fiber switch is written for x86-64"
#endif

void fiber_main();

inline std::string fmt_tid(const uint3& t) {
  char b[64];
  snprintf(b, sizeof b, "(%u,%u,%u)", t.x, t.y, t.z);
  return b;
}

inline std::string where(const Block* b, const Thread* t) {
  std::string s = "kernel '" + std::string(b->launch->kernel->display) + "', block " + fmt_tid(b->bid);
  if (t) {
    char buf[96];
    snprintf(buf, sizeof buf, ", thread %s (warp %u, lane %u)", fmt_tid(t->tid).c_str(), t->warp, t->lane);
    s += buf;
  }
  return s;
}

inline void fail(Block* b, const std::string& msg) {
  Launch* L = b->launch;
  std::lock_guard<std::mutex> g(L->err_mu);
  if (!L->failed.exchange(true)) L->error = msg;
  b->aborted = true;
}

inline Thread* current() { return t_block->cur; }

// Give control back to the block's scheduler; returns when this thread runs again.
inline void yield_to_scheduler() {
  Block* b = t_block;
  tk_swap_context(&b->cur->sp, b->sched_sp);
}

// A fault inside a thread: record it and leave the thread for good.
[[noreturn]] inline void thread_fault(const std::string& msg) {
  Block* b = t_block;
  fail(b, msg);
  b->cur->state = State::Done;
  tk_swap_context(&b->cur->sp, b->sched_sp);
  __builtin_unreachable();
}

// Set by tk_cancel() (the host's Ctrl-C or SIGTERM, taken while the launch runs on another
// thread): the launch under way stops at its next watchdog poll or scheduler round.
inline std::atomic<int>& cancel_flag() {
  static std::atomic<int> flag{0};
  return flag;
}
inline const char* kCancelled = "cancelled";

// Returns the calling thread's block (one thread-local access serves the caller too).
inline Block* poll_watchdog() {
  Block* b = t_block;
  if (!b || (++b->polls & 1023u) != 0) return b;
  if (b->launch->failed.load(std::memory_order_relaxed))
    thread_fault("");  // another block failed: stop
  if (b->launch->cancel->load(std::memory_order_relaxed)) thread_fault(kCancelled);
  if (std::chrono::steady_clock::now() > b->launch->deadline) {
    char buf[64];
    snprintf(buf, sizeof buf, "%.1f", b->launch->timeout_s);
    thread_fault("watchdog: the launch ran longer than " + std::string(buf) + " s at " +
                 where(b, b->cur) + " (a spin-wait on another CTA never ends here)");
  }
  return b;
}

// ------------------------------------------------------------------ counting hooks
#if TK_COUNTERS
inline BlockCounters* counting() { return t_block->counters; }
#else
constexpr BlockCounters* counting() { return nullptr; }
#endif

inline void count_global_load(size_t bytes) {
  if (BlockCounters* c = counting()) c->phases[t_block->cur->phase].global_load_bytes += bytes;
}

inline void count_global_store(size_t bytes) {
  if (BlockCounters* c = counting()) c->phases[t_block->cur->phase].global_store_bytes += bytes;
}

// ------------------------------------------------------------------ inter-CTA ordering check
// A launch with check_order (Module.launch(check_ordering=True)) checks every read of global
// memory that another block of the launch wrote, as the PTX memory model orders it between
// CTAs: the writer stores, fences (__threadfence) and then signals with a global atomic (its
// release: the stores its fence covered are released); the reader's global atomic, then its
// __threadfence (its acquire), come before the read; and the read is a plain ld.global
// (load_global: the acquire's fence drops the SM's L1 lines, CCTL.IVALL), not one the
// compiler may serve from the read-only cache (load_global_nc, whose data no thread of the
// launch may write). A read that breaks one of these fails, naming both blocks. Blocks run
// one at a time (in a shuffled order under a schedule seed), so every block the reader
// depends on has finished: the check is deterministic. A fence is taken as the whole block's
// (a barrier before it orders the other threads' stores, as cumulativity does on the GPU).
enum LoadPath : int { kLoadReadOnly = 0, kLoadWritten = 1 };

inline const Region* region_of(const Launch* L, uintptr_t a) {
  for (const Region* r : L->regions)
    if (a >= uintptr_t(r->data) && a < uintptr_t(r->data) + r->nbytes) return r;
  return nullptr;
}

inline std::string global_where(const Launch* L, uintptr_t a) {
  const Region* r = region_of(L, a);
  return r ? std::string(r->what) + " + " + std::to_string(a - uintptr_t(r->data)) + " bytes" : "global memory";
}

inline std::string block_name(const Launch* L, uint64_t id) {
  return "block (" + std::to_string(id % L->grid.x) + "," + std::to_string(id / L->grid.x % L->grid.y) + "," +
         std::to_string(id / (uint64_t(L->grid.x) * L->grid.y)) + ")";
}

inline void order_store(const void* p, size_t bytes) {
  Block* b = t_block;
  Launch* L = b->launch;
  if (!L->check_order) return;
  const uint64_t store = ++b->stores;
  std::lock_guard<std::mutex> g(L->order_mu);
  for (size_t i = 0; i < bytes; ++i) L->order_writes[uintptr_t(p) + i] = OrderWrite{b->id, store};
}

inline void order_load(const void* p, size_t bytes, LoadPath path) {
  Block* b = t_block;
  Launch* L = b->launch;
  if (!L->check_order) return;
  std::string why;
  uintptr_t at = 0;
  uint64_t writer = 0;
  {
    std::lock_guard<std::mutex> g(L->order_mu);
    for (size_t i = 0; i < bytes && why.empty(); ++i) {
      auto it = L->order_writes.find(uintptr_t(p) + i);
      if (it == L->order_writes.end() || it->second.block == b->id) continue;
      at = it->first;
      writer = it->second.block;
      if (path == kLoadReadOnly)
        why = "through load_global_nc, for data no thread of the launch writes (read it with load_global)";
      else if (it->second.store > L->released[writer])
        why = "not released: the writer's stores must be covered by a __threadfence() before its global atomic";
      else if (!b->acquired)
        why = "not acquired: the reader needs a global atomic, then a __threadfence(), before the read";
    }
  }
  if (!why.empty())
    thread_fault("ordering: " + where(b, b->cur) + " reads " + global_where(L, at) + ", which " +
                 block_name(L, writer) + " wrote in this launch, " + why);
}

inline void order_fence() {
  Block* b = t_block;
  if (!b || !b->launch->check_order) return;
  b->fenced = b->stores;
  if (b->atomic_since_fence) b->acquired = true;
  b->atomic_since_fence = false;
}

inline void order_atomic(const void* p) {
  Block* b = t_block;
  Launch* L = b->launch;
  if (!L->check_order || !region_of(L, uintptr_t(p))) return;  // a shared-memory atomic orders nothing here
  std::lock_guard<std::mutex> g(L->order_mu);
  L->released[b->id] = b->fenced;
  b->atomic_since_fence = true;
}

// The kernels' global-memory helpers (templates/topk_memory.cuh): counted, and checked under check_order.
inline void global_load(const void* p, size_t bytes, LoadPath path) {
  count_global_load(bytes);
  order_load(p, bytes, path);
}

inline void global_store(const void* p, size_t bytes) {
  count_global_store(bytes);
  order_store(p, bytes);
}

// How often this thread reached a call site since its last synchronisation point (0 the first time).
inline uint32_t site_occurrence(Thread* t, const char* file, uint32_t line) {
  Thread::SiteCount* stale = nullptr;
  for (unsigned i = 0; i < t->nsites; ++i) {
    Thread::SiteCount& e = t->sites[i];
    if (e.line == line && e.file == file) {
      if (e.epoch != t->sync_epoch) e = {file, line, t->sync_epoch, 0};
      return e.count++;
    }
    if (e.epoch != t->sync_epoch) stale = &e;
  }
  if (!stale) {
    if (t->nsites == kMaxAtomicSites)
      thread_fault("traffic counters: more than " + std::to_string(kMaxAtomicSites) +
                   " atomic call sites between two synchronisation points at " + where(t_block, t));
    stale = &t->sites[t->nsites++];
  }
  *stale = {file, line, t->sync_epoch, 1};
  return 0;
}

// Where a lane's shared atomic was recorded, so that using its result can make it kAdd.
struct AtomicNote {
  BlockCounters* counters = nullptr;
  unsigned warp = 0, site = 0, occurrence = 0;
  uint32_t epoch = 0;
};

// Records the lane's atomic; `kind` is the op's (kInc for an atomicAdd of 1, whose result
// may still be used: AtomicResult below).
inline AtomicNote note_atomic(BlockCounters* c, const void* p, const char* file, unsigned line,
                              uint8_t kind = kOther) {
  Block* b = t_block;
  Thread* t = b->cur;
  PhaseStats& st = c->phases[t->phase];
  // Global memory is the buffers passed to the launch; every other address an atomic may
  // take is shared memory (static __shared__ arrays live in thread-local storage).
  uintptr_t a = uintptr_t(p);
  for (const Region* r : b->launch->regions) {
    if (a - uintptr_t(r->data) < r->nbytes) {
      ++st.global_atomics;
      return {};
    }
  }
  ++st.shared_atomics;
  uint32_t occurrence = site_occurrence(t, file, line);
  OpenSite& site = c->site_of(t->warp, file, line, t->sync_epoch);
  std::vector<AtomicInstruction>& list = site.instructions;
  if (list.size() <= occurrence) list.resize(occurrence + 1, AtomicInstruction{{}, t->phase});
  AtomicInstruction& ins = list[occurrence];
  ++ins.lanes[(a >> 2) & 31];  // banks are 4 bytes wide; a 64-bit atomic counts its low word
  ins.present |= 1u << t->lane;
  ins.word[t->lane] = uint32_t(a >> 2);
  ins.kind = std::max(ins.kind, kind);  // kInc < kAdd < kMinMax < kOther: the instruction takes the most general
  return {c, t->warp, unsigned(&site - c->open[t->warp].data()), occurrence, t->sync_epoch};
}

// The lane used the result of its atomic: not ATOMS.POPC.INC but ATOMS.ADD.
inline void note_result_used(const AtomicNote& n) {
  if (!n.counters || n.site >= n.counters->nopen[n.warp]) return;
  OpenSite& site = n.counters->open[n.warp][n.site];
  if (site.epoch != n.epoch || n.occurrence >= site.instructions.size()) return;  // closed already
  uint8_t& kind = site.instructions[n.occurrence].kind;
  if (kind == kInc) kind = kAdd;
}

// What an integer atomicAdd returns: the old value, and on conversion (the result used) the
// note that the atomic has a return.
template <typename T>
struct AtomicResult {
  T old;
  AtomicNote note;
  operator T() const {
    note_result_used(note);
    return old;
  }
};

// The calling thread's counts go to `label` from here on (labels are compared as text).
inline void counter_phase(const char* label) {
  BlockCounters* c = counting();
  if (!c) return;
  int i = 0;
  while (i < c->nphases && c->phases[i].label != label && strcmp(c->phases[i].label, label) != 0) ++i;
  if (i == c->nphases) {
    if (i == kMaxPhases)
      thread_fault("traffic counters: more than " + std::to_string(kMaxPhases - 1) + " phase labels at " +
                   where(t_block, t_block->cur));
    c->phases[c->nphases++].label = label;
  }
  t_block->cur->phase = uint8_t(i);
}

// ------------------------------------------------------------------ counting sites
inline uint64_t site_mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 31);
}

// One live counting site of a fiber (a RAII object at the start of a code block): it counts
// its path's warp execution when constructed and hands the fiber back to its parent when the
// block ends. Arrivals under it are counted per child site (a few inline, then a vector).
struct WarpSite {
  WarpSite* parent = nullptr;
  Thread* thread = nullptr;
  uint64_t path = 0, instance = 0;
  unsigned nchildren = 0;
  uint32_t child_id[8], child_count[8];
  std::vector<std::pair<uint32_t, uint32_t>> more;

  uint32_t arrival(uint32_t id) {
    for (unsigned i = 0; i < nchildren; ++i)
      if (child_id[i] == id) return child_count[i]++;
    for (auto& e : more)
      if (e.first == id) return e.second++;
    if (nchildren < 8) {
      child_id[nchildren] = id;
      child_count[nchildren++] = 1;
    } else {
      more.emplace_back(id, 1u);
    }
    return 0;
  }

  explicit WarpSite(uint32_t id) {
    Block* b = t_block;
    BlockCounters* c = TK_COUNTERS && b ? b->counters : nullptr;
    if (!c) return;
    thread = b->cur;
    parent = thread->site_top;
    const uint32_t k = parent ? parent->arrival(id) : 0u;
    const uint64_t parent_path = parent ? parent->path : 0u;
    path = site_mix(parent_path, id);
    instance = site_mix(site_mix(parent ? parent->instance : 0u, id), k);
    thread->site_top = this;
    SiteTotal& total = c->sites.try_emplace(path, SiteTotal{parent_path, id, 0, 0, 0, 0}).first->second;
    ++total.lane_entries;
    total.lane_firsts += k == 0;
    const uint32_t lanes = ++c->site_instances[thread->warp][instance];
    total.count += lanes == 1;
    total.full += lanes == 32;
  }
  ~WarpSite() {
    if (thread) thread->site_top = parent;
  }
  WarpSite(const WarpSite&) = delete;
  WarpSite& operator=(const WarpSite&) = delete;
};

// ------------------------------------------------------------------ barriers
inline int block_barrier(int site, int kind, int pred) {
  Thread* t = current();
  t->state = State::Barrier;
  t->bar_site = site;
  t->bar_kind = kind;
  t->bar_pred = pred;
  yield_to_scheduler();
  return t->bar_result;
}

// ------------------------------------------------------------------ warp collectives
inline uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width) {
  Thread* t = current();
  if (!(mask & (1u << t->lane))) {
    char buf[160];
    snprintf(buf, sizeof buf, "%s with mask 0x%08x excludes the calling lane %u at ",
             kWarpOpNames[op], mask, t->lane);
    thread_fault(buf + where(t_block, t));
  }
  if (width <= 0 || width > kWarp || (width & (width - 1))) {
    thread_fault(std::string(kWarpOpNames[op]) + ": width must be a power of two <= 32 at " + where(t_block, t));
  }
  t->state = State::Warp;
  t->op = op;
  t->mask = mask;
  t->value = value;
  t->arg = arg;
  t->width = width;
  yield_to_scheduler();
  return t->result;
}

template <class T>
inline uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8, "warp shuffles move at most 8 bytes");
  uint64_t u = 0;
  memcpy(&u, &v, sizeof(T));
  return u;
}
template <class T>
inline T from_bits(uint64_t u) {
  T v;
  memcpy(&v, &u, sizeof(T));
  return v;
}

// ------------------------------------------------------------------ random streams
inline uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// ------------------------------------------------------------------ memory guards
constexpr unsigned char kCanary = 0xA5;

inline size_t page_size() {
  static size_t p = size_t(sysconf(_SC_PAGESIZE));
  return p;
}

// Guard regions are large so that far out-of-bounds accesses fault instead of landing in
// another mapping; they cost address space only.
constexpr size_t kGuardBytes = size_t(1) << 20;

inline Region* region_alloc(size_t nbytes) {
  size_t page = page_size();
  size_t data_len = (nbytes + 15) & ~size_t(15);
  size_t body = (data_len + 64 + page - 1) / page * page;  // at least 64 bytes of front zone
  size_t len = body + 2 * kGuardBytes;
  void* m = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  unsigned char* map = static_cast<unsigned char*>(m);
  if (mprotect(map + kGuardBytes, body, PROT_READ | PROT_WRITE) != 0) {
    munmap(m, len);
    return nullptr;
  }
  Region* r = new Region{map, len, nullptr, nbytes, map + kGuardBytes, map + kGuardBytes + body, "", -1};
  r->data = r->zone_hi - data_len;
  memset(r->zone_lo, kCanary, body);
  return r;
}

inline void region_free(Region* r) {
  if (!r) return;
  munmap(r->map, r->map_len);
  delete r;
}

// 0: intact; 1: the front zone was written; 2: the back zone was written.
inline int region_check(const Region* r) {
  for (const unsigned char* p = r->zone_lo; p < r->data; ++p)
    if (*p != kCanary) return 1;
  for (const unsigned char* p = r->data + r->nbytes; p < r->zone_hi; ++p)
    if (*p != kCanary) return 2;
  return 0;
}

// ------------------------------------------------------------------ the runtime
// The scheduler, the fault handlers and block execution are the emulator's runtime: one shared
// object per header and compiler that a process loads once (TK_RUNTIME; emulator/__init__.py)
// and binds every module to (tk_bind_runtime), where each module compiled its own copy before:
// that copy was about 2 s of a module's 3-6 s of g++. The runtime reaches what is the
// module's own through the Launch: its kernel, its cancel flag and the poisoning of its static
// __shared__ memory (poison_static_shared).
#if TK_RUNTIME
// ------------------------------------------------------------------ scheduler
inline std::string lanes_str(unsigned m) {
  std::string s;
  for (int i = 0; i < kWarp;) {
    if (!(m >> i & 1)) { ++i; continue; }
    int j = i;
    while (j + 1 < kWarp && (m >> (j + 1) & 1)) ++j;
    if (!s.empty()) s += ",";
    s += std::to_string(i);
    if (j > i) s += "-" + std::to_string(j);
    i = j + 1;
  }
  return s.empty() ? "none" : s;
}

struct Scheduler {
  Block* b;
  std::vector<unsigned> runq, next;
  unsigned nwarps;
  // Per warp: lanes waiting in a warp collective. A collective is resolved once every lane
  // of the arriving lane's mask waits (not at every arrival, which made warp-collective-heavy
  // kernels spend most of their time resolving); when nothing else can run, every warp is
  // resolved, which reports masks that disagree or lanes that never arrive.
  std::vector<unsigned> in_collective;

  explicit Scheduler(Block* blk) : b(blk) {
    nwarps = (b->nthreads + kWarp - 1) / kWarp;
    in_collective.assign(nwarps, 0u);
  }

  unsigned warp_lanes(unsigned w) const {
    unsigned n = std::min<unsigned>(kWarp, b->nthreads - w * kWarp);
    return n == 32 ? 0xffffffffu : ((1u << n) - 1);
  }

  void run_thread(unsigned i) {
    Thread* t = &b->threads[i];
    b->cur = t;
    tk_swap_context(&b->sched_sp, t->sp);
    b->cur = nullptr;
  }

  // Try to complete the collectives of one warp; returns false on a mask error.
  bool resolve_warp(unsigned w) {
    Thread* base = &b->threads[w * kWarp];
    unsigned exists = warp_lanes(w);
    unsigned waiting = 0;
    for (unsigned l = 0; l < kWarp; ++l)
      if ((exists >> l & 1) && base[l].state == State::Warp) waiting |= 1u << l;
    while (waiting) {
      unsigned first = __builtin_ctz(waiting);
      unsigned mask = base[first].mask & exists;
      unsigned group = 0;
      for (unsigned l = 0; l < kWarp; ++l) {
        if (!(waiting >> l & 1)) continue;
        unsigned m = base[l].mask & exists;
        if (m == mask) {
          group |= 1u << l;
        } else if (m & mask) {
          char buf[256];
          snprintf(buf, sizeof buf, "warp collective masks disagree in warp %u: lane %u uses 0x%08x, lane %u uses 0x%08x",
                   w, first, base[first].mask, l, base[l].mask);
          fail(b, buf + std::string(" at ") + where(b, nullptr));
          return false;
        }
      }
      waiting &= ~group;
      if (group != mask) continue;  // not everyone has arrived yet
      WarpOp op = base[first].op;
      for (unsigned l = 0; l < kWarp; ++l) {
        if ((group >> l & 1) && base[l].op != op) {
          fail(b, "lanes " + lanes_str(group) + " of warp " + std::to_string(w) + " meet at different warp collectives (" +
                      kWarpOpNames[op] + " and " + kWarpOpNames[base[l].op] + ") at " + where(b, nullptr));
          return false;
        }
      }
      if (!complete(base, w, group, op)) return false;
    }
    return true;
  }

  void note_exited(unsigned w) {
    unsigned m = 0;
    for (unsigned l = 0; l < kWarp && w * kWarp + l < b->nthreads; ++l)
      if (b->threads[w * kWarp + l].state == State::Done) m |= 1u << l;
    b->exited_at_sync[w] = m;
  }

  bool complete(Thread* base, unsigned w, unsigned group, WarpOp op) {
    note_exited(w);
    uint64_t ballot = 0;
    for (unsigned l = 0; l < kWarp; ++l)
      if ((group >> l & 1) && base[l].value) ballot |= 1ull << l;
    for (unsigned l = 0; l < kWarp; ++l) {
      if (!(group >> l & 1)) continue;
      Thread* t = &base[l];
      int width = t->width;
      unsigned seg = l & ~unsigned(width - 1);
      int src = int(l);
      switch (op) {
        case kShflIdx: src = int(seg) + (t->arg & (width - 1)); break;
        case kShflUp: src = (int(l) - int(seg)) >= t->arg ? int(l) - t->arg : int(l); break;
        case kShflDown: src = (int(l) - int(seg)) + t->arg < width ? int(l) + t->arg : int(l); break;
        case kShflXor: {
          int s = int(l) ^ t->arg;
          src = (s >= 0 && s < kWarp && unsigned(s) < seg + width && unsigned(s) >= seg) ? s : int(l);
          break;
        }
        default: break;
      }
      if (op <= kShflXor) {
        if (!(group >> src & 1)) {
          fail(b, std::string(kWarpOpNames[op]) + " in warp " + std::to_string(w) + ": lane " + std::to_string(l) +
                      " reads lane " + std::to_string(src) + ", which is not in the mask " + lanes_str(group) +
                      " at " + where(b, nullptr));
          return false;
        }
        t->result = base[src].value;
      } else if (op == kBallot) {
        t->result = ballot;
      } else if (op == kAny) {
        t->result = ballot != 0;
      } else if (op == kAll) {
        t->result = ballot == group;
      } else if (op == kMatchAny || op == kMatchAll) {
        unsigned same = 0;
        for (unsigned o = 0; o < kWarp; ++o)
          if ((group >> o & 1) && base[o].value == t->value) same |= 1u << o;
        t->result = op == kMatchAny ? same : (same == group ? group : 0);
      } else {
        t->result = 0;
      }
    }
    in_collective[w] &= ~group;
    for (unsigned l = 0; l < kWarp; ++l)
      if (group >> l & 1) {
        base[l].state = State::Runnable;
        ++base[l].sync_epoch;
        next.push_back(w * kWarp + l);
      }
    if (BlockCounters* c = b->counters) {
      PhaseStats& st = c->phases[base[__builtin_ctz(group)].phase];
      if (op <= kShflXor) ++st.shuffles;
      else if (op != kSyncWarp) ++st.votes;
      if (group == (warp_lanes(w) & ~b->exited_at_sync[w])) c->close_warp(w);  // the whole warp met
    }
    return true;
  }

  bool release_barrier() {
    unsigned done = 0, at_bar = 0, in_warp = 0;
    int site = -1;
    bool divergent = false;
    unsigned first_done = 0, first_warp = 0, first_bar = 0;
    for (unsigned i = 0; i < b->nthreads; ++i) {
      Thread* t = &b->threads[i];
      if (t->state == State::Done) { if (!done++) first_done = i; }
      else if (t->state == State::Warp) { if (!in_warp++) first_warp = i; }
      else if (t->state == State::Barrier) {
        if (!at_bar++) { first_bar = i; site = t->bar_site; }
        else if (t->bar_site != site) divergent = true;
      }
    }
    if (at_bar == 0) {
      // Only warp collectives are waiting, and none can complete.
      Thread* t = &b->threads[first_warp];
      Thread* base = &b->threads[t->warp * kWarp];
      unsigned missing = (t->mask & warp_lanes(t->warp)), arrived = 0, exited = 0;
      for (unsigned l = 0; l < kWarp; ++l) {
        if (!(missing >> l & 1)) continue;
        if (base[l].state == State::Warp && base[l].mask == t->mask) arrived |= 1u << l;
        if (base[l].state == State::Done) exited |= 1u << l;
      }
      char buf[256];
      snprintf(buf, sizeof buf, "%s with mask 0x%08x in warp %u: lanes %s arrived, lanes %s never will%s",
               kWarpOpNames[t->op], t->mask, t->warp, lanes_str(arrived).c_str(),
               lanes_str(missing & ~arrived).c_str(), exited ? " (they returned)" : " (deadlock)");
      fail(b, buf + std::string(" at ") + where(b, t));
      return false;
    }
    if (in_warp) {
      Thread* t = &b->threads[first_warp];
      fail(b, "deadlock: " + std::to_string(at_bar) + " threads wait at __syncthreads while thread " +
                  fmt_tid(t->tid) + " waits in " + kWarpOpNames[t->op] + " (mask 0x" +
                  [&] { char h[16]; snprintf(h, sizeof h, "%08x", t->mask); return std::string(h); }() +
                  ") at " + where(b, nullptr));
      return false;
    }
    if (done) {
      fail(b, "__syncthreads reached by " + std::to_string(at_bar) + " of " + std::to_string(b->nthreads) +
                  " threads: thread " + fmt_tid(b->threads[first_done].tid) + " and " + std::to_string(done - 1) +
                  " others already returned, at " + where(b, &b->threads[first_bar]));
      return false;
    }
    if (divergent) {
      fail(b, "divergent __syncthreads: threads of one block wait at different barriers at " + where(b, nullptr));
      return false;
    }
    int count = 0;
    for (unsigned i = 0; i < b->nthreads; ++i) count += b->threads[i].bar_pred != 0;
    for (unsigned w = 0; w < nwarps; ++w) note_exited(w);
    int kind = b->threads[first_bar].bar_kind;
    int result = kind == 1 ? count : kind == 2 ? (count == int(b->nthreads)) : kind == 3 ? (count > 0) : 0;
    for (unsigned i = 0; i < b->nthreads; ++i) {
      b->threads[i].bar_result = result;
      b->threads[i].state = State::Runnable;
      ++b->threads[i].sync_epoch;
      next.push_back(i);
    }
    if (BlockCounters* c = b->counters) {
      ++c->phases[b->threads[first_bar].phase].barriers;
      c->close_all();
    }
    return true;
  }

  void shuffle(std::vector<unsigned>& v) {
    if (!b->launch->shuffle) return;
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[splitmix(b->rng) % i]);
  }

  void run() {
    next.clear();
    for (unsigned i = 0; i < b->nthreads; ++i) next.push_back(i);
    while (!b->aborted) {
      if (next.empty()) {
        bool any_warp = false, all_done = true;
        for (unsigned i = 0; i < b->nthreads; ++i) {
          any_warp |= b->threads[i].state == State::Warp;
          all_done &= b->threads[i].state == State::Done;
        }
        if (all_done) return;
        if (any_warp)
          for (unsigned w = 0; w < nwarps && !b->aborted; ++w)
            if (!resolve_warp(w)) return;
        if (!next.empty() || b->aborted) continue;
        if (!release_barrier()) return;
        continue;
      }
      runq.swap(next);
      next.clear();
      shuffle(runq);
      for (unsigned i : runq) {
        if (b->aborted) return;
        run_thread(i);
        Thread* t = &b->threads[i];
        if (t->state == State::Runnable) next.push_back(i);  // __nanosleep
        else if (t->state == State::Warp) {
          unsigned& waiting = in_collective[t->warp];
          waiting |= 1u << t->lane;
          const unsigned group = t->mask & warp_lanes(t->warp);
          if ((waiting & group) == group && !resolve_warp(t->warp)) return;
        }
      }
      if (b->launch->cancel->load(std::memory_order_relaxed)) {
        fail(b, kCancelled);
        return;
      }
      if (std::chrono::steady_clock::now() > b->launch->deadline) {
        char buf[64];
        snprintf(buf, sizeof buf, "%.1f", b->launch->timeout_s);
        fail(b, "watchdog: the launch ran longer than " + std::string(buf) + " s at " + where(b, nullptr));
        return;
      }
    }
  }
};

// ------------------------------------------------------------------ fault handling
// Held while the process's handlers are installed or removed (process_signals starts zeroed:
// no constructor runs for it).
struct SignalLock {
  SignalLock() {
    while (__atomic_exchange_n(&process_signals.lock, 1, __ATOMIC_ACQUIRE)) std::this_thread::yield();
  }
  ~SignalLock() { __atomic_store_n(&process_signals.lock, 0, __ATOMIC_RELEASE); }
};

inline std::string describe_address(Launch* L, Block* b, uintptr_t a, bool write) {
  const char* rw = write ? "write" : "read";
  char buf[320];
  for (Region* r : L->regions) {
    uintptr_t lo = uintptr_t(r->map), hi = lo + r->map_len;
    if (a < lo || a >= hi) continue;
    long off = long(a - uintptr_t(r->data));
    snprintf(buf, sizeof buf, "out-of-bounds global %s of %s (%zu bytes) at byte offset %ld", rw, r->what,
             r->nbytes, off);
    return buf;
  }
  if (const Region* r = b->shared_region) {
    if (a >= uintptr_t(r->map) && a < uintptr_t(r->map) + r->map_len) {
      snprintf(buf, sizeof buf, "out-of-range dynamic shared-memory %s at byte offset %ld of %zu bytes", rw,
               long(a - uintptr_t(b->dyn_shared)), b->dyn_bytes);
      return buf;
    }
  }
  snprintf(buf, sizeof buf, "invalid memory %s at address 0x%lx (stack overflow or a wild pointer)", rw,
           (unsigned long)a);
  return buf;
}

inline void on_fault(int sig, siginfo_t* info, void* uctx) {
  Block* b = t_block;
  if (b && b->cur && t_fault_jmp && sig == SIGILL) {
    // Modules are compiled with the alignment sanitizer in trap mode: a load or store through
    // a pointer not aligned to its type (a 16-byte vector access off a 16-byte boundary)
    // traps here, as it would fault on a GPU.
    fail(b, "misaligned memory access (a load or store not aligned to its type, such as a 16-byte "
            "vector access off a 16-byte boundary) at " + where(b, b->cur));
    siglongjmp(*t_fault_jmp, 1);
  }
  if (b && b->cur && t_fault_jmp) {
    bool write = false;
#if defined(__x86_64__)
    write = (static_cast<ucontext_t*>(uctx)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
#endif
    fail(b, describe_address(b->launch, b, uintptr_t(info->si_addr), write) + " at " + where(b, b->cur));
    siglongjmp(*t_fault_jmp, 1);
  }
  // Not ours: restore the previous handler and let the fault happen again.
  sigaction(sig, &process_signals.old[sig == SIGSEGV ? 0 : sig == SIGBUS ? 1 : 2], nullptr);
}

inline void install_handlers() {
  SignalLock lock;
  if (process_signals.users++ > 0) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &process_signals.old[0]);
  sigaction(SIGBUS, &sa, &process_signals.old[1]);
  sigaction(SIGILL, &sa, &process_signals.old[2]);
}

inline void remove_handlers() {
  SignalLock lock;
  if (--process_signals.users > 0) return;
  sigaction(SIGSEGV, &process_signals.old[0], nullptr);
  sigaction(SIGBUS, &process_signals.old[1], nullptr);
  sigaction(SIGILL, &process_signals.old[2], nullptr);
}

// ------------------------------------------------------------------ block execution
constexpr size_t kStackBytes = 64 * 1024;

struct Worker {
  std::vector<Thread> threads;
  unsigned char* stacks = nullptr;
  size_t stacks_len = 0;
  Region* shared = nullptr;
  std::vector<unsigned char> altstack;

  ~Worker() {
    if (stacks) munmap(stacks, stacks_len);
    region_free(shared);
  }

  bool prepare(unsigned nthreads, size_t shared_bytes) {
    size_t slot = kStackBytes + page_size();
    stacks_len = slot * nthreads;
    void* m = mmap(nullptr, stacks_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return false;
    stacks = static_cast<unsigned char*>(m);
    for (unsigned i = 0; i < nthreads; ++i) mprotect(stacks + i * slot, page_size(), PROT_NONE);
    threads.resize(nthreads);
    if (shared_bytes) shared = region_alloc(shared_bytes);
    altstack.resize(64 * 1024);
    return true;
  }

  void* initial_sp(unsigned i) {
    size_t slot = kStackBytes + page_size();
    uintptr_t top = (uintptr_t(stacks + (i + 1) * slot)) & ~uintptr_t(15);
    uint64_t* sp = reinterpret_cast<uint64_t*>(top);
    *--sp = 0;                                      // alignment: fiber_main starts with rsp % 16 == 8
    *--sp = reinterpret_cast<uint64_t>(&fiber_main);  // return address for `ret`
    for (int r = 0; r < 6; ++r) *--sp = 0;          // rbp rbx r12 r13 r14 r15
    --sp;                                           // mxcsr + x87 control word
    uint32_t ctl[2] = {0x1f80u, 0x037fu};
    memcpy(sp, ctl, 8);
    return sp;
  }
};

inline void fiber_main() {
  Block* b = t_block;
  const Kernel* k = b->launch->kernel;
  k->invoke(k->fn, b->launch->args);
  b->cur->state = State::Done;
  tk_swap_context(&b->cur->sp, b->sched_sp);
  __builtin_trap();
}

// A block's counts join the launch's, phase by phase (by label).
inline void merge_counters(Launch* L, Block* b, const BlockCounters& c) {
  std::lock_guard<std::mutex> g(L->stats_mu);
  for (int i = 0; i < c.nphases; ++i) {
    const PhaseStats& s = c.phases[i];
    int j = 0;
    while (j < L->nphases && strcmp(L->phases[j].label, s.label) != 0) ++j;
    if (j == L->nphases) {
      if (j == kMaxPhases) {
        fail(b, "traffic counters: the blocks of this launch use more than " + std::to_string(kMaxPhases) +
                    " phase labels, at " + where(b, nullptr));
        return;
      }
      L->phases[L->nphases++].label = s.label;
    }
    add_stats(L->phases[j], s);
  }
  for (const auto& [path, total] : c.sites) {
    auto it = L->sites.try_emplace(path, SiteTotal{total.parent, total.id, 0, 0, 0, 0}).first;
    it->second.count += total.count;
    it->second.lane_entries += total.lane_entries;
    it->second.lane_firsts += total.lane_firsts;
    it->second.full += total.full;
  }
}

inline void run_blocks(Launch* L, uint64_t nblocks) {
  Worker w;
  BlockCounters counters;
  unsigned nthreads = L->block.x * L->block.y * L->block.z;
  if (!w.prepare(nthreads, L->shared_bytes)) {
    std::lock_guard<std::mutex> g(L->err_mu);
    if (!L->failed.exchange(true)) L->error = "cannot allocate fiber stacks";
    return;
  }
  stack_t ss{};
  ss.ss_sp = w.altstack.data();
  ss.ss_size = w.altstack.size();
  stack_t old_ss{};
  sigaltstack(&ss, &old_ss);
  if (w.shared) {
    w.shared->what = "dynamic shared memory";
  }
  for (;;) {
    uint64_t id = L->next_block.fetch_add(1);
    if (id >= nblocks || L->failed.load()) break;
    if (!L->block_order.empty()) id = L->block_order[id];
    Block b;
    b.launch = L;
    b.id = id;
    b.bid = uint3{unsigned(id % L->grid.x), unsigned(id / L->grid.x % L->grid.y),
                  unsigned(id / (uint64_t(L->grid.x) * L->grid.y))};
    b.threads = w.threads.data();
    b.nthreads = nthreads;
    b.rng = L->seed * 0x9e3779b97f4a7c15ull + id + 1;
    if (w.shared) {
      b.dyn_shared = w.shared->data;
      b.dyn_bytes = L->shared_bytes;
      b.shared_region = w.shared;
    }
    for (unsigned i = 0; i < nthreads; ++i) {
      Thread& t = w.threads[i];
      t = Thread{};
      t.tid = uint3{i % L->block.x, i / L->block.x % L->block.y, i / (L->block.x * L->block.y)};
      t.linear = i;
      t.lane = i % kWarp;
      t.warp = i / kWarp;
      t.sp = w.initial_sp(i);
    }
    L->poison();
    if (L->counting) {
      counters.reset();
      b.counters = &counters;
    }
    if (w.shared) memset(w.shared->data, 0xFF, w.shared->nbytes);
    sigjmp_buf jb;
    t_block = &b;
    t_fault_jmp = &jb;
    if (sigsetjmp(jb, 1) == 0) {
      Scheduler s(&b);
      s.run();
    }
    t_fault_jmp = nullptr;
    t_block = nullptr;
    if (w.shared && !b.aborted) {
      int damage = region_check(w.shared);
      if (damage) {
        fail(&b, std::string("out-of-range dynamic shared-memory write ") + (damage == 1 ? "before" : "after") +
                     " the " + std::to_string(L->shared_bytes) + " bytes, found in the guard zone after " +
                     where(&b, nullptr));
      }
    }
    if (b.counters && !b.aborted) {
      counters.close_all();
      merge_counters(L, &b, counters);
    }
    if (b.aborted) break;
  }
  sigaltstack(&old_ss, nullptr);
}

// The runtime's entry (tk_runtime_launch): the launch's blocks on up to `workers` threads,
// with the process's fault handlers installed around them.
inline void run_launch(Launch* L, int workers) {
  const uint64_t nblocks = uint64_t(L->grid.x) * L->grid.y * L->grid.z;
  install_handlers();
  int nworkers = int(std::min<uint64_t>(nblocks, uint64_t(std::max(1, workers))));
  if (nworkers <= 1) {
    run_blocks(L, nblocks);
  } else {
    std::vector<std::thread> pool;
    for (int i = 0; i < nworkers; ++i) pool.emplace_back(run_blocks, L, nblocks);
    for (auto& t : pool) t.join();
  }
  remove_handlers();
}
#else
// Static __shared__ arrays are thread_local: find this module's TLS block so that each block
// starts with poisoned (0xFF) shared memory, as uninitialised on a GPU. Stale reads of a
// missing barrier then show up instead of reading the previous block's values.
struct TlsSpan {
  size_t size = 0;
  void* handle = nullptr;
};

inline int find_tls_size(struct dl_phdr_info* info, size_t, void* data) {
  auto* want = static_cast<std::pair<uintptr_t, size_t>*>(data);
  if (info->dlpi_addr != want->first) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i)
    if (info->dlpi_phdr[i].p_type == PT_TLS) want->second = info->dlpi_phdr[i].p_memsz;
  return 1;
}

inline const TlsSpan& module_tls() {
  static TlsSpan span = [] {
    TlsSpan t;
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(&find_tls_size), &info)) {
      std::pair<uintptr_t, size_t> want{uintptr_t(info.dli_fbase), 0};
      dl_iterate_phdr(find_tls_size, &want);
      t.size = want.second;
      t.handle = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    }
    return t;
  }();
  return span;
}

inline void poison_static_shared() {
  const TlsSpan& t = module_tls();
  void* block = nullptr;
  t_tls_touch = 0;  // touch the module's TLS block so that it exists on this thread
  if (t.handle && t.size && dlinfo(t.handle, RTLD_DI_TLS_DATA, &block) == 0 && block) memset(block, 0xFF, t.size);
  t_block = nullptr;
  t_fault_jmp = nullptr;
  t_tls_touch = 0;
}


// The runtime's launch entry this module was bound to (tk_bind_runtime).
inline void (*runtime_launch)(void* launch, int workers) = nullptr;
#endif  // TK_RUNTIME

// ------------------------------------------------------------------ registration helpers
template <class T>
constexpr char code_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_pointer_v<U>) return 'p';
  else if constexpr (std::is_same_v<U, bool>) return 'b';
  else if constexpr (std::is_floating_point_v<U>) return sizeof(U) == 4 ? 'f' : 'd';
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U>)
    return sizeof(U) == 1 ? 'c' : sizeof(U) == 2 ? 'h' : sizeof(U) == 4 ? 'i' : 'l';
  else if constexpr (std::is_integral_v<U>)
    return sizeof(U) == 1 ? 'C' : sizeof(U) == 2 ? 'H' : sizeof(U) == 4 ? 'I' : 'L';
  else return '?';
}

template <class... A, size_t... I>
void invoke_impl(void (*f)(A...), void** args, std::index_sequence<I...>) {
  f(*static_cast<std::remove_reference_t<A>*>(args[I])...);
}

template <class... A>
struct Registrar {
  static void invoke(void* fn, void** args) {
    invoke_impl(reinterpret_cast<void (*)(A...)>(fn), args, std::index_sequence_for<A...>{});
  }
  static constexpr char sig[sizeof...(A) + 1] = {code_of<A>()..., '\0'};
};

template <class... A>
int register_kernel(void (*f)(A...), const char* display) {
  registry().push_back(Kernel{reinterpret_cast<void*>(f), &Registrar<A...>::invoke, Registrar<A...>::sig, display});
  return 0;
}

}  // namespace tk

// ------------------------------------------------------------------ built-in variables
#define threadIdx (::tk::t_block->cur->tid)
#define blockIdx (::tk::t_block->bid)
#define blockDim (::tk::t_block->launch->block)
#define gridDim (::tk::t_block->launch->grid)
#define warpSize 32

// ------------------------------------------------------------------ barriers
#define __syncthreads() ((void)::tk::block_barrier(__COUNTER__, 0, 0))
#define __syncthreads_count(p) ::tk::block_barrier(__COUNTER__, 1, (p) != 0)
#define __syncthreads_and(p) ::tk::block_barrier(__COUNTER__, 2, (p) != 0)
#define __syncthreads_or(p) ::tk::block_barrier(__COUNTER__, 3, (p) != 0)

inline void __syncwarp(unsigned mask = 0xffffffffu) { ::tk::warp_collective(::tk::kSyncWarp, mask, 0, 0, 32); }

// ------------------------------------------------------------------ warp collectives
template <class T>
inline T __shfl_sync(unsigned mask, T var, int src, int width = 32) {
  return ::tk::from_bits<T>(::tk::warp_collective(::tk::kShflIdx, mask, ::tk::to_bits(var), src, width));
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return ::tk::from_bits<T>(::tk::warp_collective(::tk::kShflUp, mask, ::tk::to_bits(var), int(delta), width));
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return ::tk::from_bits<T>(::tk::warp_collective(::tk::kShflDown, mask, ::tk::to_bits(var), int(delta), width));
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  return ::tk::from_bits<T>(::tk::warp_collective(::tk::kShflXor, mask, ::tk::to_bits(var), lane_mask, width));
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  return unsigned(::tk::warp_collective(::tk::kBallot, mask, pred != 0, 0, 32));
}
inline int __any_sync(unsigned mask, int pred) { return int(::tk::warp_collective(::tk::kAny, mask, pred != 0, 0, 32)); }
inline int __all_sync(unsigned mask, int pred) { return int(::tk::warp_collective(::tk::kAll, mask, pred != 0, 0, 32)); }
template <class T>
inline unsigned __match_any_sync(unsigned mask, T value) {
  return unsigned(::tk::warp_collective(::tk::kMatchAny, mask, ::tk::to_bits(value), 0, 32));
}
template <class T>
inline unsigned __match_all_sync(unsigned mask, T value, int* pred) {
  unsigned all = unsigned(::tk::warp_collective(::tk::kMatchAll, mask, ::tk::to_bits(value), 0, 32));
  *pred = all != 0;
  return all;
}
// The lanes of the warp that had not returned when the warp last synchronised (a barrier or
// a warp collective): threads run one after another between those points.
inline unsigned __activemask() {
  ::tk::Block* b = ::tk::t_block;
  unsigned w = b->cur->warp, n = std::min(32u, b->nthreads - w * 32);
  unsigned exists = n == 32 ? 0xffffffffu : ((1u << n) - 1);
  return exists & ~b->exited_at_sync[w];
}

// Lets other threads of the block run: intra-block spin-waits make progress.
inline void __nanosleep(unsigned) {
  ::tk::poll_watchdog();
  ::tk::yield_to_scheduler();
}

// ------------------------------------------------------------------ memory fences and atomics
inline void __threadfence() {
  ::tk::poll_watchdog();
  ::tk::order_fence();
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
inline void __threadfence_block() { ::tk::poll_watchdog(); __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() {
  ::tk::poll_watchdog();
  ::tk::order_fence();
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

// Every atomic takes its call site (file and line, filled in by the compiler) for the
// traffic counters, which group the lanes of a warp into instructions by site. Two atomics
// on one line share a site; their arrivals alternate, so each lane's k-th arrival is still
// the same instruction as every other lane's.
#define TK_SITE const char* tk_file = __builtin_FILE(), unsigned tk_line = __builtin_LINE()
#define TK_ATOMIC_ENTRY(p, ...)                                                    \
  ::tk::Block* tk_b = ::tk::poll_watchdog();                                       \
  ::tk::order_atomic(p);                                                           \
  if (TK_COUNTERS && tk_b->counters) ::tk::note_atomic(tk_b->counters, p, tk_file, tk_line, ##__VA_ARGS__)
#define TK_ATOMIC_INT(T)                                                                                       \
  inline ::tk::AtomicResult<T> atomicAdd(T* p, T v, TK_SITE) {                                                 \
    ::tk::AtomicNote note;                                                                                     \
    ::tk::Block* tk_b = ::tk::poll_watchdog();                                                                 \
    ::tk::order_atomic(p);                                                                                     \
    if (TK_COUNTERS && tk_b->counters)                                                                         \
      note = ::tk::note_atomic(tk_b->counters, p, tk_file, tk_line, v == static_cast<T>(1) ? ::tk::kInc : ::tk::kAdd);      \
    return {__atomic_fetch_add(p, v, __ATOMIC_SEQ_CST), note};                                                 \
  }                                                                                                            \
  inline T atomicSub(T* p, T v, TK_SITE) { TK_ATOMIC_ENTRY(p); return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); } \
  inline T atomicOr(T* p, T v, TK_SITE) { TK_ATOMIC_ENTRY(p); return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }   \
  inline T atomicAnd(T* p, T v, TK_SITE) { TK_ATOMIC_ENTRY(p); return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); } \
  inline T atomicXor(T* p, T v, TK_SITE) { TK_ATOMIC_ENTRY(p); return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); } \
  inline T atomicExch(T* p, T v, TK_SITE) { TK_ATOMIC_ENTRY(p); return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); } \
  inline T atomicCAS(T* p, T cmp, T v, TK_SITE) {                                                              \
    TK_ATOMIC_ENTRY(p);                                                                                        \
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                        \
    return cmp;                                                                                                \
  }                                                                                                            \
  inline T atomicMax(T* p, T v, TK_SITE) {                                                                     \
    TK_ATOMIC_ENTRY(p, ::tk::kMinMax);                                                                                        \
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);                                                              \
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {   \
    }                                                                                                          \
    return old;                                                                                                \
  }                                                                                                            \
  inline T atomicMin(T* p, T v, TK_SITE) {                                                                     \
    TK_ATOMIC_ENTRY(p, ::tk::kMinMax);                                                                                        \
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);                                                              \
    while (old > v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {   \
    }                                                                                                          \
    return old;                                                                                                \
  }
TK_ATOMIC_INT(int)
TK_ATOMIC_INT(unsigned int)
TK_ATOMIC_INT(unsigned long long)
TK_ATOMIC_INT(long long)
#undef TK_ATOMIC_INT

inline unsigned short atomicCAS(unsigned short* p, unsigned short cmp, unsigned short v, TK_SITE) {
  TK_ATOMIC_ENTRY(p);
  __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return cmp;
}

template <class F, class U>
inline F tk_atomic_float_add(F* p, F v) {
  U* q = reinterpret_cast<U*>(p);
  U old = __atomic_load_n(q, __ATOMIC_SEQ_CST), want;
  do {
    F f;
    memcpy(&f, &old, sizeof f);
    f += v;
    memcpy(&want, &f, sizeof f);
  } while (!__atomic_compare_exchange_n(q, &old, want, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
  F r;
  memcpy(&r, &old, sizeof r);
  return r;
}
inline float atomicAdd(float* p, float v, TK_SITE) {
  TK_ATOMIC_ENTRY(p);
  return tk_atomic_float_add<float, uint32_t>(p, v);
}
inline double atomicAdd(double* p, double v, TK_SITE) {
  TK_ATOMIC_ENTRY(p);
  return tk_atomic_float_add<double, uint64_t>(p, v);
}
inline float atomicExch(float* p, float v, TK_SITE) {
  TK_ATOMIC_ENTRY(p);
  uint32_t u, o;
  memcpy(&u, &v, 4);
  o = __atomic_exchange_n(reinterpret_cast<uint32_t*>(p), u, __ATOMIC_SEQ_CST);
  float r;
  memcpy(&r, &o, 4);
  return r;
}
#undef TK_ATOMIC_ENTRY
#undef TK_SITE

// ------------------------------------------------------------------ integer and bit intrinsics
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  return __builtin_bswap32(x);
}
inline unsigned long long __brevll(unsigned long long x) {
  return (static_cast<unsigned long long>(__brev(unsigned(x))) << 32) | __brev(unsigned(x >> 32));
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  uint64_t v = (uint64_t(y) << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= unsigned((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned s) {
  uint64_t v = (uint64_t(hi) << 32) | lo;
  return unsigned((v << (s & 31)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
  uint64_t v = (uint64_t(hi) << 32) | lo;
  return unsigned(v >> (s & 31));
}
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
inline long long __double_as_longlong(double d) { long long u; memcpy(&u, &d, 8); return u; }
inline double __longlong_as_double(long long u) { double d; memcpy(&d, &u, 8); return d; }
template <class T>
inline T __ldg(const T* p) { return *p; }

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return a < b ? a : b; }
inline float max(float a, float b) { return a > b ? a : b; }

// ------------------------------------------------------------------ dynamic shared memory
namespace tk {
inline unsigned char* dynamic_shared() { return t_block->dyn_shared; }
}  // namespace tk

#if TK_RUNTIME
// ------------------------------------------------------------------ the runtime's C interface
extern "C" __attribute__((visibility("default"))) void tk_runtime_launch(void* launch, int workers) {
  ::tk::run_launch(static_cast<::tk::Launch*>(launch), workers);
}
#else
// ------------------------------------------------------------------ the module's C interface
namespace tk {
// The counting sites of the module's last counted launch (tk_site_count, tk_site_read): the
// caller reads them before its next launch on the module. Not thread_local: the module's TLS
// holds static __shared__ memory, which every block's start poisons.
inline std::vector<std::array<uint64_t, 7>>& site_results() {
  static std::vector<std::array<uint64_t, 7>> rows;
  return rows;
}
}  // namespace tk

extern "C" {

__attribute__((visibility("default"))) int tk_kernel_count() { return int(::tk::registry().size()); }

__attribute__((visibility("default"))) int tk_max_phases() { return ::tk::kMaxPhases; }

__attribute__((visibility("default"))) const char* tk_kernel_signature(int i) { return ::tk::registry()[i].signature; }

__attribute__((visibility("default"))) const char* tk_kernel_display(int i) { return ::tk::registry()[i].display; }

// The symbol name as the linker sees it: the plain name of an extern "C" kernel, the
// mangled (lowered) name of a template instance.
__attribute__((visibility("default"))) const char* tk_kernel_symbol(int i) {
  Dl_info info;
  if (dladdr(::tk::registry()[i].fn, &info) && info.dli_sname) return info.dli_sname;
  return ::tk::registry()[i].display;
}

__attribute__((visibility("default"))) void tk_cancel() { ::tk::cancel_flag().store(1); }

// The runtime's tk_runtime_launch, of a runtime built from this very header by this compiler.
__attribute__((visibility("default"))) void tk_bind_runtime(void (*launch)(void*, int)) { ::tk::runtime_launch = launch; }
__attribute__((visibility("default"))) void* tk_region_alloc(size_t nbytes) { return ::tk::region_alloc(nbytes); }
__attribute__((visibility("default"))) void* tk_region_data(void* r) { return static_cast<::tk::Region*>(r)->data; }
__attribute__((visibility("default"))) int tk_region_check(void* r) { return ::tk::region_check(static_cast<::tk::Region*>(r)); }
__attribute__((visibility("default"))) void tk_region_free(void* r) { ::tk::region_free(static_cast<::tk::Region*>(r)); }

// args: like cuLaunchKernel's kernelParams, one pointer to each argument's value.
// regions/region_names: the guarded buffers passed as pointer arguments, to name faults.
// counting: collect traffic counters into phases[0, *nphases) (room for kMaxPhases).
// check_order: check the ordering of reads of other blocks' writes (order_* above), running
// the blocks one at a time, shuffled by the seed when `shuffle` is set.
__attribute__((visibility("default"))) int tk_launch(int kernel, const unsigned* grid, const unsigned* block,
                                                     void** args, void** regions, const char** region_names,
                                                     int nregions, size_t shared_bytes, int shuffle,
                                                     unsigned long long seed, double timeout_s, int workers,
                                                     char* err, size_t errlen, int counting,
                                                     ::tk::PhaseStats* phases, int* nphases, int check_order) {
  using namespace ::tk;
  cancel_flag().store(0);  // the host calls tk_cancel until this launch has returned
  if (!runtime_launch) {
    snprintf(err, errlen, "this module is not bound to the emulator's runtime (tk_bind_runtime)");
    return 1;
  }
  if (counting && !TK_COUNTERS) {
    snprintf(err, errlen, "traffic counters: this module was compiled with TK_COUNTERS=0");
    return 1;
  }
  Launch L;
  L.kernel = &registry()[kernel];
  L.grid = uint3{grid[0], grid[1], grid[2]};
  L.block = uint3{block[0], block[1], block[2]};
  L.args = args;
  L.shared_bytes = shared_bytes;
  L.shuffle = shuffle != 0;
  L.seed = seed;
  L.timeout_s = timeout_s;
  L.counting = counting != 0;
  L.deadline = std::chrono::steady_clock::now() +
               std::chrono::microseconds(static_cast<long long>(timeout_s * 1e6));
  for (int i = 0; i < nregions; ++i) {
    Region* r = static_cast<Region*>(regions[i]);
    r->what = region_names[i];
    L.regions.push_back(r);
  }
  uint64_t nblocks = uint64_t(L.grid.x) * L.grid.y * L.grid.z;
  if (check_order) {
    L.check_order = true;
    L.released.assign(nblocks, 0);
    workers = 1;
    if (L.shuffle) {
      uint64_t state = L.seed ^ 0x6a09e667f3bcc909ull;
      L.block_order.resize(nblocks);
      for (uint64_t i = 0; i < nblocks; ++i) L.block_order[i] = i;
      for (uint64_t i = nblocks; i > 1; --i) std::swap(L.block_order[i - 1], L.block_order[splitmix(state) % i]);
    }
  }
  L.cancel = &cancel_flag();
  L.poison = &poison_static_shared;
  runtime_launch(&L, workers);
  if (L.failed.load()) {
    snprintf(err, errlen, "%s", L.error.c_str());
    return 1;
  }
  // phases: room for kMaxPhases entries, filled when the launch counted
  for (int i = 0; i < L.nphases; ++i) phases[i] = L.phases[i];
  *nphases = L.nphases;
  site_results().clear();
  for (const auto& [path, total] : L.sites) site_results().push_back({path, total.parent, total.id, total.count, total.lane_entries, total.lane_firsts,
                                                      total.full});
  std::sort(site_results().begin(), site_results().end(), [](const auto& a, const auto& b) { return a[0] < b[0]; });
  return 0;
}

// The counting sites of the last launch on this module (path, parent path, site id, warp
// executions, lane entries, lanes' first entries under their parent's instance, executions
// by a full warp): tk_site_count() rows, read with tk_site_read(out) into 7 x rows uint64.
__attribute__((visibility("default"))) unsigned long long tk_site_count() { return ::tk::site_results().size(); }
__attribute__((visibility("default"))) void tk_site_read(unsigned long long* out) {
  size_t i = 0;
  for (const auto& row : ::tk::site_results())
    for (uint64_t v : row) out[i++] = v;
}

}  // extern "C"
#endif  // TK_RUNTIME
