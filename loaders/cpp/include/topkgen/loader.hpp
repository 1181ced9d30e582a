// topkgen/loader.hpp: a header-only C++17 loader for topkgen bundles (manifest schema 3).
//
// It follows the manifest and nothing else: the load checks and the dispatch lookup that
// topkgen/schemas/manifest.schema.json describes, with the messages topkgen's Python loader
// gives (it reads the text as topkgen/reader.py does and validates against the same schema,
// embedded in manifest_schema.hpp), and launches configured from the manifest alone
// (arguments passed by the names of each kernel's params, in their order). The CUDA driver
// is resolved at run time (dlopen("libcuda.so.1") + cuGetProcAddress), so this builds and
// dispatches on machines with no GPU and no CUDA toolkit. It has no NVRTC: plan with
// jit_available = false, and the row's aot_fallback serves.
//
//   topkgen::Bundle b("out");
//   topkgen::Plan p = b.plan("sm_90", "float32", k, n, rows, /*deterministic=*/false,
//                            /*jit_available=*/false);
//   // p.workspace_bytes of device memory, or 0 when the rows are not split
//   b.run(p, stream, x, values, indices, rows, n, k, /*largest=*/true, workspace);
//
// Needs: nlohmann/json (the PyPI package nlohmann-json ships the header), OpenSSL's
// libcrypto (-lcrypto) for SHA-256, and -ldl.
#pragma once

#include <dlfcn.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "manifest_schema.hpp"

// The driver's opaque handles, declared as cuda.h declares them, so CUstream and CUdeviceptr
// values from code that includes cuda.h pass straight through.
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;

namespace topkgen {

// Every refusal (a bad bundle, a shape outside the domain, a driver failure).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr std::int64_t N_MAX = 2147483647;
constexpr std::int64_t ROWS_MAX = 2147483647;
constexpr int SCHEMA_VERSION = 7;  // 7: a split in one launch (tickets, merged_*); 6: shared memory sized to the row (launch.shared_bytes); 5: output flags, ragged batches, split_rules and load_order; 4: k up to n (K rungs to 4096, the large-k path), options
constexpr std::int64_t SM_COUNT_MAX = 1024;  // as the policy schema bounds split.sm_count
constexpr std::uint64_t WORKSPACE_ALIGN = 256;  // candidate values start at a multiple of it (topkgen.policy.split)
constexpr std::uint64_t WORKSPACE_ALIGNMENT = 16;  // and the workspace itself at a multiple of this
constexpr std::int64_t GRID_MAX = 2147483647;      // CTAs of one launch (grid.x)
constexpr std::int64_t DYNAMIC_SHARED_MAX = 232448;  // the largest opt-in shared memory per block (sm_90, sm_100)
// How a launch's dynamic shared memory follows from the elements e (of s bytes) its CTAs read (schema 6:
// launch.shared_bytes; topkgen.policy.split.SHARED_BYTES_RULE, the same words): Kernel::shared_bytes_for.
constexpr const char* SHARED_BYTES_RULE =
    "0 if dynamic_shared_bytes == 0 else min(dynamic_shared_bytes, align_up((e + 16 / s - 1) * s, 16) + shared_buffer_bytes)";

namespace cu {
using Result = int;
using Device = int;
using DevicePtr = unsigned long long;
using Context = CUctx_st*;
using Module = CUmod_st*;
using Function = CUfunc_st*;
using Stream = CUstream_st*;
constexpr Result SUCCESS = 0;
constexpr int FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
constexpr int DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr int DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr int API_VERSION = 12000;  // the ABI of each entry point we ask cuGetProcAddress for

// The entry points the loader uses, resolved once through cuGetProcAddress.
struct Driver {
  Result (*Init)(unsigned);
  Result (*DeviceGet)(Device*, int);
  Result (*DeviceGetAttribute)(int*, int, Device);
  Result (*DevicePrimaryCtxRetain)(Context*, Device);
  Result (*CtxGetCurrent)(Context*);
  Result (*CtxSetCurrent)(Context);
  Result (*CtxGetDevice)(Device*);
  Result (*CtxSynchronize)();
  Result (*ModuleLoadData)(Module*, const void*);
  Result (*ModuleGetFunction)(Function*, Module, const char*);
  Result (*FuncSetAttribute)(Function, int, int);
  Result (*LaunchKernel)(Function, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, Stream,
                         void**, void**);
  Result (*MemAlloc)(DevicePtr*, std::size_t);
  Result (*MemFree)(DevicePtr);
  Result (*MemcpyHtoD)(DevicePtr, const void*, std::size_t);
  Result (*MemcpyDtoH)(void*, DevicePtr, std::size_t);
  Result (*GetErrorName)(Result, const char**);

  void check(Result r, const char* what) const {
    if (r == SUCCESS) return;
    const char* name = nullptr;
    if (GetErrorName == nullptr || GetErrorName(r, &name) != SUCCESS || name == nullptr) name = "unknown error";
    throw Error(std::string(what) + " failed: " + name + " (" + std::to_string(r) + ")");
  }

  // The process-wide driver; throws when libcuda.so.1 or an entry point is missing.
  static const Driver& get() {
    static std::once_flag once;
    static std::unique_ptr<Driver> driver;
    static std::string failure;
    std::call_once(once, [] {
      try {
        driver = std::make_unique<Driver>(load());
      } catch (const Error& err) {
        failure = err.what();
      }
    });
    if (!driver) throw Error(failure);
    return *driver;
  }

 private:
  static Driver load() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      throw Error(std::string("the CUDA driver is not available: ") + (why ? why : "dlopen(libcuda.so.1) failed"));
    }
    using GetProcV2 = Result (*)(const char*, void**, int, std::uint64_t, int*);
    using GetProcV1 = Result (*)(const char*, void**, int, std::uint64_t);
    auto v2 = reinterpret_cast<GetProcV2>(dlsym(lib, "cuGetProcAddress_v2"));
    auto v1 = reinterpret_cast<GetProcV1>(dlsym(lib, "cuGetProcAddress"));  // drivers before CUDA 12
    if (v2 == nullptr && v1 == nullptr) throw Error("the CUDA driver has no cuGetProcAddress (older than CUDA 11.3)");
    auto resolve = [&](const char* symbol, auto& fn) {
      void* p = nullptr;
      int status = 0;
      Result r = v2 ? v2(symbol, &p, API_VERSION, 0, &status) : v1(symbol, &p, API_VERSION, 0);
      if (r != SUCCESS || p == nullptr) throw Error(std::string("the CUDA driver has no ") + symbol);
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    Driver d{};
    resolve("cuGetErrorName", d.GetErrorName);
    resolve("cuInit", d.Init);
    resolve("cuDeviceGet", d.DeviceGet);
    resolve("cuDeviceGetAttribute", d.DeviceGetAttribute);
    resolve("cuDevicePrimaryCtxRetain", d.DevicePrimaryCtxRetain);
    resolve("cuCtxGetCurrent", d.CtxGetCurrent);
    resolve("cuCtxSetCurrent", d.CtxSetCurrent);
    resolve("cuCtxGetDevice", d.CtxGetDevice);
    resolve("cuCtxSynchronize", d.CtxSynchronize);
    resolve("cuModuleLoadData", d.ModuleLoadData);
    resolve("cuModuleGetFunction", d.ModuleGetFunction);
    resolve("cuFuncSetAttribute", d.FuncSetAttribute);
    resolve("cuLaunchKernel", d.LaunchKernel);
    resolve("cuMemAlloc", d.MemAlloc);
    resolve("cuMemFree", d.MemFree);
    resolve("cuMemcpyHtoD", d.MemcpyHtoD);
    resolve("cuMemcpyDtoH", d.MemcpyDtoH);
    d.check(d.Init(0), "cuInit");
    return d;
  }
};

// Makes a context current when the caller has none (device 0's primary context) and
// returns the current device's arch, "sm_90".
inline std::string current_arch() {
  const Driver& d = Driver::get();
  Context ctx = nullptr;
  d.check(d.CtxGetCurrent(&ctx), "cuCtxGetCurrent");
  if (ctx == nullptr) {
    Device dev = 0;
    d.check(d.DeviceGet(&dev, 0), "cuDeviceGet");
    d.check(d.DevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    d.check(d.CtxSetCurrent(ctx), "cuCtxSetCurrent");
  }
  Device dev = 0;
  d.check(d.CtxGetDevice(&dev), "cuCtxGetDevice");
  int major = 0, minor = 0;
  d.check(d.DeviceGetAttribute(&major, DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cuDeviceGetAttribute");
  d.check(d.DeviceGetAttribute(&minor, DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cuDeviceGetAttribute");
  return "sm_" + std::to_string(major) + std::to_string(minor);
}

// The current device's SM count (after current_arch(), which makes a context current): what
// a split batch is planned to fill (topkgen.runtime.TopK takes the device's too).
inline int current_sm_count() {
  const Driver& d = Driver::get();
  Device dev = 0;
  d.check(d.CtxGetDevice(&dev), "cuCtxGetDevice");
  int count = 0;
  d.check(d.DeviceGetAttribute(&count, DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "cuDeviceGetAttribute");
  return count;
}
}  // namespace cu

// One kernel entry of the manifest (kernels[i] or jit_kernels[i]) with its checked file.
struct Kernel {
  std::string field;  // where it sits: "kernels[3]", "jit_kernels[0]"
  bool aot = true;    // a cubin (kernels) or CUDA source for NVRTC (jit_kernels)
  std::string name, arch, dtype, mode, symbol, path, sha256;
  std::string family, work;  // radix kernels whose work is not large run splits (topkgen.policy.split_capable)
  std::string ptx_path, ptx_sha256, ptx;  // kernels[i].ptx (schema 5), when the arch ships PTX: checked at load
  std::vector<std::string> serves, nvrtc_options;
  std::vector<std::string> params;  // parameter names in launch order (their C types are checked at load)
  std::int64_t k = 0, k_min = 0, n_min = 0, n_max = 0;
  unsigned threads_per_block = 0, rows_per_block = 0, dynamic_shared_bytes = 0;
  unsigned shared_buffer_bytes = 0;  // launch.shared_buffer_bytes (schema 6)
  std::string data;  // the file's bytes, read and checked at load

  bool serves_mode(const std::string& m) const { return std::find(serves.begin(), serves.end(), m) != serves.end(); }
  bool takes(const std::string& p) const { return std::find(params.begin(), params.end(), p) != params.end(); }
  // The dynamic shared memory of one launch whose CTAs read at most `elements` elements, also
  // its shared_bytes argument (launch.shared_bytes, schema 6; topkgen.policy.split.SharedMemory):
  // 0 without any, else min(dynamic_shared_bytes, align_up((e + 16 / s - 1) x s, 16) + shared_buffer_bytes).
  unsigned shared_bytes_for(std::int64_t elements) const {
    if (dynamic_shared_bytes == 0) return 0;
    const std::int64_t s = dtype == "float32" ? 4 : 2;
    const std::int64_t copy = ((elements + 16 / s - 1) * s + 15) / 16 * 16;
    return static_cast<unsigned>(std::min<std::int64_t>(dynamic_shared_bytes, copy + shared_buffer_bytes));
  }
};

// How a request is served: the kernel and its chunks per row (1: one launch, one CTA per
// row; more: the split of topkgen.policy.split, two launches through a workspace).
// The request options (manifest `options`, schema 5): sorted = false lets the kernels skip
// their final sort (deterministic kernels sort anyway); int32 indices are written by the
// kernels, 4 bytes each, into the indices output.
enum class IndexDtype { int64, int32 };
struct Options {
  bool sorted = true;
  IndexDtype index_dtype = IndexDtype::int64;
};
// The bits of the kernels' `flags` parameter (options.flags).
constexpr int FLAG_UNSORTED = 1, FLAG_INT32_INDICES = 2;

struct Plan {
  const Kernel* kernel = nullptr;
  std::int64_t rows = 0, n = 0, k = 0;  // the request it was made for: run() takes no other
  std::int64_t chunks = 1;
  std::int64_t chunk = 0;               // elements per chunk (the last takes the rest of the row)
  std::uint64_t values_offset = 0;      // candidate values' offset in the workspace
  std::uint64_t workspace_bytes = 0;    // 0 when nothing needs one (a split; the large-k path's int32 scratch)
  int flags = 0;                        // the output launch's flags (FLAG_*)
  bool scratch = false;                 // the workspace is the large-k path's scratch (int32 indices)
  std::size_t index_bytes() const { return (flags & FLAG_INT32_INDICES) ? 4 : 8; }
  // The dynamic shared memory of each launch (schema 6): one CTA per row reads n elements; a
  // split's stage 1 at most its last chunk, its stage 2 chunks x k candidates.
  std::vector<unsigned> shared_bytes() const {
    if (chunks <= 1) return {kernel->shared_bytes_for(n)};
    return {kernel->shared_bytes_for(n - (chunks - 1) * chunk), kernel->shared_bytes_for(chunks * k)};
  }
};

// One arch's split rule (manifest split_rules[arch], schema 5; topkgen.policy.model.SplitTuning).
struct SplitRule {
  std::int64_t sm_count = 0, ctas_per_sm = 0, rows_below = 0, min_n = 0, max_chunks = 0, min_chunk = 0, chunk_per_k = 0;
  std::map<std::int64_t, std::int64_t> rows_below_by_k;  // rows_below for the K rungs it names
  std::int64_t rows_below_for(std::int64_t k_rung) const {
    const auto it = rows_below_by_k.find(k_rung);
    return it == rows_below_by_k.end() ? rows_below : it->second;
  }
};

// Which binary of the bundle serves a GPU (Bundle::binary; topkgen.runtime.binary, the same words).
struct Binary {
  std::string gpu;    // the GPU's arch, sm_86
  std::string way;    // "cubin", "lower-minor cubin", "ptx" or "jit"
  std::string arch;   // the arch whose kernels (cubins, PTX, or tuning for JIT) serve it
  std::string words;  // what explain prints
};

// A ragged batch (manifest schema 5): row r's candidates are x[r, starts[r] : starts[r] +
// lengths[r]], lengths and starts device arrays of rows int32 (window_bytes 4) or int64 (8)
// entries, starts 0 (null) for windows at the row's start. The kernels read them on the device
// and clamp each window to its row; rows with fewer than k candidates are padded with index -1
// and -inf (largest) or +inf (smallest). All null / 0: dense rows.
struct Windows {
  cu::DevicePtr lengths = 0, starts = 0;
  int window_bytes = 0;
};

namespace detail {
using json = nlohmann::ordered_json;  // keys in document order, as Python reads them

inline std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

inline std::string range(std::int64_t lo, std::int64_t hi) { return std::to_string(lo) + ".." + std::to_string(hi); }

// Typed access that names the field when the document is not what the schema says.
struct Doc {
  std::string file;
  [[noreturn]] void fail(const std::string& field, const std::string& message) const {
    throw Error(file + ": " + field + ": " + message);
  }
  const json& at(const json& obj, const std::string& key, const std::string& field) const {
    if (!obj.is_object()) fail(field, "expected an object");
    auto it = obj.find(key);
    if (it == obj.end()) fail(field, "missing required key '" + key + "'");
    return *it;
  }
  std::string str(const json& obj, const std::string& key, const std::string& field) const {
    const json& v = at(obj, key, field);
    if (!v.is_string()) fail(field + "." + key, "expected a string");
    return v.get<std::string>();
  }
  std::int64_t integer(const json& obj, const std::string& key, const std::string& field, std::int64_t lo,
                       std::int64_t hi) const {
    const json& v = at(obj, key, field);
    if (!v.is_number_integer()) fail(field + "." + key, "expected an integer");
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi))
      fail(field + "." + key, "out of range");
    std::int64_t x = v.get<std::int64_t>();
    if (x < lo || x > hi) fail(field + "." + key, std::to_string(x) + " is outside " + range(lo, hi));
    return x;
  }
  std::vector<std::string> strings(const json& obj, const std::string& key, const std::string& field) const {
    const json& v = at(obj, key, field);
    if (!v.is_array()) fail(field + "." + key, "expected a list");
    std::vector<std::string> out;
    for (const json& s : v) {
      if (!s.is_string()) fail(field + "." + key, "expected a list of strings");
      out.push_back(s.get<std::string>());
    }
    return out;
  }
  std::pair<std::int64_t, std::int64_t> pair(const json& row, const std::string& key, const std::string& field,
                                             std::int64_t hi) const {
    const json& v = at(row, key, field);
    if (!v.is_array() || v.size() != 2 || !v[0].is_number_integer() || !v[1].is_number_integer())
      fail(field + "." + key, "expected [lo, hi]");
    std::int64_t lo = v[0].get<std::int64_t>(), up = v[1].get<std::int64_t>();
    if (lo < 1 || up < 1 || lo > hi || up > hi) fail(field + "." + key, "outside 1.." + std::to_string(hi));
    return {lo, up};
  }
};

inline std::string sha256_hex(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr) != 1) throw Error("SHA-256 failed");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

constexpr std::size_t MAX_MANIFEST_BYTES = 64 << 20;  // topkgen.build.bundle's limits
constexpr std::size_t BINARY_PROBE = 8000;  // topkgen.common.reader.BINARY_PROBE: a NUL among these bytes: binary
constexpr std::size_t MAX_FILE_BYTES = 64 << 20;      // a cubin or a JIT source

inline const char* file_kind(mode_t mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFLNK: return "a symbolic link";
    case S_IFIFO: return "a FIFO";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    default: return "of an unknown kind";
  }
}

// A path as Python's pathlib.PurePosixPath reads and prints it (topkgen's messages name
// files so): repeated slashes and "." parts dropped, exactly two leading slashes kept, "."
// for nothing; ".." is kept as written.
class PurePath {
 public:
  explicit PurePath(const std::string& p)
      : root_(p.compare(0, 2, "//") == 0 && p.compare(0, 3, "///") != 0 ? "//" : p.compare(0, 1, "/") == 0 ? "/" : "") {
    for (std::size_t start = 0; start <= p.size();) {
      const std::size_t slash = std::min(p.find('/', start), p.size());
      const std::string part = p.substr(start, slash - start);
      if (!part.empty() && part != ".") parts_.push_back(part);
      start = slash + 1;
    }
  }
  std::string str() const {
    std::string s = root_;
    for (std::size_t i = 0; i < parts_.size(); ++i) s += (i ? "/" : "") + parts_[i];
    return s.empty() ? "." : s;
  }
  std::string name() const { return parts_.empty() ? "" : parts_.back(); }
  PurePath parent() const {
    PurePath p = *this;
    if (!p.parts_.empty()) p.parts_.pop_back();
    return p;
  }
  PurePath child(const std::string& name) const {
    PurePath p = *this;
    p.parts_.push_back(name);
    return p;
  }

 private:
  std::string root_;
  std::vector<std::string> parts_;
};

// The bytes of the regular file `rel` ("sm_90/x.cubin") under the directory `root` (which
// may be reached through a link), reached through directories only and read no further
// than `limit` bytes (topkgen.build.bundle.read_bundle_file, with its messages). A bundle holds no
// symbolic links (one could lead out of it), FIFOs (which block), devices or sockets. On
// failure returns false with the reason.
inline bool read_bundle_file(const std::string& root, const std::string& rel, std::size_t limit, std::string& out,
                             std::string& why) {
  struct Fd {
    int fd;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
  } dir{::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  auto failed = [&] {
    why = std::strerror(errno);
    return false;
  };
  if (dir.fd < 0) return failed();
  struct stat st;
  for (std::size_t start = 0;;) {
    const std::size_t slash = rel.find('/', start);
    const bool last = slash == std::string::npos;
    const std::string name = rel.substr(start, last ? std::string::npos : slash - start);
    const std::string what = last ? "it" : rel.substr(0, slash);
    if (::fstatat(dir.fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return failed();
    if (S_ISLNK(st.st_mode)) {
      why = what + " is a symbolic link; a bundle holds none";
      return false;
    }
    if (last ? !S_ISREG(st.st_mode) : !S_ISDIR(st.st_mode)) {
      why = what + " is " + file_kind(st.st_mode) + ", not " + (last ? "a regular file" : "a directory");
      return false;
    }
    const int fd = ::openat(dir.fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (last ? 0 : O_DIRECTORY));
    if (fd < 0) return failed();
    ::close(dir.fd);
    dir.fd = fd;
    if (last) break;
    start = slash + 1;
  }
  if (::fstat(dir.fd, &st) != 0) return failed();
  if (!S_ISREG(st.st_mode)) {  // replaced since the lstat
    why = std::string("it is ") + file_kind(st.st_mode) + ", not a regular file";
    return false;
  }
  out.clear();
  char buf[1 << 16];
  while (static_cast<std::uint64_t>(st.st_size) <= limit && out.size() <= limit) {  // a file may grow while it is read
    const ssize_t got = ::read(dir.fd, buf, std::min(sizeof buf, limit + 1 - out.size()));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return failed();
    if (got == 0) break;
    out.append(buf, static_cast<std::size_t>(got));
  }
  if (static_cast<std::uint64_t>(st.st_size) > limit || out.size() > limit) {
    why = "it is larger than " + std::to_string(limit) + " bytes";
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------- JSON text
// What topkgen.common.reader checks in a JSON file before and while parsing it, in its order and
// with its messages: strict UTF-8; no control characters but tab and line breaks, no line
// separators, bidirectional controls, surrogates or noncharacters, raw or as \u escapes;
// nesting at most 32 deep; no NaN or Infinity; numbers of at most 40 characters; no UTF-8
// BOM; no duplicate keys; and a syntax error in the words of Python's json, at its place.
// Positions are line:column, columns counted in characters.

constexpr int MAX_DEPTH = 32;
constexpr std::size_t MAX_NUMBER_CHARS = 40;

// The code point at byte i of t and its length, or 0 where Python's strict UTF-8 decoder
// fails (stray or overlong bytes, surrogates, values above U+10FFFF, a cut sequence).
inline std::size_t utf8_at(const std::string& t, std::size_t i, std::uint32_t& cp) {
  auto byte = [&](std::size_t j) -> unsigned { return j < t.size() ? static_cast<unsigned char>(t[j]) : 0x100; };
  const unsigned c = byte(i);
  std::size_t n = 1;
  unsigned lo = 0x80, hi = 0xBF;
  if (c < 0x80) {
    cp = c;
    return 1;
  } else if (c >= 0xC2 && c <= 0xDF) {
    n = 2, cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3, cp = c & 0x0F, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4, cp = c & 0x07, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  } else {
    return 0;
  }
  for (std::size_t k = 1; k < n; ++k, lo = 0x80, hi = 0xBF) {
    const unsigned d = byte(i + k);
    if (d < lo || d > hi) return 0;
    cp = cp << 6 | (d & 0x3F);
  }
  return n;
}

inline bool forbidden(std::uint32_t c) {  // topkgen.common.reader._FORBIDDEN
  return c <= 0x08 || c == 0x0B || c == 0x0C || (c >= 0x0E && c <= 0x1F) || (c >= 0x7F && c <= 0x9F) || c == 0x2028 ||
         c == 0x2029 || (c >= 0x202A && c <= 0x202E) || (c >= 0x2066 && c <= 0x2069) || (c >= 0xD800 && c <= 0xDFFF) ||
         c == 0xFFFE || c == 0xFFFF;
}

inline std::string describe_char(std::uint32_t c) {
  const char* kind = c >= 0xD800 && c <= 0xDFFF                                          ? "a lone surrogate"
                     : (c >= 0x202A && c <= 0x202E) || (c >= 0x2066 && c <= 0x2069) ? "a bidirectional control"
                     : c == 0x2028 || c == 0x2029                                      ? "a line separator"
                     : c == 0xFFFE || c == 0xFFFF                                      ? "a noncharacter"
                     : c == 0                                                          ? "a NUL byte (is the file UTF-16?)"
                                                                                       : "a control character";
  char hex[16];
  std::snprintf(hex, sizeof hex, "U+%04X", static_cast<unsigned>(c));
  return std::string(hex) + ", " + kind + ", is not allowed";
}

// "FILE:LINE:COLUMN: MESSAGE" for byte `at` of t (valid UTF-8 up to there).
[[noreturn]] inline void refuse_at(const std::string& source, const std::string& t, std::size_t at,
                                   const std::string& message) {
  std::size_t line = 1, line_start = 0, column = 1;
  for (std::size_t i = 0; i < at; ++i)
    if (t[i] == '\n') ++line, line_start = i + 1;
  for (std::size_t i = line_start; i < at; ++i) column += (static_cast<unsigned char>(t[i]) & 0xC0) != 0x80;
  throw Error(source + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " + message);
}

// \u escapes in the string token t[begin, end) must not spell a forbidden character or half
// a surrogate pair (topkgen.common.reader._check_escapes).
inline void check_escapes(const std::string& source, const std::string& t, std::size_t begin, std::size_t end) {
  auto hex4 = [&](std::size_t at, std::uint32_t& code) {
    if (at + 4 > end) return false;
    code = 0;
    for (std::size_t k = at; k < at + 4; ++k) {
      const char c = t[k];
      const int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (v < 0) return false;
      code = code << 4 | static_cast<unsigned>(v);
    }
    return true;
  };
  bool pending = false;  // a high surrogate waiting for its low half
  std::size_t pending_at = 0, pending_end = 0;
  std::uint32_t pending_code = 0;
  for (std::size_t i = begin; i < end;) {
    if (t[i] != '\\') {
      ++i;
      continue;
    }
    std::uint32_t code = 0;
    bool is_u = i + 1 < end && t[i + 1] == 'u' && hex4(i + 2, code);
    if (!is_u && (i + 1 >= end || t[i + 1] == '\n')) {
      ++i;
      continue;
    }
    const std::size_t next = i + (is_u ? 6 : 2);
    if (pending) {
      if (!is_u || code < 0xDC00 || code > 0xDFFF || i != pending_end)
        refuse_at(source, t, pending_at, describe_char(pending_code));
      pending = false;
    } else if (is_u && code >= 0xD800 && code <= 0xDBFF) {
      pending = true, pending_at = i, pending_end = next, pending_code = code;
    } else if (is_u && forbidden(code)) {
      refuse_at(source, t, i, describe_char(code));
    }
    i = next;
  }
  if (pending) refuse_at(source, t, pending_at, describe_char(pending_code));
}

// Python's json.dumps(key) (ASCII only), as topkgen.common.reader names a duplicate key.
inline std::string py_json_key(const std::string& key) {
  std::string out = "\"";
  char buf[16];
  for (std::size_t i = 0; i < key.size();) {
    std::uint32_t c = 0;
    const std::size_t n = utf8_at(key, i, c);
    i += n ? n : 1;
    if (c == '"' || c == '\\') out += '\\', out += static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c == '\b') out += "\\b";
    else if (c == '\f') out += "\\f";
    else if (c >= 0x20 && c < 0x7F) out += static_cast<char>(c);
    else if (c < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c)), out += buf;
    else
      std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + ((c - 0x10000) >> 10), 0xDC00 + ((c - 0x10000) & 0x3FF)),
          out += buf;
  }
  return out + "\"";
}

// False for an integer token ("-?[0-9]+") outside -2^63..2^64-1, which nlohmann would read
// as a float; true for any other number token.
inline bool fits_64_bits(const std::string& token) {
  const bool negative = token[0] == '-';
  std::string digits = token.substr(negative);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return true;  // not an integer token
  digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size() - 1));
  const std::string limit = negative ? "9223372036854775808" : "18446744073709551615";
  return digits.size() < limit.size() || (digits.size() == limit.size() && digits <= limit);
}

// How many bytes from t[i] on spell a number, as json.scanner's NUMBER_RE reads one:
// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, the parts after the integer only when whole.
inline std::size_t number_prefix(const std::string& t, std::size_t i) {
  auto digit = [&](std::size_t j) { return j < t.size() && t[j] >= '0' && t[j] <= '9'; };
  auto digits = [&](std::size_t j) {
    while (digit(j)) ++j;
    return j;
  };
  std::size_t j = i + (i < t.size() && t[i] == '-');
  if (!digit(j)) return 0;
  j = t[j] == '0' ? j + 1 : digits(j);
  if (j < t.size() && t[j] == '.' && digit(j + 1)) j = digits(j + 1);
  if (j < t.size() && (t[j] == 'e' || t[j] == 'E')) {
    const std::size_t k = j + 1 + (j + 1 < t.size() && (t[j + 1] == '+' || t[j + 1] == '-'));
    if (digit(k)) j = digits(k);
  }
  return j - i;
}

// Whether a token follows JSON's number grammar.
inline bool json_number(const std::string& s) { return !s.empty() && number_prefix(s, 0) == s.size(); }

// A byte iterator over the text that counts, in `*read`, the bytes nlohmann's parser has taken:
// at each SAX event that is where the token just read ends (past a number, one more: the byte
// that ended it), which tells where a syntax error lies as Python's json sees it.
struct CountingIterator {
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;
  const char* at;
  std::size_t* read;
  reference operator*() const { return *at; }
  CountingIterator& operator++() { return ++at, ++*read, *this; }
  bool operator==(const CountingIterator& other) const { return at == other.at; }
  bool operator!=(const CountingIterator& other) const { return at != other.at; }
};

// The first byte at or after i that is not JSON whitespace.
inline std::size_t after_blanks(const std::string& t, std::size_t i) {
  while (i < t.size() && (t[i] == ' ' || t[i] == '\t' || t[i] == '\n' || t[i] == '\r')) ++i;
  return i;
}

// Where the key or value after the token that ends at `end` begins: past the ',' or ':'
// between them, unless that token opened an object or array (`opened`; also when none was read).
inline std::size_t next_item(const std::string& t, std::size_t end, bool opened) {
  const std::size_t at = after_blanks(t, end);
  return !opened && at < t.size() && (t[at] == ',' || t[at] == ':') ? after_blanks(t, at + 1) : at;
}

// Python's json message, and its byte offset, for the syntax error nlohmann words as `what`
// after taking `read` bytes of t. `end`: where the last token read whole ends; `opened`: that
// token opened an object or array (or none was read); `container`: what holds the next value
// ('[', '{', or 0 at the top). Python names the token where it expected another, or, inside a
// string or a number, the first byte that does not fit.
inline std::pair<std::string, std::size_t> python_syntax_error(const std::string& t, const std::string& what,
                                                               std::size_t read, std::size_t end, bool opened,
                                                               char container) {
  auto has = [&](const char* words) { return what.find(words) != std::string::npos; };
  if (has("; expected end of input")) return {"Extra data", after_blanks(t, end)};
  if (has("while parsing object separator")) return {"Expecting ':' delimiter", after_blanks(t, end)};
  if (has("while parsing object -") || has("while parsing array"))
    return {"Expecting ',' delimiter", after_blanks(t, end)};
  const std::size_t at = next_item(t, end, opened);  // a key or a value was due there
  const bool key = has("while parsing object key");
  if (at < t.size() && t[at] == '"') {  // a string nlohmann could not read
    if (has("control character")) return {"Invalid control character at", read - 1};
    if (has("after backslash") && read <= t.size()) return {"Invalid \\escape", read - 2};
    if (has("4 hex digits")) return {"Invalid \\uXXXX escape", t.rfind("\\u", std::min(read, t.size()) - 1) + 1};
    if (t.size() >= at + 7 && t[t.size() - 5] == 'u') {  // Python's wants a byte after a \u escape's digits
      std::size_t slashes = 0;
      while (t.size() - 6 - slashes > at && t[t.size() - 6 - slashes] == '\\') ++slashes;
      if (slashes % 2 == 1) return {"Invalid \\uXXXX escape", t.size() - 5};
    }
    return {"Unterminated string starting at", at};
  }
  if (key) return {"Expecting property name enclosed in double quotes", at};
  const std::size_t number = number_prefix(t, at);  // a number nlohmann could not read: Python reads its head
  if (number == 0) return {"Expecting value", at};
  return {container ? "Expecting ',' delimiter" : "Extra data", at + number};
}

// Builds a document with its keys in document order as nlohmann's SAX parser reads it, each
// key appended: ordered_map's own insert searches the keys before it, quadratic in an
// object's keys (200,000 keys, a 2 MB file, took 90 s). A key repeated in an object is
// handed to `duplicate` when the object ends (Python's object_pairs_hook finds it there).
template <class Json>
class DocumentBuilder {
 public:
  using string_t = typename Json::string_t;
  using number_integer_t = typename Json::number_integer_t;
  using number_unsigned_t = typename Json::number_unsigned_t;
  using number_float_t = typename Json::number_float_t;
  using binary_t = typename Json::binary_t;

  Json root;
  std::string error;         // the parse error, as Python's json words it
  std::size_t error_at = 0;  // and its byte offset
  std::size_t read = 0;      // the bytes the parser has taken (CountingIterator)

  DocumentBuilder(const std::string& text, std::function<void(const std::string&)> duplicate)
      : text_(text), duplicate_(std::move(duplicate)) {}

  bool null() { return add(Json(nullptr)); }
  bool boolean(bool v) { return add(Json(v)); }
  bool number_integer(number_integer_t v) { return add(Json(v), true); }
  bool number_unsigned(number_unsigned_t v) { return add(Json(v), true); }
  bool number_float(number_float_t v, const string_t&) { return add(Json(v), true); }
  bool string(string_t& v) { return add(Json(std::move(v))); }
  bool binary(binary_t&) { return false; }  // not in JSON text
  bool start_object(std::size_t) {
    open_.push_back(place(Json::object()));
    keys_.emplace_back();
    return read_whole(false, true);
  }
  bool key(string_t& k) {
    auto& [seen, dup] = keys_.back();
    if (!seen.insert(k).second && dup.empty()) dup = k + '\0';  // '\0': set even for the key ""
    key_ = std::move(k);
    return read_whole(false, false);
  }
  bool end_object() {
    const std::string dup = std::move(keys_.back().second);
    keys_.pop_back();
    open_.pop_back();
    if (!dup.empty()) duplicate_(dup.substr(0, dup.size() - 1));
    return read_whole(false, false);
  }
  bool start_array(std::size_t) {
    open_.push_back(place(Json::array()));
    return read_whole(false, true);
  }
  bool end_array() {
    open_.pop_back();
    return read_whole(false, false);
  }
  // `position`: nlohmann's count of the bytes it read, one past the text when it reached its end
  bool parse_error(std::size_t position, const std::string&, const typename Json::exception& ex) {
    const char container = open_.empty() ? 0 : open_.back()->is_array() ? '[' : '{';
    std::tie(error, error_at) = python_syntax_error(text_, ex.what(), position, end_, opened_, container);
    return false;
  }

 private:
  bool add(Json&& v, bool number = false) { return place(std::move(v)), read_whole(number, false); }
  // A token was read whole: it ends where the parser stands, but for a number, which the
  // parser ends by taking the byte after it (when there is one).
  bool read_whole(bool number, bool opens) {
    if (number) {
      const std::size_t start = next_item(text_, end_, opened_);
      end_ = start + number_prefix(text_, start);
    } else {
      end_ = read;
    }
    opened_ = opens;
    return true;
  }
  // Where a value goes: the root, the end of the open array, or the open object's last key.
  // (The open containers stay put: only the innermost one grows.)
  Json* place(Json&& v) {
    if (open_.empty()) return &(root = std::move(v));
    Json& parent = *open_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    auto& items = static_cast<typename Json::object_t::Container&>(parent.template get_ref<typename Json::object_t&>());
    items.emplace_back(std::move(key_), std::move(v));
    return &items.back().second;
  }

  const std::string& text_;
  std::size_t end_ = 0;   // where the last token read whole ends
  bool opened_ = true;    // it opened an object or array, or none was read yet
  std::function<void(const std::string&)> duplicate_;
  std::vector<Json*> open_;
  std::vector<std::pair<std::set<std::string>, std::string>> keys_;  // per open object: its keys, the first repeated
  string_t key_;
};

// One JSON document read as topkgen.common.reader.read_json reads it (after the bounded read).
template <class Json>
Json parse_json(const std::string& t, const std::string& source) {
  // At most MAX_JSON_VALUES values, bounded by the commas, colons and opening brackets
  // (topkgen.common.reader._check_values, the same words): 64 MiB of `[0,0,...]` took 4.6 s and 1.1 GiB.
  constexpr std::size_t MAX_JSON_VALUES = 1 << 22;
  std::size_t values = 0;
  for (const char ch : t) values += ch == ',' || ch == ':' || ch == '[' || ch == '{';
  if (values > MAX_JSON_VALUES)
    throw Error(source + ": holds " + std::to_string(values) + " commas, colons and brackets: more JSON values "
                "than the " + std::to_string(MAX_JSON_VALUES) + " a file topkgen reads may hold");
  std::uint32_t c = 0;
  for (std::size_t i = 0, n = 0; i < t.size(); i += n) {
    if ((n = utf8_at(t, i, c)) == 0) {
      char msg[128];
      const bool utf16 = t.compare(0, 2, "\xff\xfe") == 0 || t.compare(0, 2, "\xfe\xff") == 0;
      const bool binary = t.find('\0') < BINARY_PROBE;  // as topkgen.common.reader.decode (and git) decide it
      std::snprintf(msg, sizeof msg, "not UTF-8: byte 0x%02x cannot be decoded%s", static_cast<unsigned char>(t[i]),
                    utf16    ? " (the file looks like UTF-16); save the file as UTF-8"
                    : binary ? "; the file is binary (it holds NUL bytes), not text"
                             : "; save the file as UTF-8");
      refuse_at(source, t, i, msg);
    }
  }
  for (std::size_t i = 0, n = 0; i < t.size(); i += n) {
    const unsigned char b = static_cast<unsigned char>(t[i]);
    if (b >= 0x20 && b < 0x7F) {  // printable ASCII, most of any manifest: never forbidden
      n = 1;
      continue;
    }
    if ((n = utf8_at(t, i, c)), forbidden(c)) refuse_at(source, t, i, describe_char(c));
  }
  // The token scan of topkgen.common.reader.parse_json: strings, brackets, numbers, NaN, Infinity.
  int depth = 0;
  auto digit = [&](std::size_t i) { return i < t.size() && t[i] >= '0' && t[i] <= '9'; };
  for (std::size_t i = 0; i < t.size();) {
    const char ch = t[i];
    if (ch == '"') {
      std::size_t j = i + 1;
      while (j < t.size() && t[j] != '"' && t[j] != '\n')
        j += t[j] == '\\' && j + 1 < t.size() && t[j + 1] != '\n' ? 2 : t[j] == '\\' ? t.size() : 1;
      if (j < t.size() && t[j] == '"') {
        check_escapes(source, t, i, j + 1);
        i = j + 1;
        continue;
      }
    } else if (ch == '[' || ch == '{') {
      if (++depth > MAX_DEPTH) refuse_at(source, t, i, "nested deeper than " + std::to_string(MAX_DEPTH) + " levels");
    } else if (ch == ']' || ch == '}') {
      --depth;
    } else if (digit(i) || (ch == '-' && digit(i + 1))) {
      std::size_t j = i + 1;
      while (j < t.size() && (digit(j) || std::strchr(".eE+-", t[j]) != nullptr)) ++j;
      if (j - i > MAX_NUMBER_CHARS)
        refuse_at(source, t, i, "a number of " + std::to_string(j - i) + " characters is out of range (at most " +
                                    std::to_string(MAX_NUMBER_CHARS) + ")");
      const std::string token = t.substr(i, j - i);
      if (!fits_64_bits(token)) refuse_at(source, t, i, "the integer " + token + " does not fit in 64 bits");
      if (json_number(token) && std::isinf(std::strtod(token.c_str(), nullptr)))  // nlohmann refuses it unnamed
        refuse_at(source, t, i, "the number " + token + " is beyond the range of a double");
      i = j;
      continue;
    } else if (ch == 'N' || ch == 'I' || ch == '-') {  // only there: three compares a byte took 64 MiB of blanks 2.35 s
      for (const char* word : {"NaN", "Infinity", "-Infinity"})
        if (t.compare(i, std::strlen(word), word) == 0) refuse_at(source, t, i, std::string(word) + " is not JSON");
    }
    ++i;
  }
  if (t.compare(0, 3, "\xef\xbb\xbf") == 0)  // nlohmann skips it; topkgen.common.reader refuses it, in these words
    refuse_at(source, t, 0, "not valid JSON: the file opens with a byte order mark (U+FEFF), which JSON does not "
                            "allow; save it as UTF-8 without one");
  // Duplicate keys, reported as Python's object_pairs_hook finds them: when their object
  // ends, at the last place the key is written in the file.
  auto duplicate = [&](const std::string& key) {
    const std::string needle = py_json_key(key);
    std::size_t at = std::string::npos, from = t.size();
    while (at == std::string::npos && from != std::string::npos && (from = t.rfind(needle, from)) != std::string::npos) {
      std::size_t j = from + needle.size();
      while (j < t.size() && std::strchr(" \t\n\r\f\v", t[j]) != nullptr && t[j] != '\0') ++j;
      if (j < t.size() && t[j] == ':') at = from;
      from = from == 0 ? std::string::npos : from - 1;
    }
    refuse_at(source, t, at == std::string::npos ? 0 : at, "duplicate key " + needle);
  };
  DocumentBuilder<Json> builder(t, duplicate);
  const CountingIterator first{t.data(), &builder.read}, last{t.data() + t.size(), &builder.read};
  if (!Json::sax_parse(first, last, &builder))
    refuse_at(source, t, builder.error_at, "not valid JSON: " + builder.error);
  return std::move(builder.root);
}

// A schema pattern, searched as topkgen.common.schema searches it (Python's re.search, `$` the end
// of the string) in linear time: a manifest's strings may be long, and std::regex recurses
// per character. The syntax the shipped schema uses: literals, \-escapes, [classes] with
// ranges and ^, `.`, the quantifiers *, + and {n}, and the anchors ^ and $.
class Pattern {
 public:
  explicit Pattern(const std::string& p) {
    std::size_t i = 0;
    auto unsupported = [&] { throw Error("the manifest schema's pattern " + p + " uses syntax this loader lacks"); };
    if (p.compare(0, 1, "^") == 0) start_ = true, ++i;
    while (i < p.size()) {
      Atom atom;
      const char c = p[i++];
      if (c == '$' && i == p.size()) {
        end_ = true;
        break;
      } else if (c == '[') {
        if (i < p.size() && p[i] == '^') atom.negated = true, ++i;
        while (i < p.size() && p[i] != ']') {
          const char lo = p[i] == '\\' && i + 1 < p.size() ? p[++i] : p[i];
          ++i;
          char hi = lo;
          if (i + 1 < p.size() && p[i] == '-' && p[i + 1] != ']') hi = p[i + 1], i += 2;
          atom.ranges.push_back({static_cast<unsigned char>(lo), static_cast<unsigned char>(hi)});
        }
        if (i++ >= p.size()) unsupported();
      } else if (c == '.') {
        atom.negated = true, atom.ranges.push_back({'\n', '\n'});
      } else if (c == '\\' && i < p.size() && std::ispunct(static_cast<unsigned char>(p[i]))) {
        atom.ranges.push_back({static_cast<unsigned char>(p[i]), static_cast<unsigned char>(p[i])}), ++i;
      } else if (std::strchr("\\()|?*+{}^$", c) != nullptr) {
        unsupported();
      } else {
        atom.ranges.push_back({static_cast<unsigned char>(c), static_cast<unsigned char>(c)});
      }
      std::size_t copies = 1;
      if (i < p.size() && (p[i] == '*' || p[i] == '+')) {
        copies = p[i++] == '+';
        atoms_.insert(atoms_.end(), copies, atom);
        atom.star = true;
        copies = 1;
      } else if (i < p.size() && p[i] == '{') {
        const std::size_t close = p.find('}', i);
        if (close == std::string::npos || close == i + 1 || p.find_first_not_of("0123456789", i + 1) != close) unsupported();
        copies = std::stoul(p.substr(i + 1, close - i - 1));
        i = close + 1;
      }
      atoms_.insert(atoms_.end(), copies, atom);
    }
  }

  bool search(const std::string& s) const {
    const std::size_t accept = atoms_.size();
    std::vector<char> now(accept + 1, 0), next(accept + 1, 0);
    auto add = [&](std::vector<char>& set, std::size_t state) {  // with what follows a starred atom's skip
      for (; !set[state]; ++state) {
        set[state] = 1;
        if (state == accept || !atoms_[state].star) break;
      }
    };
    add(now, 0);
    for (std::size_t i = 0, n = 0;; i += n) {
      if (now[accept] && (!end_ || i == s.size())) return true;
      if (i >= s.size()) return false;
      std::uint32_t c = 0;
      n = std::max<std::size_t>(utf8_at(s, i, c), 1);
      std::fill(next.begin(), next.end(), 0);
      bool alive = false;
      for (std::size_t state = 0; state < accept; ++state)
        if (now[state] && atoms_[state].matches(c)) add(next, atoms_[state].star ? state : state + 1), alive = true;
      if (!start_) add(next, 0), alive = true;
      if (!alive) return false;
      now.swap(next);
    }
  }

 private:
  struct Atom {
    std::vector<std::pair<std::uint32_t, std::uint32_t>> ranges;
    bool negated = false, star = false;
    bool matches(std::uint32_t c) const {
      const bool in = std::any_of(ranges.begin(), ranges.end(), [&](const auto& r) { return r.first <= c && c <= r.second; });
      return in != negated;
    }
  };
  std::vector<Atom> atoms_;
  bool start_ = false, end_ = false;
};

// ---------------------------------------------------------------------------- the schema
// The manifest validated against topkgen/schemas/manifest.schema.json (embedded) by a port
// of topkgen/schema.py: the same keywords, the same depth-first walk in document order, the
// same messages. Values are described as Python's repr would describe them.

// Python's repr of a str the reader let through: quotes, backslashes, tab and line breaks
// escaped, and the assigned characters Python 3.11 (Unicode 14) does not print (spaces but
// ' ', format characters, private use); unassigned ones, which Python escapes too, are not.
inline std::string py_repr(const std::string& s) {
  static const std::uint32_t hidden[][2] = {
      {0xA0, 0xA0}, {0xAD, 0xAD}, {0x600, 0x605}, {0x61C, 0x61C}, {0x6DD, 0x6DD}, {0x70F, 0x70F},
      {0x890, 0x891}, {0x8E2, 0x8E2}, {0x1680, 0x1680}, {0x180E, 0x180E}, {0x2000, 0x200F}, {0x202F, 0x202F},
      {0x205F, 0x2064}, {0x206A, 0x206F}, {0x3000, 0x3000}, {0xE000, 0xF8FF}, {0xFEFF, 0xFEFF}, {0xFFF9, 0xFFFB},
      {0x110BD, 0x110BD}, {0x110CD, 0x110CD}, {0x13430, 0x13438}, {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A},
      {0xE0001, 0xE0001}, {0xE0020, 0xE007F}, {0xF0000, 0xFFFFD}, {0x100000, 0x10FFFD}};
  const char quote = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  char buf[16];
  for (std::size_t i = 0, n = 0; i < s.size(); i += n) {
    std::uint32_t c = 0;
    n = std::max<std::size_t>(utf8_at(s, i, c), 1);
    if (c == '\\' || c == static_cast<unsigned char>(quote)) out += '\\', out += static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (std::none_of(std::begin(hidden), std::end(hidden), [&](const auto& r) { return r[0] <= c && c <= r[1]; }))
      out.append(s, i, n);
    else
      std::snprintf(buf, sizeof buf, c < 0x100 ? "\\x%02x" : c < 0x10000 ? "\\u%04x" : "\\U%08x", static_cast<unsigned>(c)),
          out += buf;
  }
  return out + quote;
}

// Python's repr of a JSON number: an integer as written; a float with the fewest digits that
// read back (the closest such), fixed-point for 1e-4 <= |x| < 1e16, else d.ddde+XX.
// (nlohmann's own dump switches at 1e15, and its Grisu2 digits are not always the shortest.)
template <class Json>
std::string py_number(const Json& v) {
  if (!v.is_number_float()) return v.dump();
  const double value = v.template get<double>(), x = std::fabs(value);
  char buf[64];
  for (int precision = 0; precision < 17; ++precision) {  // 17 digits always read back
    std::snprintf(buf, sizeof buf, "%.*e", precision, x);
    if (std::strtod(buf, nullptr) == x) break;  // both in the current locale
  }
  const char* e = std::strchr(buf, 'e');
  std::string digits;
  for (const char* p = buf; p < e; ++p)
    if (*p >= '0' && *p <= '9') digits += *p;
  digits.erase(std::max<std::size_t>(digits.find_last_not_of('0') + 1, 1));
  const int exponent = std::atoi(e + 1);  // of the first digit
  const std::string sign = std::signbit(value) ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) return sign + "0." + std::string(-exponent - 1, '0') + digits;
    if (digits.size() <= static_cast<std::size_t>(exponent) + 1)
      return sign + digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    return sign + digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
  }
  const std::string power = std::to_string(std::abs(exponent));
  return sign + digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "") + "e" +
         (exponent < 0 ? "-" : "+") + (power.size() < 2 ? "0" : "") + power;
}

// Python's json.dumps(v): ASCII only, ", " and ": " between items, keys in document order.
template <class Json>
std::string py_dumps(const Json& v) {
  if (v.is_number()) return py_number(v);
  if (v.is_string()) return v.dump(-1, ' ', true);
  std::vector<std::string> items;
  if (v.is_array())
    for (const Json& x : v) items.push_back(py_dumps(x));
  else if (v.is_object())
    for (auto it = v.begin(); it != v.end(); ++it)
      items.push_back(Json(it.key()).dump(-1, ' ', true) + ": " + py_dumps(it.value()));
  else
    return v.dump();  // null, true, false
  return (v.is_array() ? "[" : "{") + join(items, ", ") + (v.is_array() ? "]" : "}");
}

template <class Json>
std::string describe(const Json& v) {  // topkgen.common.schema._describe
  if (v.is_boolean()) return v.template get<bool>() ? "true" : "false";
  if (v.is_null()) return "null";
  if (v.is_object()) return "a mapping";
  if (v.is_array()) return "a list";
  if (v.is_string()) return py_repr(v.template get_ref<const std::string&>());
  return py_number(v);
}

inline std::size_t characters(const std::string& s) {
  std::size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

template <class Json>
class SchemaValidator {
 public:
  explicit SchemaValidator(const Json& root) : root_(root) {}

  // Throws Error("FILE: PATH: MESSAGE") for the first violation topkgen.common.schema.validate finds.
  void validate(const Json& value, const std::string& file) const {
    try {
      check(value, root_, "");
    } catch (const Violation& v) {
      throw Error(file + ": " + (v.path.empty() ? "<document>" : v.path) + ": " + v.message);
    }
  }

 private:
  struct Violation {
    std::string path, message;
  };

  static std::string key_path(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

  static bool is_number(const Json& v) { return v.is_number(); }  // booleans are not numbers in nlohmann either

  static bool has_type(const Json& v, const std::string& type) {
    return type == "object" ? v.is_object() : type == "array" ? v.is_array() : type == "string" ? v.is_string()
         : type == "integer" ? v.is_number_integer() : type == "number" ? v.is_number()
         : type == "boolean" ? v.is_boolean() : type == "null" ? v.is_null() : false;
  }

  // -1, 0 or 1 as a < b, a == b, a > b for two JSON numbers (integers compared exactly).
  static int compare(const Json& a, const Json& b) {
    if (a.is_number_float() || b.is_number_float()) {
      const double x = a.template get<double>(), y = b.template get<double>();
      return x < y ? -1 : x > y;
    }
    const bool neg_a = a.is_number_integer() && !a.is_number_unsigned() && a.template get<std::int64_t>() < 0;
    const bool neg_b = b.is_number_integer() && !b.is_number_unsigned() && b.template get<std::int64_t>() < 0;
    if (neg_a != neg_b) return neg_a ? -1 : 1;
    if (neg_a) {
      const std::int64_t x = a.template get<std::int64_t>(), y = b.template get<std::int64_t>();
      return x < y ? -1 : x > y;
    }
    const std::uint64_t x = a.template get<std::uint64_t>(), y = b.template get<std::uint64_t>();
    return x < y ? -1 : x > y;
  }

  static bool same(const Json& a, const Json& b) { return a == b; }  // JSON equality: 1 == 1.0, true != 1

  const Json& resolve(const std::string& ref) const {
    const Json* node = &root_;
    for (std::size_t at = 2; at <= ref.size();) {  // "#/$defs/kernel"
      const std::size_t slash = std::min(ref.find('/', at), ref.size());
      node = &node->at(ref.substr(at, slash - at));
      at = slash + 1;
    }
    return *node;
  }

  const Pattern& pattern(const std::string& p) const {
    auto it = patterns_.find(p);
    if (it == patterns_.end()) it = patterns_.emplace(p, Pattern(p)).first;
    return it->second;
  }

  void check(const Json& value, const Json& schema, const std::string& path) const {
    auto refusal = schema.find("x-refusal");
    if (refusal == schema.end()) return check_node(value, schema, path);
    try {
      check_node(value, schema, path);
    } catch (Violation& v) {
      if (v.path == path) v.message += ": " + refusal->template get<std::string>();
      throw;
    }
  }

  void check_node(const Json& value, const Json& schema, const std::string& path) const {
    auto fail = [&](const std::string& message) { throw Violation{path, message}; };
    if (auto ref = schema.find("$ref"); ref != schema.end()) check(value, resolve(ref->template get<std::string>()), path);
    if (auto type = schema.find("type"); type != schema.end()) {
      std::vector<std::string> types;
      if (type->is_array())
        for (const Json& t : *type) types.push_back(t.template get<std::string>());
      else
        types.push_back(type->template get<std::string>());
      if (std::none_of(types.begin(), types.end(), [&](const std::string& t) { return has_type(value, t); }))
        fail("expected " + join(types, " or ") + ", got " + describe(value));
    }
    if (auto c = schema.find("const"); c != schema.end() && !same(value, *c))
      fail("must be " + c->dump(-1, ' ', true) + ", got " + describe(value));
    if (auto e = schema.find("enum"); e != schema.end() && std::none_of(e->begin(), e->end(), [&](const Json& x) { return same(value, x); })) {
      std::vector<std::string> choices;
      for (const Json& x : *e) choices.push_back(x.dump(-1, ' ', true));
      fail(describe(value) + " is not one of " + join(choices, ", "));
    }
    if (is_number(value)) {
      if (auto m = schema.find("minimum"); m != schema.end() && compare(value, *m) < 0)
        fail(py_number(value) + " is less than the minimum " + py_number(*m));
      if (auto m = schema.find("maximum"); m != schema.end() && compare(value, *m) > 0)
        fail(py_number(value) + " is greater than the maximum " + py_number(*m));
    }
    if (value.is_string()) {
      const std::string& s = value.template get_ref<const std::string&>();
      if (auto m = schema.find("minLength"); m != schema.end() && characters(s) < m->template get<std::size_t>())
        fail("must have at least " + m->dump() + " characters");
      if (auto m = schema.find("maxLength"); m != schema.end() && characters(s) > m->template get<std::size_t>())
        fail("must have at most " + m->dump() + " characters");
      if (auto p = schema.find("pattern"); p != schema.end() && !pattern(p->template get<std::string>()).search(s))
        fail(py_repr(s) + " does not match the pattern " + p->template get<std::string>());
    }
    if (value.is_array()) {
      if (auto m = schema.find("minItems"); m != schema.end() && value.size() < m->template get<std::size_t>())
        fail(m->template get<std::size_t>() == 1 ? std::string("must not be empty")
                                                 : "must have at least " + m->dump() + " items");
      if (auto m = schema.find("maxItems"); m != schema.end() && value.size() > m->template get<std::size_t>())
        fail("must have at most " + m->dump() + (m->template get<std::size_t>() == 1 ? " item" : " items"));
      if (schema.value("uniqueItems", false)) {
        std::set<Json> seen;
        for (std::size_t i = 0; i < value.size(); ++i)
          if (!seen.insert(value[i]).second)
            throw Violation{path + "[" + std::to_string(i) + "]", "duplicate item " + describe(value[i])};
      }
      if (auto items = schema.find("items"); items != schema.end())
        for (std::size_t i = 0; i < value.size(); ++i) check(value[i], *items, path + "[" + std::to_string(i) + "]");
    }
    if (value.is_object()) check_object(value, schema, path);
  }

  void check_object(const Json& value, const Json& schema, const std::string& path) const {
    static const Json none = Json::object();
    auto p = schema.find("properties");
    const Json& props = p == schema.end() ? none : *p;
    auto x = schema.find("additionalProperties");
    const bool closed = x != schema.end() && x->is_boolean() && !x->template get<bool>();
    // Unknown and badly named keys first: a typo reads better than "missing key".
    for (auto it = value.begin(); it != value.end(); ++it) {
      const std::string kp = key_path(path, it.key());
      if (auto names = schema.find("propertyNames"); names != schema.end()) {
        try {
          check(Json(it.key()), *names, kp);
        } catch (const Violation& v) {
          throw Violation{kp, "bad key: " + v.message};
        }
      }
      if (closed && !props.contains(it.key())) {
        std::vector<std::string> allowed;
        for (auto q = props.begin(); q != props.end(); ++q) allowed.push_back(q.key());
        std::sort(allowed.begin(), allowed.end());
        throw Violation{kp, "unknown key '" + it.key() + "' (allowed: " + (allowed.empty() ? "none" : join(allowed, ", ")) + ")"};
      }
    }
    if (auto m = schema.find("minProperties"); m != schema.end() && value.size() < m->template get<std::size_t>())
      throw Violation{path, "must have at least " + m->dump() + " entries"};
    if (auto required = schema.find("required"); required != schema.end())
      for (const Json& key : *required)
        if (!value.contains(key.template get<std::string>()))
          throw Violation{path, "missing required key '" + key.template get<std::string>() + "'"};
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (auto q = props.find(it.key()); q != props.end()) check(it.value(), *q, key_path(path, it.key()));
      else if (x != schema.end() && x->is_object()) check(it.value(), *x, key_path(path, it.key()));
    }
  }

  const Json& root_;
  mutable std::map<std::string, Pattern> patterns_;
};

// The SM number of a CUDA ELF file, or -1 when it is not one (e_machine 190, EM_CUDA; the
// SM sits in e_flags bits 8-15 from ABI version 8 on, bits 0-7 before).
inline int elf_sm(const std::string& d) {
  auto byte = [&](std::size_t i) { return static_cast<unsigned>(static_cast<unsigned char>(d[i])); };
  if (d.size() < 52 || d.compare(0, 4, "\x7f" "ELF") != 0) return -1;
  if ((byte(18) | byte(19) << 8) != 190) return -1;
  unsigned flags = byte(48) | byte(49) << 8 | byte(50) << 16 | byte(51) << 24;
  return static_cast<int>(byte(8) >= 8 ? (flags >> 8) & 0xFF : flags & 0xFF);
}

// The most of an ELF file a loader walks (topkgen.manifest.checks.MAX_ELF_SECTIONS ...): a
// cubin holds about 20 sections and 30 symbols in its one symbol table. A forged one of 65535
// section headers, each naming one 64 MiB symbol table, was a walk of 10^11 symbols.
constexpr std::uint64_t MAX_ELF_SECTIONS = 1024, MAX_ELF_SYMBOLS = 1 << 16;

// Why a loader does not walk this ELF file's sections (more section headers, symbol tables or
// symbols than any cubin holds), or "" (topkgen.manifest.checks.elf_bounds_problem, the same
// words). Read from the ELF header and the section headers alone.
inline std::string elf_bounds_problem(const std::string& d) {
  auto u = [&](std::uint64_t at, int bytes) {
    std::uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(d[at + i]);
    return v;
  };
  const std::uint64_t size = d.size();
  if (size < 64 || d[4] != 2 || d[5] != 1) return "";
  const std::uint64_t shoff = u(0x28, 8), shentsize = u(0x3A, 2), shnum = u(0x3C, 2);
  if (shnum > MAX_ELF_SECTIONS)
    return "it has " + std::to_string(shnum) + " section headers (a loader reads at most " +
           std::to_string(MAX_ELF_SECTIONS) + ")";
  if (shentsize < 64 || shoff > size || shnum > (size - shoff) / shentsize) return "";
  std::uint64_t tables = 0, symbols = 0;
  for (std::uint64_t i = 0; i < shnum; ++i) {
    const std::uint64_t h = shoff + i * shentsize;
    if (u(h + 4, 4) != 2) continue;  // SHT_SYMTAB
    ++tables;
    symbols = std::max(symbols, u(h + 32, 8) / 24);
  }
  if (tables > 1) return "it has " + std::to_string(tables) + " symbol tables (a loader reads one)";
  if (symbols > MAX_ELF_SYMBOLS)
    return "its symbol table holds " + std::to_string(symbols) + " symbols (a loader reads at most " +
           std::to_string(MAX_ELF_SYMBOLS) + ")";
  return "";
}

// Whether a little-endian ELF64 file's symbol tables (SHT_SYMTAB) define `symbol` as a
// function (STT_FUNC, in a section): 1 yes, 0 no, -1 when the file is not such an ELF file,
// a table lies outside it or it is more than a loader walks (elf_bounds_problem)
// (topkgen.manifest.checks.elf_defines_function). Every offset is checked before it is read:
// the file may be forged.
inline int elf_defines_function(const std::string& d, const std::string& symbol) {
  if (!elf_bounds_problem(d).empty()) return -1;
  auto u = [&](std::uint64_t at, int bytes) {
    std::uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(d[at + i]);
    return v;
  };
  const std::uint64_t size = d.size();
  if (size < 64 || d[4] != 2 || d[5] != 1) return -1;  // ELFCLASS64, ELFDATA2LSB
  const std::uint64_t shoff = u(0x28, 8), shentsize = u(0x3A, 2), shnum = u(0x3C, 2);
  if (shentsize < 64 || shoff > size || shnum > (size - shoff) / shentsize) return -1;
  for (std::uint64_t i = 0; i < shnum; ++i) {
    const std::uint64_t h = shoff + i * shentsize;
    if (u(h + 4, 4) != 2) continue;  // SHT_SYMTAB
    const std::uint64_t offset = u(h + 24, 8), length = u(h + 32, 8), link = u(h + 40, 4), entsize = u(h + 56, 8);
    if (link >= shnum || entsize != 24 || offset > size || length > size - offset) return -1;
    const std::uint64_t s = shoff + link * shentsize, str_offset = u(s + 24, 8), str_length = u(s + 32, 8);
    if (str_offset > size || str_length > size - str_offset) return -1;
    for (std::uint64_t at = offset; at + 24 <= offset + length; at += 24) {
      const std::uint64_t name = u(at, 4), info = u(at + 4, 1), shndx = u(at + 6, 2);
      if ((info & 0xF) == 2 && shndx != 0 && name < str_length && str_length - name > symbol.size() &&
          d.compare(str_offset + name, symbol.size(), symbol) == 0 && d[str_offset + name + symbol.size()] == '\0')
        return 1;
    }
  }
  return 0;
}

struct Row {
  std::int64_t k_lo, k_hi, n_lo, n_hi, r_lo, r_hi;
  const Kernel* kernel;
  const Kernel* fallback;  // null: nothing serves the row without JIT
  std::int64_t chunks, fallback_chunks;
};

// The row visits left for indexing a manifest's dispatch lists (topkgen.policy.dispatch_table.
// IndexBudget): indexing is quadratic in a list's rows, and a forged manifest of a few MB
// would take minutes and gigabytes.
constexpr std::uint64_t MAX_INDEX_VISITS = 1 << 20;

struct IndexBudget {
  std::uint64_t left = MAX_INDEX_VISITS;
  void spend(std::uint64_t visits, const std::string& path, const Doc& doc) {
    if (visits > left)
      doc.fail(path, "the dispatch lists are cut too finely: indexing them takes more than " +
                         std::to_string(MAX_INDEX_VISITS) + " row visits");
    left -= visits;
  }
};

// One dispatch list, checked to tile the domain and indexed for lookup (the same
// procedure and messages as topkgen.policy.dispatch_table.ListIndex): cut k at every row's k
// bounds; in each k segment cut n at the bounds of the rows spanning it; in each n segment
// the rows spanning it, sorted by rows, must tile the batch sizes 1..ROWS_MAX.
struct List {
  struct Cell {  // one n segment of one k segment
    std::vector<std::int64_t> rows_starts;
    std::vector<std::size_t> members;
  };
  std::vector<Row> rows;
  std::vector<std::int64_t> k_starts;
  std::vector<std::vector<std::int64_t>> n_starts;
  std::vector<std::vector<Cell>> cells;
  bool all_jit = true;  // no row has an AOT fallback

  void index(const std::string& path, const Doc& doc, IndexBudget& budget) {
    std::set<std::int64_t> starts{1};
    for (const Row& r : rows) {
      starts.insert(r.k_lo);
      if (r.k_hi < N_MAX) starts.insert(r.k_hi + 1);
    }
    k_starts.assign(starts.begin(), starts.end());
    for (std::size_t si = 0; si < k_starts.size(); ++si) {
      std::int64_t a = k_starts[si], b = si + 1 < k_starts.size() ? k_starts[si + 1] - 1 : N_MAX;
      budget.spend(rows.size(), path, doc);
      std::vector<std::size_t> spanning;
      for (std::size_t i = 0; i < rows.size(); ++i)
        if (rows[i].k_lo <= a && a <= rows[i].k_hi) spanning.push_back(i);
      std::set<std::int64_t> cut{a};
      for (std::size_t i : spanning) {
        if (rows[i].n_lo > a) cut.insert(rows[i].n_lo);
        if (a < rows[i].n_hi + 1 && rows[i].n_hi + 1 <= N_MAX) cut.insert(rows[i].n_hi + 1);
      }
      std::vector<std::int64_t> cuts(cut.begin(), cut.end());
      budget.spend(spanning.size() * cuts.size(), path, doc);
      std::vector<Cell> seg;
      for (std::size_t ci = 0; ci < cuts.size(); ++ci) {
        std::int64_t c = cuts[ci], d = ci + 1 < cuts.size() ? cuts[ci + 1] - 1 : N_MAX;
        Cell cell;
        for (std::size_t i : spanning)
          if (rows[i].n_lo <= c && c <= rows[i].n_hi) cell.members.push_back(i);
        std::stable_sort(cell.members.begin(), cell.members.end(),
                         [&](std::size_t x, std::size_t y) { return rows[x].r_lo < rows[y].r_lo; });
        if (cell.members.empty()) doc.fail(path, "no row serves k=" + std::to_string(a) + " n=" + range(c, d));
        std::int64_t covered = 1;
        const Row* prev = nullptr;
        std::size_t prev_i = 0;
        for (std::size_t i : cell.members) {
          const Row& r = rows[i];
          if (prev != nullptr && r.r_lo <= prev->r_hi)
            doc.fail(path, "rows [" + std::to_string(prev_i) + "] and [" + std::to_string(i) + "] overlap at k=" +
                               range(a, b) + " n=" + range(c, d) + " rows=" + range(r.r_lo, std::min(r.r_hi, prev->r_hi)));
          if (r.r_lo > covered)
            doc.fail(path, "no row serves k=" + std::to_string(a) + " n=" + range(c, d) + " rows=" + range(covered, r.r_lo - 1));
          covered = std::max(covered, r.r_hi + 1);
          prev = &r;
          prev_i = i;
        }
        if (covered <= ROWS_MAX)
          doc.fail(path, "no row serves k=" + std::to_string(a) + " n=" + range(c, d) + " rows=" + range(covered, ROWS_MAX));
        for (std::size_t i : cell.members) cell.rows_starts.push_back(rows[i].r_lo);
        seg.push_back(std::move(cell));
      }
      n_starts.push_back(std::move(cuts));
      cells.push_back(std::move(seg));
    }
  }

  const Row& find(std::int64_t k, std::int64_t n, std::int64_t r) const {
    std::size_t s = std::upper_bound(k_starts.begin(), k_starts.end(), k) - k_starts.begin() - 1;
    const auto& ns = n_starts[s];
    std::size_t t = std::upper_bound(ns.begin(), ns.end(), n) - ns.begin() - 1;
    const Cell& cell = cells[s][t];
    std::size_t j = std::upper_bound(cell.rows_starts.begin(), cell.rows_starts.end(), r) - cell.rows_starts.begin() - 1;
    return rows[cell.members[j]];
  }
};

// The C type of each parameter a loader can pass ("{t}": the element type), in the order
// topkgen.build.render.PARAM_TYPES lists them.
inline const std::vector<std::pair<std::string, std::string>>& param_types() {
  static const std::vector<std::pair<std::string, std::string>> types = {
      {"x", "const {t}*"}, {"x_indices", "const long long*"}, {"values", "{t}*"}, {"indices", "long long*"},
      {"rows", "int"}, {"n", "int"}, {"k", "int"}, {"largest", "int"}, {"chunk", "int"}, {"row_stride", "long long"},
      {"flags", "int"}, {"lengths", "const void*"}, {"starts", "const void*"}, {"window_bytes", "int"}, {"split_n", "int"},
      {"shared_bytes", "int"}, {"scratch", "void*"}, {"tickets", "unsigned int*"}, {"merged_values", "{t}*"},
      {"merged_indices", "long long*"}, {"merged_flags", "int"}};
  return types;
}

inline std::string c_type(const std::string& dtype) {
  return dtype == "float32" ? "float" : dtype == "bfloat16" ? "__nv_bfloat16" : "__half";
}

inline std::size_t dtype_size(const std::string& dtype) { return dtype == "float32" ? 4 : 2; }
}  // namespace detail

class Bundle {
 public:
  // Reads the manifest and every file it names, and makes every load check; throws
  // topkgen::Error naming the file and the field of the first violation. `path` is the
  // bundle's directory or its manifest, read and named as topkgen.build.bundle.load_manifest does
  // (a path that is no directory is the manifest; "a//b/." is spelled "a/b").
  explicit Bundle(const std::string& path) {
    const detail::PurePath given(path);
    struct stat st;
    const bool dir = ::stat(given.str().c_str(), &st) == 0 && S_ISDIR(st.st_mode);
    const detail::PurePath file = dir ? given.child("manifest.json") : given;
    dir_ = file.parent().str();
    doc_.file = file.str();
    std::string text, why;
    if (!detail::read_bundle_file(dir_, file.name(), detail::MAX_MANIFEST_BYTES, text, why))
      throw Error(doc_.file + ": cannot read manifest: " + why);
    const detail::json m = detail::parse_json<detail::json>(text, doc_.file);
    check_version(m);  // the order of topkgen.build.bundle.load_manifest: version, schema, the load checks
    static const detail::json schema = detail::json::parse(detail::MANIFEST_SCHEMA);
    detail::SchemaValidator<detail::json>(schema).validate(m, doc_.file);
    if (auto shard = m.find("shard"); shard != m.end())  // its fields valid, as topkgen.runtime.TopK words it
      throw Error(doc_.file + ": shard: part " + shard->at("index").dump() + "/" + shard->at("count").dump() +
                  " of a sharded build, not a bundle; assemble the parts with `topkgen merge` first");
    archs_ = doc_.strings(m, "archs", "<document>");
    arch_set_.insert(archs_.begin(), archs_.end());
    read_entries(m);
    read_dispatch(m);
    read_serving(m);
    read_files();
  }

  Bundle(const Bundle&) = delete;
  Bundle& operator=(const Bundle&) = delete;

  const std::vector<std::string>& archs() const { return archs_; }
  const std::vector<std::unique_ptr<Kernel>>& kernels() const { return kernels_; }

  // The kernel for a request whose batch size is unknown: one lookup in
  // dispatch[arch][dtype][mode] (the row for rows = ROWS_MAX), launched unsplit. Without JIT
  // the row's aot_fallback serves. Errors read as topkgen.policy.select's.
  const Kernel& select(const std::string& arch, const std::string& dtype, std::int64_t k, std::int64_t n,
                       bool deterministic, bool jit_available) const {
    return *lookup(arch, dtype, k, n, ROWS_MAX, deterministic, jit_available).first;
  }

  // How a batch of `rows` rows is served: the kernel, its chunks per row and, for a split,
  // the workspace that run() needs (topkgen.policy.split's arithmetic). rows = 0, an empty batch,
  // is served unsplit with no workspace: run() launches nothing for it.
  //
  // `sm_count`: the SMs of the GPU the split is planned to fill (0: the part split_rules[arch]
  // names, i.e. the table's chunks); the same kernel serves, only the chunks of small batches
  // change (split_rules' rule, topkgen.policy.select's decisions for a GPU of that count).
  Plan plan(const std::string& arch, const std::string& dtype, std::int64_t k, std::int64_t n, std::int64_t rows,
            bool deterministic, bool jit_available, Options options = Options(), std::int64_t sm_count = 0) const {
    if (sm_count < 0 || sm_count > SM_COUNT_MAX)
      throw Error("sm_count: must be in 1.." + std::to_string(SM_COUNT_MAX) + ", got " + std::to_string(sm_count));
    auto [kernel, chunks] = lookup(arch, dtype, k, n, rows, deterministic, jit_available);
    if (sm_count > 0 && rows > 0) {
      const auto rule = split_rules_.find(arch);
      if (rule != split_rules_.end() && rule->second.has_value() && rule->second->sm_count != sm_count)
        chunks = split_chunks(*rule->second, *kernel, rows, n, k, sm_count);
    }
    Plan p;
    p.kernel = kernel;
    p.rows = rows, p.n = n, p.k = k;
    p.chunks = chunks;
    p.chunk = n / chunks;
    p.flags = flags_of(options);
    if (chunks > 1) {
      const std::uint64_t count = static_cast<std::uint64_t>(rows) * chunks * k;
      p.values_offset = (count * 8 + WORKSPACE_ALIGN - 1) / WORKSPACE_ALIGN * WORKSPACE_ALIGN;
      p.workspace_bytes = p.values_offset + count * detail::dtype_size(dtype);
    } else if (kernel->takes("scratch") && options.index_dtype == IndexDtype::int32) {
      p.scratch = true;  // the large-k path's candidates no longer fit in 4-byte index slots
      p.workspace_bytes = static_cast<std::uint64_t>(rows) * k * 8;
    }
    return p;
  }

  // split_rules' rule: the chunks per row of a batch of `rows` (>= 1) served by kernel `e` on a
  // GPU of `sm_count` SMs (topkgen.policy.selection._split and SplitTuning.chunks).
  static std::int64_t split_chunks(const SplitRule& s, const Kernel& e, std::int64_t rows, std::int64_t n,
                                   std::int64_t k, std::int64_t sm_count) {
    if (rows <= 0 || e.family != "radix" || e.work == "large") return 1;
    if (rows >= s.rows_below_for(e.k) || n < s.min_n) return 1;
    const std::int64_t size = static_cast<std::int64_t>(detail::dtype_size(e.dtype));
    const std::int64_t resident = std::max<std::int64_t>(0, e.dynamic_shared_bytes / size - (16 / size - 1));
    std::int64_t want = sm_count * s.ctas_per_sm / rows;
    if (resident > 0) {
      std::int64_t fitting = s.max_chunks;  // the fewest chunks each of which it reads once (1: the row fits)
      for (std::int64_t c = 1; c <= s.max_chunks; c *= 2)
        if (n <= c * (resident - c + 1)) {
          fitting = c;
          break;
        }
      want = std::max(want, fitting);
    }
    const std::int64_t bound = std::min({s.max_chunks, n / std::max(s.min_chunk, s.chunk_per_k * e.k), want});
    if (bound < 2) return 1;
    std::int64_t chunks = 1;
    while (chunks * 2 <= bound) chunks *= 2;
    const std::int64_t chunk = n / chunks, merge = chunks * k;
    if (!(e.n_min <= std::min(chunk, merge)) || merge > e.n_max) return 1;  // its n window holds no such split
    return chunks;
  }

  // Which binary of the bundle serves a GPU of arch `gpu` (load_order, schema 5; the rule and
  // words of topkgen.runtime.binary.resolve): its own cubins; a lower minor's of the same
  // major that fit its shared memory and are not arch-specific; shipped PTX through the
  // driver's JIT; JIT from the bundle's sources (only when `jit_available`: this loader has no
  // NVRTC, a caller with one may); else throws a refusal naming the GPU, the archs and the fix.
  Binary binary(const std::string& gpu, bool jit_available) const {
    const auto cap = capability(gpu);
    const auto known = gpus_.find(gpu);
    const bool limited = known != gpus_.end();
    const std::int64_t limit = limited ? known->second.second : 0;
    auto need = [&](const std::string& a) { auto it = shared_needed_.find(a); return it == shared_needed_.end() ? 0 : it->second; };
    auto fits = [&](const std::string& a) { return !limited || need(a) <= limit; };
    auto fit_words = [&](const std::string& a) {
      return limited ? "; their " + std::to_string(need(a)) + " bytes of shared memory per block fit its " + std::to_string(limit) : std::string();
    };
    auto also = [&](const std::vector<std::string>& passed) { return passed.empty() ? std::string() : " (" + detail::join(passed, "; ") + ")"; };
    auto by_capability_down = [&](std::vector<std::string> v) {
      std::stable_sort(v.begin(), v.end(), [&](const std::string& a, const std::string& b) { return capability(a) > capability(b); });
      return v;
    };
    if (arch_set_.count(gpu)) {
      const std::string own = targets_.at(gpu);
      return {gpu, "cubin", gpu, gpu + " GPU: the bundle's " + gpu + " cubins" + (own == gpu ? "" : " (arch-specific " + own + ": this arch only)")};
    }
    std::vector<std::string> passed, lower, ptx;
    for (const std::string& a : archs_)
      if (capability(a).first == cap.first && capability(a).second < cap.second) lower.push_back(a);
    for (const std::string& a : by_capability_down(lower)) {
      if (targets_.at(a) != a) {
        passed.push_back(a + " cubins are arch-specific (" + targets_.at(a) + "): they run on " + a + " only");
      } else if (fits(a)) {
        return {gpu, "lower-minor cubin", a, gpu + " GPU: no " + gpu + " cubin; the " + a + " cubins run on it (same major " +
                std::to_string(cap.first) + ", lower minor" + fit_words(a) + ")" + also(passed)};
      } else {
        passed.push_back(a + " cubins need " + std::to_string(need(a)) + " bytes of shared memory per block, above its " + std::to_string(limit));
      }
    }
    for (const std::string& a : ptx_archs_)
      if (capability(a) <= cap) ptx.push_back(a);
    for (const std::string& a : by_capability_down(ptx)) {
      if (fits(a)) {
        const auto c = capability(a);
        return {gpu, "ptx", a, gpu + " GPU: no cubin runs on it" + also(passed) + "; the " + a + " kernels' PTX (compute_" +
                std::to_string(c.first) + std::to_string(c.second) + "), compiled for " + gpu + " by the driver's JIT" + fit_words(a)};
      }
      passed.push_back(a + " PTX needs " + std::to_string(need(a)) + " bytes of shared memory per block, above its " + std::to_string(limit));
    }
    if (ptx_archs_.empty()) passed.push_back("no PTX in the bundle");
    else if (ptx.empty()) passed.push_back("no PTX in the bundle for an arch at or below " + gpu);
    std::vector<std::string> tuned;
    bool own_tuning = false;
    for (const std::string& a : policy_archs_) {
      own_tuning = own_tuning || a == gpu;
      if (capability(a) <= cap && fits(a)) tuned.push_back(a);
    }
    if (jit_available && (own_tuning || !tuned.empty())) {
      const std::string a = own_tuning ? gpu : by_capability_down(tuned).front();
      const std::string tuning = a == gpu ? "its own tuning" : a + "'s tuning, the nearest below it that fits";
      return {gpu, "jit", a, gpu + " GPU: no cubin for it (" + detail::join(passed, "; ") + "); JIT from the bundle's sources with NVRTC for " +
              gpu + ", with " + tuning};
    }
    passed.push_back(jit_available ? "the policy tunes no arch at or below " + gpu + " that fits it"
                                   : std::string("JIT is off (TOPKGEN_DISABLE_JIT, or no NVRTC)"));
    throw Error("no binary of the bundle serves this GPU (" + gpu + "): the bundle holds " +
                (archs_.empty() ? std::string("no arch") : detail::join(archs_, ", ")) + " (" + detail::join(passed, "; ") +
                "); fix: add " + gpu + " to the policy's archs and `topkgen build --arch " + gpu + "`, or allow JIT");
  }

  // The compute capability of an arch: load_order.gpus' record, else its name (sm_121: 12.1).
  std::pair<int, int> capability(const std::string& arch) const {
    auto it = gpus_.find(arch);
    if (it != gpus_.end()) return it->second.first;
    const std::string digits = arch.size() > 4 ? arch.substr(3) : std::string("00");
    int major = 0;
    for (std::size_t i = 0; i + 1 < digits.size(); ++i) major = major * 10 + (std::isdigit(static_cast<unsigned char>(digits[i])) ? digits[i] - '0' : 0);
    return {major, std::isdigit(static_cast<unsigned char>(digits.back())) ? digits.back() - '0' : 0};
  }

  static int flags_of(const Options& o) {
    return (o.sorted ? 0 : FLAG_UNSORTED) | (o.index_dtype == IndexDtype::int32 ? FLAG_INT32_INDICES : 0);
  }

  // Launches an AOT kernel once on `stream` for `rows` rows of n elements at x (device
  // pointers), one CTA per row; grid, block and dynamic shared memory come from the manifest.
  void launch(const Kernel& kern, cu::Stream stream, cu::DevicePtr x, cu::DevicePtr values, cu::DevicePtr indices,
              int rows, int n, int k, bool largest, Options options = Options()) {
    Plan p;
    p.kernel = &kern;
    p.rows = rows, p.n = n, p.k = k;
    p.chunk = n;
    p.flags = flags_of(options);
    if (kern.takes("scratch") && options.index_dtype == IndexDtype::int32)
      throw Error("kernel " + kern.name + ": int32 indices need the large-k path's scratch: use plan() and run()");
    run(p, stream, x, values, indices, rows, n, k, largest, 0);
  }

  // Runs a plan on `stream`: one launch, or a split's two through `workspace` (at least
  // plan.workspace_bytes of device memory; unused when that is 0). `indices` holds int64 or,
  // with the plan's Options::index_dtype int32, int32 (the kernels write them). Arguments go
  // by the names of the kernel's params, in their order. Nothing waits for the GPU.
  // `windows`: a ragged batch (Windows; the default: dense rows, null pointers). The plan is
  // the one for n, the bound; the kernels read the lengths on the device and clamp each window.
  void run(const Plan& p, cu::Stream stream, cu::DevicePtr x, cu::DevicePtr values, cu::DevicePtr indices, int rows,
           int n, int k, bool largest, cu::DevicePtr workspace, const Windows& windows = {}) {
    const Kernel& kern = *p.kernel;
    if (!kern.aot)
      throw Error("kernel " + kern.name + ": served by JIT from " + kern.path +
                  ", and this loader has no NVRTC; plan with jit_available = false");
    if (rows < 0) throw Error("rows: must be >= 0, got " + std::to_string(rows));
    if (rows == 0) return;  // an empty batch launches nothing
    if (p.rows != rows || p.n != n || p.k != k)  // its chunk and workspace are that request's
      throw Error("plan: made for rows=" + std::to_string(p.rows) + " n=" + std::to_string(p.n) + " k=" +
                  std::to_string(p.k) + ", run with rows=" + std::to_string(rows) + " n=" + std::to_string(n) +
                  " k=" + std::to_string(k));
    if (p.chunks > 1 && workspace == 0) throw Error("workspace: a split needs " + std::to_string(p.workspace_bytes) + " bytes");
    if (p.scratch && workspace == 0)
      throw Error("workspace: int32 indices on the large-k path need " + std::to_string(p.workspace_bytes) + " bytes");
    if (p.workspace_bytes && workspace % WORKSPACE_ALIGNMENT != 0)
      throw Error("workspace: must start at a multiple of " + std::to_string(WORKSPACE_ALIGNMENT) + " bytes");
    check_disjoint(kern, p, x, values, indices, workspace);
    if (windows.lengths == 0 && windows.starts != 0) throw Error("starts: given without lengths");
    if (windows.lengths != 0 && windows.window_bytes != 4 && windows.window_bytes != 8)
      throw Error("window_bytes: must be 4 (int32 lengths) or 8 (int64), got " + std::to_string(windows.window_bytes));
    const Windows w = windows.lengths == 0 ? Windows{} : windows;
    cu::Function fn = function(kern);
    const int flag = largest ? 1 : 0;
    const std::vector<unsigned> shared = p.shared_bytes();  // each launch's dynamic shared memory
    if (p.chunks == 1) {
      stage(fn, kern, stream, rows, {x, 0, values, indices, p.scratch ? workspace : 0}, {rows, n, k, flag, n, p.flags}, n,
            w, 0, shared[0]);
      return;
    }
    const int chunks = static_cast<int>(p.chunks), m = chunks * k;
    const cu::DevicePtr cand_indices = workspace, cand_values = workspace + p.values_offset;
    // Stage 1 writes the workspace's int64 candidates in no order stage 2 needs: unsorted, whatever
    // the request asks (stage 2 selects and sorts again; deterministic kernels sort regardless).
    stage(fn, kern, stream, static_cast<std::int64_t>(rows) * chunks, {x, 0, cand_values, cand_indices, 0},
          {rows, n, k, flag, static_cast<int>(p.chunk), FLAG_UNSORTED}, n, w, 0, shared[0]);
    stage(fn, kern, stream, rows, {cand_values, cand_indices, values, indices, 0}, {rows, m, k, flag, m, p.flags}, m, w,
          w.lengths != 0 ? n : 0, shared[1]);  // stage 2 finds each window's candidates from stage 1's n
  }

 private:
  using Tables = std::map<std::string, std::map<std::string, std::map<std::string, detail::List>>>;

  // The launches read x while CTAs write the candidates and the outputs in no order: any two
  // of the buffers that overlap race (the Python runtime's _check_disjoint, same message).
  static void check_disjoint(const Kernel& kern, const Plan& p, cu::DevicePtr x, cu::DevicePtr values,
                             cu::DevicePtr indices, cu::DevicePtr workspace) {
    const std::size_t elem = detail::dtype_size(kern.dtype), outputs = static_cast<std::size_t>(p.rows) * p.k;
    const struct { const char* label; cu::DevicePtr start; std::size_t bytes; } extents[] = {
        {"x", x, static_cast<std::size_t>(p.rows) * p.n * elem},
        {"values", values, outputs * elem},
        {"indices", indices, outputs * p.index_bytes()},
        {"workspace", workspace, static_cast<std::size_t>(p.workspace_bytes)}};
    for (std::size_t i = 1; i < 4; ++i)
      for (std::size_t j = 0; j < i; ++j) {
        const auto& a = extents[i];
        const auto& b = extents[j];
        const bool overlap = a.start >= b.start ? a.start - b.start < b.bytes : b.start - a.start < a.bytes;  // no wrap
        if (a.bytes && b.bytes && overlap)
          throw Error(std::string(a.label) + ": shares memory with " + b.label + "; the kernels write " + a.label +
                      " while they read or write " + b.label + ": pass separate arrays");
      }
  }

  static std::vector<std::string> sorted_keys(const detail::json& obj) {
    std::vector<std::string> keys;
    for (auto it = obj.begin(); it != obj.end(); ++it) keys.push_back(it.key());
    std::sort(keys.begin(), keys.end());
    return keys;
  }

  template <class M>
  static std::string known(const M& m) {
    std::vector<std::string> keys;
    for (const auto& kv : m) keys.push_back(kv.first);
    return detail::join(keys, ", ");
  }

  struct Pointers {
    cu::DevicePtr x, x_indices, values, indices, scratch;
  };
  struct Ints {
    int rows, n, k, largest, chunk, flags;
  };

  // One launch: grid.x = ceil_div(grid_rows, rows_per_block), `shared` bytes of dynamic shared
  // memory (also its shared_bytes argument), arguments by param name.
  void stage(cu::Function fn, const Kernel& kern, cu::Stream stream, std::int64_t grid_rows, Pointers ptr, Ints v,
             long long row_stride, Windows w, int split_n, unsigned shared) {
    int shared_bytes = static_cast<int>(shared);
    // A split runs as its two launches here: no tickets, so no merge in stage 1 (schema 7).
    cu::DevicePtr none = 0;
    int no_flags = 0;
    std::vector<void*> args;
    for (const std::string& name : kern.params) {
      if (name == "x") args.push_back(&ptr.x);
      else if (name == "x_indices") args.push_back(&ptr.x_indices);
      else if (name == "values") args.push_back(&ptr.values);
      else if (name == "indices") args.push_back(&ptr.indices);
      else if (name == "rows") args.push_back(&v.rows);
      else if (name == "n") args.push_back(&v.n);
      else if (name == "k") args.push_back(&v.k);
      else if (name == "largest") args.push_back(&v.largest);
      else if (name == "chunk") args.push_back(&v.chunk);
      else if (name == "row_stride") args.push_back(&row_stride);
      else if (name == "flags") args.push_back(&v.flags);
      else if (name == "lengths") args.push_back(&w.lengths);
      else if (name == "starts") args.push_back(&w.starts);
      else if (name == "window_bytes") args.push_back(&w.window_bytes);
      else if (name == "split_n") args.push_back(&split_n);
      else if (name == "shared_bytes") args.push_back(&shared_bytes);
      else if (name == "scratch") args.push_back(&ptr.scratch);
      else if (name == "tickets" || name == "merged_values" || name == "merged_indices") args.push_back(&none);
      else if (name == "merged_flags") args.push_back(&no_flags);
      else throw Error("kernel " + kern.name + ": unknown parameter '" + name + "'");  // refused at load
    }
    const cu::Driver& d = cu::Driver::get();
    unsigned grid = static_cast<unsigned>((grid_rows + kern.rows_per_block - 1) / kern.rows_per_block);
    d.check(d.LaunchKernel(fn, grid, 1, 1, kern.threads_per_block, 1, 1, shared, stream, args.data(),
                           nullptr),
            "cuLaunchKernel");
  }

  // One lookup: the row's kernel and chunks (or its AOT fallback's, without JIT).
  std::pair<const Kernel*, std::int64_t> lookup(const std::string& arch, const std::string& dtype, std::int64_t k,
                                                std::int64_t n, std::int64_t rows, bool deterministic,
                                                bool jit_available) const {
    auto by_arch = tables_.find(arch);
    if (by_arch == tables_.end()) throw Error("arch: '" + arch + "' is not in the bundle (known: " + known(tables_) + ")");
    auto by_dtype = by_arch->second.find(dtype);
    if (by_dtype == by_arch->second.end())
      throw Error("dtype: '" + dtype + "' is not in the bundle (known: " + known(by_arch->second) + ")");
    check_shape(k, n);
    check_rows(rows);
    const std::string mode = deterministic ? "deterministic" : "fast";
    const detail::List& list = by_dtype->second.at(mode);
    if (!jit_available && list.all_jit && by_dtype->second.at(deterministic ? "fast" : "deterministic").all_jit)
      throw Error("dtype: '" + dtype + "' has no AOT kernels and JIT is disabled");
    const detail::Row& row = list.find(k, n, rows == 0 ? ROWS_MAX : rows);  // an empty batch: served unsplit
    if (jit_available) return {row.kernel, rows == 0 ? 1 : row.chunks};
    if (row.fallback == nullptr)
      throw Error("no kernel serves arch=" + arch + " dtype=" + dtype + " k=" + std::to_string(k) + " n=" +
                  std::to_string(n) + " mode=" + mode + " without JIT");
    return {row.fallback, rows == 0 ? 1 : row.fallback_chunks};
  }

  static void check_rows(std::int64_t rows) {
    if (rows < 0) throw Error("rows: must be >= 0, got " + std::to_string(rows));
    if (rows > ROWS_MAX) throw Error("rows: must be <= " + std::to_string(ROWS_MAX) + ", got " + std::to_string(rows));
  }

  static void check_shape(std::int64_t k, std::int64_t n) {
    if (k <= 0) throw Error("k: must be >= 1, got " + std::to_string(k));
    if (k > N_MAX) throw Error("k: must be <= " + std::to_string(N_MAX) + ", got " + std::to_string(k));
    if (n <= 0) throw Error("n: must be >= 1, got " + std::to_string(n));
    if (n > N_MAX) throw Error("n: must be <= " + std::to_string(N_MAX) + ", got " + std::to_string(n));
    if (k > n) throw Error("k: must be <= n, got k=" + std::to_string(k) + " > n=" + std::to_string(n));
  }

  void check_version(const detail::json& m) {
    auto it = m.find("schema_version");  // end() when m is not an object
    const bool integer = it != m.end() && it->is_number_integer();  // neither 3.0 nor true is 3
    if (integer && *it == SCHEMA_VERSION) return;
    if (integer && *it == 1)
      throw Error(doc_.file + ": schema_version: 1 has no dispatch table; rebuild the bundle (topkgen build)");
    if (integer && *it == 2)
      throw Error(doc_.file + ": schema_version: 2 has no batch size in its dispatch table; rebuild the bundle (topkgen build)");
    if (integer && *it == 3)
      throw Error(doc_.file + ": schema_version: 3 stops k at 1024 and has no options (sorted, index_dtype); rebuild "
                  "the bundle (topkgen build)");
    if (integer && *it == 6)
      throw Error(doc_.file + ": schema_version: 6 has no tickets or merged_* parameters (a split always takes two "
                  "launches); rebuild the bundle (topkgen build)");
    if (integer && *it == 5)
      throw Error(doc_.file + ": schema_version: 5 launches every radix kernel with all of its dynamic shared memory and "
                  "has no shared_bytes parameter (its kernels size nothing to the row); rebuild the bundle (topkgen build)");
    if (integer && *it == 4)
      throw Error(doc_.file + ": schema_version: 4 has no output flags, ragged-batch parameters, split_rules or "
                  "load_order (its kernels always sort, write int64 indices and read dense rows; a split for the GPU's "
                  "SM count, which binary serves a GPU); rebuild the bundle (topkgen build)");
    throw Error(doc_.file + ": schema_version: " + (it == m.end() ? std::string("null") : detail::py_dumps(*it)) +
                " is not supported (this topkgen reads version " + std::to_string(SCHEMA_VERSION) + ")");
  }

  void read_entries(const detail::json& m) {
    for (const char* section : {"kernels", "jit_kernels"}) {
      const detail::json& list = doc_.at(m, section, "<document>");
      for (std::size_t i = 0; i < list.size(); ++i) {
        auto kern = std::make_unique<Kernel>();
        Kernel& e = *kern;
        const detail::json& j = list[i];
        e.aot = std::string(section) == "kernels";
        e.field = std::string(section) + "[" + std::to_string(i) + "]";
        e.name = doc_.str(j, "name", e.field);
        e.arch = doc_.str(j, "arch", e.field);
        e.dtype = doc_.str(j, "dtype", e.field);
        e.mode = doc_.str(j, "mode", e.field);
        e.family = doc_.str(j, "family", e.field);
        e.work = doc_.str(j, "work", e.field);
        e.serves = doc_.strings(j, "serves", e.field);
        e.symbol = doc_.str(j, "symbol", e.field);
        e.path = doc_.str(j, e.aot ? "cubin" : "source", e.field);
        e.sha256 = doc_.str(j, "sha256", e.field);
        e.k = doc_.integer(j, "k", e.field, 1, N_MAX);
        e.k_min = doc_.integer(j, "k_min", e.field, 1, N_MAX);
        const detail::json& window = doc_.at(j, "n_window", e.field);
        e.n_min = doc_.integer(window, "min", e.field + ".n_window", 1, N_MAX);
        e.n_max = doc_.integer(window, "max", e.field + ".n_window", 1, N_MAX);
        const std::string lf = e.field + ".launch";
        const detail::json& launch = doc_.at(j, "launch", e.field);
        if (doc_.str(launch, "grid", lf) != "ceil_div(rows, rows_per_block)")
          doc_.fail(lf + ".grid", "unknown grid rule '" + doc_.str(launch, "grid", lf) + "'");
        e.threads_per_block = static_cast<unsigned>(doc_.integer(launch, "threads_per_block", lf, 32, 1024));
        e.rows_per_block = static_cast<unsigned>(doc_.integer(launch, "rows_per_block", lf, 1, 32));
        e.dynamic_shared_bytes = static_cast<unsigned>(doc_.integer(launch, "dynamic_shared_bytes", lf, 0, DYNAMIC_SHARED_MAX));
        e.shared_buffer_bytes = static_cast<unsigned>(doc_.integer(launch, "shared_buffer_bytes", lf, 0, DYNAMIC_SHARED_MAX));
        if (doc_.str(launch, "shared_bytes", lf) != SHARED_BYTES_RULE)
          doc_.fail(lf + ".shared_bytes", "unknown shared memory rule '" + doc_.str(launch, "shared_bytes", lf) + "'");
        if (!e.aot) e.nvrtc_options = doc_.strings(j, "nvrtc_options", e.field);
        if (auto ptx = j.find("ptx"); e.aot && ptx != j.end()) {  // schema 5: PTX beside the cubin
          e.ptx_path = doc_.str(*ptx, "path", e.field + ".ptx");
          e.ptx_sha256 = doc_.str(*ptx, "sha256", e.field + ".ptx");
        }
        // the checks of topkgen.manifest.checks.check_entries, in its order
        if (arch_set_.count(e.arch) == 0) doc_.fail(e.field + ".arch", e.arch + " is not one of the bundle's archs");
        auto [it, fresh] = by_name_.emplace(std::make_pair(e.arch, e.name), &e);
        if (!fresh)
          doc_.fail(e.field + ".name", "duplicate kernel name '" + e.name + "' for " + e.arch + " (also " +
                                           it->second->field + ")");
        const std::string expected = e.aot ? e.arch + "/" + e.name + ".cubin" : "jit/" + e.arch + "/" + e.name + ".cu";
        if (e.path != expected)
          doc_.fail(e.field + (e.aot ? ".cubin" : ".source"), "'" + e.path + "' must be '" + expected + "'");
        read_params(j, e);
        kernels_.push_back(std::move(kern));
      }
    }
  }

  // The parameter checks of topkgen.manifest.checks.check_entries: known names, their C types.
  void read_params(const detail::json& j, Kernel& e) {
    const detail::json& params = doc_.at(j, "params", e.field);
    if (!params.is_array()) doc_.fail(e.field + ".params", "expected a list");
    std::vector<std::string> known;
    for (const auto& [name, type] : detail::param_types()) known.push_back(name);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::string pf = e.field + ".params[" + std::to_string(i) + "]";
      const std::string name = doc_.str(params[i], "name", pf), ctype = doc_.str(params[i], "ctype", pf);
      auto it = std::find_if(detail::param_types().begin(), detail::param_types().end(),
                             [&](const auto& t) { return t.first == name; });
      if (it == detail::param_types().end())
        doc_.fail(pf + ".name", "'" + name + "' is not a parameter a loader can pass (known: " + detail::join(known, ", ") + ")");
      std::string expected = it->second;
      const std::size_t at = expected.find("{t}");
      if (at != std::string::npos) expected.replace(at, 3, detail::c_type(e.dtype));
      if (ctype != expected) doc_.fail(pf + ".ctype", "'" + ctype + "' must be '" + expected + "'");
      e.params.push_back(name);
    }
  }

  void read_dispatch(const detail::json& m) {
    const detail::json& dispatch = doc_.at(m, "dispatch", "<document>");
    if (!dispatch.is_object()) doc_.fail("dispatch", "expected an object");
    std::map<std::string, const detail::json*> tables;  // an ordered_json lookup reads every key before it
    for (auto it = dispatch.begin(); it != dispatch.end(); ++it) tables.emplace(it.key(), &it.value());
    for (const std::string& arch : archs_)
      if (tables.count(arch) == 0) doc_.fail("dispatch", "no table for " + arch);
    detail::IndexBudget budget;  // one for all the lists
    for (const auto& [arch, table] : tables) {  // in sorted order, as topkgen.manifest.checks.check_dispatch
      if (arch_set_.count(arch) == 0) doc_.fail("dispatch." + arch, "not one of the bundle's archs");
      const detail::json& by_dtype = *table;
      if (!by_dtype.is_object()) doc_.fail("dispatch." + arch, "expected an object");
      for (const std::string& dtype : sorted_keys(by_dtype)) {
        const detail::json& by_mode = by_dtype.at(dtype);
        for (const char* mode : {"deterministic", "fast"}) {
          const std::string path = "dispatch." + arch + "." + dtype + "." + mode;
          const detail::json& rows = doc_.at(by_mode, mode, "dispatch." + arch + "." + dtype);
          if (!rows.is_array()) doc_.fail(path, "expected a list of rows");
          detail::List& list = tables_[arch][dtype][mode];
          for (std::size_t i = 0; i < rows.size(); ++i) {
            const std::string rf = path + "[" + std::to_string(i) + "]";
            auto [k_lo, k_hi] = doc_.pair(rows[i], "k", rf, N_MAX);
            auto [n_lo, n_hi] = doc_.pair(rows[i], "n", rf, N_MAX);
            auto [r_lo, r_hi] = doc_.pair(rows[i], "rows", rf, ROWS_MAX);
            list.rows.push_back({k_lo, k_hi, n_lo, n_hi, r_lo, r_hi, nullptr, nullptr, 1, 0});
          }
          for (std::size_t i = 0; i < list.rows.size(); ++i) {
            const detail::Row& r = list.rows[i];
            const std::string rf = path + "[" + std::to_string(i) + "]";
            auto empty = [&](const char* key, std::int64_t lo, std::int64_t hi) {
              if (lo > hi) doc_.fail(rf + "." + key, "[" + std::to_string(lo) + ", " + std::to_string(hi) + "] is empty (lo > hi)");
            };
            empty("k", r.k_lo, r.k_hi);
            empty("n", r.n_lo, r.n_hi);
            empty("rows", r.r_lo, r.r_hi);
          }
          list.index(path, doc_, budget);
          for (std::size_t i = 0; i < list.rows.size(); ++i) resolve_row(path, i, rows[i], arch, dtype, mode, list);
        }
      }
    }
  }

  // split_rules and load_order (schema 5): the checks of topkgen.manifest.checks.check_serving,
  // in its order and words.
  void read_serving(const detail::json& m) {
    const detail::json& rules = doc_.at(m, "split_rules", "<document>");
    const detail::json& order = doc_.at(m, "load_order", "<document>");
    const std::set<std::string> archs(archs_.begin(), archs_.end());
    const std::string want = archs.empty() ? "none" : detail::join({archs.begin(), archs.end()}, ", ");
    for (const auto& [field, obj] : {std::pair<std::string, const detail::json*>{"split_rules", &rules},
                                     {"load_order.shared_needed", &order.at("shared_needed")},
                                     {"load_order.targets", &order.at("targets")}}) {
      std::set<std::string> keys;
      for (auto it = obj->begin(); it != obj->end(); ++it) keys.insert(it.key());
      if (keys != archs)
        doc_.fail(field, "has " + (keys.empty() ? std::string("no arch") : detail::join({keys.begin(), keys.end()}, ", ")) +
                             ", not the bundle's archs (" + want + ")");
    }
    for (const std::string& arch : archs) {
      const std::string target = doc_.str(order.at("targets"), arch, "load_order.targets");
      if (target != arch && target != arch + "a")
        doc_.fail("load_order.targets." + arch, "'" + target + "' must be " + arch + " or " + arch + "a");
      targets_[arch] = target;
      shared_needed_[arch] = doc_.integer(order.at("shared_needed"), arch, "load_order.shared_needed", 0, INT64_MAX);
      const detail::json& r = rules.at(arch);
      if (r.is_null()) {
        split_rules_[arch] = std::nullopt;
        continue;
      }
      const std::string rf = "split_rules." + arch;
      split_rules_[arch] = SplitRule{doc_.integer(r, "sm_count", rf, 1, SM_COUNT_MAX), doc_.integer(r, "ctas_per_sm", rf, 1, 32),
                                     doc_.integer(r, "rows_below", rf, 2, 65536), doc_.integer(r, "min_n", rf, 1, N_MAX),
                                     doc_.integer(r, "max_chunks", rf, 2, 256), doc_.integer(r, "min_chunk", rf, 1, N_MAX),
                                     doc_.integer(r, "chunk_per_k", rf, 1, N_MAX), {}};
      const detail::json& by_k = doc_.at(r, "rows_below_by_k", rf);
      if (!by_k.is_object()) doc_.fail(rf + ".rows_below_by_k", "expected an object");
      for (auto it = by_k.begin(); it != by_k.end(); ++it) {
        const std::string& key = it.key();
        std::int64_t rung = 0;  // a K rung: a power of two from 1 to 4096, written in decimal
        for (char c : key) rung = (c >= '0' && c <= '9' && rung <= 4096) ? rung * 10 + (c - '0') : -1;
        if (key.empty() || key.size() > 4 || key[0] == '0' || rung < 1 || rung > 4096 || (rung & (rung - 1)) != 0)
          doc_.fail(rf + ".rows_below_by_k", "'" + key + "' is not a K rung (a power of two from 1 to 4096)");
        split_rules_[arch]->rows_below_by_k[rung] = doc_.integer(by_k, key, rf + ".rows_below_by_k", 2, 65536);
      }
    }
    ptx_archs_ = doc_.strings(order, "ptx_archs", "load_order");
    for (std::size_t i = 0; i < ptx_archs_.size(); ++i)
      if (archs.count(ptx_archs_[i]) == 0)
        doc_.fail("load_order.ptx_archs[" + std::to_string(i) + "]", ptx_archs_[i] + " is not one of the bundle's archs");
    policy_archs_ = doc_.strings(order, "policy_archs", "load_order");
    const detail::json& gpus = doc_.at(order, "gpus", "load_order");
    for (auto it = gpus.begin(); it != gpus.end(); ++it) {
      const detail::json& cap = doc_.at(it.value(), "capability", "load_order.gpus." + it.key());
      gpus_[it.key()] = {{cap.at(0).get<int>(), cap.at(1).get<int>()},
                         doc_.integer(it.value(), "shared_bytes_per_block", "load_order.gpus." + it.key(), 0, INT64_MAX)};
    }
  }

  // The checks of topkgen.manifest.checks._check_row, in its order.
  void resolve_row(const std::string& path, std::size_t i, const detail::json& j, const std::string& arch,
                   const std::string& dtype, const std::string& mode, detail::List& list) {
    const std::string rf = path + "[" + std::to_string(i) + "]";
    detail::Row& row = list.rows[i];
    const std::string name = doc_.str(j, "kernel", rf), source = doc_.str(j, "source", rf);
    auto it = by_name_.find({arch, name});
    if (it == by_name_.end()) doc_.fail(rf + ".kernel", "no kernel '" + name + "' for " + arch);
    if (it->second->aot != (source == "aot"))
      doc_.fail(rf + ".source", "'" + source + "' but " + name + " is " + it->second->field);
    check_fits(rf + ".kernel", row, *it->second, dtype, mode);
    row.kernel = it->second;
    row.chunks = doc_.integer(j, "chunks", rf, 1, 256);
    check_split(rf + ".chunks", row, row.chunks, *it->second);
    const detail::json& fallback = doc_.at(j, "aot_fallback", rf);
    const detail::json& aot_chunks = doc_.at(j, "aot_chunks", rf);
    if (fallback.is_null() != aot_chunks.is_null()) doc_.fail(rf + ".aot_chunks", "must be null exactly when aot_fallback is");
    if (fallback.is_null()) return;
    if (!fallback.is_string()) doc_.fail(rf + ".aot_fallback", "expected a string or null");
    const std::string fb = fallback.get<std::string>();
    if (source == "aot" && fb != name) doc_.fail(rf + ".aot_fallback", "must be " + name + ", the row's AOT kernel");
    row.fallback_chunks = doc_.integer(j, "aot_chunks", rf, 1, 256);
    if (source == "aot" && row.fallback_chunks != row.chunks)
      doc_.fail(rf + ".aot_chunks", "must be " + std::to_string(row.chunks) + ", the row's chunks");
    auto fit = by_name_.find({arch, fb});
    if (fit == by_name_.end() || !fit->second->aot)
      doc_.fail(rf + ".aot_fallback", "no AOT kernel '" + fb + "' for " + arch);
    check_fits(rf + ".aot_fallback", row, *fit->second, dtype, mode);
    check_split(rf + ".aot_chunks", row, row.fallback_chunks, *fit->second);
    row.fallback = fit->second;
    list.all_jit = false;
  }

  // topkgen.manifest.checks._check_split: a kernel that runs a row in chunks takes them, and
  // every chunk and merge of the row fits it.
  void check_split(const std::string& field, const detail::Row& row, std::int64_t chunks, const Kernel& e) const {
    if (chunks == 1) return;
    for (const char* p : {"x_indices", "chunk", "row_stride"})
      if (!e.takes(p)) doc_.fail(field, e.name + " cannot run a split: it does not take x_indices, chunk, row_stride");
    const std::int64_t first = std::max(row.n_lo, row.k_hi);
    if (first / chunks < row.k_hi)
      doc_.fail(field, std::to_string(chunks) + " chunks of rows from " + std::to_string(first) + " hold fewer than k=" +
                           std::to_string(row.k_hi) + " elements");
    if (first / chunks < chunks)  // the kernel finds its chunk as n / chunk: that is `chunks` only when chunk >= chunks
      doc_.fail(field, std::to_string(chunks) + " chunks of rows from " + std::to_string(first) + " are shorter than " +
                           std::to_string(chunks) + " elements: n / chunk would not be " + std::to_string(chunks));
    if (row.r_hi > GRID_MAX / chunks)
      doc_.fail(field, std::to_string(chunks) + " chunks of batches up to " + std::to_string(row.r_hi) +
                           " rows are more CTAs than a grid holds (" + std::to_string(GRID_MAX) + ")");
    const std::int64_t lo = std::min(std::max(row.n_lo, row.k_lo) / chunks, chunks * row.k_lo), hi = chunks * row.k_hi;
    if (!(e.n_min <= lo && hi <= e.n_max))
      doc_.fail(field, e.name + " serves n " + detail::range(e.n_min, e.n_max) + ", not its chunks and merges " +
                           detail::range(lo, hi));
  }

  void check_fits(const std::string& field, const detail::Row& row, const Kernel& e, const std::string& dtype,
                  const std::string& mode) const {
    if (e.dtype != dtype) doc_.fail(field, e.name + " is a " + e.dtype + " kernel, not " + dtype);
    if (!e.serves_mode(mode)) doc_.fail(field, e.name + " does not serve " + mode);
    if (!(e.k_min <= row.k_lo && row.k_hi <= e.k))
      doc_.fail(field, e.name + " serves k " + detail::range(e.k_min, e.k) + ", not " + detail::range(row.k_lo, row.k_hi));
    std::int64_t lo = std::max(row.n_lo, row.k_lo);  // below the diagonal nothing is asked
    if (lo <= row.n_hi && !(e.n_min <= lo && row.n_hi <= e.n_max))
      doc_.fail(field, e.name + " serves n " + detail::range(e.n_min, e.n_max) + ", not " + detail::range(lo, row.n_hi));
  }

  // Each file: sha256, then for a cubin the ELF machine, the SM and the entry's symbol
  // (topkgen.manifest.checks.check_file).
  void read_files() {
    const detail::Doc doc{detail::PurePath(dir_).child("manifest.json").str()};  // topkgen.build.bundle.read_files' label
    for (auto& kern : kernels_) {
      Kernel& e = *kern;
      const std::string key = e.aot ? ".cubin" : ".source";
      std::string why;
      if (!detail::read_bundle_file(dir_, e.path, detail::MAX_FILE_BYTES, e.data, why))
        doc.fail(e.field + key, "cannot read " + e.path + ": " + why);
      if (detail::sha256_hex(e.data) != e.sha256)
        doc.fail(e.field + ".sha256", e.path + " does not match its sha256 in the manifest");
      if (!e.aot) continue;
      int sm = detail::elf_sm(e.data);
      if (sm < 0) doc.fail(e.field + ".cubin", e.path + " is not a CUDA ELF file");
      if ("sm_" + std::to_string(sm) != e.arch)
        doc.fail(e.field + ".cubin", e.path + " is compiled for sm_" + std::to_string(sm) + ", not " + e.arch);
      if (const std::string too_big = detail::elf_bounds_problem(e.data); !too_big.empty())
        doc.fail(e.field + ".cubin", e.path + " is not a CUDA ELF file a loader reads: " + too_big);
      const int defined = detail::elf_defines_function(e.data, e.symbol);
      if (defined < 0) doc.fail(e.field + ".cubin", e.path + " is not a CUDA ELF file: its symbol table cannot be read");
      if (defined == 0) doc.fail(e.field + ".symbol", e.path + " defines no function '" + e.symbol + "'");
      if (e.ptx_path.empty()) continue;  // topkgen.manifest.reading.read_files: the PTX's path, file and sha256
      if (e.ptx_path != e.arch + "/" + e.name + ".ptx")
        doc.fail(e.field + ".ptx.path", "'" + e.ptx_path + "' must be '" + e.arch + "/" + e.name + ".ptx'");
      if (!detail::read_bundle_file(dir_, e.ptx_path, detail::MAX_FILE_BYTES, e.ptx, why))
        doc.fail(e.field + ".ptx", "cannot read " + e.ptx_path + ": " + why);
      if (detail::sha256_hex(e.ptx) != e.ptx_sha256)
        doc.fail(e.field + ".ptx.sha256", e.ptx_path + " does not match its sha256 in the manifest");
    }
  }

  cu::Function function(const Kernel& kern) {
    auto it = functions_.find(kern.name + "@" + kern.arch);
    if (it != functions_.end()) return it->second;
    const cu::Driver& d = cu::Driver::get();
    const std::string device = cu::current_arch();
    bool ptx = false;  // the load order (binary()): a lower minor's cubin as is, shipped PTX through the driver's JIT
    if (device != kern.arch) {
      const Binary served = binary(device, false);  // throws the refusal when nothing of the bundle serves it
      if (served.arch != kern.arch)
        throw Error("kernel " + kern.name + ": compiled for " + kern.arch + ", the current device is " + device + " (" +
                    served.words + ")");
      ptx = served.way == "ptx";
    }
    if (ptx && kern.ptx.empty()) throw Error("kernel " + kern.name + ": " + kern.arch + " ships PTX, but not for it");
    cu::Module module = nullptr;
    d.check(d.ModuleLoadData(&module, ptx ? kern.ptx.c_str() : kern.data.data()), ptx ? "cuModuleLoadData(PTX)" : "cuModuleLoadData");
    cu::Function fn = nullptr;
    d.check(d.ModuleGetFunction(&fn, module, kern.symbol.c_str()), "cuModuleGetFunction");
    // The driver's default limit on dynamic shared memory is 48 KiB less the kernel's static
    // shared memory (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES in cuda.h): set it for any
    // kernel launched with some.
    if (kern.dynamic_shared_bytes > 0)
      d.check(d.FuncSetAttribute(fn, cu::FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 static_cast<int>(kern.dynamic_shared_bytes)),
              "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
    functions_.emplace(kern.name + "@" + kern.arch, fn);
    return fn;
  }

  std::string dir_;
  detail::Doc doc_;
  std::vector<std::string> archs_;
  std::set<std::string> arch_set_;
  std::vector<std::unique_ptr<Kernel>> kernels_;
  std::map<std::pair<std::string, std::string>, const Kernel*> by_name_;
  Tables tables_;
  std::map<std::string, cu::Function> functions_;
  std::map<std::string, std::optional<SplitRule>> split_rules_;  // split_rules (schema 5)
  std::map<std::string, std::pair<std::pair<int, int>, std::int64_t>> gpus_;  // load_order.gpus: capability, shared per block
  std::map<std::string, std::int64_t> shared_needed_;
  std::map<std::string, std::string> targets_;
  std::vector<std::string> ptx_archs_, policy_archs_;
};

}  // namespace topkgen
