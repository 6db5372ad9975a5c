// xsp's native capture core: level F's records (aten ops, autograd nodes, user ranges, module
// calls, iterations) in a memory-mapped arena, and levels L and G's CUPTI activity buffers.
//
// The arena is a file the level-set process maps shared. Each thread claims fixed-size chunks of
// records from it and writes a record's fields before its kind, so what the runner reads after
// the process died (os._exit, SIGKILL, a segfault) holds every record that was complete. Names
// are interned into the arena's string region once per distinct string. Its layout is read by
// xsp/tracer/convert/arena.py with numpy, without this extension (the runner never imports torch).
//
// CUPTI's buffers come from a pool of large buffers; completion only queues them, and decoding
// into columns happens once, after the measured window (cupti_decode; a continuous session's
// sampled iterations each collect theirs as CUPTI stops, cupti_collect).

#include <torch/extension.h>
#include <structmember.h>

#include <ATen/record_function.h>
#include <pybind11/numpy.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#ifdef XSP_WITH_CUPTI
#include <cupti.h>
#endif

namespace py = pybind11;

namespace {

// -- arena layout (xsp/tracer/convert/arena.py mirrors it) ---------------------------------------
constexpr char kMagic[8] = {'X', 'S', 'P', 'A', 'R', 'E', 'N', 'A'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kHeaderBytes = 4096;
constexpr uint64_t kChunkRecords = 4096;

enum Kind : uint8_t {
  kOp = 1,
  kModule = 2,
  kRange = 3,
  kStep = 4,
  kModuleInfo = 5,
  kMemory = 6,
  kSource = 7,  // an op's calling Python line: seq_nr is the op's record id, name the line
  // a CUDA graph node made while recording: seq_nr its CUPTI node id, name the innermost op open
  // on the thread that made it, shapes that op's module index, dtypes its phase (kPhase*)
  kGraphNode = 8,
  kGraphClone = 9,  // a node cloned (graph instantiation): seq_nr the new id, aux the original's
};

// Phases of the op that made a graph node, as conversion's PHASES name them.
constexpr int8_t kPhaseForward = 0, kPhaseBackward = 1, kPhaseOptimizer = 2, kPhaseUnknown = -1;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t record_bytes;
  uint64_t chunk_records;
  uint64_t chunk_capacity;
  uint64_t chunks_offset;
  uint64_t strings_offset;
  uint64_t strings_capacity;
  int64_t pid;
  std::atomic<uint64_t> chunks_used;
  std::atomic<uint64_t> strings_count;
  std::atomic<uint64_t> strings_bytes;
  std::atomic<uint64_t> dropped_records;  // arena full
  std::atomic<uint64_t> dropped_strings;  // string region full
  std::atomic<uint64_t> callback_errors;  // exceptions caught inside a callback
};

struct ChunkHead {
  int64_t os_thread;  // gettid(): the id CUPTI's records carry
  int64_t rf_thread;  // RecordFunction's thread id: what forwardThreadId() refers to
  std::atomic<uint64_t> used;
  uint64_t pad;
};

struct Record {
  int64_t start_ns;
  int64_t end_ns;   // 0 while open
  int64_t seq_nr;   // op: autograd sequence number; module: module index; step: iteration;
                    // memory: bytes allocated (negative: freed)
  int64_t aux;      // op: forward thread (RecordFunction id); memory: bytes allocated in all
  int32_t name;     // string id, -1 unknown
  int32_t shapes;   // op/module: input shapes; -1 none; memory: device type
  int32_t dtypes;   // op: input dtypes; module: output shapes; memory: device index
  uint8_t scope;    // RecordScope of ops
  uint8_t pad[2];
  uint8_t kind;     // written last: 0 means the slot is empty
};
static_assert(sizeof(Record) == 48, "arena record layout");
static_assert(sizeof(ChunkHead) == 32, "arena chunk layout");

struct Arena {
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
  Header* header = nullptr;
  int fd = -1;
};

Arena g_arena;
std::atomic<uint64_t> g_generation{1};  // bumped at each open: thread-local state goes stale
std::mutex g_strings_mutex;
std::unordered_map<std::string, int32_t> g_strings;
std::atomic<bool> g_record_shapes{false};
bool g_root_shapes = false;  // a run with shapes records its root module calls' every iteration
std::atomic<bool> g_push_correlation{false};
std::atomic<bool> g_memory{false};  // allocator events are recorded
std::atomic<int> g_capturing{0};    // CUDA stream captures in progress (CUPTI's driver callbacks)
std::atomic<int64_t> g_captures{0};    // captures begun: the high half of an open op's instance
std::atomic<int64_t> g_captured_ops{0};  // outermost ops opened during captures
// While capturing: forward op sequence number -> module index, so that a backward node (which
// carries its forward op's number) made during a capture knows its layer.
std::mutex g_capture_mutex;
std::unordered_map<int64_t, int64_t> g_capture_modules;
at::CallbackHandle g_callback = 0;        // the op callback that asks for inputs (shapes)
at::CallbackHandle g_plain_callback = 0;  // the same without: after the first iteration

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

uint64_t fnv(const void* data, size_t n, uint64_t h = 1469598103934665603ULL) {
  auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

struct ThreadState {
  uint64_t generation = 0;
  ChunkHead* chunk = nullptr;
  uint64_t chunk_index = 0;
  uint64_t used = 0;
  int64_t os_thread = 0;
  std::unordered_map<uint64_t, std::pair<int32_t, std::string>> names;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> shapes;
  std::vector<Record*> modules;  // open module calls
  std::vector<Record*> ranges;   // open xsp ranges (iterations)
  // Ops open on this thread while a CUDA stream capture is in progress (anywhere): the graph
  // nodes a capture makes take the innermost one's name, module and phase.
  struct OpenOp {
    int32_t name;
    int64_t module;
    int8_t phase;
    // the outermost open op holding it (the aten op inductor's wrapper called, e.g.
    // aten::convolution): its name, and its instance, (capture << 32) | op number
    int32_t outer;
    int64_t instance;
  };
  std::vector<OpenOp> open_ops;
  // Python code objects: whether each is torch's or xsp's own (skipped when looking for the
  // line that called an op), and each (code, line)'s interned "file:line function". The code
  // objects are held (a reference each), so that an address is never reused while cached.
  std::unordered_map<PyCodeObject*, bool> own_code;
  std::unordered_map<uint64_t, int32_t> sources;
  // The innermost frame at the last op, its code and instruction, and the line found: ops that
  // run inside one Python call (aten::linear, then its aten::t and aten::addmm) reuse it.
  PyFrameObject* last_frame = nullptr;
  PyCodeObject* last_code = nullptr;
  int last_lasti = -1;
  int32_t last_source = -1;
};

ThreadState& state() {
  thread_local ThreadState t;
  uint64_t generation = g_generation.load(std::memory_order_acquire);
  if (t.generation != generation) {
    t = ThreadState();
    t.generation = generation;
    t.os_thread = int64_t(syscall(SYS_gettid));
  }
  return t;
}

Record* records_of(ChunkHead* chunk) { return reinterpret_cast<Record*>(chunk + 1); }

// A free slot on this thread, or nullptr when no arena is open or it is full.
Record* claim(ThreadState& t, uint64_t* global_index = nullptr) {
  Header* h = g_arena.header;
  if (h == nullptr) return nullptr;
  if (t.chunk == nullptr || t.used == h->chunk_records) {
    uint64_t index = h->chunks_used.fetch_add(1);
    if (index >= h->chunk_capacity) {
      h->chunks_used.store(h->chunk_capacity);
      h->dropped_records.fetch_add(1);
      t.chunk = nullptr;
      return nullptr;
    }
    uint64_t chunk_bytes = sizeof(ChunkHead) + h->chunk_records * sizeof(Record);
    t.chunk = reinterpret_cast<ChunkHead*>(g_arena.base + h->chunks_offset + index * chunk_bytes);
    t.chunk->os_thread = t.os_thread;
    t.chunk->rf_thread = int64_t(at::RecordFunction::currentThreadId());
    t.chunk_index = index;
    t.used = 0;
  }
  if (global_index != nullptr) *global_index = t.chunk_index * h->chunk_records + t.used;
  Record* r = records_of(t.chunk) + t.used++;
  t.chunk->used.store(t.used, std::memory_order_release);
  return r;
}

void publish(Record* r, Kind kind) { __atomic_store_n(&r->kind, uint8_t(kind), __ATOMIC_RELEASE); }

// The id of ``text`` in the arena's string region, writing it there the first time.
int32_t intern_global(const char* text, size_t n) {
  std::lock_guard<std::mutex> lock(g_strings_mutex);
  std::string key(text, n);
  auto found = g_strings.find(key);
  if (found != g_strings.end()) return found->second;
  Header* h = g_arena.header;
  if (h == nullptr) return -1;
  uint64_t at = h->strings_bytes.load();
  uint64_t need = (4 + n + 3) & ~uint64_t(3);
  if (at + need > h->strings_capacity) {
    h->dropped_strings.fetch_add(1);
    return -1;
  }
  uint8_t* slot = g_arena.base + h->strings_offset + at;
  uint32_t len = uint32_t(n);
  std::memcpy(slot, &len, 4);
  std::memcpy(slot + 4, text, n);
  h->strings_bytes.store(at + need, std::memory_order_release);
  int32_t id = int32_t(h->strings_count.load());
  h->strings_count.store(uint64_t(id) + 1, std::memory_order_release);
  g_strings.emplace(std::move(key), id);
  return id;
}

int32_t intern(ThreadState& t, const char* text, size_t n) {
  uint64_t key = fnv(text, n);
  auto found = t.names.find(key);
  if (found != t.names.end() && found->second.second.size() == n &&
      std::memcmp(found->second.second.data(), text, n) == 0) {
    return found->second.first;
  }
  int32_t id = intern_global(text, n);
  if (id >= 0) t.names[key] = {id, std::string(text, n)};
  return id;
}

int32_t intern(ThreadState& t, const std::string& text) { return intern(t, text.data(), text.size()); }

// -- input shapes and dtypes, in the profiler's notation: [[2,3],[]] and float,Scalar ---------
void append_dims(std::string& out, c10::IntArrayRef dims) {
  out += '[';
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(dims[i]);
  }
  out += ']';
}

bool plain_sizes(const at::Tensor& t) {
  return t.defined() && !t.is_nested() && !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
}

void hash_inputs(c10::ArrayRef<c10::IValue> inputs, uint64_t& h) {
  for (const auto& v : inputs) {
    uint8_t tag = v.isTensor() ? 1 : v.isScalar() ? 2 : v.isTensorList() ? 3 : 0;
    h = fnv(&tag, 1, h);
    if (tag == 1) {
      const auto& t = v.toTensor();
      if (plain_sizes(t)) {
        auto dims = t.sizes();
        h = fnv(dims.data(), dims.size() * sizeof(int64_t), h);
        auto type = int8_t(t.scalar_type());
        h = fnv(&type, 1, h);
      }
    }
  }
}

std::pair<int32_t, int32_t> input_ids(ThreadState& t, c10::ArrayRef<c10::IValue> inputs) {
  uint64_t h = 1469598103934665603ULL;
  hash_inputs(inputs, h);
  auto found = t.shapes.find(h);
  if (found != t.shapes.end()) return found->second;
  std::string shapes = "[", dtypes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& v = inputs[i];
    if (i) {
      shapes += ',';
      dtypes += ',';
    }
    if (v.isTensor()) {
      const auto& tensor = v.toTensor();
      if (plain_sizes(tensor)) {
        append_dims(shapes, tensor.sizes());
        dtypes += std::string(c10::scalarTypeToTypeMeta(tensor.scalar_type()).name());
      } else {
        shapes += "[]";
        dtypes += tensor.defined() ? "Tensor" : "";
      }
    } else {
      shapes += "[]";
      dtypes += v.isScalar() ? "Scalar" : v.isTensorList() ? "TensorList" : "";
    }
  }
  shapes += ']';
  std::pair<int32_t, int32_t> ids{intern(t, shapes), intern(t, dtypes)};
  t.shapes[h] = ids;
  return ids;
}

// Shapes of the tensors in a Python value (a module call's arguments, keyword arguments or
// output), in order, through nested tuples, lists and dicts down to kMaxDepth.
constexpr int kMaxDepth = 4;

void add_python_shapes(py::handle value, std::string& out, bool& first, int depth) {
  if (THPVariable_Check(value.ptr())) {
    const auto& tensor = THPVariable_Unpack(value.ptr());
    if (!first) out += ',';
    first = false;
    if (plain_sizes(tensor)) {
      append_dims(out, tensor.sizes());
    } else {
      out += "[]";
    }
  } else if (depth >= kMaxDepth) {
    return;
  } else if (py::isinstance<py::tuple>(value) || py::isinstance<py::list>(value)) {
    for (auto item : value) add_python_shapes(item, out, first, depth + 1);
  } else if (py::isinstance<py::dict>(value)) {
    for (auto item : value.cast<py::dict>()) add_python_shapes(item.second, out, first, depth + 1);
  }
}

int32_t python_shapes(ThreadState& t, py::handle value, py::handle more = py::handle()) {
  std::string out = "[";
  bool first = true;
  add_python_shapes(value, out, first, 0);
  if (more) add_python_shapes(more, out, first, 0);
  out += ']';
  return intern(t, out);
}

// -- the Python line that called an op ---------------------------------------------------------
// On a thread that runs Python, the innermost frame that is not torch's or xsp's own is the line
// of the program (or of the model's code) that called the op. Asked only while shapes are
// recorded (the first measured iteration of the deepest level set with F), as shapes are.
bool library_file(PyCodeObject* code) {
  const char* file = PyUnicode_AsUTF8(code->co_filename);
  if (file == nullptr) {
    PyErr_Clear();
    return true;
  }
  return std::strstr(file, "/torch/") != nullptr || std::strstr(file, "/xsp/tracer/") != nullptr ||
         std::strncmp(file, "<frozen", 7) == 0;
}

int32_t intern_source(ThreadState& t, PyCodeObject* code, int line) {
  uint64_t key = fnv(&code, sizeof(code), fnv(&line, sizeof(line)));
  auto found = t.sources.find(key);
  if (found != t.sources.end()) return found->second;
  const char* file = PyUnicode_AsUTF8(code->co_filename);
  const char* function = PyUnicode_AsUTF8(code->co_qualname);
  if (file == nullptr || function == nullptr) {
    PyErr_Clear();
    return -1;
  }
  int32_t id = intern(t, std::string(file) + ":" + std::to_string(line) + " " + function);
  t.sources[key] = id;
  return id;
}

bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

int32_t op_source(ThreadState& t) {
  // a thread Python never ran on (autograd's engine, a C++ pool) has no frames to look at
  if (!Py_IsInitialized() || python_finalizing() || PyGILState_GetThisThreadState() == nullptr)
    return -1;
  // torch's bindings release the GIL around an op; take it back, as torch.profiler's with_stack
  // does in its callback
  py::gil_scoped_acquire gil;
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  if (frame == nullptr) return -1;
  PyCodeObject* top = PyFrame_GetCode(frame);  // a new reference
  int lasti = PyFrame_GetLasti(frame);
  Py_DECREF(top);  // compared by address only: a cached code object is held (own_code)
  if (frame == t.last_frame && top == t.last_code && lasti == t.last_lasti &&
      t.own_code.count(top) != 0)
    return t.last_source;
  Py_INCREF(frame);
  int32_t id = -1;
  for (int depth = 0; frame != nullptr && depth < 64 && id < 0; ++depth) {
    PyCodeObject* code = PyFrame_GetCode(frame);  // a new reference
    auto found = t.own_code.find(code);
    bool own;
    if (found == t.own_code.end()) {
      own = library_file(code);
      Py_INCREF(code);  // held by the cache
      t.own_code.emplace(code, own);
    } else {
      own = found->second;
    }
    if (!own) id = intern_source(t, code, PyFrame_GetLineNumber(frame));
    Py_DECREF(code);
    PyFrameObject* back = id < 0 ? PyFrame_GetBack(frame) : nullptr;  // a new reference
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  t.last_frame = PyEval_GetFrame();
  t.last_code = top;
  t.last_lasti = lasti;
  t.last_source = id;
  return id;
}

std::atomic<bool> g_record_sources{true};  // off only to measure what the lines cost

void record_source(ThreadState& t, uint64_t op_index) {
  if (!g_record_sources.load(std::memory_order_relaxed)) return;
  int32_t id = op_source(t);
  if (id < 0) return;
  Record* r = claim(t);
  if (r == nullptr) return;
  r->seq_nr = int64_t(op_index + 1);  // the op's record id
  r->aux = -1;
  r->name = id;
  r->shapes = r->dtypes = -1;
  r->scope = 0;
  r->start_ns = r->end_ns = now_ns();
  publish(r, kSource);
}

// -- the RecordFunction callback --------------------------------------------------------------
struct OpContext : at::ObserverContext {
  Record* record = nullptr;
  uint64_t generation = 0;
  bool pushed = false;
  bool stacked = false;  // on its thread's open_ops (a capture was in progress at its start)
};

std::mutex g_error_mutex;
std::string g_first_error;

void callback_failed(const char* what) {
  if (g_arena.header) g_arena.header->callback_errors.fetch_add(1);
  std::lock_guard<std::mutex> lock(g_error_mutex);
  if (g_first_error.empty()) g_first_error = what;
}

#ifdef XSP_WITH_CUPTI
// A continuous session whose API calls come from CUPTI's callbacks (``cupti_start``'s
// ``api_callbacks``) reads each call's op from this thread's stack of open op ids; otherwise
// CUPTI's EXTERNAL_CORRELATION records join them.
std::atomic<bool> g_push_cupti{true};
thread_local std::vector<uint64_t> t_external;
void push_correlation(uint64_t id) {
  t_external.push_back(id);
  if (g_push_cupti.load(std::memory_order_relaxed))
    cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, id);
}
void pop_correlation() {
  if (!t_external.empty()) t_external.pop_back();
  if (!g_push_cupti.load(std::memory_order_relaxed)) return;
  uint64_t last = 0;
  cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
}
#else
void push_correlation(uint64_t) {}
void pop_correlation() {}
#endif

int64_t current_module();

// The module of the forward op with sequence number ``seq_nr`` that ran during a capture, -1.
int64_t captured_forward_module(int64_t seq_nr) {
  std::lock_guard<std::mutex> lock(g_capture_mutex);
  auto found = g_capture_modules.find(seq_nr);
  return found == g_capture_modules.end() ? -1 : found->second;
}

// Puts an op that starts during a stream capture on its thread's open ops, with its module and
// phase: the enclosing op's, else the innermost module call's (forward). A backward node's own
// range (``ConvolutionBackward0``, under ``autograd::engine::evaluate_function: ...``) carries
// its forward op's number, which names the module that forward op ran in.
bool open_op(ThreadState& t, const char* name, const Record* r) {
  static const char kBackward[] = "autograd::engine::evaluate_function: ";
  ThreadState::OpenOp op{r->name, -1, kPhaseForward, r->name, 0};
  if (!t.open_ops.empty()) {
    op.module = t.open_ops.back().module;
    op.phase = t.open_ops.back().phase;
    op.outer = t.open_ops.back().outer;
    op.instance = t.open_ops.back().instance;
  } else {
    op.module = current_module();
    op.instance = (g_captures.load(std::memory_order_relaxed) << 32) |
                  ((g_captured_ops.fetch_add(1, std::memory_order_relaxed) + 1) & 0xffffffff);
  }
  if (std::strncmp(name, kBackward, sizeof(kBackward) - 1) == 0) {
    op.phase = kPhaseBackward;
    op.module = -1;
  } else if (std::strncmp(name, "Optimizer.", 10) == 0) {
    op.phase = kPhaseOptimizer;
    op.module = -1;
  }
  if (op.phase == kPhaseBackward && op.module < 0 && r->seq_nr >= 0 &&
      r->scope == uint8_t(at::RecordScope::BACKWARD_FUNCTION)) {
    op.module = captured_forward_module(r->seq_nr);
    // the engine's work after the node's own range (summing a bias's gradient to its shape)
    // runs in the evaluate_function range: it takes the module too
    if (!t.open_ops.empty() && t.open_ops.back().module < 0) t.open_ops.back().module = op.module;
  }
  if (op.phase == kPhaseForward && op.module >= 0 && r->seq_nr >= 0) {
    std::lock_guard<std::mutex> lock(g_capture_mutex);
    if (g_capture_modules.size() > (1u << 20)) g_capture_modules.clear();  // bounded
    g_capture_modules[r->seq_nr] = op.module;
  }
  t.open_ops.push_back(op);
  return true;
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  try {
    auto& t = state();
    uint64_t index = 0;
    Record* r = claim(t, &index);
    if (r == nullptr) return nullptr;
    auto ctx = std::make_unique<OpContext>();
    ctx->record = r;
    ctx->generation = t.generation;
    const char* name = fn.name();
    r->name = intern(t, name, std::strlen(name));
    r->seq_nr = fn.seqNr();
    r->aux = int64_t(fn.forwardThreadId());
    r->scope = uint8_t(fn.scope());
    r->shapes = r->dtypes = -1;
    if (fn.needsInputs() && g_record_shapes.load(std::memory_order_relaxed)) {
      auto ids = input_ids(t, fn.inputs());
      r->shapes = ids.first;
      r->dtypes = ids.second;
      record_source(t, index);
    }
    r->end_ns = 0;
    if (g_push_correlation.load(std::memory_order_relaxed)) {
      push_correlation(index + 1);
      ctx->pushed = true;
    }
    if (g_capturing.load(std::memory_order_relaxed) > 0) ctx->stacked = open_op(t, name, r);
    r->start_ns = now_ns();
    publish(r, kOp);
    return ctx;
  } catch (const std::exception& e) {
    callback_failed(e.what());
    return nullptr;
  } catch (...) {
    callback_failed("unknown exception");
    return nullptr;
  }
}

void on_exit(const at::RecordFunction&, at::ObserverContext* base) {
  auto* ctx = static_cast<OpContext*>(base);
  if (ctx == nullptr || ctx->record == nullptr) return;
  int64_t end = now_ns();
  if (ctx->pushed) pop_correlation();
  if (ctx->stacked) {
    auto& t = state();
    if (!t.open_ops.empty()) t.open_ops.pop_back();
  }
  // An op that began before its arena closed (the optimizer range around the step that ends
  // the run) ends after it: its slot is still mapped, but no longer read.
  if (ctx->generation != g_generation.load(std::memory_order_acquire)) return;
  __atomic_store_n(&ctx->record->end_ns, end, __ATOMIC_RELEASE);
}

void remove_op_callbacks() {
  for (auto* handle : {&g_callback, &g_plain_callback}) {
    if (*handle != 0) at::removeCallback(*handle);
    *handle = 0;
  }
}

void on_fork_child() {
  // A forked child (a DataLoader worker) must not write into its parent's arena.
  remove_op_callbacks();
  g_arena = Arena();
  g_generation.fetch_add(1);
  new (&g_strings_mutex) std::mutex();
  g_strings.clear();
  g_push_correlation.store(false);
}

// -- Python API: arena ------------------------------------------------------------------------
void arena_open(const std::string& path, uint64_t capacity_bytes) {
  if (g_arena.header != nullptr) throw std::runtime_error("an xsp capture arena is already open");
  uint64_t strings = std::max<uint64_t>(capacity_bytes / 16, 1 << 20);
  uint64_t chunk_bytes = sizeof(ChunkHead) + kChunkRecords * sizeof(Record);
  uint64_t chunks = std::max<uint64_t>((capacity_bytes - strings) / chunk_bytes, 4);
  uint64_t total = kHeaderBytes + strings + chunks * chunk_bytes;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create the capture arena " + path + ": " + strerror(errno));
  if (ftruncate(fd, off_t(total)) != 0) {
    ::close(fd);
    throw std::runtime_error("cannot size the capture arena " + path + ": " + strerror(errno));
  }
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    ::close(fd);
    throw std::runtime_error("cannot map the capture arena " + path + ": " + strerror(errno));
  }
  // No read-ahead for the header and the strings: a first touch of the sparse file would
  // otherwise zero a large folio around it (2 ms for the header, inside the request that starts
  // a continuous session's batch). The records' chunks keep it: with one page per fault, level
  // F's records cost a request several µs more
  madvise(base, kHeaderBytes + strings, MADV_RANDOM);
  auto* h = new (base) Header();
  std::memcpy(h->magic, kMagic, 8);
  h->version = kVersion;
  h->record_bytes = sizeof(Record);
  h->chunk_records = kChunkRecords;
  h->chunk_capacity = chunks;
  h->strings_offset = kHeaderBytes;
  h->strings_capacity = strings;
  h->chunks_offset = kHeaderBytes + strings;
  h->pid = getpid();
  {
    std::lock_guard<std::mutex> lock(g_strings_mutex);
    g_strings.clear();
  }
  {
    std::lock_guard<std::mutex> lock(g_error_mutex);
    g_first_error.clear();
  }
  g_arena.base = static_cast<uint8_t*>(base);
  g_arena.bytes = total;
  g_arena.fd = fd;
  g_generation.fetch_add(1, std::memory_order_release);
  g_arena.header = h;
}

void ops_stop();

// Stops recording into the arena. The mapping stays: ops that began before may still end, on
// any thread, and write their end into it; its pages are given back to the file instead.
void arena_close() {
  ops_stop();
  g_memory.store(false);
  if (g_arena.header == nullptr) return;
  Arena closing = g_arena;
  g_arena.header = nullptr;
  g_generation.fetch_add(1, std::memory_order_release);
  // No msync: the shared mapping's pages are the file's page cache, which every reader (this
  // process's drain, or the runner after a crash) sees; only a crash of the OS needs the disk.
  madvise(closing.base, closing.bytes, MADV_DONTNEED);
  ::close(closing.fd);
  g_arena = Arena();
}

void ops_start(bool record_shapes) {
  if (g_arena.header == nullptr) throw std::runtime_error("open the capture arena first");
  if (g_callback != 0 || g_plain_callback != 0) return;
  g_record_shapes.store(record_shapes);
  g_root_shapes = record_shapes;
  if (record_shapes) {  // the plain twin waits, disabled, for ops_shapes(false)
    g_plain_callback = at::addGlobalCallback(at::RecordFunctionCallback(&on_enter, &on_exit));
    at::disableCallback(g_plain_callback);
    g_callback = at::addGlobalCallback(
        at::RecordFunctionCallback(&on_enter, &on_exit).needsInputs(true));
  } else {
    g_plain_callback = at::addGlobalCallback(at::RecordFunctionCallback(&on_enter, &on_exit));
  }
}

// Switches the shapes (ops' inputs, module calls' arguments and outputs) off between
// iterations, by swapping the op callback for its twin that asks for no inputs (asking is fixed
// per callback). The swap disables one before enabling the other: an op that another thread
// starts in between goes unrecorded rather than twice (none runs at an iteration boundary).
void ops_shapes(bool on) {
  if (g_callback == 0 || g_plain_callback == 0 || on == g_record_shapes.load()) return;
  at::disableCallback(on ? g_plain_callback : g_callback);
  g_record_shapes.store(on);
  at::reenableCallback(on ? g_callback : g_plain_callback);
}

void ops_stop() { remove_op_callbacks(); }

void module_enter(int64_t index, py::handle args, py::handle kwargs) {
  auto& t = state();
  Record* r = claim(t);
  if (r == nullptr) {
    t.modules.push_back(nullptr);
    return;
  }
  r->seq_nr = index;
  r->aux = -1;
  r->name = -1;
  r->scope = 0;
  // a root call's arguments are recorded every iteration: conversion copies the first
  // iteration's shapes only to those whose root calls had the same (xsp.tracer.convert.shapes)
  bool root = g_root_shapes && t.modules.empty();
  r->shapes = g_record_shapes.load(std::memory_order_relaxed) || root
                  ? python_shapes(t, args, kwargs)
                  : -1;
  r->dtypes = -1;
  r->end_ns = 0;
  r->start_ns = now_ns();
  publish(r, kModule);
  t.modules.push_back(r);
}

void module_exit(py::handle output) {
  int64_t end = now_ns();
  auto& t = state();
  if (t.modules.empty()) return;
  Record* r = t.modules.back();
  t.modules.pop_back();
  if (r == nullptr) return;
  if (g_record_shapes.load(std::memory_order_relaxed)) r->dtypes = python_shapes(t, output);
  __atomic_store_n(&r->end_ns, end, __ATOMIC_RELEASE);
}

// The module index of the innermost open module call on this thread, -1 for none.
int64_t current_module() {
  auto& t = state();
  for (auto it = t.modules.rbegin(); it != t.modules.rend(); ++it)
    if (*it != nullptr) return (*it)->seq_nr;
  return -1;
}

// Closes the module calls an exception left open; returns how many.
int64_t modules_unwind() {
  auto& t = state();
  int64_t open = int64_t(t.modules.size());
  int64_t end = now_ns();
  for (Record* r : t.modules)
    if (r != nullptr) __atomic_store_n(&r->end_ns, end, __ATOMIC_RELEASE);
  t.modules.clear();
  return open;
}

void range_begin(const std::string& name) {
  auto& t = state();
  Record* r = claim(t);
  t.ranges.push_back(r);
  if (r == nullptr) return;
  r->name = intern(t, name);
  r->seq_nr = r->aux = -1;
  r->shapes = r->dtypes = -1;
  r->scope = 0;
  r->end_ns = 0;
  r->start_ns = now_ns();
  publish(r, kRange);
}

void range_end() {
  int64_t end = now_ns();
  auto& t = state();
  if (t.ranges.empty()) return;
  Record* r = t.ranges.back();
  t.ranges.pop_back();
  if (r != nullptr) __atomic_store_n(&r->end_ns, end, __ATOMIC_RELEASE);
}

void step(int64_t iteration, int64_t start_ns, int64_t end_ns) {
  auto& t = state();
  Record* r = claim(t);
  if (r == nullptr) return;
  r->seq_nr = iteration;
  r->aux = -1;
  r->name = r->shapes = r->dtypes = -1;
  r->scope = 0;
  r->start_ns = start_ns;
  r->end_ns = end_ns;
  publish(r, kStep);
}

// Level M's iteration boundaries, one call each: the clock is read here and the step record
// written at the end, through CPython's own calling convention (no pybind11 dispatch), as a
// service pays them on every request. The open iteration is the process's (callers hold the GIL).
int64_t g_step_index = -1;
int64_t g_step_start = 0;

PyObject* py_step_begin(PyObject*, PyObject* index) {
  long long i = PyLong_AsLongLong(index);
  if (i == -1 && PyErr_Occurred()) return nullptr;
  g_step_index = i;
  g_step_start = now_ns();
  Py_RETURN_NONE;
}

PyObject* py_step_end(PyObject*, PyObject*) {
  int64_t end = now_ns();
  if (g_step_index >= 0) step(g_step_index, g_step_start, end);
  g_step_index = -1;  // an end without its begin (the levels came on inside it) records nothing
  Py_RETURN_NONE;
}

PyMethodDef g_step_methods[] = {
    {"step_begin", py_step_begin, METH_O, "step_begin(index): level M's iteration begins now"},
    {"step_end", py_step_end, METH_NOARGS, "step_end(): the open iteration ends now, recorded"},
    {nullptr, nullptr, 0, nullptr}};

// -- a service's root-module calls ----------------------------------------------------------------
// The root module's class gets a RootCall as its ``__call__`` (xsp.tracer.capture.iterations
// ._RootCalls). A call of the root outside another of its calls is an iteration: the Python
// markers run around the model, except while the session has leased the wrapper its next
// iterations (``lease``): iterations that record level M's step and nothing else (unsampled, no
// application span to join), up to its next sampled one and the next thing it has due (a
// progress line, a batch). Those are timed and recorded here, with no Python frame of xsp's
// (a service's request paid 1.1-1.4 µs for six of them on the dev machine); the session learns
// how many ran (``settle``) before its next marker runs. Every other call goes on to the next
// ``__call__`` in the module's class hierarchy (torch's), as ``super().__call__`` would.
PyObject* g_call_name = nullptr;  // "__call__"
PyObject* g_otel_name = nullptr;  // "opentelemetry.trace": a program that may have a request span

struct RootCall {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* root;
  PyObject* cls;
  PyObject* own;     // the class's own __call__ that this one replaced, or None
  PyObject* begins;  // begins(): an iteration begins
  PyObject* ends;    // ends(error): it ended, error None or "Type: message"
  PyObject* report;  // report(exception): a marker raised (logged; the program goes on)
  PyObject* settle;  // settle(done, [(index, error)]): leased iterations done since the last
  PyObject* sync;    // the device's synchronize, or None
  PyObject* errors;  // [(index, error)] of leased iterations that raised
  int64_t lease_next, lease_left, deadline_ns, done;
  bool inside;
};

int64_t monotonic_ns() {  // Python's time.monotonic clock, in which the session's deadlines are
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

struct Raised {  // the exception being raised, held while a marker runs
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  Raised() {
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != nullptr) PyException_SetTraceback(value, traceback);
  }
  void restore() { PyErr_Restore(type, value, traceback); }
  PyObject* text() const {  // as iterations._error writes it: "Type: message"
    const char* name = Py_TYPE(value)->tp_name;
    const char* dot = strrchr(name, '.');
    PyObject* out = PyUnicode_FromFormat("%s: %S", dot ? dot + 1 : name, value);
    if (out == nullptr) {
      PyErr_Clear();
      out = PyUnicode_FromString(dot ? dot + 1 : name);
    }
    return out;
  }
};

void report_raised(RootCall* self) {
  Raised raised;  // tracing never breaks the traced program: the failure is logged
  PyObject* logged = PyObject_CallOneArg(self->report, raised.value);
  if (logged == nullptr) PyErr_WriteUnraisable(self->report);
  Py_XDECREF(logged);
  Py_XDECREF(raised.type);
  Py_XDECREF(raised.value);
  Py_XDECREF(raised.traceback);
}

void call_marker(RootCall* self, PyObject* marker, PyObject* arg) {
  PyObject* out = arg ? PyObject_CallOneArg(marker, arg) : PyObject_CallNoArgs(marker);
  if (out == nullptr) return report_raised(self);
  Py_DECREF(out);
}

PyObject* call_next(RootCall* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  PyObject* module = args[0];
  PyObject* next = self->own != Py_None ? self->own : nullptr;
  if (next == nullptr) {  // the first __call__ after the root's class in the module's MRO
    PyObject* mro = Py_TYPE(module)->tp_mro;
    Py_ssize_t n = PyTuple_GET_SIZE(mro), i = 0;
    while (i < n && PyTuple_GET_ITEM(mro, i) != self->cls) ++i;
    for (++i; i < n && next == nullptr; ++i) {
      PyObject* dict = reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i))->tp_dict;
      if (dict == nullptr) continue;  // a static builtin type's, on Python 3.12 (object: none)
      next = PyDict_GetItemWithError(dict, g_call_name);
      if (next == nullptr && PyErr_Occurred()) return nullptr;
    }
    if (next == nullptr) {
      PyErr_SetString(PyExc_TypeError, "xsp: no __call__ after the root module's class");
      return nullptr;
    }
  }
  if (PyType_HasFeature(Py_TYPE(next), Py_TPFLAGS_METHOD_DESCRIPTOR))  // a plain function
    return PyObject_Vectorcall(next, args, nargsf, kwnames);
  descrgetfunc get = Py_TYPE(next)->tp_descr_get;
  PyObject* bound = get ? get(next, module, reinterpret_cast<PyObject*>(Py_TYPE(module))) : next;
  if (bound == nullptr) return nullptr;
  if (get == nullptr) Py_INCREF(bound);
  PyObject* out = PyObject_Vectorcall(bound, args + 1, PyVectorcall_NARGS(nargsf) - 1, kwnames);
  Py_DECREF(bound);
  return out;
}

bool synchronize(RootCall* self) {
  if (self->sync == Py_None) return true;
  PyObject* out = PyObject_CallNoArgs(self->sync);
  if (out == nullptr) {
    report_raised(self);
    return false;
  }
  Py_DECREF(out);
  return true;
}

bool leased(RootCall* self) {
  if (self->lease_left <= 0) return false;
  PyObject* otel = PyDict_GetItemWithError(PyImport_GetModuleDict(), g_otel_name);
  if (otel == nullptr && PyErr_Occurred()) PyErr_Clear();
  if (otel != nullptr || monotonic_ns() >= self->deadline_ns) {
    self->lease_left = 0;  // the markers' way from now on: the session decides again
    return false;
  }
  return true;
}

PyObject* leased_iteration(RootCall* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  int64_t index = self->lease_next++;
  --self->lease_left;
  if (!synchronize(self)) self->lease_left = 0;
  int64_t start = now_ns();
  PyObject* out = call_next(self, args, nargsf, kwnames);
  if (out != nullptr) {
    synchronize(self);
    step(index, start, now_ns());
    ++self->done;
    return out;
  }
  Raised raised;
  synchronize(self);
  step(index, start, now_ns());
  ++self->done;
  self->lease_left = 0;  // its failure reaches the session at the next marker
  PyObject* text = raised.text();
  PyObject* item = text ? Py_BuildValue("(LN)", static_cast<long long>(index), text) : nullptr;
  if (item == nullptr || PyList_Append(self->errors, item) != 0) PyErr_Clear();
  Py_XDECREF(item);
  raised.restore();
  return nullptr;
}

void settle_leased(RootCall* self) {
  if (self->done == 0 && PyList_GET_SIZE(self->errors) == 0) return;
  PyObject* errors = self->errors;
  PyObject* fresh = PyList_New(0);
  if (fresh == nullptr) {
    PyErr_Clear();
    return;
  }
  self->errors = fresh;
  PyObject* done = PyLong_FromLongLong(self->done);
  self->done = 0;
  PyObject* out = done ? PyObject_CallFunctionObjArgs(self->settle, done, errors, nullptr) : nullptr;
  if (out == nullptr) PyErr_WriteUnraisable(self->settle);
  Py_XDECREF(out);
  Py_XDECREF(done);
  Py_DECREF(errors);
}

PyObject* marked_iteration(RootCall* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  settle_leased(self);
  call_marker(self, self->begins, nullptr);
  PyObject* out = call_next(self, args, nargsf, kwnames);
  if (out == nullptr) {
    Raised raised;
    PyObject* text = raised.text();
    if (text != nullptr) call_marker(self, self->ends, text);
    Py_XDECREF(text);
    raised.restore();
    return nullptr;
  }
  call_marker(self, self->ends, Py_None);
  return out;
}

PyObject* root_call(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<RootCall*>(callable);
  if (PyVectorcall_NARGS(nargsf) < 1) {
    PyErr_SetString(PyExc_TypeError, "a module's __call__ needs the module");
    return nullptr;
  }
  if (args[0] != self->root || self->inside) return call_next(self, args, nargsf, kwnames);
  self->inside = true;
  PyObject* out = leased(self) ? leased_iteration(self, args, nargsf, kwnames)
                               : marked_iteration(self, args, nargsf, kwnames);
  self->inside = false;
  return out;
}

PyObject* root_call_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *root, *cls, *own, *begins, *ends, *report, *settle;
  static const char* names[] = {"root", "cls", "own", "begins", "ends", "report", "settle", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOO", const_cast<char**>(names), &root, &cls,
                                   &own, &begins, &ends, &report, &settle))
    return nullptr;
  auto* self = reinterpret_cast<RootCall*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->vectorcall = root_call;
  PyObject** fields[] = {&self->root, &self->cls,    &self->own,   &self->begins,
                         &self->ends, &self->report, &self->settle};
  PyObject* values[] = {root, cls, own, begins, ends, report, settle};
  for (size_t i = 0; i < 7; ++i) *fields[i] = Py_NewRef(values[i]);
  self->sync = Py_NewRef(Py_None);
  self->errors = PyList_New(0);
  if (self->errors == nullptr) {
    Py_DECREF(self);
    return nullptr;
  }
  return reinterpret_cast<PyObject*>(self);
}

int root_call_traverse(PyObject* object, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<RootCall*>(object);
  Py_VISIT(Py_TYPE(object));
  Py_VISIT(self->root);
  Py_VISIT(self->cls);
  Py_VISIT(self->own);
  Py_VISIT(self->begins);
  Py_VISIT(self->ends);
  Py_VISIT(self->report);
  Py_VISIT(self->settle);
  Py_VISIT(self->sync);
  Py_VISIT(self->errors);
  return 0;
}

int root_call_clear(PyObject* object) {
  auto* self = reinterpret_cast<RootCall*>(object);
  Py_CLEAR(self->root);
  Py_CLEAR(self->cls);
  Py_CLEAR(self->own);
  Py_CLEAR(self->begins);
  Py_CLEAR(self->ends);
  Py_CLEAR(self->report);
  Py_CLEAR(self->settle);
  Py_CLEAR(self->sync);
  Py_CLEAR(self->errors);
  self->lease_left = 0;
  return 0;
}

void root_call_dealloc(PyObject* object) {
  PyTypeObject* type = Py_TYPE(object);
  PyObject_GC_UnTrack(object);
  root_call_clear(object);
  type->tp_free(object);
  Py_DECREF(type);
}

PyObject* root_call_get(PyObject* self, PyObject* obj, PyObject*) {
  if (obj == nullptr || obj == Py_None) return Py_NewRef(self);
  return PyMethod_New(self, obj);  // module.__call__, as a function's would be
}

PyObject* root_call_lease(PyObject* object, PyObject* args) {
  auto* self = reinterpret_cast<RootCall*>(object);
  long long next, count, deadline;
  PyObject* sync;
  if (!PyArg_ParseTuple(args, "LLLO", &next, &count, &deadline, &sync)) return nullptr;
  if (self->root == nullptr) Py_RETURN_NONE;  // cleared: removed
  Py_SETREF(self->sync, Py_NewRef(sync));
  self->lease_next = next;
  self->lease_left = count;
  self->deadline_ns = deadline;
  Py_RETURN_NONE;
}

PyObject* root_call_use(PyObject* object, PyObject* args) {
  auto* self = reinterpret_cast<RootCall*>(object);
  PyObject *begins, *ends;
  if (!PyArg_ParseTuple(args, "OO", &begins, &ends)) return nullptr;
  Py_XSETREF(self->begins, Py_NewRef(begins));
  Py_XSETREF(self->ends, Py_NewRef(ends));
  Py_RETURN_NONE;
}

PyObject* root_call_settle(PyObject* object, PyObject*) {
  auto* self = reinterpret_cast<RootCall*>(object);
  self->lease_left = 0;
  if (self->settle != nullptr && self->errors != nullptr) settle_leased(self);
  Py_RETURN_NONE;
}

PyMethodDef g_root_call_methods[] = {
    {"lease", root_call_lease, METH_VARARGS,
     "lease(next_index, count, deadline_ns, sync): the next iterations record M's step here"},
    {"use", root_call_use, METH_VARARGS, "use(begins, ends): the markers from now on"},
    {"settle", root_call_settle, METH_NOARGS,
     "settle(): end the lease and tell the session the leased iterations done"},
    {nullptr, nullptr, 0, nullptr}};

PyMemberDef g_root_call_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(RootCall, vectorcall), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr}};

PyType_Slot g_root_call_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(root_call_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(root_call_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(root_call_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(root_call_clear)},
    {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
    {Py_tp_descr_get, reinterpret_cast<void*>(root_call_get)},
    {Py_tp_methods, g_root_call_methods},
    {Py_tp_members, g_root_call_members},
    {Py_tp_doc, const_cast<char*>("The root module class's __call__: its iterations' markers")},
    {0, nullptr}};

PyType_Spec g_root_call_spec = {
    "xsp_native.RootCall", sizeof(RootCall), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
        Py_TPFLAGS_METHOD_DESCRIPTOR,
    g_root_call_slots};

// -- trace ids: BLAKE2b-128 of "<prefix><iteration>" for each iteration, as
// ``xsp.tracer.schema.trace_id_for`` computes them one by one (RFC 7693). A continuous session's
// exporter hashes one per request; here without the interpreter lock -------------------------
constexpr uint64_t kBlakeIv[8] = {0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL,
                                  0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
                                  0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL,
                                  0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};
constexpr uint8_t kBlakeSigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

inline uint64_t rotr64(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }

void blake2b_compress(uint64_t h[8], const uint8_t block[128], uint64_t bytes, bool last) {
  uint64_t m[16], v[16];
  for (int i = 0; i < 16; ++i) std::memcpy(&m[i], block + 8 * i, 8);  // little-endian hosts
  for (int i = 0; i < 8; ++i) v[i] = h[i], v[i + 8] = kBlakeIv[i];
  v[12] ^= bytes;
  if (last) v[14] = ~v[14];
  auto g = [&v](int a, int b, int c, int d, uint64_t x, uint64_t y) {
    v[a] += v[b] + x;
    v[d] = rotr64(v[d] ^ v[a], 32);
    v[c] += v[d];
    v[b] = rotr64(v[b] ^ v[c], 24);
    v[a] += v[b] + y;
    v[d] = rotr64(v[d] ^ v[a], 16);
    v[c] += v[d];
    v[b] = rotr64(v[b] ^ v[c], 63);
  };
  for (const auto& s : kBlakeSigma) {
    g(0, 4, 8, 12, m[s[0]], m[s[1]]);
    g(1, 5, 9, 13, m[s[2]], m[s[3]]);
    g(2, 6, 10, 14, m[s[4]], m[s[5]]);
    g(3, 7, 11, 15, m[s[6]], m[s[7]]);
    g(0, 5, 10, 15, m[s[8]], m[s[9]]);
    g(1, 6, 11, 12, m[s[10]], m[s[11]]);
    g(2, 7, 8, 13, m[s[12]], m[s[13]]);
    g(3, 4, 9, 14, m[s[14]], m[s[15]]);
  }
  for (int i = 0; i < 8; ++i) h[i] ^= v[i] ^ v[i + 8];
}

void blake2b_128(const std::string& text, uint8_t out[16]) {
  uint64_t h[8];
  for (int i = 0; i < 8; ++i) h[i] = kBlakeIv[i];
  h[0] ^= 0x01010000ULL ^ 16;  // no key, 16-byte digest
  size_t n = text.size(), at = 0;
  uint8_t block[128];
  while (n - at > 128) {
    blake2b_compress(h, reinterpret_cast<const uint8_t*>(text.data()) + at, at + 128, false);
    at += 128;
  }
  std::memset(block, 0, 128);
  std::memcpy(block, text.data() + at, n - at);
  blake2b_compress(h, block, n, true);
  std::memcpy(out, h, 16);
}

py::bytes trace_ids(const std::string& prefix, py::array_t<int64_t, py::array::c_style> iterations) {
  auto its = iterations.unchecked<1>();
  std::string out(size_t(its.shape(0)) * 16, '\0');
  {
    py::gil_scoped_release unlocked;
    std::string text;
    for (py::ssize_t i = 0; i < its.shape(0); ++i) {
      text = prefix;
      text += std::to_string(its(i));
      blake2b_128(text, reinterpret_cast<uint8_t*>(&out[size_t(i) * 16]));
    }
  }
  return py::bytes(out);
}

void module_info(int64_t index, const std::string& text) {
  auto& t = state();
  Record* r = claim(t);
  if (r == nullptr) return;
  r->seq_nr = index;
  r->aux = -1;
  r->name = intern(t, text);
  r->shapes = r->dtypes = -1;
  r->scope = 0;
  r->start_ns = r->end_ns = now_ns();
  publish(r, kModuleInfo);
}

// -- allocator events: the CPU and CUDA caching allocators report every allocation and free to
// the profiler state in the thread's debug info, as they do to torch.profiler. Ours is a
// profiler state whose configuration says "disabled", so that torch, which reads that slot as
// its own profiler's, sees no profiler running --------------------------------------------------
struct MemoryObserver : torch::profiler::impl::ProfilerStateBase {
  MemoryObserver()
      : ProfilerStateBase(torch::profiler::impl::ProfilerConfig(
            torch::profiler::impl::ProfilerState::Disabled)) {}
  torch::profiler::impl::ActiveProfilerType profilerType() override {
    return torch::profiler::impl::ActiveProfilerType::NONE;
  }
  bool memoryProfilingEnabled() const override { return g_memory.load(std::memory_order_relaxed); }
  void reportMemoryUsage(void*, int64_t bytes, size_t total_allocated, size_t, c10::Device device)
      override {
    if (!g_memory.load(std::memory_order_relaxed)) return;
    auto& t = state();
    Record* r = claim(t);
    if (r == nullptr) return;
    r->seq_nr = bytes;
    r->aux = int64_t(total_allocated);
    r->name = -1;
    r->shapes = int32_t(device.type());
    r->dtypes = int32_t(device.index());
    r->scope = 0;
    r->start_ns = r->end_ns = now_ns();
    publish(r, kMemory);
  }
};

c10::DebugInfoBase* g_observer = nullptr;  // ours, while it is in the thread's debug info

// Allocations of this thread, and of the threads that inherit its state (autograd's engine).
void memory_start() {
  if (g_observer != nullptr) return;
  auto observer = std::make_shared<MemoryObserver>();
  g_observer = observer.get();
  c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, std::move(observer));
  g_memory.store(true);
}

void memory_stop() {
  g_memory.store(false);
  if (g_observer == nullptr) return;
  // a torch.profiler started since sits on top: its state is not ours to take away
  if (c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) == g_observer)
    c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
  g_observer = nullptr;
}

py::dict arena_counts() {
  py::dict out;
  Header* h = g_arena.header;
  if (h == nullptr) return out;
  out["dropped_records"] = h->dropped_records.load();
  out["dropped_strings"] = h->dropped_strings.load();
  out["callback_errors"] = h->callback_errors.load();
  out["chunks_used"] = std::min(h->chunks_used.load(), h->chunk_capacity);
  std::lock_guard<std::mutex> lock(g_error_mutex);
  if (!g_first_error.empty()) out["first_callback_error"] = g_first_error.substr(0, 300);
  return out;
}

#ifdef XSP_WITH_CUPTI
// -- CUPTI ------------------------------------------------------------------------------------
struct Completed {
  uint8_t* buffer;
  size_t valid;
};

struct Cupti {
  std::mutex mutex;
  std::vector<uint8_t*> pool;  // free buffers
  std::vector<uint8_t*> owned;
  std::unordered_map<uint8_t*, size_t> capacity;  // each owned buffer's size
  std::vector<Completed> completed;
  size_t buffer_bytes = 64 << 20;
  uint64_t requested = 0, grown = 0, completed_while_measuring = 0;
  std::atomic<bool> measuring{false};
  bool registered = false;
  std::vector<CUpti_ActivityKind> enabled;
  std::vector<CUpti_ActivityKind> paused;  // enabled, switched off between sampled iterations
  CUpti_SubscriberHandle subscriber = nullptr;  // graph nodes and stream captures, with G
  bool graphs = false;                          // the subscriber's graph callbacks are on
  bool api_callbacks = false;                   // L's API calls from the subscriber's callbacks
  bool correlate = false;  // with api_callbacks: each call's op taken from the thread's open op
  std::string subscribe_error;
} g_cupti;

// L's API calls as the subscriber's callbacks see them (a continuous session: their domains are
// switched off between sampled iterations, where CUPTI's RUNTIME and DRIVER kinds, once
// enabled, cost every CUDA call until CUPTI is finalized).
struct ApiCall {
  int64_t start, end, thread, external;
  uint32_t cbid, correlation;
  int8_t runtime;
};
std::atomic<bool> g_api_recording{false};
std::mutex g_calls_mutex;
std::vector<ApiCall> g_calls;
std::vector<uint8_t> g_quiet_bits[2];  // [driver, runtime]: cbid -> a bookkeeping call

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  std::lock_guard<std::mutex> lock(g_cupti.mutex);
  g_cupti.requested++;
  uint8_t* b = nullptr;
  size_t size_of = g_cupti.buffer_bytes;
  if (!g_cupti.pool.empty()) {
    b = g_cupti.pool.back();
    g_cupti.pool.pop_back();
    size_of = std::min(size_of, g_cupti.capacity[b]);  // the pool's buffers may be larger
  } else {
    b = static_cast<uint8_t*>(aligned_alloc(8, g_cupti.buffer_bytes));
    if (b != nullptr) {
      g_cupti.owned.push_back(b);
      g_cupti.capacity[b] = g_cupti.buffer_bytes;
      g_cupti.grown++;
    }
  }
  *buffer = b;
  *size = b ? size_of : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_cupti.mutex);
  if (g_cupti.measuring.load()) g_cupti.completed_while_measuring++;
  g_cupti.completed.push_back({buffer, valid});
}

void check(CUptiResult status, const char* what) {
  if (status == CUPTI_SUCCESS) return;
  const char* text = nullptr;
  cuptiGetResultString(status, &text);
  throw std::runtime_error(std::string(what) + ": " + (text ? text : "CUPTI error"));
}

CUpti_ActivityKind kind_of(const std::string& name) {
  if (name == "CONCURRENT_KERNEL") return CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  if (name == "MEMCPY") return CUPTI_ACTIVITY_KIND_MEMCPY;
  if (name == "MEMSET") return CUPTI_ACTIVITY_KIND_MEMSET;
  if (name == "RUNTIME") return CUPTI_ACTIVITY_KIND_RUNTIME;
  if (name == "DRIVER") return CUPTI_ACTIVITY_KIND_DRIVER;
  if (name == "MARKER") return CUPTI_ACTIVITY_KIND_MARKER;
  if (name == "EXTERNAL_CORRELATION") return CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
  if (name == "SYNCHRONIZATION") return CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
  if (name == "CUDA_EVENT") return CUPTI_ACTIVITY_KIND_CUDA_EVENT;
  throw std::runtime_error("unknown CUPTI activity kind " + name);
}

std::string api_name(CUpti_CallbackDomain domain, uint32_t cbid) {
  const char* name = nullptr;
  if (cuptiGetCallbackName(domain, cbid, &name) != CUPTI_SUCCESS || name == nullptr) {
    return std::string(domain == CUPTI_CB_DOMAIN_RUNTIME_API ? "cudaAPI#" : "cuAPI#") +
           std::to_string(cbid);
  }
  std::string text(name);
  auto cut = text.rfind("_v");
  if (cut != std::string::npos && cut + 2 < text.size() &&
      text.find_first_not_of("0123456789", cut + 2) == std::string::npos)
    text.resize(cut);  // cudaLaunchKernel_v7000 -> cudaLaunchKernel
  return text;
}

// The bookkeeping calls named in ``quiet``, found by name once per process: a continuous
// session starts CUPTI again for each sampled iteration, and looking ~1,500 names up each time
// would cost more than switching the calls off.
std::vector<std::pair<CUpti_CallbackDomain, uint32_t>> g_quiet;

// Switches off the bookkeeping calls named in ``quiet``; returns how many.
int quiet_calls(CUpti_CallbackDomain domain, uint32_t count, const std::vector<std::string>& quiet) {
  bool known = std::any_of(g_quiet.begin(), g_quiet.end(),
                           [domain](const auto& call) { return call.first == domain; });
  if (!known) {
    for (uint32_t cbid = 1; cbid < count; ++cbid) {
      std::string name = api_name(domain, cbid);
      if (std::find(quiet.begin(), quiet.end(), name) != quiet.end())
        g_quiet.emplace_back(domain, cbid);
    }
  }
  int off = 0;
  for (const auto& [where, cbid] : g_quiet) {
    if (where != domain) continue;
    CUptiResult status = domain == CUPTI_CB_DOMAIN_RUNTIME_API
                             ? cuptiActivityEnableRuntimeApi(cbid, 0)
                             : cuptiActivityEnableDriverApi(cbid, 0);
    if (status == CUPTI_SUCCESS) off++;
  }
  return off;
}

// -- CUDA graphs: which op made each node. A kernel a graph replays has no launch of its own;
// its record carries the node's id, and the node's record here the op, module and phase that
// made it while the graph was captured (or the node it was cloned from, when instantiated).
// Stream capture's begin and end calls, in the runtime's and the driver's API: whichever of the
// two reports a capture reports both its begin and its end, so the count stays balanced.
bool capture_call(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, bool begin) {
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
    if (begin)
      return cbid == CUPTI_RUNTIME_TRACE_CBID_cudaStreamBeginCapture_v10000 ||
             cbid == CUPTI_RUNTIME_TRACE_CBID_cudaStreamBeginCapture_ptsz_v10000 ||
             cbid == CUPTI_RUNTIME_TRACE_CBID_cudaStreamBeginCaptureToGraph_v12030 ||
             cbid == CUPTI_RUNTIME_TRACE_CBID_cudaStreamBeginCaptureToGraph_ptsz_v12030;
    return cbid == CUPTI_RUNTIME_TRACE_CBID_cudaStreamEndCapture_v10000 ||
           cbid == CUPTI_RUNTIME_TRACE_CBID_cudaStreamEndCapture_ptsz_v10000;
  }
  if (begin)
    return cbid == CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture ||
           cbid == CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_ptsz ||
           cbid == CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2 ||
           cbid == CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2_ptsz ||
           cbid == CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph ||
           cbid == CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph_ptsz;
  return cbid == CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture ||
         cbid == CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture_ptsz;
}

void record_graph_node(CUpti_CallbackId cbid, const CUpti_GraphData* graph) {
  uint64_t node = 0;
  if (graph == nullptr || cuptiGetGraphNodeId(graph->node, &node) != CUPTI_SUCCESS) return;
  auto& t = state();
  Record* r = claim(t);
  if (r == nullptr) return;
  r->seq_nr = int64_t(node);
  r->aux = -1;
  r->name = r->shapes = r->dtypes = -1;
  r->scope = 0;
  Kind kind = kGraphNode;
  if (cbid == CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED) {
    uint64_t original = 0;
    if (graph->originalNode != nullptr &&
        cuptiGetGraphNodeId(graph->originalNode, &original) == CUPTI_SUCCESS)
      r->aux = int64_t(original);
    kind = kGraphClone;
  } else if (!t.open_ops.empty()) {
    const auto& op = t.open_ops.back();
    r->name = op.name;
    r->shapes = int32_t(op.module);
    r->dtypes = op.phase;
    r->aux = op.outer;  // an extern call's nodes take its module at conversion
  } else {  // no op open (a capture xsp did not see begin): the module call, if any
    r->shapes = int32_t(current_module());
    r->dtypes = r->shapes >= 0 ? kPhaseForward : kPhaseUnknown;
  }
  r->end_ns = now_ns();
  // a made node's start: its outermost op's instance (0: none), which groups a call's nodes
  r->start_ns = kind == kGraphNode && !t.open_ops.empty() ? t.open_ops.back().instance : r->end_ns;
  publish(r, kind);
}

void record_api_call(CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                     const CUpti_CallbackData* call) {
  int runtime = domain == CUPTI_CB_DOMAIN_RUNTIME_API;
  const auto& quiet = g_quiet_bits[runtime];
  if (cbid < quiet.size() && quiet[cbid]) return;
  uint64_t now = 0;
  cuptiGetTimestamp(&now);
  if (call->callbackSite == CUPTI_API_ENTER) {
    *call->correlationData = now;
    return;
  }
  thread_local int64_t os_thread = int64_t(syscall(SYS_gettid));
  ApiCall a{int64_t(*call->correlationData), int64_t(now), os_thread,
            t_external.empty() ? 0 : int64_t(t_external.back()), cbid, call->correlationId,
            int8_t(runtime)};
  std::lock_guard<std::mutex> lock(g_calls_mutex);
  g_calls.push_back(a);
}

void CUPTIAPI on_cupti_callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                const void* data) {
  try {
    if (domain == CUPTI_CB_DOMAIN_DRIVER_API || domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
      auto* call = static_cast<const CUpti_CallbackData*>(data);
      auto site = call->callbackSite;
      if (g_api_recording.load(std::memory_order_relaxed)) record_api_call(domain, cbid, call);
      if (capture_call(domain, cbid, true) && site == CUPTI_API_EXIT) {
        g_captures.fetch_add(1);
        g_capturing.fetch_add(1);
      } else if (capture_call(domain, cbid, false) && site == CUPTI_API_ENTER) {
        int now = g_capturing.load();
        while (now > 0 && !g_capturing.compare_exchange_weak(now, now - 1)) {
        }
      }
    } else if (domain == CUPTI_CB_DOMAIN_RESOURCE) {
      auto* resource = static_cast<const CUpti_ResourceData*>(data);
      record_graph_node(cbid, static_cast<const CUpti_GraphData*>(resource->resourceDescriptor));
    }
  } catch (const std::exception& e) {
    callback_failed(e.what());
  } catch (...) {
    callback_failed("unknown exception in a CUPTI callback");
  }
}

// Subscribes to graph node creation and stream capture; another CUPTI subscriber in the process
// (torch.profiler's) refuses it, which costs only the graph attribution.
bool subscribe() {
  if (g_cupti.subscriber != nullptr) return true;
  CUptiResult status = cuptiSubscribe(&g_cupti.subscriber, on_cupti_callback, nullptr);
  if (status != CUPTI_SUCCESS) {
    const char* text = nullptr;
    cuptiGetResultString(status, &text);
    g_cupti.subscribe_error = text ? text : "CUPTI error";
    g_cupti.subscriber = nullptr;
    return false;
  }
  g_cupti.subscribe_error.clear();
  return true;
}

// The stream captures' begin and end calls (also after a domain was switched off whole).
void enable_capture_calls() {
  for (auto domain : {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_CB_DOMAIN_DRIVER_API}) {
    uint32_t count = domain == CUPTI_CB_DOMAIN_RUNTIME_API ? CUPTI_RUNTIME_TRACE_CBID_SIZE
                                                           : CUPTI_DRIVER_TRACE_CBID_SIZE;
    for (uint32_t cbid = 1; cbid < count; ++cbid)
      if (capture_call(domain, cbid, true) || capture_call(domain, cbid, false))
        cuptiEnableCallback(1, g_cupti.subscriber, domain, cbid);
  }
}

void subscribe_graphs() {
  if (g_cupti.graphs || !subscribe()) return;
  g_cupti.graphs = true;
  for (auto cbid : {CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED, CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED})
    cuptiEnableCallback(1, g_cupti.subscriber, CUPTI_CB_DOMAIN_RESOURCE, cbid);
  enable_capture_calls();
}

// L's API calls from the subscriber's callbacks on (every runtime and driver call but the
// bookkeeping ones, skipped in the callback) or off (the two domains switched off whole, then
// the stream captures' calls on again if G records graphs).
void api_callbacks_on(bool on, bool captures = true) {
  if (g_cupti.subscriber == nullptr) return;
  g_api_recording.store(on && g_cupti.api_callbacks);
  for (auto domain : {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_CB_DOMAIN_DRIVER_API})
    check(cuptiEnableDomain(on ? 1 : 0, g_cupti.subscriber, domain), "CUPTI API callbacks");
  if (g_cupti.graphs && (on ? !g_cupti.api_callbacks : captures)) enable_capture_calls();
}

void unsubscribe_graphs() {
  if (g_cupti.subscriber == nullptr) return;
  g_api_recording.store(false);
  cuptiUnsubscribe(g_cupti.subscriber);
  g_cupti.subscriber = nullptr;
  g_cupti.graphs = g_cupti.api_callbacks = false;
  g_capturing.store(0);
  std::lock_guard<std::mutex> lock(g_capture_mutex);
  g_capture_modules.clear();
}

bool pushes_correlation() {
  return std::find(g_cupti.enabled.begin(), g_cupti.enabled.end(),
                   CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) != g_cupti.enabled.end();
}

// The bookkeeping calls named in ``quiet`` as bits by cbid, for the API callbacks to skip.
void quiet_bits(const std::vector<std::string>& quiet) {
  for (int runtime = 0; runtime < 2; ++runtime) {
    auto domain = runtime ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API;
    uint32_t count = runtime ? CUPTI_RUNTIME_TRACE_CBID_SIZE : CUPTI_DRIVER_TRACE_CBID_SIZE;
    auto& bits = g_quiet_bits[runtime];
    if (!bits.empty()) continue;
    bits.assign(count, 0);
    for (uint32_t cbid = 1; cbid < count; ++cbid)
      bits[cbid] = std::find(quiet.begin(), quiet.end(), api_name(domain, cbid)) != quiet.end();
  }
}

// ``api_callbacks``: the RUNTIME and DRIVER kinds come from the subscriber's callbacks instead
// of CUPTI's activity records, and each call's op from the thread's open op (no
// EXTERNAL_CORRELATION records): what a continuous session can switch off between sampled
// iterations (``cupti_pause``) at no cost to the CUDA calls made meanwhile.
int cupti_start(const std::vector<std::string>& kinds, uint64_t buffer_bytes, int64_t pool_buffers,
                const std::vector<std::string>& quiet, bool api_callbacks = false) {
  int quieted = 0;
  if (!g_cupti.registered) {
    check(cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM), "CUPTI thread ids");
    {
      std::lock_guard<std::mutex> lock(g_cupti.mutex);
      g_cupti.buffer_bytes = buffer_bytes;
      g_cupti.requested = g_cupti.grown = g_cupti.completed_while_measuring = 0;
      for (int64_t i = int64_t(g_cupti.owned.size()); i < pool_buffers; ++i) {
        auto* b = static_cast<uint8_t*>(aligned_alloc(8, buffer_bytes));
        if (b == nullptr) break;
        g_cupti.owned.push_back(b);
        g_cupti.capacity[b] = buffer_bytes;
        g_cupti.pool.push_back(b);
      }
    }
    check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "CUPTI callbacks");
    g_cupti.registered = true;
  }
  bool correlate = false;
  for (const auto& name : kinds) {
    CUpti_ActivityKind kind = kind_of(name);
    if (api_callbacks && (kind == CUPTI_ACTIVITY_KIND_RUNTIME || kind == CUPTI_ACTIVITY_KIND_DRIVER ||
                          kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION)) {
      correlate = correlate || kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
      if (kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION || g_cupti.api_callbacks) continue;
      if (!subscribe())
        throw std::runtime_error("CUPTI's callback subscriber: " + g_cupti.subscribe_error);
      quiet_bits(quiet);
      g_cupti.api_callbacks = true;
      api_callbacks_on(true);
      continue;
    }
    if (std::find(g_cupti.enabled.begin(), g_cupti.enabled.end(), kind) != g_cupti.enabled.end())
      continue;
    check(cuptiActivityEnable(kind), ("CUPTI cannot record " + name).c_str());
    g_cupti.enabled.push_back(kind);
    if (kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) subscribe_graphs();
    if (!quiet.empty() && kind == CUPTI_ACTIVITY_KIND_RUNTIME)
      quieted += quiet_calls(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_SIZE, quiet);
    if (!quiet.empty() && kind == CUPTI_ACTIVITY_KIND_DRIVER)
      quieted += quiet_calls(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_SIZE, quiet);
  }
  if (correlate) g_cupti.correlate = true;
  g_push_cupti.store(!g_cupti.api_callbacks);
  g_push_correlation.store(pushes_correlation() || g_cupti.correlate);
  return quieted;
}

void cupti_measuring(bool on) { g_cupti.measuring.store(on); }

uint64_t cupti_flush();

// A continuous session between its sampled iterations: the kinds and the API callbacks switched
// off, CUPTI left initialized (its start and finalize cost about 11 ms; kinds merely disabled
// cost every later CUDA call for some kinds, RUNTIME, DRIVER and SYNCHRONIZATION among them,
// until finalize, which is why ``api_callbacks`` records the API calls from callbacks);
// ``flush``: every record so far to the completed queue. Returns the records CUPTI dropped.
uint64_t cupti_pause(bool captures = true, bool flush = true) {
  g_push_correlation.store(false);
  if (g_cupti.api_callbacks || !captures) api_callbacks_on(false, captures);
  // unflushed, the records wait in CUPTI's buffer for the next flush (a batch boundary): the
  // next sampled iteration writes on into it rather than paying for a fresh buffer
  uint64_t dropped = flush ? cupti_flush() : 0;
  for (auto kind : g_cupti.enabled) {
    cuptiActivityDisable(kind);
    if (std::find(g_cupti.paused.begin(), g_cupti.paused.end(), kind) == g_cupti.paused.end())
      g_cupti.paused.push_back(kind);
  }
  g_cupti.enabled.clear();
  return dropped;
}

// The next sampled iteration: what ``cupti_pause`` switched off, on again.
void cupti_resume() {
  for (auto kind : g_cupti.paused) {
    check(cuptiActivityEnable(kind), "CUPTI cannot record again");
    g_cupti.enabled.push_back(kind);
  }
  g_cupti.paused.clear();
  if (g_cupti.api_callbacks) {
    api_callbacks_on(true);
  } else if (g_cupti.graphs) {  // paused without the stream captures' callbacks
    enable_capture_calls();
  }
  g_push_correlation.store(pushes_correlation() || g_cupti.correlate);
}

// A continuous session's batch boundary, between iterations, with CUPTI running: every record
// so far to the completed queue (cupti_decode takes them); returns the records CUPTI dropped
// since last asked.
uint64_t cupti_flush() {
  check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "CUPTI flush");
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  return dropped;
}

uint64_t cupti_stop() {
  g_push_correlation.store(false);
  if (g_cupti.api_callbacks) api_callbacks_on(false);
  uint64_t dropped = cupti_flush();
  for (auto kind : g_cupti.enabled) cuptiActivityDisable(kind);
  g_cupti.enabled.clear();
  g_cupti.paused.clear();
  g_cupti.correlate = false;
  g_push_cupti.store(true);
  unsubscribe_graphs();
  return dropped;
}

// The program's own profiler (torch.profiler with device activities) takes CUPTI: every record so
// far to the completed queue, xsp's kinds off, its subscriber released (Kineto subscribes once and
// never retries), the calls xsp quieted recorded again, and xsp's buffer callbacks to be
// registered anew when it starts again (Kineto registers its own). Returns the records dropped.
uint64_t cupti_step_aside() {
  uint64_t dropped = cupti_stop();
  for (const auto& [domain, cbid] : g_quiet) {
    if (domain == CUPTI_CB_DOMAIN_RUNTIME_API)
      cuptiActivityEnableRuntimeApi(cbid, 1);
    else
      cuptiActivityEnableDriverApi(cbid, 1);
  }
  g_cupti.registered = false;
  return dropped;
}

uint64_t cupti_timestamp() {
  uint64_t t = 0;
  check(cuptiGetTimestamp(&t), "CUPTI timestamp");
  return t;
}

void cupti_finalize() {
  if (!g_cupti.registered) return;
  g_cupti.registered = false;
  check(cuptiFinalize(), "CUPTI finalize");
}

template <typename T>
py::bytes column(const std::vector<T>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

struct Strings {
  std::unordered_map<std::string, int32_t> index;
  std::vector<std::string> values;
  int32_t operator()(const char* text) {
    std::string key(text ? text : "");
    auto found = index.find(key);
    if (found != index.end()) return found->second;
    int32_t id = int32_t(values.size());
    index.emplace(key, id);
    values.push_back(std::move(key));
    return id;
  }
};

// CUPTI's records decoded into columns, gathered over the collections until the next decode (a
// continuous session collects after each sampled iteration, before CUPTI is finalized, and
// decodes at its batch boundary).
struct Decoded {
  std::vector<int8_t> g_kind, g_copy;
  std::vector<int32_t> g_name;
  std::vector<int64_t> g_start, g_end, g_corr, g_device, g_stream, g_regs, g_shared, g_bytes;
  std::vector<int32_t> g_grid, g_block;  // x,y,z triples
  std::vector<int64_t> g_graph_node;     // the graph node a kernel replays, 0 for a launch
  std::vector<int8_t> a_kind;
  std::vector<int32_t> a_name;
  std::vector<int64_t> a_start, a_end, a_corr, a_thread;
  std::vector<int32_t> m_domain, m_name;
  std::vector<int64_t> m_start, m_end, m_thread;
  std::vector<int64_t> x_corr, x_external;
  // the stream and CUDA event an API call names: its synchronization (stream, event and context
  // syncs, stream waits on an event) or its event record
  std::vector<int64_t> n_corr, n_stream, n_event;
  std::vector<int8_t> n_type;  // CUpti_ActivitySynchronizationType; -1: an event record
  std::unordered_map<uint32_t, size_t> open_markers;
  std::unordered_map<uint64_t, int32_t> api_names;
  Strings kernel_names, api_strings, marker_names, domains;
  uint64_t records = 0, unknown = 0, unpaired = 0, buffers = 0;
  // CUPTI numbers its correlation ids from 1 again each time it starts: each run's ids go on
  // from the last run's largest, so that a kernel never meets another run's launch
  int64_t correlation_base = 0, correlation_max = 0;
} g_decoded;

// Every completed buffer, decoded into ``g_decoded`` with ``offset_ns`` added to its times (a
// continuous session's: CUPTI's clock to the Unix epoch, measured while CUPTI ran);
// ``run_ended``: CUPTI stopped after these records, and the next ones' correlation ids start
// again. The buffers go back to the pool. Returns how many buffers it decoded.
uint64_t cupti_collect(int64_t offset_ns, bool run_ended) {
  std::vector<Completed> buffers;
  {
    std::lock_guard<std::mutex> lock(g_cupti.mutex);
    buffers.swap(g_cupti.completed);
  }
  std::vector<ApiCall> calls;
  {
    std::lock_guard<std::mutex> lock(g_calls_mutex);
    calls.swap(g_calls);
  }
  Decoded& d = g_decoded;
  d.buffers += buffers.size();
  auto correlation = [&d](uint32_t id) {
    int64_t unique = int64_t(id) + d.correlation_base;
    d.correlation_max = std::max(d.correlation_max, unique);
    return unique;
  };
  auto api_name_code = [&d](bool runtime, uint32_t cbid) {
    uint64_t key = (uint64_t(runtime) << 32) | cbid;
    auto found = d.api_names.find(key);
    if (found != d.api_names.end()) return found->second;
    std::string text =
        api_name(runtime ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API, cbid);
    int32_t name = d.api_strings(text.c_str());
    d.api_names.emplace(key, name);
    return name;
  };
  for (const auto& a : calls) {  // recorded by the API callbacks (``api_callbacks``)
    d.a_kind.push_back(a.runtime ? 0 : 1);
    d.a_name.push_back(api_name_code(a.runtime, a.cbid));
    d.a_start.push_back(a.start + offset_ns);
    d.a_end.push_back(a.end + offset_ns);
    int64_t unique = correlation(a.correlation);
    d.a_corr.push_back(unique);
    d.a_thread.push_back(a.thread);
    if (a.external != 0) {
      d.x_corr.push_back(unique);
      d.x_external.push_back(a.external);
    }
  }
  for (auto& done : buffers) {
    CUpti_Activity* record = nullptr;
    while (cuptiActivityGetNextRecord(done.buffer, done.valid, &record) == CUPTI_SUCCESS) {
      d.records++;
      switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        case CUPTI_ACTIVITY_KIND_KERNEL: {
          // graphNodeId sits where version 5 put it in every later version
          auto* k = reinterpret_cast<CUpti_ActivityKernel5*>(record);
          d.g_graph_node.push_back(int64_t(k->graphNodeId));
          d.g_kind.push_back(0);
          d.g_name.push_back(d.kernel_names(k->name ? k->name : "?"));
          d.g_start.push_back(int64_t(k->start) + offset_ns);
          d.g_end.push_back(int64_t(k->end) + offset_ns);
          d.g_corr.push_back(correlation(k->correlationId));
          d.g_device.push_back(k->deviceId);
          d.g_stream.push_back(k->streamId);
          d.g_grid.insert(d.g_grid.end(), {k->gridX, k->gridY, k->gridZ});
          d.g_block.insert(d.g_block.end(), {k->blockX, k->blockY, k->blockZ});
          d.g_regs.push_back(k->registersPerThread);
          d.g_shared.push_back(int64_t(k->staticSharedMemory) + int64_t(k->dynamicSharedMemory));
          d.g_bytes.push_back(-1);
          d.g_copy.push_back(-1);
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          // graphNodeId (a copy replayed from a graph) sits where version 5 put it since
          auto* c = reinterpret_cast<CUpti_ActivityMemcpy5*>(record);
          d.g_graph_node.push_back(int64_t(c->graphNodeId));
          d.g_kind.push_back(1);
          d.g_name.push_back(-1);
          d.g_start.push_back(int64_t(c->start) + offset_ns);
          d.g_end.push_back(int64_t(c->end) + offset_ns);
          d.g_corr.push_back(correlation(c->correlationId));
          d.g_device.push_back(c->deviceId);
          d.g_stream.push_back(c->streamId);
          d.g_grid.insert(d.g_grid.end(), {0, 0, 0});
          d.g_block.insert(d.g_block.end(), {0, 0, 0});
          d.g_regs.push_back(-1);
          d.g_shared.push_back(-1);
          d.g_bytes.push_back(int64_t(c->bytes));
          d.g_copy.push_back(int8_t(c->copyKind));
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          // and a set's where version 3 put it
          auto* s = reinterpret_cast<CUpti_ActivityMemset3*>(record);
          d.g_graph_node.push_back(int64_t(s->graphNodeId));
          d.g_kind.push_back(2);
          d.g_name.push_back(-1);
          d.g_start.push_back(int64_t(s->start) + offset_ns);
          d.g_end.push_back(int64_t(s->end) + offset_ns);
          d.g_corr.push_back(correlation(s->correlationId));
          d.g_device.push_back(s->deviceId);
          d.g_stream.push_back(s->streamId);
          d.g_grid.insert(d.g_grid.end(), {0, 0, 0});
          d.g_block.insert(d.g_block.end(), {0, 0, 0});
          d.g_regs.push_back(-1);
          d.g_shared.push_back(-1);
          d.g_bytes.push_back(int64_t(s->bytes));
          d.g_copy.push_back(-1);
          break;
        }
        case CUPTI_ACTIVITY_KIND_RUNTIME:
        case CUPTI_ACTIVITY_KIND_DRIVER: {
          auto* a = reinterpret_cast<CUpti_ActivityAPI*>(record);
          bool runtime = record->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
          d.a_kind.push_back(runtime ? 0 : 1);
          d.a_name.push_back(api_name_code(runtime, a->cbid));
          d.a_start.push_back(int64_t(a->start) + offset_ns);
          d.a_end.push_back(int64_t(a->end) + offset_ns);
          d.a_corr.push_back(correlation(a->correlationId));
          d.a_thread.push_back(a->threadId);
          break;
        }
        case CUPTI_ACTIVITY_KIND_MARKER: {
          auto* m = reinterpret_cast<CUpti_ActivityMarker2*>(record);
          if (m->flags & CUPTI_ACTIVITY_FLAG_MARKER_START) {
            d.open_markers[m->id] = d.m_start.size();
            d.m_domain.push_back(d.domains(m->domain ? m->domain : ""));
            d.m_name.push_back(d.marker_names(m->name ? m->name : ""));
            d.m_start.push_back(int64_t(m->timestamp) + offset_ns);
            d.m_end.push_back(0);
            d.m_thread.push_back(int64_t(m->objectId.pt.threadId));
          } else if (m->flags & CUPTI_ACTIVITY_FLAG_MARKER_END) {
            auto found = d.open_markers.find(m->id);
            if (found == d.open_markers.end()) {
              d.unpaired++;
            } else {
              d.m_end[found->second] = int64_t(m->timestamp) + offset_ns;
              d.open_markers.erase(found);
            }
          }
          break;
        }
        case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
          auto* x = reinterpret_cast<CUpti_ActivityExternalCorrelation*>(record);
          if (x->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) {
            d.x_corr.push_back(correlation(x->correlationId));
            d.x_external.push_back(int64_t(x->externalId));
          }
          break;
        }
        case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
          // the fields read here sit where version 1 put them in every later version
          auto* y = reinterpret_cast<CUpti_ActivitySynchronization*>(record);
          d.n_corr.push_back(correlation(y->correlationId));
          d.n_type.push_back(int8_t(y->type));
          d.n_stream.push_back(y->streamId == CUPTI_SYNCHRONIZATION_INVALID_VALUE
                                 ? -1 : int64_t(y->streamId));
          d.n_event.push_back(y->cudaEventId == CUPTI_SYNCHRONIZATION_INVALID_VALUE
                                ? -1 : int64_t(y->cudaEventId));
          break;
        }
        case CUPTI_ACTIVITY_KIND_CUDA_EVENT: {
          auto* e = reinterpret_cast<CUpti_ActivityCudaEvent*>(record);
          d.n_corr.push_back(correlation(e->correlationId));
          d.n_type.push_back(-1);
          d.n_stream.push_back(e->streamId);
          d.n_event.push_back(e->eventId);
          break;
        }
        default:
          d.unknown++;
      }
    }
    std::lock_guard<std::mutex> lock(g_cupti.mutex);
    g_cupti.pool.push_back(done.buffer);
  }
  if (run_ended) d.correlation_base = d.correlation_max + 1;
  return buffers.size();
}

// What was collected since the last decode, and every completed buffer (with ``offset_ns``), as
// columns.
py::dict cupti_decode(int64_t offset_ns) {
  cupti_collect(offset_ns, false);
  Decoded d;
  std::swap(d, g_decoded);
  py::dict gpu, api, markers, external, counts, named;
  gpu["kind"] = column(d.g_kind);
  gpu["name"] = column(d.g_name);
  gpu["names"] = d.kernel_names.values;
  gpu["start_ns"] = column(d.g_start);
  gpu["end_ns"] = column(d.g_end);
  gpu["correlation"] = column(d.g_corr);
  gpu["device"] = column(d.g_device);
  gpu["stream"] = column(d.g_stream);
  gpu["grid"] = column(d.g_grid);
  gpu["block"] = column(d.g_block);
  gpu["registers"] = column(d.g_regs);
  gpu["shared_memory"] = column(d.g_shared);
  gpu["bytes"] = column(d.g_bytes);
  gpu["copy_kind"] = column(d.g_copy);
  gpu["graph_node"] = column(d.g_graph_node);
  api["kind"] = column(d.a_kind);
  api["name"] = column(d.a_name);
  api["names"] = d.api_strings.values;
  api["start_ns"] = column(d.a_start);
  api["end_ns"] = column(d.a_end);
  api["correlation"] = column(d.a_corr);
  api["thread"] = column(d.a_thread);
  markers["domain"] = column(d.m_domain);
  markers["domains"] = d.domains.values;
  markers["name"] = column(d.m_name);
  markers["names"] = d.marker_names.values;
  markers["start_ns"] = column(d.m_start);
  markers["end_ns"] = column(d.m_end);
  markers["thread"] = column(d.m_thread);
  external["correlation"] = column(d.x_corr);
  external["external"] = column(d.x_external);
  named["correlation"] = column(d.n_corr);
  named["type"] = column(d.n_type);
  named["stream"] = column(d.n_stream);
  named["event"] = column(d.n_event);
  {
    std::lock_guard<std::mutex> lock(g_cupti.mutex);
    counts["buffers"] = d.buffers;
    counts["buffers_requested"] = g_cupti.requested;
    counts["buffers_grown"] = g_cupti.grown;
    counts["buffers_completed_while_measuring"] = g_cupti.completed_while_measuring;
    if (!g_cupti.subscribe_error.empty()) counts["graph_nodes_unrecorded"] = g_cupti.subscribe_error;
  }
  counts["records"] = d.records;
  counts["unknown_records"] = d.unknown;
  counts["unpaired_markers"] = d.unpaired + d.open_markers.size();
  py::dict out;
  out["gpu"] = gpu;
  out["api"] = api;
  out["markers"] = markers;
  out["external"] = external;
  out["named"] = named;
  out["counts"] = counts;
  return out;
}
#endif  // XSP_WITH_CUPTI

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "xsp's native capture core";
  pthread_atfork(nullptr, nullptr, on_fork_child);
  m.attr("ARENA_VERSION") = kVersion;
  m.attr("WITH_CUPTI") =
#ifdef XSP_WITH_CUPTI
      true;
#else
      false;
#endif
  m.def("arena_open", &arena_open, py::arg("path"), py::arg("capacity_bytes"));
  m.def("arena_close", &arena_close);
  m.def("arena_counts", &arena_counts);
  m.def("ops_start", &ops_start, py::arg("record_shapes"));
  m.def("ops_sources", [](bool on) { g_record_sources.store(on); }, py::arg("on"));
  m.def("ops_stop", &ops_stop);
  m.def("ops_shapes", &ops_shapes, py::arg("on"));
  m.def("module_enter", &module_enter);
  m.def("module_exit", &module_exit);
  m.def("modules_unwind", &modules_unwind);
  m.def("current_module", &current_module);
  m.def("memory_start", &memory_start);
  m.def("memory_stop", &memory_stop);
  m.def("range_begin", &range_begin);
  m.def("range_end", &range_end);
  m.def("step", &step);
  m.def("module_info", &module_info);
  m.def("now_ns", &now_ns);
  m.def("trace_ids", &trace_ids, py::arg("prefix"), py::arg("iterations"));
  if (PyModule_AddFunctions(m.ptr(), g_step_methods) != 0) throw py::error_already_set();
  g_call_name = PyUnicode_InternFromString("__call__");
  g_otel_name = PyUnicode_InternFromString("opentelemetry.trace");
  PyObject* root_call_type = PyType_FromSpec(&g_root_call_spec);
  if (root_call_type == nullptr || g_call_name == nullptr || g_otel_name == nullptr)
    throw py::error_already_set();
  m.attr("RootCall") = py::reinterpret_steal<py::object>(root_call_type);
#ifdef XSP_WITH_CUPTI
  m.def("cupti_start", &cupti_start, py::arg("kinds"), py::arg("buffer_bytes"),
        py::arg("pool_buffers"), py::arg("quiet"), py::arg("api_callbacks") = false);
  m.def("cupti_measuring", &cupti_measuring);
  m.def("cupti_stop", &cupti_stop);
  m.def("cupti_pause", &cupti_pause, py::arg("captures") = true, py::arg("flush") = true);
  m.def("cupti_resume", &cupti_resume);
  m.def("cupti_step_aside", &cupti_step_aside);
  m.def("cupti_flush", &cupti_flush);
  m.def("cupti_decode", &cupti_decode, py::arg("offset_ns") = 0);
  m.def("cupti_collect", &cupti_collect, py::arg("offset_ns"), py::arg("run_ended"));
  m.def("cupti_timestamp", &cupti_timestamp);
  m.def("cupti_finalize", &cupti_finalize);
  m.def("graph_captures_open", []() { return g_capturing.load(); });
#endif
}
