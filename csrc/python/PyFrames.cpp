#include "python/PyFrames.h"

#include "guard/collective/CallSite.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>  // before CPython's internal headers, whose macros break it (a unity unit includes it later)
#include <cstring>
#include <unordered_map>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
// 3.11's interpreter frame records, read by the call-site capture (see
// siteOfThread). Their layout is fixed within a minor version.
#define Py_BUILD_CORE
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#endif

namespace torch_ext::py {

namespace {

// A library named by its folder: frames under `prefix` belong to `name`.
struct LibraryRoot {
  std::string prefix;
  std::string name;
};

std::vector<LibraryRoot> g_internal;  // torch, torch_ext
std::vector<LibraryRoot> g_listed;    // TORCH_EXT_LIBRARY_PACKAGES
std::vector<std::string> g_stdlib;
std::vector<std::string> g_site;
std::atomic<bool> g_callSites{true};

bool startsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// The first path component after `prefix` in `file`, without ".py": the
// top-level package or module of an installed file.
std::string topLevelName(const std::string& file, size_t from) {
  size_t end = file.find('/', from);
  std::string name = file.substr(from, end == std::string::npos ? std::string::npos : end - from);
  if (end == std::string::npos) {
    auto dot = name.find('.');
    if (dot != std::string::npos) name.resize(dot);
  }
  return name.empty() ? "site-packages" : name;
}

// --- call sites -------------------------------------------------------------

// A call site is the user's frame and the innermost framework frame above it
// (code object and instruction of each; the framework half is null when the
// user's code called torch directly), then its path: the user frames that
// called it, up to kCallers (issue 67: look-alike collectives issued through
// one helper differ a frame or two up, at the line that called the helper).
constexpr size_t kCallers = 3;
// How many frames above the user's frame a capture reads at most for its
// callers: a path is a few user frames up, not the whole stack (under a
// framework, user frames are far apart; what is past this bound is left out).
constexpr int kCallerWalk = 16;

struct SiteKey {
  PyCodeObject* code;
  int lasti;
  PyCodeObject* viaCode;
  int viaLasti;
  std::array<PyCodeObject*, kCallers> callerCode{};
  std::array<int, kCallers> callerLasti{};
  bool operator==(const SiteKey& o) const {
    return code == o.code && lasti == o.lasti && viaCode == o.viaCode && viaLasti == o.viaLasti &&
           callerCode == o.callerCode && callerLasti == o.callerLasti;
  }
};
struct SiteKeyHash {
  size_t operator()(const SiteKey& k) const {
    size_t h = std::hash<void*>()(k.code) ^ (static_cast<size_t>(k.lasti) * 0x9e3779b97f4a7c15ULL);
    h ^= (std::hash<void*>()(k.viaCode) * 31u) ^ (static_cast<size_t>(k.viaLasti) * 0xc2b2ae3d27d4eb4fULL);
    for (size_t i = 0; i < kCallers; ++i) {
      h = h * 0x100000001b3ULL ^ std::hash<void*>()(k.callerCode[i]) ^ static_cast<size_t>(k.callerLasti[i]);
    }
    return h;
  }
};

// Both caches hold a reference to their code objects, so an address is never
// reused for another code object while cached. Accessed only with the GIL.
std::unordered_map<PyCodeObject*, CodeInfo>* g_codes = nullptr;
std::unordered_map<SiteKey, uint32_t, SiteKeyHash>* g_sites = nullptr;

// siteOfStack<false>: a frame or a site this thread has not seen with the GIL.
constexpr uint32_t kMiss = UINT32_MAX;

// What the GIL-held path decided, per thread, read without the GIL (issue 70):
// torch's binding releases the GIL before a collective reaches the guard, and
// taking it back for the call site was a second GIL hand-off per collective
// (with another Python thread running, a wait of up to the switch interval).
// Only the owning thread touches its copy. Kinds are copied, not pointed to:
// setListedLibraries frees the global cache's entries, and bumps the epoch so
// that each thread drops its copy before its next capture.
class ThreadSites {
 public:
  // Drops what was learnt under an older epoch (setListedLibraries).
  void sync(uint64_t epoch) {
    if (epoch_ == epoch) return;
    memo_.fill(Slot{});
    kinds_.clear();
    sites_.clear();
    lastId_ = kMiss;
    epoch_ = epoch;
  }
  bool kind(PyCodeObject* code, FrameKind* out) {
    Slot& slot = memo_[(reinterpret_cast<uintptr_t>(code) >> 4) % memo_.size()];
    if (slot.code != code) {
      auto it = kinds_.find(code);
      if (it == kinds_.end()) return false;
      slot = Slot{code, it->second};
    }
    *out = slot.kind;
    return true;
  }
  void learn(PyCodeObject* code, FrameKind kind) {
    kinds_.emplace(code, kind);
  }
  uint32_t site(const SiteKey& key) {
    if (lastId_ != kMiss && key == lastKey_) return lastId_;
    auto it = sites_.find(key);
    if (it == sites_.end()) return kMiss;
    lastKey_ = key;
    lastId_ = it->second;
    return lastId_;
  }
  void learn(const SiteKey& key, uint32_t id) {
    sites_.emplace(key, id);
  }

 private:
  // A direct-mapped memo in front of the map: a loop's few code objects are
  // found without hashing.
  struct Slot {
    PyCodeObject* code = nullptr;
    FrameKind kind = FrameKind::Core;
  };
  uint64_t epoch_ = 0;
  std::array<Slot, 64> memo_{};
  std::unordered_map<PyCodeObject*, FrameKind> kinds_;
  std::unordered_map<SiteKey, uint32_t, SiteKeyHash> sites_;
  SiteKey lastKey_{};
  uint32_t lastId_ = kMiss;
};

// Out of line: the caller keeps the address. Inlined, -O1 reads the thread-local
// address anew (__tls_get_addr) at nearly every use.
[[gnu::noinline]] ThreadSites& threadSites() {
  thread_local ThreadSites sites;
  return sites;
}
std::atomic<uint64_t> g_epoch{1};  // bumped by setListedLibraries

[[maybe_unused]] int frameLasti(PyFrameObject* frame) {  // used where the frame walk is the public API
#if PY_VERSION_HEX >= 0x030B0000
  return PyFrame_GetLasti(frame);
#else
  return PyFrame_GetLineNumber(frame);
#endif
}

// One frame of a call-site walk. The code object is borrowed: every frame on
// the walking thread's own stack is executing, so its code object lives at
// least as long as the walk. `lasti` is the instruction offset in bytes (the
// line number before Python 3.11).
struct WalkedFrame {
  PyCodeObject* code = nullptr;
  int lasti = -1;
  const CodeInfo* info = nullptr;
};

int lineAt(PyCodeObject* code, int lasti) {
#if PY_VERSION_HEX >= 0x030B0000
  return PyCode_Addr2Line(code, lasti);
#else
  (void)code;
  return lasti;
#endif
}

// A site first seen in this process: its frames interned, the cache keeping
// its code objects alive. GIL held.
uint32_t internSite(const SiteKey& key, const WalkedFrame& user, const WalkedFrame& via,
                    const std::array<WalkedFrame, kCallers>& callers, size_t nCallers) {
  std::vector<Frame> frames{
      Frame{user.info->filename, lineAt(user.code, user.lasti), user.info->function, user.info->library}};
  if (via.code != nullptr) {
    frames.push_back(Frame{via.info->filename, lineAt(via.code, via.lasti), via.info->function, via.info->library});
  }
  for (size_t i = 0; i < nCallers; ++i) {
    const WalkedFrame& c = callers[i];
    frames.push_back(Frame{c.info->filename, lineAt(c.code, c.lasti), c.info->function, c.info->library});
  }
  const uint32_t id = CallSites::instance().intern(frames);
  Py_INCREF(user.code);
  Py_XINCREF(via.code);
  for (size_t i = 0; i < nCallers; ++i) Py_INCREF(callers[i].code);
  g_sites->emplace(key, id);
  return id;
}

// The class of a walked frame's code: with the GIL from the global cache (and
// kept for this thread), without it from this thread's copy only (nullopt: not
// seen here yet).
template <bool kGil>
bool kindOf(ThreadSites& t, WalkedFrame* f, FrameKind* kind) {
  if constexpr (kGil) {
    f->info = &codeInfo(f->code);
    *kind = f->info->kind;
    t.learn(f->code, *kind);
    return true;
  } else {
    return t.kind(f->code, kind);
  }
}

// Walks from the innermost frame (`next` yields them, innermost first) to the
// first user frame, remembering the innermost framework frame on the way. Per
// frame this costs one lookup of the code object's cached decision; the strings
// are built once per distinct site, with the GIL. With no user frame on the
// stack (a collective issued entirely by library code) the innermost framework
// frame is the call site. Without the GIL (kGil false) it reads this thread's
// copies only and returns kMiss where they do not know a frame or the site.
template <bool kGil, typename Next>
uint32_t siteOfStack(ThreadSites& t, Next&& next) {
  WalkedFrame f, user, via;
  FrameKind kind = FrameKind::Core;
  while (next(&f)) {
    if (!kindOf<kGil>(t, &f, &kind)) return kMiss;
    if (kind == FrameKind::User) {
      user = f;
      break;
    }
    if (kind == FrameKind::Framework && via.code == nullptr) via = f;
  }
  std::array<WalkedFrame, kCallers> callers{};
  size_t nCallers = 0;
  if (user.code == nullptr) {
    if (via.code == nullptr) return 0;
    user = via;  // no user frame: the framework frame stands alone
    via = WalkedFrame{};
  } else {
    // The user frames that called it (the program's top level included).
    for (int walked = 0; nCallers < kCallers && walked < kCallerWalk && next(&f); ++walked) {
      if (!kindOf<kGil>(t, &f, &kind)) return kMiss;
      if (kind == FrameKind::User) callers[nCallers++] = f;
    }
  }
  SiteKey key{user.code, user.lasti, via.code, via.code != nullptr ? via.lasti : -1};
  for (size_t i = 0; i < nCallers; ++i) {
    key.callerCode[i] = callers[i].code;
    key.callerLasti[i] = callers[i].lasti;
  }
  if (const uint32_t id = t.site(key); id != kMiss || !kGil) return id;
  auto it = g_sites->find(key);
  const uint32_t id = it != g_sites->end() ? it->second : internSite(key, user, via, callers, nCallers);
  t.learn(key, id);
  return id;
}

// The call site of the thread whose state is `ts`, from its own frames: with
// the GIL, or (kGil false) while that thread is itself in a C++ call with the
// GIL released. Its frame records do not change then: it runs no Python until
// the call returns, and only it runs its frames.
template <bool kGil>
uint32_t siteOfThread(ThreadSites& t, PyThreadState* ts) {
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
  // CPython 3.11: read the interpreter's own frame records. The public route
  // (PyEval_GetFrame, PyFrame_GetBack) turns every frame it passes into a
  // frame object, which the interpreter must then keep and tear down with the
  // frame: most of the cost of a capture (issue 11). This skips incomplete
  // frames exactly as PyFrame_GetBack does, and yields the same instruction
  // offsets as PyFrame_GetLasti.
  _PyInterpreterFrame* cur = ts->cframe->current_frame;
  return siteOfStack<kGil>(t, [&cur](WalkedFrame* f) {
    while (cur != nullptr && _PyFrame_IsIncomplete(cur)) cur = cur->previous;
    if (cur == nullptr) return false;
    const int lasti = _PyInterpreterFrame_LASTI(cur);
    f->code = cur->f_code;
    f->lasti = lasti < 0 ? -1 : lasti * static_cast<int>(sizeof(_Py_CODEUNIT));
    cur = cur->previous;
    return true;
  });
#else
  // Other versions: the public API, with the GIL only. Frame objects of
  // executing frames are kept by the interpreter, so the references taken
  // here are dropped at once.
  (void)ts;
  if constexpr (!kGil) return kMiss;
  PyFrameObject* cur = PyEval_GetFrame();  // borrowed
  return siteOfStack<kGil>(t, [&cur](WalkedFrame* f) {
    if (cur == nullptr) return false;
    PyCodeObject* code = PyFrame_GetCode(cur);
    Py_DECREF(code);
    f->code = code;
    f->lasti = frameLasti(cur);
    PyFrameObject* back = PyFrame_GetBack(cur);
    Py_XDECREF(back);
    cur = back;
    return true;
  });
#endif
}

}  // namespace

Classified classifyFile(const std::string& file) {
  if (startsWith(file, "<frozen")) return {FrameKind::Core, "stdlib"};
  for (const auto& r : g_internal) {
    if (startsWith(file, r.prefix)) return {FrameKind::Core, r.name};
  }
  for (const auto& r : g_listed) {
    if (startsWith(file, r.prefix)) return {FrameKind::Framework, r.name};
  }
  for (const auto& p : g_site) {
    if (startsWith(file, p)) return {FrameKind::Framework, topLevelName(file, p.size())};
  }
  // Any other site-packages/dist-packages folder (a user site, a system one seen
  // through a venv) holds installed packages too.
  for (const char* marker : {"/site-packages/", "/dist-packages/"}) {
    auto pos = file.find(marker);
    if (pos != std::string::npos) return {FrameKind::Framework, topLevelName(file, pos + std::strlen(marker))};
  }
  for (const auto& p : g_stdlib) {
    if (startsWith(file, p)) return {FrameKind::Core, "stdlib"};
  }
  return {};
}

std::string attrString(PyObject* obj, const char* name) {
  PyObject* v = PyObject_GetAttrString(obj, name);
  if (v == nullptr) {
    PyErr_Clear();
    return "";
  }
  const char* s = PyUnicode_Check(v) ? PyUnicode_AsUTF8(v) : nullptr;
  std::string out = s ? s : "";
  if (s == nullptr) PyErr_Clear();
  Py_DECREF(v);
  return out;
}

const CodeInfo& codeInfo(PyCodeObject* code) {
  auto it = g_codes->find(code);
  if (it != g_codes->end()) return it->second;
  CodeInfo info;
  info.filename = attrString(reinterpret_cast<PyObject*>(code), "co_filename");
  info.function = attrString(reinterpret_cast<PyObject*>(code), "co_qualname");
  if (info.function.empty()) info.function = attrString(reinterpret_cast<PyObject*>(code), "co_name");
  Classified c = classifyFile(info.filename);
  info.kind = c.kind;
  info.library = std::move(c.library);
  Py_INCREF(code);
  return g_codes->emplace(code, std::move(info)).first->second;
}

Frame frameOf(PyFrameObject* frame, const CodeInfo& info) {
  return Frame{info.filename, PyFrame_GetLineNumber(frame), info.function, info.library};
}

void installFrames(const std::vector<std::string>& internal, const std::vector<std::string>& stdlib,
                   const std::vector<std::string>& sitePackages) {
  g_internal.clear();
  for (const auto& p : internal) {
    // ".../torch/" -> "torch", ".../torch_ext/" -> "torch_ext"
    std::string trimmed = p.substr(0, p.find_last_not_of('/') + 1);
    auto slash = trimmed.find_last_of('/');
    g_internal.push_back({p, slash == std::string::npos ? trimmed : trimmed.substr(slash + 1)});
  }
  g_stdlib = stdlib;
  g_site = sitePackages;
  if (g_codes == nullptr) g_codes = new std::unordered_map<PyCodeObject*, CodeInfo>();
  if (g_sites == nullptr) g_sites = new std::unordered_map<SiteKey, uint32_t, SiteKeyHash>();
}

uint32_t captureCallSite() {
  if (!g_callSites.load(std::memory_order_relaxed) || g_sites == nullptr || !Py_IsInitialized()) return 0;
  // A thread without a Python thread state has no Python frames (e.g. autograd
  // device threads): do not create one.
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (ts == nullptr) return 0;
  ThreadSites& t = threadSites();
  t.sync(g_epoch.load(std::memory_order_acquire));
  // A collective issued from Python holds the GIL: nothing to take.
  if (PyGILState_Check()) return siteOfThread<true>(t, PyThreadState_Get());
  // torch's binding released it: a site this thread has seen is found without it.
  if (const uint32_t id = siteOfThread<false>(t, ts); id != kMiss) return id;
  PyGILState_STATE gil = PyGILState_Ensure();
  const uint32_t id = siteOfThread<true>(t, PyThreadState_Get());
  PyGILState_Release(gil);
  return id;
}

Frame frameOfCode(PyObject* code, int line) {
  if (code == nullptr || !PyCode_Check(code)) return Frame{};
  if (g_codes == nullptr) {  // runtime not installed: no classification
    std::string function = attrString(code, "co_qualname");
    if (function.empty()) function = attrString(code, "co_name");
    return Frame{attrString(code, "co_filename"), line, std::move(function), ""};
  }
  const CodeInfo& info = codeInfo(reinterpret_cast<PyCodeObject*>(code));
  return Frame{info.filename, line, info.function, info.library};
}

void setCallSitesEnabled(bool enabled) {
  g_callSites = enabled;
}

void setListedLibraries(const std::vector<std::pair<std::string, std::string>>& roots) {
  std::vector<LibraryRoot> listed;
  for (const auto& r : roots) listed.push_back({r.first, r.second});
  // Longest prefix first: a listed subpackage wins over its parent.
  std::sort(listed.begin(), listed.end(),
            [](const LibraryRoot& a, const LibraryRoot& b) { return a.prefix.size() > b.prefix.size(); });
  g_listed = std::move(listed);
  // Decisions cached under the old list are stale. The caches own references to
  // their code objects; drop them (the GIL is held).
  if (g_sites != nullptr) {
    for (auto& kv : *g_sites) {
      Py_XDECREF(kv.first.code);
      Py_XDECREF(kv.first.viaCode);
      for (PyCodeObject* c : kv.first.callerCode) Py_XDECREF(c);
    }
    g_sites->clear();
  }
  if (g_codes != nullptr) {
    for (auto& kv : *g_codes) Py_DECREF(kv.first);
    g_codes->clear();
  }
  g_epoch.fetch_add(1, std::memory_order_release);  // each thread's copies too, before its next capture
}

}  // namespace torch_ext::py
