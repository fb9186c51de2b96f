#include "guard/collective/IncidentSink.h"

namespace torch_ext {

namespace {

class DetachedSink final : public IncidentSink {
 public:
  void requestIncident(const std::shared_ptr<GroupState>&, const Incident&) override {}
  bool publishVerdict(const std::shared_ptr<GroupState>&, const Incident&, const Verdict&) override {
    return true;
  }
  std::string failureReport(const std::shared_ptr<GroupState>&, uint64_t, const std::string& error) override {
    return error;
  }
  std::string writeDump(const std::string&, const std::string&, const GroupState*) override {
    return std::string();
  }
};

}  // namespace

IncidentSink& detachedIncidentSink() {
  static DetachedSink sink;  // stateless; lives as long as the process
  return sink;
}

}  // namespace torch_ext
