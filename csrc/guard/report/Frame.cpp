#include "guard/report/Frame.h"

#include <algorithm>
#include <set>
#include <sstream>

namespace torch_ext {

std::string Frame::describe() const {
  auto slash = filename.find_last_of('/');
  std::ostringstream os;
  if (!library.empty()) os << library << (slash == std::string::npos ? " " : " .../");
  os << (slash == std::string::npos ? filename : filename.substr(slash + 1)) << ":" << line;
  if (!function.empty()) os << " in " << function;
  return os.str();
}

std::string describeFrames(const std::vector<Frame>& frames, size_t maxFrames) {
  if (frames.empty()) return "(unknown call site)";
  std::ostringstream os;
  for (size_t i = 0; i < frames.size() && i < maxFrames; ++i) {
    os << (i ? " <- " : "") << frames[i].describe();
  }
  return os.str();
}

std::string describeCallSite(const std::vector<Frame>& frames) {
  if (frames.empty()) return "(unknown call site)";
  std::string out = frames[0].describe();
  if (frames[0].isUser() && frames.size() > 1 && !frames[1].isUser()) out += " (via " + frames[1].describe() + ")";
  return out;
}

std::vector<Frame> callersOf(const std::vector<Frame>& site) {
  if (site.empty() || !site[0].isUser()) return {};
  const size_t first = site.size() > 1 && !site[1].isUser() ? 2 : 1;  // past the framework frame
  return {site.begin() + static_cast<std::ptrdiff_t>(std::min(first, site.size())), site.end()};
}

std::string describeCaller(const std::vector<Frame>& site) {
  const std::vector<Frame> callers = callersOf(site);
  return callers.empty() ? "" : callers[0].describe();
}

std::string describeCallPath(const std::vector<Frame>& site) {
  const std::string caller = describeCaller(site);
  return describeCallSite(site) + (caller.empty() ? "" : " from " + caller);
}

namespace {

// "... 6 lightning frames ...", "... 3 torch, lightning frames ...".
std::string foldedRun(const std::vector<Frame>& frames, size_t begin, size_t end) {
  std::vector<std::string> libs;
  std::set<std::string> seen;
  for (size_t i = begin; i < end; ++i) {
    if (seen.insert(frames[i].library).second) libs.push_back(frames[i].library);
  }
  std::ostringstream os;
  os << "... " << (end - begin) << " ";
  for (size_t i = 0; i < libs.size(); ++i) os << (i ? ", " : "") << libs[i];
  os << (end - begin == 1 ? " frame ..." : " frames ...");
  return os.str();
}

}  // namespace

std::string describeStack(const std::vector<Frame>& frames, size_t maxUser) {
  if (frames.empty()) return "(no Python frames)";
  std::vector<std::string> parts;
  size_t users = 0;
  size_t i = 0;
  // Where the thread is now, user's or not.
  parts.push_back(frames[0].describe());
  users += frames[0].isUser() ? 1 : 0;
  i = 1;
  while (i < frames.size() && users < maxUser) {
    if (frames[i].isUser()) {
      parts.push_back(frames[i].describe());
      ++users;
      ++i;
      continue;
    }
    size_t j = i;
    while (j < frames.size() && !frames[j].isUser()) ++j;
    if (j == frames.size()) {
      // Library frames up to the outermost (the interpreter's entry, a launcher).
      parts.push_back(foldedRun(frames, i, j));
    } else if (j - i == 1) {
      parts.push_back(frames[i].describe());
    } else {
      parts.push_back(foldedRun(frames, i, j));
    }
    i = j;
  }
  if (i < frames.size()) {
    size_t rest = frames.size() - i;
    parts.push_back("... " + std::to_string(rest) + (rest == 1 ? " outer frame" : " outer frames"));
  }
  std::ostringstream os;
  for (size_t k = 0; k < parts.size(); ++k) os << (k ? " <- " : "") << parts[k];
  return os.str();
}

}  // namespace torch_ext
