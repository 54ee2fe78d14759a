#pragma once
// The reaper: a small process kiln-run forks at start so that no rank outlives kiln-run, even when
// kiln-run gets SIGKILL (PR_SET_PDEATHSIG reaches only a rank's first process, and SIGTERM can be
// caught by a rank stuck in a collective). kiln-run tells it each rank's process group over a pipe;
// when the pipe closes without "done", the reaper sends every group SIGTERM and SIGCONT, SIGKILL
// 1 s later, removes kiln-run's temp folder and exits.
#include <sys/types.h>

#include <string>

namespace kiln_run {

class Reaper {
 public:
  // Forks the reaper (a warning on stderr and none at all when fork fails). `dir` is removed by
  // the reaper only when kiln-run died; kiln-run removes it itself otherwise.
  explicit Reaper(const std::string& dir);
  ~Reaper();  // done()
  Reaper(const Reaper&) = delete;
  Reaper& operator=(const Reaper&) = delete;

  void track(pid_t pgid);    // a rank's process group (its pid: each rank leads its own)
  void untrack(pid_t pgid);  // that rank was waited for
  // kiln-run ends normally: the reaper exits without touching anything.
  void done();

 private:
  void send(const std::string& line);
  int pipe_ = -1;
  pid_t pid_ = -1;
};

}  // namespace kiln_run
