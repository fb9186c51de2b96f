#include "python/PyRuntime.h"

#include "guard/CallSite.h"
#include "guard/Runtime.h"
#include "guard/Watchdog.h"

#include <Python.h>
#include <frameobject.h>

#include <dlfcn.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace torch_ext::py {

namespace {

constexpr size_t kMaxStackFrames = 8;

std::vector<std::string> g_internal;
std::vector<std::string> g_stdlib;
std::vector<std::string> g_site;
std::atomic<bool> g_installed{false};
std::atomic<bool> g_callSites{true};
PyThreadState* g_mainTstate = nullptr;

bool startsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

bool isInternalFile(const std::string& file) {
  if (startsWith(file, "<frozen")) return true;
  for (const auto& p : g_internal) {
    if (startsWith(file, p)) return true;
  }
  for (const auto& p : g_site) {
    if (startsWith(file, p)) return false;
  }
  for (const auto& p : g_stdlib) {
    if (startsWith(file, p)) return true;
  }
  return false;
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

// --- call sites (GIL held) ---------------------------------------------------

struct CodeInfo {
  bool internal = false;
  std::string filename;
  std::string function;
};

struct SiteKey {
  PyCodeObject* code;
  int lasti;
  bool operator==(const SiteKey& o) const {
    return code == o.code && lasti == o.lasti;
  }
};
struct SiteKeyHash {
  size_t operator()(const SiteKey& k) const {
    return std::hash<void*>()(k.code) ^ (static_cast<size_t>(k.lasti) * 0x9e3779b97f4a7c15ULL);
  }
};

// Both caches hold a reference to their code objects, so an address is never
// reused for another code object while cached. Accessed only with the GIL.
std::unordered_map<PyCodeObject*, CodeInfo>* g_codes = nullptr;
std::unordered_map<SiteKey, uint32_t, SiteKeyHash>* g_sites = nullptr;

const CodeInfo& codeInfo(PyCodeObject* code) {
  auto it = g_codes->find(code);
  if (it != g_codes->end()) return it->second;
  CodeInfo info;
  info.filename = attrString(reinterpret_cast<PyObject*>(code), "co_filename");
  info.function = attrString(reinterpret_cast<PyObject*>(code), "co_qualname");
  if (info.function.empty()) info.function = attrString(reinterpret_cast<PyObject*>(code), "co_name");
  info.internal = isInternalFile(info.filename);
  Py_INCREF(code);
  return g_codes->emplace(code, std::move(info)).first->second;
}

uint32_t captureCallSite() {
  if (!g_installed.load(std::memory_order_acquire) || !g_callSites.load(std::memory_order_relaxed)) return 0;
  // A thread without a Python thread state has no Python frames (e.g. autograd
  // device threads): do not create one.
  if (PyGILState_GetThisThreadState() == nullptr || !Py_IsInitialized()) return 0;
  PyGILState_STATE gil = PyGILState_Ensure();
  uint32_t id = 0;
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  Py_XINCREF(frame);
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    const CodeInfo& info = codeInfo(code);
    if (!info.internal) {
#if PY_VERSION_HEX >= 0x030B0000
      SiteKey key{code, PyFrame_GetLasti(frame)};
#else
      SiteKey key{code, PyFrame_GetLineNumber(frame)};
#endif
      auto it = g_sites->find(key);
      if (it != g_sites->end()) {
        id = it->second;
      } else {
        Frame f{info.filename, PyFrame_GetLineNumber(frame), info.function};
        id = CallSites::instance().intern({f});
        Py_INCREF(code);
        g_sites->emplace(key, id);
      }
      Py_DECREF(code);
      break;
    }
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(code);
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  PyGILState_Release(gil);
  return id;
}

// --- helper thread -----------------------------------------------------------

class Helper {
 public:
  // Runs `task` with the GIL on the helper thread; never blocks the caller.
  void post(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    queue_.push_back(std::move(task));
    if (!thread_.joinable()) {
      thread_ = std::thread([this] {
        pthread_setname_np(pthread_self(), "torch_ext_py");
        run();
      });
    }
    cv_.notify_one();
  }

  // Stops and joins. Releases the GIL while joining when the caller holds it,
  // because the helper may be waiting for it.
  void stop() {
    std::thread t;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      t = std::move(thread_);
    }
    cv_.notify_all();
    if (t.joinable()) {
      if (Py_IsInitialized() && PyGILState_Check()) {
        Py_BEGIN_ALLOW_THREADS t.join();
        Py_END_ALLOW_THREADS
      } else {
        t.join();
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    queue_.clear();
    stopping_ = false;
  }

  // Since when the helper has been waiting for the GIL (0: not waiting).
  int64_t waitingSinceNs() const {
    return waitingSince_.load();
  }

 private:
  void run() {
    while (true) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (stopping_ && queue_.empty()) return;
        if (stopping_) {
          queue_.clear();
          return;
        }
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      if (!Py_IsInitialized() || !g_installed.load()) continue;
      waitingSince_ = steadyNs();
      PyGILState_STATE gil = PyGILState_Ensure();
      waitingSince_ = 0;
      task();
      PyGILState_Release(gil);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::thread thread_;
  bool stopping_ = false;
  std::atomic<int64_t> waitingSince_{0};
};

Helper& helper() {
  static auto* h = new Helper();
  return *h;
}

// --- main-thread stacks ------------------------------------------------------

std::vector<Frame> filterFrames(std::vector<Frame> raw) {
  std::vector<Frame> user;
  for (const auto& f : raw) {
    if (!isInternalFile(f.filename)) user.push_back(f);
    if (user.size() >= kMaxStackFrames) break;
  }
  if (user.empty()) {
    raw.resize(std::min(raw.size(), kMaxStackFrames));
    return raw;
  }
  return user;
}

// GIL held.
std::vector<Frame> readMainFrames() {
  std::vector<Frame> out;
  if (g_mainTstate == nullptr) return out;
  PyFrameObject* frame = PyThreadState_GetFrame(g_mainTstate);  // new ref
  while (frame != nullptr && out.size() < 128) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    const CodeInfo& info = codeInfo(code);
    out.push_back(Frame{info.filename, PyFrame_GetLineNumber(frame), info.function});
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(code);
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  return out;
}

using DumpTracebackFn = void (*)(int, PyThreadState*);

// Reads the main thread's frames without the GIL, as faulthandler does. Only
// used when the main thread has held the GIL for longer than the budget, i.e.
// it sits in native code and its frames are not changing.
std::vector<Frame> readMainFramesWithoutGil(std::string* why) {
  static auto fn = reinterpret_cast<DumpTracebackFn>(dlsym(RTLD_DEFAULT, "_Py_DumpTraceback"));
  std::vector<Frame> out;
  if (fn == nullptr || g_mainTstate == nullptr) {
    *why = "this Python offers no way to read the stack without the GIL";
    return out;
  }
  int fd = memfd_create("torch_ext_stack", 0);
  if (fd < 0) {
    *why = "memfd_create failed";
    return out;
  }
  fn(fd, g_mainTstate);
  lseek(fd, 0, SEEK_SET);
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0 && text.size() < (1 << 20)) text.append(buf, static_cast<size_t>(n));
  close(fd);
  // Lines look like:   File "/path/x.py", line 12 in func
  size_t pos = 0;
  while ((pos = text.find("File \"", pos)) != std::string::npos) {
    size_t q = text.find('"', pos + 6);
    if (q == std::string::npos) break;
    Frame f;
    f.filename = text.substr(pos + 6, q - pos - 6);
    size_t ln = text.find("line ", q);
    size_t eol = text.find('\n', q);
    if (ln != std::string::npos && (eol == std::string::npos || ln < eol)) {
      f.line = std::atoi(text.c_str() + ln + 5);
      size_t in = text.find(" in ", ln);
      if (in != std::string::npos && (eol == std::string::npos || in < eol)) {
        f.function = text.substr(in + 4, (eol == std::string::npos ? text.size() : eol) - in - 4);
      }
    }
    out.push_back(std::move(f));
    pos = q;
  }
  return out;
}

struct StackRequest {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::vector<Frame> frames;
};

MainThreadStack sampleMainStack(std::chrono::milliseconds budget) {
  MainThreadStack result;
  if (!g_installed.load() || g_mainTstate == nullptr) {
    result.note = "no Python main thread known";
    return result;
  }
  const int64_t waiting = helper().waitingSinceNs();
  const int64_t budgetNs = std::chrono::duration_cast<std::chrono::nanoseconds>(budget).count();
  bool gotIt = false;
  if (waiting == 0) {
    auto req = std::make_shared<StackRequest>();
    helper().post([req] {
      auto frames = readMainFrames();
      std::lock_guard<std::mutex> lock(req->mu);
      req->frames = std::move(frames);
      req->done = true;
      req->cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(req->mu);
    gotIt = req->cv.wait_for(lock, budget, [&] { return req->done; });
    if (gotIt) result.frames = filterFrames(std::move(req->frames));
  }
  if (!gotIt) {
    const int64_t heldNs = waiting ? steadyNs() - waiting : budgetNs;
    std::string why;
    auto frames = readMainFramesWithoutGil(&why);
    result.frames = filterFrames(std::move(frames));
    char buf[160];
    std::snprintf(buf, sizeof(buf), "main thread has held the GIL for %.1f s (blocked in native code?)",
                  static_cast<double>(heldNs) / 1e9);
    result.note = buf;
    if (!why.empty()) result.note += "; " + why;
  }
  result.available = !result.frames.empty();
  return result;
}

void logViaPython(LogLevel level, const std::string& msg) {
  helper().post([level, msg] {
    PyObject* logging = PyImport_ImportModule("logging");
    if (logging == nullptr) {
      PyErr_Clear();
      return;
    }
    PyObject* logger = PyObject_CallMethod(logging, "getLogger", "s", "torch_ext");
    if (logger != nullptr) {
      PyObject* r = PyObject_CallMethod(logger, "log", "is", static_cast<int>(level), msg.c_str());
      Py_XDECREF(r);
      Py_DECREF(logger);
    }
    if (PyErr_Occurred()) PyErr_Clear();
    Py_DECREF(logging);
  });
}

PyThreadState* findThreadState(unsigned long threadId) {
  PyInterpreterState* interp = PyInterpreterState_Main();
  for (PyThreadState* ts = PyInterpreterState_ThreadHead(interp); ts != nullptr; ts = PyThreadState_Next(ts)) {
    if (ts->thread_id == threadId) return ts;
  }
  return nullptr;
}

} // namespace

void installRuntime(const std::vector<std::string>& internal, const std::vector<std::string>& stdlib,
                    const std::vector<std::string>& sitePackages, unsigned long mainThreadId) {
  g_internal = internal;
  g_stdlib = stdlib;
  g_site = sitePackages;
  if (g_codes == nullptr) g_codes = new std::unordered_map<PyCodeObject*, CodeInfo>();
  if (g_sites == nullptr) g_sites = new std::unordered_map<SiteKey, uint32_t, SiteKeyHash>();
  g_mainTstate = findThreadState(mainThreadId);
  g_installed = true;
  CallSites::instance().setProvider(&captureCallSite);
  Runtime::instance().install(&sampleMainStack, &logViaPython, [] { helper().stop(); });
}

void uninstallRuntime() {
  g_installed = false;
  CallSites::instance().setProvider(nullptr);
  Runtime::instance().uninstall();
  helper().stop();
  g_mainTstate = nullptr;
}

void setCallSitesEnabled(bool enabled) {
  g_callSites = enabled;
}

} // namespace torch_ext::py
