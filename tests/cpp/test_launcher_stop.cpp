// LauncherStop's error file: torchelastic's format (what torchrun's summary
// prints as the worker's traceback), and a file already there is kept.
#include "guard/watchdog/LauncherStop.h"

#include "guard/report/Json.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

using torch_ext::Json;
using torch_ext::writeLauncherErrorFile;

namespace test_launcher_stop {

namespace {

std::string readAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST(LauncherStop, WritesTorchelasticsErrorFileOnceAndKeepsAnExistingOne) {
  char tmpl[] = "/tmp/torch_ext_launcher_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/error.json";
  ASSERT_TRUE(writeLauncherErrorFile(path, "CollectiveFailureError: collective #4 ...", "rank 0 was stopped:\n  x"));
  const Json j = Json::parse(readAll(path));
  const Json& message = j.at("message");
  EXPECT_EQ(message.at("message").asString(), "CollectiveFailureError: collective #4 ...");
  EXPECT_EQ(message.at("extraInfo").at("py_callstack").asString(), "rank 0 was stopped:\n  x");
  const std::string stamp = message.at("extraInfo").at("timestamp").asString();  // seconds, as a string
  EXPECT_GT(std::stoll(stamp), 1600000000LL) << stamp;
  // The first error of a process is its story: a second write (or the program's own @record) keeps it.
  EXPECT_FALSE(writeLauncherErrorFile(path, "later", "later"));
  EXPECT_EQ(Json::parse(readAll(path)).at("message").at("message").asString(),
            "CollectiveFailureError: collective #4 ...");
  EXPECT_FALSE(writeLauncherErrorFile("", "m", "d"));  // outside torchrun: nothing
  std::remove(path.c_str());
  rmdir(tmpl);
}

}  // namespace test_launcher_stop
