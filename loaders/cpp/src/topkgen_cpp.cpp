// topkgen-cpp: a small CLI over topkgen/loader.hpp, for tests, benchmarks and gpu-check.
//
//   topkgen-cpp verify DIR      load DIR (every check), print a summary
//   topkgen-cpp select DIR [--format text|json]
//                               per stdin line "ARCH DTYPE K N MODE JIT [ROWS]" (DTYPE also
//                               fp32, bf16, fp16, ...; JIT 0 or 1, the numbers whole 64-bit
//                               integers; any other line stops it, an error naming stdin:LINE)
//                               print, line by line and flushed, "KERNEL" (no ROWS: the batch
//                               size unknown) or "KERNEL CHUNKS WORKSPACE_BYTES VALUES_OFFSET
//                               SHARED_BYTES" (SHARED_BYTES: each launch's dynamic shared memory,
//                               [S] or [S1,S2] for a split's stages; schema 6),
//                               or "error: MESSAGE"; --format json: one object per line with
//                               those names ({"kernel": ..., "chunks": ...} or {"error": ...}).
//                               Exit 0 when every request was served, 1 when one was refused.
//                               --sm-count N: plan splits for a GPU of N SMs (split_rules)
//   topkgen-cpp binary DIR GPU_ARCH [--jit]
//                               which binary serves a GPU of that arch (the load order):
//                               "WAY<TAB>ARCH<TAB>WORDS", or "error: REFUSAL" and exit 1;
//                               --jit: the caller has NVRTC (JIT from the bundle's sources)
//   topkgen-cpp bench DIR       time select over the stdin shapes: median ns per lookup
//   topkgen-cpp launch DIR ARCH DTYPE K N ROWS MODE JIT LARGEST IN VALUES INDICES [LENGTHS [STARTS]]
//                               top-k of ROWS x N elements read from IN on the GPU (split
//                               when the bundle says so), outputs written raw to VALUES and
//                               INDICES (int64), each launch with the dynamic shared memory
//                               select prints; prints the kernel and its chunks per row
//                               (ROWS 0: empty outputs, nothing launched)
//                               [LENGTHS [STARTS]]: a ragged batch, ROWS raw int64 each (the
//                               windows of topkgen.runtime's lengths= and starts=)
//
// DIR: a bundle's directory or its manifest file, as topkgen reads it.
// Errors: "topkgen-cpp: error: MESSAGE" on stderr, exit 2 (a missing driver and a failed
// driver call in launch too; a request launch cannot serve too).
#include <topkgen/loader.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Shape {
  std::string arch, dtype;
  std::int64_t k = 0, n = 0, rows = 0;
  bool has_rows = false;  // without ROWS the batch size is unknown: no split plan
  bool deterministic = false, jit = false;
};

// A whole field as a decimal integer that fits in 64 bits ("4x", "+4", "1e3" and 2^63 are not).
bool whole_integer(const std::string& field, std::int64_t& value) {
  const char* end = field.data() + field.size();
  auto [stop, error] = std::from_chars(field.data(), end, value);
  return error == std::errc() && stop == end;
}

// What stdin said, fit for a terminal: control bytes (an escape sequence, a NUL that cut the
// message short) and bytes beyond ASCII (a bidirectional override) as \xNN, tab as \t; a
// valid line is ASCII, and this is how topkgen.common.reader.printable shows a control character.
std::string shown(const std::string& text) {
  std::string out;
  char buf[8];
  for (const unsigned char c : text) {
    if (c == '\t') out += "\\t";
    else if (c < 0x20 || c >= 0x7f) std::snprintf(buf, sizeof buf, "\\x%02x", c), out += buf;
    else out += static_cast<char>(c);
  }
  return out;
}

// A dtype with the short spellings the Python CLI takes (topkgen.common.suggest.DTYPE_ALIASES),
// in any case: fp32, f32, bf16, fp16, f16, half.
std::string dtype_name(std::string name) {
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (name == "fp32" || name == "f32") return "float32";
  if (name == "bf16") return "bfloat16";
  if (name == "fp16" || name == "f16" || name == "half") return "float16";
  return name;
}

// "ARCH DTYPE K N MODE JIT [ROWS]", every field whole: JIT 0 or 1, K, N and ROWS integers.
bool parse_shape(const std::string& line, Shape& s) {
  std::istringstream in(line);
  std::vector<std::string> f;
  for (std::string field; in >> field;) f.push_back(field);
  if (f.size() != 6 && f.size() != 7) return false;
  s.arch = f[0], s.dtype = dtype_name(f[1]);
  if (!whole_integer(f[2], s.k) || !whole_integer(f[3], s.n)) return false;
  if (f[4] != "fast" && f[4] != "deterministic") return false;
  if (f[5] != "0" && f[5] != "1") return false;
  s.deterministic = f[4] == "deterministic";
  s.jit = f[5] == "1";
  s.has_rows = f.size() == 7;  // negative counts are refused by Bundle::plan, with the reason
  return !s.has_rows || whole_integer(f[6], s.rows);
}

// The next shape on stdin (empty lines skipped), false at its end; a malformed line is an
// error naming stdin:LINE, as topkgen's workload files name theirs.
bool next_shape(Shape& s, std::size_t& line_no) {
  std::string line;
  while (std::getline(std::cin, line)) {
    ++line_no;
    if (line.empty()) continue;
    if (!parse_shape(line, s))
      throw topkgen::Error("stdin:" + std::to_string(line_no) + ": expected 'ARCH DTYPE K N MODE JIT [ROWS]', got '" +
                           shown(line) + "'");
    return true;
  }
  return false;
}

std::vector<Shape> read_shapes() {
  std::vector<Shape> shapes;
  std::size_t line_no = 0;
  for (Shape s; next_shape(s, line_no); s = Shape()) shapes.push_back(s);
  return shapes;
}

int verify(const std::string& dir) {
  topkgen::Bundle bundle(dir);
  std::size_t aot = 0, jit = 0;
  for (const auto& k : bundle.kernels()) (k->aot ? aot : jit)++;
  std::cout << dir << ": " << aot << " cubins and " << jit << " JIT sources for "
            << topkgen::detail::join(bundle.archs(), ", ") << ": every check passed\n";
  return 0;
}

// Answers each line as it is read, flushed: a caller on a pipe gets an answer per request,
// and a malformed line stops it after the answers to every line before it. Exit 1 when a
// request was refused (each refusal is answered on its line; the lines after it too).
// The request options of select and launch: --unsorted, --index-dtype int64|int32 (the
// Python CLI's `run` words). False when an argument is neither.
bool parse_options(const std::vector<std::string>& a, std::size_t from, topkgen::Options& o) {
  for (std::size_t i = from; i < a.size(); ++i) {
    if (a[i] == "--unsorted") {
      o.sorted = false;
    } else if (a[i] == "--index-dtype" && i + 1 < a.size() && (a[i + 1] == "int64" || a[i + 1] == "int32")) {
      o.index_dtype = a[++i] == "int32" ? topkgen::IndexDtype::int32 : topkgen::IndexDtype::int64;
    } else {
      return false;
    }
  }
  return true;
}

int select(const std::string& dir, bool json, topkgen::Options options, std::int64_t sm_count) {
  topkgen::Bundle bundle(dir);
  std::size_t line_no = 0;
  bool refused = false;
  for (Shape s; next_shape(s, line_no); s = Shape()) {
    nlohmann::ordered_json answer;
    try {
      if (!s.has_rows) {
        answer["kernel"] = bundle.select(s.arch, s.dtype, s.k, s.n, s.deterministic, s.jit).name;
      } else {
        const topkgen::Plan p = bundle.plan(s.arch, s.dtype, s.k, s.n, s.rows, s.deterministic, s.jit, options, sm_count);
        answer["kernel"] = p.kernel->name;
        answer["chunks"] = p.chunks;
        answer["workspace_bytes"] = p.workspace_bytes;
        answer["values_offset"] = p.values_offset;
        answer["shared_bytes"] = p.shared_bytes();  // each launch's dynamic shared memory (schema 6)
        if (p.flags) answer["flags"] = p.flags;  // a request with options (a fifth column only then)
      }
    } catch (const topkgen::Error& err) {
      answer = {{"error", shown(err.what())}};  // it quotes the line's ARCH or DTYPE: ASCII once shown
      refused = true;
    }
    std::string out;
    if (json) {
      out = answer.dump();
    } else if (answer.contains("error")) {
      out = "error: " + answer["error"].get<std::string>();
    } else {
      for (const auto& [key, value] : answer.items())
        out += (out.empty() ? "" : " ") + (value.is_string() ? value.get<std::string>() : value.dump());
    }
    std::cout << out << '\n' << std::flush;
  }
  return refused ? 1 : 0;
}

// Which binary serves a GPU of arch GPU: "WAY ARCH" then the words, or the refusal (exit 1).
int binary(const std::string& dir, const std::string& gpu, bool jit) {
  topkgen::Bundle bundle(dir);
  try {
    const topkgen::Binary b = bundle.binary(gpu, jit);
    std::cout << b.way << "\t" << b.arch << "\t" << b.words << "\n";
    return 0;
  } catch (const topkgen::Error& err) {
    std::cout << "error: " << shown(err.what()) << "\n";
    return 1;
  }
}

// --sm-count N: 1..1024, a whole number.
std::int64_t sm_count_arg(const std::string& text) {
  std::int64_t n = 0;
  if (!whole_integer(text, n) || n < 1 || n > topkgen::SM_COUNT_MAX)
    throw topkgen::Error("--sm-count: expected a whole number in 1.." + std::to_string(topkgen::SM_COUNT_MAX) + ", got '" +
                         shown(text) + "'");
  return n;
}

int bench(const std::string& dir) {
  topkgen::Bundle bundle(dir);
  const std::vector<Shape> shapes = read_shapes();
  if (shapes.empty()) throw topkgen::Error("stdin: no shapes");
  std::vector<double> per_lookup;
  std::size_t sink = 0;
  for (int rep = 0; rep < 21; ++rep) {
    auto start = std::chrono::steady_clock::now();
    for (int loop = 0; loop < 20; ++loop)
      for (const Shape& s : shapes) sink += bundle.select(s.arch, s.dtype, s.k, s.n, s.deterministic, s.jit).k;
    std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
    per_lookup.push_back(took.count() / (20.0 * shapes.size()));
  }
  std::sort(per_lookup.begin(), per_lookup.end());
  std::printf("%.1f ns median per lookup over %zu shapes (21 runs; checksum %zu)\n", per_lookup[per_lookup.size() / 2],
              shapes.size(), sink % 10);
  return 0;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw topkgen::Error(path + ": cannot read");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spill(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!out) throw topkgen::Error(path + ": cannot write");
}

int launch(const std::vector<std::string>& a, topkgen::Options options) {
  // DIR ARCH DTYPE K N ROWS MODE JIT LARGEST IN VALUES INDICES
  topkgen::Bundle bundle(a[0]);
  Shape s;
  const std::string shape = a[1] + " " + a[2] + " " + a[3] + " " + a[4] + " " + a[6] + " " + a[7] + " " + a[5];
  if (!parse_shape(shape, s) || !s.has_rows)  // select's reading of a line, ROWS last
    throw topkgen::Error("launch: expected ARCH DTYPE K N ROWS MODE JIT as whole numbers and names, got '" +
                         a[1] + " " + a[2] + " " + a[3] + " " + a[4] + " " + a[5] + " " + a[6] + " " + a[7] + "'");
  if (a[8] != "0" && a[8] != "1") throw topkgen::Error("launch: LARGEST must be 0 or 1, got '" + a[8] + "'");
  const bool largest = a[8] == "1";
  topkgen::Plan plan = bundle.plan(s.arch, s.dtype, s.k, s.n, s.rows, s.deterministic, s.jit, options);  // checks rows
  const int rows = static_cast<int>(s.rows);
  const std::size_t elem = s.dtype == "float32" ? 4 : 2;
  const std::string x = slurp(a[9]);
  const std::size_t expected = static_cast<std::size_t>(rows) * static_cast<std::size_t>(s.n) * elem;
  if (x.size() != expected) throw topkgen::Error(a[9] + ": expected " + std::to_string(expected) + " bytes");
  std::vector<std::string> window_files;  // LENGTHS [STARTS], checked before the driver is used
  for (std::size_t i = 12; i < a.size(); ++i) {
    window_files.push_back(slurp(a[i]));
    if (window_files.back().size() != static_cast<std::size_t>(rows) * 8)
      throw topkgen::Error(a[i] + ": expected " + std::to_string(static_cast<std::size_t>(rows) * 8) +
                           " bytes (ROWS int64 " + (i == 12 ? "lengths" : "starts") + "), got " +
                           std::to_string(window_files.back().size()));
  }
  if (rows == 0) {  // an empty batch launches nothing: empty outputs, no driver needed
    spill(a[10], ""), spill(a[11], "");
    std::cout << plan.kernel->name << " " << plan.chunks << "\n";
    return 0;
  }
  const auto& d = topkgen::cu::Driver::get();
  topkgen::cu::current_arch();  // a current context
  // planned again for the device's own SM count (split_rules): the same kernel, its chunks for this GPU
  plan = bundle.plan(s.arch, s.dtype, s.k, s.n, s.rows, s.deterministic, s.jit, options, topkgen::cu::current_sm_count());
  topkgen::cu::DevicePtr dx = 0, dv = 0, di = 0, dw = 0;
  const std::size_t out_elems = static_cast<std::size_t>(rows) * s.k;
  d.check(d.MemAlloc(&dx, x.size()), "cuMemAlloc");
  d.check(d.MemAlloc(&dv, out_elems * elem), "cuMemAlloc");
  d.check(d.MemAlloc(&di, out_elems * plan.index_bytes()), "cuMemAlloc");
  if (plan.workspace_bytes) d.check(d.MemAlloc(&dw, plan.workspace_bytes), "cuMemAlloc");
  d.check(d.MemcpyHtoD(dx, x.data(), x.size()), "cuMemcpyHtoD");
  topkgen::Windows windows;  // LENGTHS [STARTS]: rows int64 each, read above
  std::vector<topkgen::cu::DevicePtr> window_buffers;
  for (std::size_t i = 12; i < a.size(); ++i) {
    const std::string& w = window_files[i - 12];
    topkgen::cu::DevicePtr p = 0;
    d.check(d.MemAlloc(&p, w.size()), "cuMemAlloc");
    d.check(d.MemcpyHtoD(p, w.data(), w.size()), "cuMemcpyHtoD");
    window_buffers.push_back(p);
    (i == 12 ? windows.lengths : windows.starts) = p;
    windows.window_bytes = 8;
  }
  bundle.run(plan, nullptr, dx, dv, di, rows, static_cast<int>(s.n), static_cast<int>(s.k), largest, dw, windows);
  d.check(d.CtxSynchronize(), "cuCtxSynchronize");
  for (auto p : window_buffers) d.MemFree(p);
  std::string values(out_elems * elem, '\0'), indices(out_elems * plan.index_bytes(), '\0');
  d.check(d.MemcpyDtoH(values.data(), dv, values.size()), "cuMemcpyDtoH");
  d.check(d.MemcpyDtoH(indices.data(), di, indices.size()), "cuMemcpyDtoH");
  for (auto p : {dx, dv, di, dw})
    if (p) d.MemFree(p);
  spill(a[10], values);
  spill(a[11], indices);
  std::cout << plan.kernel->name << " " << plan.chunks << "\n";
  return 0;
}

int usage() {
  std::cerr << "usage: topkgen-cpp verify DIR | select DIR [--format text|json] [--sm-count N] [OPTIONS] | bench DIR\n"
               "       topkgen-cpp binary DIR GPU_ARCH [--jit]\n"
               "       topkgen-cpp launch DIR ARCH DTYPE K N ROWS MODE JIT LARGEST IN VALUES INDICES [LENGTHS [STARTS]]\n"
               "                   [OPTIONS]\n"
               "OPTIONS: --unsorted (no promised order), --index-dtype int64|int32 (INDICES: 8 or 4 bytes each)\n"
               "select and bench read 'ARCH DTYPE K N MODE JIT [ROWS]' lines on stdin; README: 'Writing a loader'\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() < 2) return usage();
  const std::string cmd = args[0];
  args.erase(args.begin());
  try {
    if (cmd == "verify" && args.size() == 1) return verify(args[0]);
    topkgen::Options options;
    if (cmd == "select" && !args.empty()) {  // DIR [--format text|json] [--sm-count N] [OPTIONS], in any order
      bool json = false;
      std::int64_t sm_count = 0;
      std::vector<std::string> rest;  // the request options, for parse_options
      for (std::size_t i = 1; i < args.size(); ++i) {
        if (args[i] == "--format" && i + 1 < args.size() && (args[i + 1] == "text" || args[i + 1] == "json")) json = args[++i] == "json";
        else if (args[i] == "--sm-count" && i + 1 < args.size()) sm_count = sm_count_arg(args[++i]);
        else if (args[i] == "--index-dtype" && i + 1 < args.size()) rest.push_back(args[i]), rest.push_back(args[++i]);
        else rest.push_back(args[i]);
      }
      if (parse_options(rest, 0, options)) return select(args[0], json, options, sm_count);
      return usage();
    }
    if (cmd == "binary" && args.size() == 2) return binary(args[0], args[1], false);
    if (cmd == "binary" && args.size() == 3 && args[2] == "--jit") return binary(args[0], args[1], true);
    if (cmd == "bench" && args.size() == 1) return bench(args[0]);
    if (cmd == "launch") {  // 12 words, LENGTHS [STARTS], then the request options
      std::size_t words = 0;
      while (words < args.size() && args[words].rfind("--", 0) != 0) ++words;
      if (words >= 12 && words <= 14 && parse_options(args, words, options))
        return launch(std::vector<std::string>(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(words)), options);
    }
    return usage();
  } catch (const topkgen::Error& err) {
    std::cerr << "topkgen-cpp: error: " << err.what() << "\n";
    return 2;
  } catch (const std::exception& err) {  // a malformed manifest nlohmann refuses, a bad number
    std::cerr << "topkgen-cpp: error: " << err.what() << "\n";
    return 2;
  }
}
