#include "python/PyRuntime.h"
#include "python/PyFrames.h"
#include "guard/Clock.h"

#include "guard/collective/CallSite.h"
#include "guard/collective/LabelTable.h"
#include "guard/Runtime.h"
#include "guard/watchdog/Watchdog.h"

#include <Python.h>
#include <frameobject.h>

#include <dlfcn.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace torch_ext::py {

namespace {

// Frames kept of a main-thread stack: enough that the user's frames under a
// deep framework stack (Lightning's fit loop is ~40 frames) are never cut off.
constexpr size_t kMaxStackFrames = 96;
constexpr size_t kMaxUserStackFrames = 8;

std::atomic<bool> g_installed{false};
PyThreadState* g_mainTstate = nullptr;

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

  // Waits, at most `timeout`, until every task posted so far has run (the
  // caller must not hold the GIL: the tasks need it). True if they all ran.
  bool flush(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return idle_.wait_for(lock, timeout, [this] { return queue_.empty() && !busy_; });
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
        busy_ = true;
      }
      if (Py_IsInitialized() && g_installed.load()) {
        waitingSince_ = steadyNs();
        PyGILState_STATE gil = PyGILState_Ensure();
        waitingSince_ = 0;
        task();
        PyGILState_Release(gil);
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        busy_ = false;
      }
      idle_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::thread thread_;
  bool stopping_ = false;
  bool busy_ = false;  // a task is running
  std::condition_variable idle_;
  std::atomic<int64_t> waitingSince_{0};
};

Helper& helper() {
  static auto* h = new Helper();
  return *h;
}

// --- main-thread stacks ------------------------------------------------------

// Keeps the innermost frame, every user frame up to kMaxUserStackFrames and the
// library frames between them (folded when the report is written), within
// kMaxStackFrames: the user's frames are what a report is for, so library
// frames are dropped first.
//
// Frames outside the program's top level (the outermost `<module>` frame of
// user code) are its launcher's, not the program's: runpy's for `python -m`, a
// debugger's, a harness that runs programs in a process it forked
// (torch_ext/testing/_zygote.py). They are left out, so a program's stack reads
// the same however it was started.
std::vector<Frame> filterFrames(std::vector<Frame> raw) {
  for (size_t i = raw.size(); i-- > 0;) {
    if (raw[i].function == "<module>" && raw[i].isUser()) {
      raw.resize(i + 1);
      break;
    }
  }
  size_t users = 0;
  size_t keep = 0;
  while (keep < raw.size() && users < kMaxUserStackFrames) {
    users += raw[keep].isUser() ? 1 : 0;
    ++keep;
  }
  // Up to the next user frame beyond the limit: the outer library frames (a
  // launcher, the interpreter's entry) are kept only while there is room.
  raw.resize(keep);
  if (raw.size() <= kMaxStackFrames) return raw;
  std::vector<Frame> out;
  size_t budget = kMaxStackFrames - std::min(users, kMaxStackFrames);
  for (size_t i = 0; i < raw.size(); ++i) {
    if (i == 0 || raw[i].isUser()) {
      out.push_back(raw[i]);
    } else if (budget > 0) {
      out.push_back(raw[i]);
      --budget;
    }
  }
  return out;
}

// GIL held.
std::vector<Frame> readFrames(PyThreadState* tstate) {
  std::vector<Frame> out;
  if (tstate == nullptr) return out;
  PyFrameObject* frame = PyThreadState_GetFrame(tstate);  // new ref
  while (frame != nullptr && out.size() < 128) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    const CodeInfo& info = codeInfo(code);
    out.push_back(frameOf(frame, info));
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(code);
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  return out;
}

std::vector<Frame> readMainFrames() {
  return readFrames(g_mainTstate);
}

// GIL held: every Python thread but the main one and this one that has a
// Python frame, with its threading name (threading._active, when loaded).
std::vector<ThreadStack> readOtherThreads() {
  std::map<unsigned long, std::string> names;
  PyObject* name = PyUnicode_FromString("threading");
  PyObject* threading = name ? PyImport_GetModule(name) : nullptr;  // new ref; only if already imported
  Py_XDECREF(name);
  if (threading != nullptr) {
    if (PyObject* active = PyObject_GetAttrString(threading, "_active")) {
      if (PyDict_Check(active)) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(active, &pos, &key, &value)) {
          const unsigned long ident = PyLong_AsUnsignedLong(key);
          names[ident] = attrString(value, "name");
        }
      }
      Py_DECREF(active);
    }
    Py_DECREF(threading);
  }
  if (PyErr_Occurred()) PyErr_Clear();
  std::vector<ThreadStack> out;
  PyThreadState* self = PyThreadState_Get();
  PyInterpreterState* interp = PyInterpreterState_Main();
  for (PyThreadState* ts = PyInterpreterState_ThreadHead(interp); ts != nullptr && out.size() < 64;
       ts = PyThreadState_Next(ts)) {
    if (ts == g_mainTstate || ts == self) continue;
    ThreadStack t;
    t.id = ts->thread_id;
    auto it = names.find(ts->thread_id);
    if (it != names.end()) t.name = it->second;
    t.frames = filterFrames(readFrames(ts));
    if (!t.frames.empty()) out.push_back(std::move(t));
  }
  return out;
}

struct ThreadsRequest {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::vector<ThreadStack> threads;
};

std::vector<ThreadStack> sampleOtherThreads(std::chrono::milliseconds budget) {
  // Only with the GIL: when the helper already waits for it, the main thread
  // holds it in native code and the other threads cannot run Python anyway.
  if (!g_installed.load() || helper().waitingSinceNs() != 0) return {};
  auto req = std::make_shared<ThreadsRequest>();
  helper().post([req] {
    auto threads = readOtherThreads();
    std::lock_guard<std::mutex> lock(req->mu);
    req->threads = std::move(threads);
    req->done = true;
    req->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(req->mu);
  if (!req->cv.wait_for(lock, budget, [&] { return req->done; })) return {};
  return std::move(req->threads);
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
    f.library = classifyFile(f.filename).library;
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
    std::snprintf(buf, sizeof(buf), "main thread has held the GIL for at least %.1f s (blocked in native code?)",
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

}  // namespace

// --- label origins, resolved when first read --------------------------------

// `s` as UTF-8 if it is a compact ASCII string: its characters follow the
// object header and are immutable, so they can be read without the GIL (the
// object is kept alive by a reference of ours). Nothing is allocated.
static bool asciiWithoutGil(PyObject* s, std::string* out) {
  if (s == nullptr || !PyUnicode_Check(s) || !PyUnicode_IS_COMPACT_ASCII(s)) return false;
  out->assign(static_cast<const char*>(PyUnicode_DATA(s)), static_cast<size_t>(PyUnicode_GET_LENGTH(s)));
  return true;
}

static PyObject* nameOf(PyCodeObject* code) {
#if PY_VERSION_HEX >= 0x030B0000
  return code->co_qualname;
#else
  return code->co_name;
#endif
}

// LabelTable's resolver. With the GIL (torch_ext.ledger(), the exit flush): the
// cached classification of call sites. Without it (the watchdog writing a
// report or a dump, the verifier): the code object's strings read in place, as
// keepForLazyOrigin checked they can be, and the file classified by its path.
static bool resolveOrigin(const OriginRef& ref, Frame* out) {
  auto* code = static_cast<PyCodeObject*>(const_cast<void*>(ref.code));
  if (code == nullptr) return false;
  if (g_installed.load() && Py_IsInitialized() && PyGILState_Check()) {
    *out = frameOfCode(reinterpret_cast<PyObject*>(code), ref.line);
    return !out->filename.empty();
  }
  Frame f;
  f.line = ref.line;
  if (!asciiWithoutGil(code->co_filename, &f.filename) || !asciiWithoutGil(nameOf(code), &f.function)) return false;
  f.library = classifyFile(f.filename).library;
  *out = std::move(f);
  return true;
}

void installRuntime(const std::vector<std::string>& internal, const std::vector<std::string>& stdlib,
                    const std::vector<std::string>& sitePackages, unsigned long mainThreadId) {
  installFrames(internal, stdlib, sitePackages);
  g_mainTstate = findThreadState(mainThreadId);
  g_installed = true;
  CallSites::instance().setProvider(&captureCallSite);
  LabelTable::instance().setResolver(&resolveOrigin);
  Runtime::instance().install(&sampleMainStack, &logViaPython, [] { helper().stop(); });
  Runtime::instance().setThreadStacks(&sampleOtherThreads);
  Runtime::instance().setFlushLogs(&flushLogs);
  // TORCH_EXT_LIVE_SIGNAL: live.py's _log_live_report asks every rank on a thread of its own (GIL: a moment).
  Runtime::instance().setLiveReport([](int sig) {
    helper().post([sig] {
      PyObject* mod = PyImport_ImportModule("torch_ext.diagnose.live");
      PyObject* r = mod ? PyObject_CallMethod(mod, "_log_live_report", "i", sig) : nullptr;
      Py_XDECREF(r);
      Py_XDECREF(mod);
      if (PyErr_Occurred()) PyErr_Print();
    });
  });
}

bool flushLogs(std::chrono::milliseconds timeout) {
  return helper().flush(timeout);
}

void uninstallRuntime() {
  // Unresolved label origins are resolved now, with the GIL, while their code can be read.
  LabelTable::instance().resolveAll();
  LabelTable::instance().setResolver(nullptr);
  g_installed = false;
  CallSites::instance().setProvider(nullptr);
  Runtime::instance().uninstall();
  Runtime::instance().setLiveReport(nullptr);
  Runtime::instance().setThreadStacks(nullptr);
  Runtime::instance().setFlushLogs(nullptr);
  helper().stop();
  g_mainTstate = nullptr;
}

bool keepForLazyOrigin(PyObject* code) {
  if (code == nullptr || !PyCode_Check(code)) return false;
  auto* c = reinterpret_cast<PyCodeObject*>(code);
  std::string unused;
  if (!asciiWithoutGil(c->co_filename, &unused) || !asciiWithoutGil(nameOf(c), &unused)) return false;
  Py_INCREF(code);  // kept for good: LabelTable keeps its labels for good
  return true;
}

}  // namespace torch_ext::py
