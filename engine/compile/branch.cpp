// Side streams for parallel branches of captured steps.
#include "branch.h"

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "capture.h"
#include "kiln/runtime/cublas.h"

namespace kiln::compile_detail {

namespace {

struct SideStreams {
  std::mutex mu;
  std::map<int, std::unique_ptr<rt::Stream>> by_device;  // never destroyed: streams outlive graphs
};

SideStreams& side_streams() {
  static auto* s = new SideStreams;
  return *s;
}

const rt::Stream* side_stream(int device) {
  SideStreams& s = side_streams();
  std::lock_guard lock(s.mu);
  auto it = s.by_device.find(device);
  return it == s.by_device.end() ? nullptr : it->second.get();
}

thread_local const rt::Stream* t_branch = nullptr;
thread_local int t_branch_device = -1;
thread_local std::vector<rt::Event> t_joins;  // recorded at each branch's end, not yet waited for

}  // namespace

void prepare_branch_stream(Device d) {
  if (!d.is_cuda() || capturing() || side_stream(d.index())) return;
  auto stream = std::make_unique<rt::Stream>(rt::Stream::create(d.index()));
  (void)rt::cublas_workspace(*stream);  // the handle and its workspace, made now
  SideStreams& s = side_streams();
  std::lock_guard lock(s.mu);
  s.by_device.emplace(d.index(), std::move(stream));
}

bool run_branch(Device d, const std::function<void()>& fn) {
  if (!d.is_cuda() || !capturing() || t_branch) return false;
  const rt::Stream* side = side_stream(d.index());
  if (!side) return false;
  const rt::Stream& main = rt::default_stream(d.index());
  rt::Event fork = rt::Event::create(d.index());
  fork.record(main);
  side->wait(fork);
  t_branch = side;
  t_branch_device = d.index();
  try {
    fn();
  } catch (...) {
    t_branch = nullptr;
    rt::Event join = rt::Event::create(d.index());
    join.record(*side);
    t_joins.push_back(std::move(join));
    throw;
  }
  t_branch = nullptr;
  rt::Event join = rt::Event::create(d.index());
  join.record(*side);
  t_joins.push_back(std::move(join));
  return true;
}

void join_branches() {
  for (const rt::Event& e : t_joins) rt::default_stream(e.device()).wait(e);
  t_joins.clear();
}

const rt::Stream* branch_stream(Device d) {
  return t_branch && d.is_cuda() && d.index() == t_branch_device ? t_branch : nullptr;
}

}  // namespace kiln::compile_detail
