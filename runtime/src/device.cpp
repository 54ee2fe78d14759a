#include "kiln/runtime/device.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "check.h"
#include "driver.h"
#include "kiln/error.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/log.h"
#include "memory_cache.h"

namespace kiln::rt {

namespace {

// Filled on first use; a fill that throws is retried by the next caller. Each field has
// its own lock because filling one may fill another (default_stream -> make_current).
struct Once {
  std::mutex mu;
  std::atomic<bool> ready{false};
};

struct DeviceSlot {
  Once info_once, ctx_once, stream_once, unbacked_once;
  DeviceInfo info;
  CUcontext ctx = nullptr;
  Stream* stream = nullptr;
  Stream* unbacked = nullptr;  // a shape-only pass's
};

struct DeviceTable {
  int count = 0;
  std::unique_ptr<DeviceSlot[]> slots;
};

template <class Fill>
void fill_once(Once& once, Fill&& fill) {
  if (once.ready.load(std::memory_order_acquire)) return;
  std::lock_guard lock(once.mu);
  if (once.ready.load(std::memory_order_relaxed)) return;
  fill();
  once.ready.store(true, std::memory_order_release);
}

// Leaked on purpose: static destructors of other objects may still ask for devices at exit.
DeviceTable& table() {
  static DeviceTable* t = [] {
    auto* out = new DeviceTable;
    out->count = device_count();
    out->slots = std::make_unique<DeviceSlot[]>(static_cast<std::size_t>(out->count));
    return out;
  }();
  return *t;
}

// Throws DeviceError with the driver's reason, or when the ordinal is out of range.
DeviceSlot& slot(int ordinal) {
  driver();
  DeviceTable& t = table();
  if (ordinal < 0 || ordinal >= t.count) {
    throw DeviceError("[device] cuda:" + std::to_string(ordinal) + " does not exist (" + std::to_string(t.count) +
                      (t.count == 1 ? " GPU)" : " GPUs)"));
  }
  return t.slots[ordinal];
}

int attribute(CUdevice_attribute attr, CUdevice dev) {
  int v = 0;
  KILN_CU(cuDeviceGetAttribute(&v, attr, dev));
  return v;
}

void require(const void* handle, const char* what) {
  driver();  // without a GPU, say why rather than "empty"
  if (!handle) throw DeviceError(std::string("[device] ") + what + " is empty (default-constructed or moved from)");
}

thread_local int current_ordinal = -1;

// The primary context is retained once and never released: it lives as long as the process.
void retain_context(DeviceSlot& s, int ordinal) {
  fill_once(s.ctx_once, [&] {
    CUdevice dev = 0;
    KILN_CU(cuDeviceGet(&dev, ordinal));
    KILN_CU(cuDevicePrimaryCtxRetain(&s.ctx, dev));
  });
}

// The background retains of open_device_async, joined at exit (a static destroyed before
// the logger and the driver table it uses).
class Openers {
 public:
  Openers() { log(); }
  ~Openers() {
    for (std::thread& t : threads_) t.join();
  }
  void open(int ordinal) {
    std::lock_guard lock(mu_);
    threads_.emplace_back([ordinal] {
      try {
        retain_context(slot(ordinal), ordinal);
      } catch (const std::exception& e) {  // the first make_current retries and throws it
        log().debug("[device] opening cuda:{} in the background failed: {}", ordinal, e.what());
      }
    });
  }

 private:
  std::mutex mu_;
  std::vector<std::thread> threads_;
};

}  // namespace

bool gpu_available(std::string* why) { return try_driver(why) != nullptr; }

int device_count() {
  const Driver* d = try_driver(nullptr);
  if (!d) return 0;
  int n = 0;
  if (d->cuDeviceGetCount(&n) != CUDA_SUCCESS) return 0;
  return n;
}

const DeviceInfo& device_info(int ordinal) {
  DeviceSlot& s = slot(ordinal);
  fill_once(s.info_once, [&] {
    CUdevice dev = 0;
    KILN_CU(cuDeviceGet(&dev, ordinal));
    char name[256] = {};
    KILN_CU(cuDeviceGetName(name, sizeof(name), dev));
    std::size_t total = 0;
    KILN_CU(cuDeviceTotalMem(&total, dev));
    DeviceInfo info;
    info.ordinal = ordinal;
    info.name = name;
    info.cc_major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    info.cc_minor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    info.sm_count = attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    info.total_memory = total;
    info.l2_bytes = attribute(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, dev);
    info.max_shared_optin = attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev);
    s.info = std::move(info);
    log().debug("[device] cuda:{} is {} (sm_{}, {} SMs, {} MiB)", ordinal, s.info.name, s.info.arch(),
                s.info.sm_count, s.info.total_memory >> 20);
  });
  return s.info;
}

std::size_t free_memory(int ordinal) {
  if (shape_only()) return device_info(ordinal).total_memory;  // a pass holds no memory, opens no context
  make_current(ordinal);
  std::size_t free = 0, total = 0;
  KILN_CU(cuMemGetInfo(&free, &total));
  return free;
}

void open_device_async(int ordinal) {
  DeviceSlot& s = slot(ordinal);
  if (s.ctx_once.ready.load(std::memory_order_acquire)) return;
  static Openers openers;
  openers.open(ordinal);
}

// Assumes nobody else switches this thread's context behind kiln's back (cuBLAS does not).
void make_current(int ordinal) {
  if (current_ordinal == ordinal) return;
  DeviceSlot& s = slot(ordinal);
  retain_context(s, ordinal);
  KILN_CU(cuCtxSetCurrent(s.ctx));
  current_ordinal = ordinal;
}

// ---- Stream ----

Stream Stream::create(int device, bool high_priority) {
  make_current(device);
  CUstream h = nullptr;
  if (high_priority) {
    int least = 0, greatest = 0;
    KILN_CU(cuCtxGetStreamPriorityRange(&least, &greatest));
    KILN_CU(cuStreamCreateWithPriority(&h, CU_STREAM_NON_BLOCKING, greatest));
  } else {
    KILN_CU(cuStreamCreate(&h, CU_STREAM_NON_BLOCKING));
  }
  Stream s;
  s.handle_ = h;
  s.device_ = device;
  return s;
}

int Stream::priority() const {
  if (!handle_ || unbacked_) return 0;
  make_current(device_);
  int p = 0;
  KILN_CU(cuStreamGetPriority(static_cast<CUstream>(handle_), &p));
  return p;
}

Stream::~Stream() {
  if (!handle_ || unbacked_) return;  // an unbacked stream has no driver stream to destroy
  release_stream_blocks(device_, handle_);
  try {
    KILN_CU(cuStreamDestroy(static_cast<CUstream>(handle_)));
  } catch (const std::exception& e) {
    log().error("[stream] destroying a stream of cuda:{}: {}", device_, e.what());
  }
}

Stream::Stream(Stream&& o) noexcept
    : handle_(std::exchange(o.handle_, nullptr)),
      device_(std::exchange(o.device_, -1)),
      unbacked_(std::exchange(o.unbacked_, false)) {}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    Stream old(std::move(*this));
    handle_ = std::exchange(o.handle_, nullptr);
    device_ = std::exchange(o.device_, -1);
    unbacked_ = std::exchange(o.unbacked_, false);
  }
  return *this;
}

void Stream::synchronize() const {
  require(handle_, "stream");
  if (unbacked_) return;
  KILN_CU(cuStreamSynchronize(static_cast<CUstream>(handle_)));
}

void Stream::wait(const Event& e) const {
  require(handle_, "stream");
  require(e.handle(), "event");
  if (unbacked_) return;
  KILN_CU(cuStreamWaitEvent(static_cast<CUstream>(handle_), static_cast<CUevent>(e.handle()), 0));
}

Stream& default_stream(int device) {
  DeviceSlot& s = slot(device);
  if (shape_only()) {
    fill_once(s.unbacked_once, [&] {
      s.unbacked = new Stream;
      // Any non-null handle: the driver never sees it (an op's empty-stream checks pass).
      s.unbacked->handle_ = s.unbacked;
      s.unbacked->device_ = device;
      s.unbacked->unbacked_ = true;
    });
    return *s.unbacked;
  }
  // Never destroyed, so no driver call runs after libcuda has been torn down at exit.
  fill_once(s.stream_once, [&] { s.stream = new Stream(Stream::create(device)); });
  return *s.stream;
}

// ---- Event ----

Event Event::create(int device, bool timing) {
  make_current(device);
  CUevent h = nullptr;
  KILN_CU(cuEventCreate(&h, timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING));
  Event e;
  e.handle_ = h;
  e.device_ = device;
  return e;
}

Event::~Event() {
  if (!handle_) return;
  try {
    KILN_CU(cuEventDestroy(static_cast<CUevent>(handle_)));
  } catch (const std::exception& e) {
    log().error("[event] destroying an event of cuda:{}: {}", device_, e.what());
  }
}

Event::Event(Event&& o) noexcept
    : handle_(std::exchange(o.handle_, nullptr)), device_(std::exchange(o.device_, -1)) {}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    Event old(std::move(*this));
    handle_ = std::exchange(o.handle_, nullptr);
    device_ = std::exchange(o.device_, -1);
  }
  return *this;
}

void Event::record(const Stream& s) {
  require(handle_, "event");
  require(s.handle(), "stream");
  if (s.device() != device_) {
    throw DeviceError("[event] an event of cuda:" + std::to_string(device_) + " cannot be recorded on a stream of cuda:" +
                      std::to_string(s.device()));
  }
  KILN_CU(cuEventRecord(static_cast<CUevent>(handle_), static_cast<CUstream>(s.handle())));
}

void Event::synchronize() const {
  require(handle_, "event");
  KILN_CU(cuEventSynchronize(static_cast<CUevent>(handle_)));
}

bool Event::done() const {
  require(handle_, "event");
  CUresult r = driver().cuEventQuery(static_cast<CUevent>(handle_));
  if (r == CUDA_SUCCESS) return true;
  if (r == CUDA_ERROR_NOT_READY) return false;
  detail::throw_cu(r, "cuEventQuery(handle_)", __FILE__, __LINE__);
}

float Event::elapsed_ms_since(const Event& start) const {
  require(handle_, "event");
  require(start.handle_, "start event");
  float ms = 0;
  KILN_CU(cuEventElapsedTime(&ms, static_cast<CUevent>(start.handle_), static_cast<CUevent>(handle_)));
  return ms;
}

}  // namespace kiln::rt
