#pragma once
// The compile servers (kiln-nvrtc-server) this process runs, as /proc shows them.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace kiln_test {

// Niceness of each kiln-nvrtc-server this process started and still runs, by pid.
inline std::map<int, int> own_compile_servers() {
  std::map<int, int> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    if (stat.substr(open + 1, close - open - 1).rfind("kiln-nvrtc", 0) != 0) continue;
    // After the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
    // stime cutime cstime priority nice ...
    std::istringstream rest(stat.substr(close + 2));
    std::string field;
    int ppid = 0, nice = 0;
    for (int i = 1; i <= 17 && rest >> field; ++i) {
      if (i == 2) ppid = std::stoi(field);
      if (i == 17) nice = std::stoi(field);
    }
    if (ppid == ::getpid()) out[std::stoi(name)] = nice;
  }
  return out;
}

// A process's environment, entry by entry (/proc/<pid>/environ).
inline std::vector<std::string> process_environment(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::vector<std::string> out;
  for (std::string entry; std::getline(in, entry, '\0');) out.push_back(entry);
  return out;
}

}  // namespace kiln_test
