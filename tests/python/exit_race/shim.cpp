// Forces a race of torch's (2.13, CPython 3.11) at the exit of a DDP process
// on gloo, for test_endings.py: LD_PRELOADed into the processes of a test.
//
// The race: a gloo worker thread (c10d::ProcessGroupGloo::runLoop, named
// pt_gloo_runloop) runs an all-reduce DDP started in backward; the trainer
// goes on as soon as its result is ready, while the worker still holds the
// work, whose copy of the thread-local state holds a contextvars.Context that
// autograd's backward put there. If the worker drops the work late — after
// torch's decref checked Py_IsInitialized() but before it takes the GIL, while
// the main thread begins finalizing — CPython ends the worker (pthread_exit)
// inside noexcept destructors: "terminate called without an active exception",
// "Fatal Python error: Aborted", <no Python frame>. About 1 exit in 100-300.
//
// Made certain here:
//  1. pthread_mutex_lock, called from runLoop after a work ran (where the
//     worker takes its mutex again before dropping the work), waits until
//     the gate opens (at most 3 s).
//  2. sitecustomize.py's atexit handler, the last one to run, opens the gate
//     (shim_open_gate_and_wait) and holds the GIL until a worker is in
//     torch's decref, about to take the GIL.
//  3. That worker waits (in PyGILState_Ensure and friends) until the
//     interpreter is finalizing, then asks for the GIL.
// Every pthread_exit and the threads that take the GIL while the interpreter
// finalizes are logged to stderr ("[exit-race ...]"), with a backtrace.
#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>

extern "C" int _Py_IsFinalizing(void);

namespace {

std::atomic<int> gate_open{0};
std::atomic<int> gloo_acquiring{0};
std::atomic<uintptr_t> runloop_begin{0}, runloop_end{0};
std::atomic<long> lookups{0};
constexpr int kHoldMs = 3000;  // the longest a worker holds a finished work

void say(const char* what, bool trace = true) {
  char name[32] = "?";
  pthread_getname_np(pthread_self(), name, sizeof name);
  char head[192];
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int n = snprintf(head, sizeof head, "[exit-race %.3f pid=%d tid=%d thread=%s] %s\n",
                   ts.tv_sec + ts.tv_nsec / 1e9, getpid(), gettid(), name, what);
  if (n > 0) (void)!write(2, head, static_cast<size_t>(n));
  if (!trace) return;
  void* frames[48];
  backtrace_symbols_fd(frames, backtrace(frames, 48), 2);
}

bool is_gloo_worker() {
  char name[32] = "";
  pthread_getname_np(pthread_self(), name, sizeof name);
  return strncmp(name, "pt_gloo", 7) == 0;
}

// Before a thread asks for the GIL.
void before_gil(const char* what) {
  if (gate_open.load() && is_gloo_worker()) {
    // torch's decref checked Py_IsInitialized() just before: ask for the GIL
    // only once the interpreter is finalizing.
    gloo_acquiring++;
    say("a gloo worker is about to take the GIL; it waits until the interpreter finalizes");
    for (int i = 0; i < 5000 && !_Py_IsFinalizing(); ++i) usleep(1000);
  }
  if (_Py_IsFinalizing() && gettid() != getpid()) {
    char m[96];
    snprintf(m, sizeof m, "%s while the interpreter finalizes", what);
    say(m);
  }
}

// The range of c10d::ProcessGroupGloo::runLoop, once libtorch_cpu is loaded.
void find_runloop() {
  if (runloop_begin.load(std::memory_order_relaxed) != 0 || (lookups++ % 4096) != 0) return;
  void* lib = dlopen("libtorch_cpu.so", RTLD_NOW | RTLD_NOLOAD);
  void* f = lib ? dlsym(lib, "_ZN4c10d16ProcessGroupGloo7runLoopEi") : nullptr;
  if (f == nullptr) return;
  Dl_info info;
  const ElfW(Sym)* sym = nullptr;
  if (dladdr1(f, &info, (void**)(&sym), RTLD_DL_SYMENT) && sym) {
    runloop_end = reinterpret_cast<uintptr_t>(f) + sym->st_size;
    runloop_begin = reinterpret_cast<uintptr_t>(f);
    say("found c10d::ProcessGroupGloo::runLoop: its finished works wait for the gate", false);
  }
}

}  // namespace

extern "C" int shim_open_gate_and_wait() {
  gate_open = 1;
  say("the gate opens (the last atexit handler)");
  for (int i = 0; i < 5000 && gloo_acquiring.load() == 0; ++i) usleep(1000);
  say(gloo_acquiring.load() ? "a gloo worker takes the GIL next; the atexit handler returns"
                            : "no gloo worker came within 5 s; the atexit handler returns");
  return gloo_acquiring.load();
}

extern "C" void pthread_exit(void* ret) {
  using Fn = void (*)(void*);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_exit"));
  say("pthread_exit");
  real(ret);
  __builtin_unreachable();
}

#define BEFORE_GIL(ret, fn, params, args)                         \
  extern "C" ret fn params {                                      \
    using Fn = ret(*) params;                                     \
    static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, #fn)); \
    before_gil(#fn);                                              \
    return real args;                                             \
  }
struct _ts;
BEFORE_GIL(int, PyGILState_Ensure, (void), ())
BEFORE_GIL(void, PyEval_AcquireThread, (_ts * t), (t))
BEFORE_GIL(void, PyEval_RestoreThread, (_ts * t), (t))

extern "C" int pthread_mutex_lock(pthread_mutex_t* m) {
  using Fn = int (*)(pthread_mutex_t*);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_mutex_lock"));
  find_runloop();
  const uintptr_t from = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  const uintptr_t begin = runloop_begin.load(std::memory_order_relaxed);
  if (begin != 0 && from >= begin && from < runloop_end.load(std::memory_order_relaxed)) {
    static thread_local int calls = 0;
    if (calls++ > 0) {  // the loop's first lock is its start; each later one follows a work
      for (int i = 0; i < kHoldMs && !gate_open.load(); ++i) usleep(1000);
    }
  }
  return real(m);
}
