#pragma once
// Devices, primary contexts, streams and events. No CUDA types appear here:
// handles are opaque pointers so engine headers stay plain C++.
#include <cstddef>
#include <string>

namespace kiln::rt {

// True when libcuda.so.1 loaded, cuInit succeeded and at least one GPU exists.
// `why` receives the reason when false.
bool gpu_available(std::string* why = nullptr);
int device_count();  // 0 when no driver/GPU (never throws)
// The CUDA driver's version ("13.0"), or "" when libcuda.so.1 does not load; needs no GPU.
std::string driver_version();

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  std::size_t total_memory = 0;
  int l2_bytes = 0;
  int max_shared_optin = 0;  // bytes per block after opting in
  int arch() const { return cc_major * 10 + cc_minor; }  // 90 for sm_90
};
// Throws DeviceError naming why when the driver, the GPU or the ordinal is missing.
const DeviceInfo& device_info(int ordinal);
// Bytes the driver reports free on the device now (cuMemGetInfo); excludes what kiln's
// pool holds but has not handed out (see pool_usage). Throws DeviceError like device_info. A
// shape-only pass sees the whole device free.
std::size_t free_memory(int ordinal);

// Makes the device's primary context current on this thread (retained once per process).
void make_current(int ordinal);

class Event;

class Stream {
 public:
  Stream() = default;  // empty: no stream
  // A non-blocking stream on `device`; with high_priority, the device's highest stream priority,
  // so its kernels take SMs ahead of other streams' (communication beside compute).
  static Stream create(int device, bool high_priority = false);
  ~Stream();
  Stream(Stream&& o) noexcept;
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  void synchronize() const;
  void wait(const Event& e) const;  // later work on this stream waits for e
  void* handle() const { return handle_; }  // CUstream
  int priority() const;                     // the driver's priority: 0 normal, lower numbers higher
  int device() const { return device_; }
  explicit operator bool() const { return handle_ != nullptr; }
  // A shape-only pass's stream: no driver stream behind it, so it needs no context; nothing
  // is queued on it, synchronize and wait return at once.
  bool unbacked() const { return unbacked_; }

 private:
  friend Stream& default_stream(int device);
  void* handle_ = nullptr;
  int device_ = -1;
  bool unbacked_ = false;
};

// The stream kiln's ops run on for `device`; created on first use, lives for the process.
// Inside a shape-only pass it is the device's unbacked stream instead, so a pass creates no
// context: it plans while another thread opens the device (open_device_async).
Stream& default_stream(int device);

// Creates the device's primary context on a background thread and returns at once; the first
// make_current of the device waits for it (about 0.3 s on an H100 host). Throws DeviceError as
// device_info does; an error of the context's creation is thrown by that first use.
void open_device_async(int ordinal);

class Event {
 public:
  Event() = default;
  static Event create(int device, bool timing = false);
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(const Stream& s);
  void synchronize() const;
  bool done() const;
  float elapsed_ms_since(const Event& start) const;  // both must be timing events
  void* handle() const { return handle_; }

 private:
  void* handle_ = nullptr;
  int device_ = -1;
};

}  // namespace kiln::rt
