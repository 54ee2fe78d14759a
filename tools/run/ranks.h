#pragma once
// This node's ranks: started as process-group leaders, signalled as groups, waited for without
// blocking, and killed after the grace period once they were asked to stop.
#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "reaper.h"

namespace kiln_run {

struct RankExit {
  int local = 0;  // which rank of this node
  pid_t pid = -1;
  int status = 0;  // as waitpid reports it
};

// "exited with code 3", "was killed by signal 9 (Killed)"; and the exit code kiln-run passes on.
std::string how(int status);
int code_of(int status);

class Ranks {
 public:
  Ranks(Reaper& reaper, double grace_s) : reaper_(reaper), grace_s_(grace_s) {}

  // Starts one process of `program` per environment; `mask` is the signal mask they get. A rank
  // that cannot be started shows up in reap() as exiting with code 1, the others keep running.
  void start(const std::vector<std::string>& program, const std::vector<std::vector<std::string>>& envs,
             const sigset_t& mask);
  // SIGTERM and SIGCONT (a stopped rank acts on the SIGTERM) to every running rank; SIGKILL follows
  // after the grace period, from tick().
  void stop() { signal_all(SIGTERM); }
  // A signal kiln-run got, passed on the same way.
  void signal_all(int sig);
  // Ranks that ended since the last call.
  std::vector<RankExit> reap();
  // Sends SIGKILL once the grace period after the first stop has passed.
  void tick();
  int running() const;
  double grace_s() const { return grace_s_; }

 private:
  struct Rank {
    pid_t pid = -1;
    bool running = false;
  };
  Reaper& reaper_;
  double grace_s_;
  std::vector<Rank> ranks_;
  std::vector<RankExit> unstarted_;
  std::optional<std::chrono::steady_clock::time_point> kill_at_;
  bool killed_ = false;
};

}  // namespace kiln_run
