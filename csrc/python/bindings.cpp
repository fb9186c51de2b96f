// bindings.cpp: the pybind11 glue of torch_ext._C (the module's functions).
// C++ errors cross into Python through python/PyErrors (typed guard errors
// become the torch_ext exception classes, on every path).
//
// GuardBackend is handed to Python as a plain torch Backend (the type torch
// registers); guard-specific calls take that object and check that it is ours.
// This keeps us off torch's private pybind holder type.

#include "guard/Config.h"
#include "guard/Errors.h"
#include "guard/Runtime.h"
#include "guard/backend/GuardBackend.h"
#include "guard/collective/LabelTable.h"
#include "guard/collective/WorkRetirement.h"
#include "guard/device/CudaGate.h"
#include "guard/device/StreamGate.h"
#include "guard/report/DumpAnalysis.h"
#include "guard/report/DumpStragglers.h"
#include "guard/report/Report.h"
#include "guard/report/Snapshot.h"
#include "guard/store/JoinHandshake.h"
#include "guard/store/StoreKeys.h"
#include "guard/watchdog/Dumps.h"
#include "guard/watchdog/LauncherStop.h"
#include "guard/watchdog/Watchdog.h"
#include "nccl_sim/NcclSimBackend.h"
#include "python/PyErrors.h"
#include "python/PyFrames.h"
#include "python/PyRuntime.h"

#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <type_traits>
#include <variant>
#include <string>
#include <vector>

namespace py = pybind11;
using torch_ext::GuardBackend;

namespace {

// A stream gate of its own for Python (tests, benchmarks/stream_gate.py).
struct PyStreamGate {
  torch_ext::device::StreamGate gate;
};

GuardBackend& asGuard(const c10::intrusive_ptr<c10d::Backend>& backend) {
  auto* g = dynamic_cast<GuardBackend*>(backend.get());
  if (g == nullptr) {
    throw py::type_error("expected the backend of a process group created with backend=\"guard\", got backend '" +
                         (backend ? backend->getBackendName() : std::string("None")) + "'");
  }
  return *g;
}

py::object settingToPython(const torch_ext::SettingValue& v) {
  return std::visit(
      [](const auto& x) -> py::object {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::monostate>) {
          return py::none();
        } else {
          return py::cast(x);
        }
      },
      v);
}

// Every setting of the table, typed, plus where each given one came from.
py::dict configDict(const torch_ext::Config& c) {
  py::dict d;
  for (const auto& s : torch_ext::settings()) d[s.option] = settingToPython(s.get(c));
  d["source"] = c.source;
  d["raw"] = c.raw;
  return d;
}

torch_ext::Config resolve(const std::map<std::string, std::string>& overrides) {
  try {
    return torch_ext::Config::resolve(overrides);
  } catch (const torch_ext::ConfigError& e) {
    throw py::value_error(e.what());
  }
}

// The store protocols spoken from Python, keys and values as StoreKeys.h spells
// them, so that each protocol has one speaker: a live request, for the asker
// outside the job (torch_ext/diagnose/live.py; keys relative to the group's
// prefix, the directory's "prefix", except the directory itself), and the
// epoch check (torch_ext/epochs.py).
void bindStoreProtocol(py::module& m) {
  namespace keys = torch_ext::keys;
  m.def("_live_directory_key", [] { return std::string(keys::kLiveDirectory); });
  m.def("_live_request_id", [](const std::string& unique) { return keys::kLiveRequestPrefix + unique; });
  m.def("_alerts_key", [] { return std::string(keys::kAlerts); });
  m.def("_alert_key", [](int64_t k) { return keys::alert(k); });
  m.def("_live_alert", [](const std::string& requestId, const std::vector<int64_t>& ranks, bool everyRank) {
    return keys::AlertRecord{requestId, -1, everyRank ? std::string() : keys::rankSpec(ranks)}.encode();
  });
  m.def("_snapshot_key",
        [](const std::string& incidentId, int groupRank) { return keys::snapshot(incidentId, groupRank); });
  m.def("_status_key", [](int groupRank) { return keys::status(groupRank); });
  // The epoch check's keys (torch_ext/epochs.py), whole: it uses the group's store as given.
  m.def("_epoch_record_key", [](const std::string& loop, int64_t epoch, int groupRank) {
    return keys::kPrefix + keys::epochRecord(loop, epoch, groupRank);
  });
  m.def("_epoch_claim_key",
        [](const std::string& loop, int64_t epoch) { return keys::kPrefix + keys::epochClaim(loop, epoch); });
  m.def("_epoch_warned_key", [](const std::string& loop) { return keys::kPrefix + keys::epochWarned(loop); });
}

// The join handshake of a guard group being created (store/JoinHandshake.h).
void bindJoin(py::module& m) {
  m.def(
      "_join",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const std::string& groupName,
         const torch_ext::Config& cfg, const std::string& torchExt, const std::string& torch, const std::string& host,
         int64_t pid, int64_t globalRank, const std::vector<int64_t>& members) {
        torch_ext::JoinContext ctx;
        ctx.group = groupName;
        ctx.rank = rank;
        ctx.size = size;
        ctx.warnAfter = std::chrono::milliseconds(static_cast<int64_t>(cfg.warnAfterS * 1000.0));
        ctx.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.joinTimeoutS * 1000.0));
        auto mine = torch_ext::JoinRecord::of(cfg, torchExt, torch, host, pid);
        mine.globalRank = globalRank;
        mine.members = members;
        torch_ext::JoinResult out;
        {
          py::gil_scoped_release release;
          out = torch_ext::JoinHandshake::join(*store, ctx, mine);
        }
        torch_ext::Config adopted = cfg;
        try {
          adopted.adopt(out.adopt, "rank 0's");
        } catch (const torch_ext::ConfigError& e) {
          throw py::value_error(e.what());
        }
        return py::make_tuple(adopted, out.adopt, out.notes);
      },
      "The join handshake of a guard group being created (store/JoinHandshake.h): blocks until the ranks agree; "
      "returns (the settings this rank runs: its own with rank 0's job-wide values, those values, one line to log "
      "per value taken); raises GroupJoinError when the group cannot start.");
  m.def(
      "_plain_gloo_ranks",
      [](const c10::intrusive_ptr<c10d::Store>& store, int size) {
        py::gil_scoped_release release;
        return torch_ext::JoinHandshake::plainGlooRanks(*store, size);
      },
      "The group ranks that created a plain gloo group at this store prefix instead of joining the guard.");
}

// Settings, and the creation of a guard group (torch_ext/backend.py).
void bindSetup(py::module& m) {
  m.def(
      "_register_exceptions",
      [](py::object guard, py::object mismatch, py::object timeout, py::object failure, py::object storeLost,
         py::object deadlock, py::object join) {
        torch_ext::py::installErrors(std::move(guard), std::move(mismatch), std::move(timeout), std::move(failure),
                                     std::move(storeLost), std::move(deadlock), std::move(join));
      },
      "Installs the Python classes raised for guard errors, on every path out of C++ (python/PyErrors.h).");

  m.def(
      "resolve_config",
      [](const std::map<std::string, std::string>& overrides) { return configDict(resolve(overrides)); },
      py::arg("overrides") = std::map<std::string, std::string>{},
      "Validated settings from TORCH_EXT_* and the given overrides (raises ValueError naming the bad setting).");
  // A group's settings, resolved once (backend.py's _create_guard) and handed
  // as they are to the join handshake and the backend.
  py::class_<torch_ext::Config>(m, "_Config")
      .def("as_dict", &configDict, "The settings as resolve_config gives them.")
      .def(
          "inner_timeout",
          [](const torch_ext::Config& c, double timeoutS) {
            const auto ms = std::chrono::milliseconds(static_cast<int64_t>(timeoutS * 1000.0));
            return std::chrono::duration<double>(c.innerTimeout(ms)).count();
          },
          py::arg("timeout"),
          "Seconds the inner backends of a group with this timeout wait before failing an operation themselves: "
          "beyond abort_after and busy_cap, so the guard's report always comes first.")
      .def("__repr__", [](const torch_ext::Config& c) { return "_Config(" + c.describe() + ")"; });
  m.def("_resolve", &resolve, py::arg("overrides") = std::map<std::string, std::string>{},
        "Validated settings from TORCH_EXT_* and the given overrides, as one _Config (raises ValueError naming "
        "the bad setting).");

  m.def(
      "env_var_docs",
      []() {
        std::vector<std::tuple<std::string, std::string, std::string, std::string, std::string>> out;
        for (const auto& d : torch_ext::settings()) {
          out.emplace_back(d.option, d.env, d.defaultValue, torch_ext::enumName(d.scope), d.meaning);
        }
        return out;
      },
      "(option, env var, default, scope ('job' or 'rank'), meaning) for every setting.");
  m.def("exchange_interval", &torch_ext::exchangeIntervalS, py::arg("interval"), py::arg("store_budget"),
        py::arg("group_size"),
        "Seconds between two store exchanges of a rank in a group of group_size ranks under the store budget.");
  m.def("straggler_look_every", &torch_ext::stragglerLookEvery, py::arg("group_size"),
        "Exchanges between two reads of every rank's status by the straggler analyst (group rank 0).");

  m.def(
      "_announce",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank) { torch_ext::Watchdog::announce(*store, rank); },
      py::call_guard<py::gil_scoped_release>());

  m.def(
      "_create_backend",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeoutS,
         const std::string& groupName, const std::vector<int64_t>& globalRanks, const torch_ext::Config& config,
         const std::map<std::string, std::pair<std::string, c10::intrusive_ptr<c10d::Backend>>>& inner,
         const std::optional<c10::intrusive_ptr<c10d::Backend>>& helper, const std::string& storeHostedBy,
         int64_t storeHostRank) -> c10::intrusive_ptr<c10d::Backend> {
        torch_ext::Config cfg = config;
        torch_ext::StoreAddress address = torch_ext::StoreChannel::addressOf(store);
        address.hostedBy = storeHostedBy;
        address.hostRank = storeHostRank;
        std::map<std::string, torch_ext::InnerBackend> inners;
        for (const auto& kv : inner) inners[kv.first] = torch_ext::InnerBackend{kv.second.first, kv.second.second};
        auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeoutS * 1000.0));
        py::gil_scoped_release release;
        return c10::make_intrusive<GuardBackend>(store, std::move(address), rank, size, timeout, groupName, globalRanks,
                                                 std::move(cfg), std::move(inners), helper.value_or(nullptr));
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("group_name"),
      py::arg("global_ranks"), py::arg("config"), py::arg("inner"), py::arg("helper") = py::none(),
      py::arg("store_hosted_by") = "", py::arg("store_host_rank") = -1);
}

// nccl_sim (torch_ext.testing.nccl_sim).
void bindNcclSim(py::module& m) {
  m.def(
      "_nccl_sim_create",
      [](const c10::intrusive_ptr<c10d::Backend>& transport, int rank, int size, const std::string& label,
         bool faultsApply) -> c10::intrusive_ptr<c10d::Backend> {
        torch_ext::NcclSimSettings settings;
        try {
          settings = torch_ext::NcclSimSettings::fromEnv();
        } catch (const torch_ext::ConfigError& e) {
          throw py::value_error(e.what());
        }
        return c10::make_intrusive<torch_ext::nccl_sim::NcclSimBackend>(rank, size, label, faultsApply, transport,
                                                                        settings);
      },
      py::arg("transport"), py::arg("rank"), py::arg("size"), py::arg("label"), py::arg("faults_apply"));
  m.def("_is_nccl_sim", [](const c10::intrusive_ptr<c10d::Backend>& b) {
    return dynamic_cast<torch_ext::nccl_sim::NcclSimBackend*>(b.get()) != nullptr;
  });
  m.def(
      "_nccl_sim_synchronize",
      [](const c10::intrusive_ptr<c10d::Backend>& b) {
        auto* sim = dynamic_cast<torch_ext::nccl_sim::NcclSimBackend*>(b.get());
        if (sim == nullptr) throw py::type_error("expected an nccl_sim backend");
        py::gil_scoped_release release;
        sim->synchronizeStream();
      },
      "Blocks until the communicator's stream has run everything issued so far (no timeout).");
  m.def("_nccl_sim_pending", [](const c10::intrusive_ptr<c10d::Backend>& b) -> size_t {
    auto* sim = dynamic_cast<torch_ext::nccl_sim::NcclSimBackend*>(b.get());
    if (sim == nullptr) throw py::type_error("expected an nccl_sim backend");
    return sim->stream()->pending();
  });
  m.def(
      "_raise_failure",
      [](const c10::intrusive_ptr<c10d::Backend>& b, double waitS) {
        // The group's typed error, once it has failed (waiting up to `waitS`
        // for the verdict that is on its way); returns if it did not fail.
        auto state = asGuard(b).state();
        if (waitS > 0 && !state->failed()) {
          py::gil_scoped_release release;
          state->waitUntil([] { return false; }, std::chrono::milliseconds(static_cast<int64_t>(waitS * 1000.0)));
        }
        if (!state->failed()) return;
        if (torch_ext::device::StreamGate* gate = state->streamGate()) {
          // The sync point (nccl_sim.synchronize()): what the program reads next is
          // filled first, as a held stream would be (GuardBackend::awaitVerdicts).
          py::gil_scoped_release release;
          gate->awaitHostPoison(
              std::chrono::milliseconds(static_cast<int64_t>(state->config().storeTimeoutS * 1000.0)));
        }
        state->throwFailure("");
      },
      py::arg("backend"), py::arg("wait_s") = 0.0);
}

// A guard group looked at from Python: its inners, config, ledger, mode and stream gate.
// Long: a list of bindings.
void bindGroups(py::module& m) {
  m.def(
      "_await_verdicts",
      [](const c10::intrusive_ptr<c10d::Backend>& b) {
        auto& g = asGuard(b);
        py::gil_scoped_release release;
        g.awaitVerdicts();
      },
      "check=verify: waits until what this rank issued is verified; raises the group's typed error if it failed.");
  m.def("_stream_ordered", [](const c10::intrusive_ptr<c10d::Backend>& b) { return torch_ext::isStreamOrdered(*b); });

  m.def(
      "_store_address",
      [](const c10::intrusive_ptr<c10d::Store>& store) {
        auto a = torch_ext::StoreChannel::addressOf(store);
        return py::make_tuple(a.kind, a.host, a.port);
      },
      "(kind, host, port) of the store under a group's PrefixStores.");
  m.def(
      "_store_health",
      [](const c10::intrusive_ptr<c10d::Backend>& b) {
        auto& channel = asGuard(b).state()->store().channel();
        return py::make_tuple(torch_ext::storeHealthName(channel.health()), channel.describeLoss());
      },
      "(health, description of the loss) of the group's store channel.");

  m.def("_is_guard",
        [](const c10::intrusive_ptr<c10d::Backend>& b) { return dynamic_cast<GuardBackend*>(b.get()) != nullptr; });
  m.def("_repr", [](const c10::intrusive_ptr<c10d::Backend>& b) {
    auto& g = asGuard(b);
    g.state()->setDesc(g.getGroupDesc());  // torch set it after creating the backend
    return g.repr();
  });
  m.def("_inner", [](const c10::intrusive_ptr<c10d::Backend>& b, const std::string& device) {
    auto& g = asGuard(b);
    auto it = g.inners().find(device);
    return it == g.inners().end() ? c10::intrusive_ptr<c10d::Backend>() : it->second.backend;  // null after shutdown
  });
  m.def("_inner_names", [](const c10::intrusive_ptr<c10d::Backend>& b) {
    std::map<std::string, std::string> out;
    for (const auto& kv : asGuard(b).inners()) out[kv.first] = kv.second.name;
    return out;
  });
  m.def("_config", [](const c10::intrusive_ptr<c10d::Backend>& b) { return configDict(asGuard(b).state()->config()); });
  m.def(
      "_group_json",
      [](const c10::intrusive_ptr<c10d::Backend>& b, size_t maxEntries) {
        auto& st = *asGuard(b).state();
        return torch_ext::toJson(torch_ext::groupView(st, maxEntries ? maxEntries : st.ledger().capacity())).dump();
      },
      py::arg("backend"), py::arg("max_entries") = 0, py::call_guard<py::gil_scoped_release>());
  // Works kept until the issuing thread may free them (WorkRetirement), and the scans so far.
  m.def("_retired_works", []() {
    auto& r = torch_ext::WorkRetirement::instance();
    return py::make_tuple(r.kept(), r.scans());
  });
  // The group's straggler analysis (JSON; "" when none yet).
  m.def(
      "_stragglers",
      [](const c10::intrusive_ptr<c10d::Backend>& b) {
        return torch_ext::Watchdog::instance().stragglers(asGuard(b).state().get());
      },
      py::arg("backend"), py::call_guard<py::gil_scoped_release>());
  // The last collective seq issued on a guard group (torch_ext/epochs.py: whether an
  // epoch's loop issued collectives).
  m.def("_last_seq",
        [](const c10::intrusive_ptr<c10d::Backend>& b) { return asGuard(b).state()->ledger().progress().lastSeq; });
  // The group's mode's counters (check="verify": its verifier's; None where
  // the mode keeps none, as in other modes or at world size 1).
  m.def("_verifier_stats", [](const c10::intrusive_ptr<c10d::Backend>& b) -> py::object {
    const auto counters = asGuard(b).state()->mode().counters();
    if (counters.empty()) return py::none();
    py::dict d;
    for (const auto& [name, value] : counters) d[py::str(name)] = value;
    return d;
  });
  // The stream gate's counters on a group (None where no gate holds streams).
  m.def("_stream_gate_stats", [](const c10::intrusive_ptr<c10d::Backend>& b) -> py::object {
    torch_ext::device::StreamGate* g = asGuard(b).state()->streamGate();
    if (g == nullptr) return py::none();
    const auto s = g->stats();
    py::dict d;
    d["device_holds"] = s.deviceHolds;
    d["host_holds"] = s.hostHolds;
    d["passed"] = s.passed;
    d["poisoned"] = s.poisoned;
    d["word"] = g->word();
    return d;
  });
  // A stream gate of its own, for tests and benchmarks/stream_gate.py: hold(seq,
  // tensors) on their device's current stream, release(seq), poison(first_bad).
  py::class_<PyStreamGate, std::shared_ptr<PyStreamGate>>(m, "_StreamGate")
      .def(py::init<>())
      .def(
          "hold",
          [](PyStreamGate& g, uint64_t seq, const std::vector<at::Tensor>& outputs) {
            return g.gate.hold(seq, outputs);
          },
          py::arg("seq"), py::arg("outputs"), py::call_guard<py::gil_scoped_release>())
      .def(
          "release", [](PyStreamGate& g, uint64_t seq) { g.gate.release(seq); }, py::arg("verified_seq"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "poison", [](PyStreamGate& g, uint64_t seq) { g.gate.poison(seq); }, py::arg("first_bad"),
          py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("word", [](const PyStreamGate& g) { return g.gate.word(); });
  // Whether the gate runs on CUDA here: (True, "") or (False, why not).
  m.def("_cuda_gate_available", []() {
    auto& c = torch_ext::device::CudaGate::instance();
    const bool ok = c.available();
    return py::make_tuple(ok, c.unavailableWhy());
  });
}

// Failures, dumps, reports and the watchdog's counters.
// Long: a list of bindings.
void bindWatchdog(py::module& m) {
  m.def("_failure", [](const c10::intrusive_ptr<c10d::Backend>& b) -> py::object {
    auto f = asGuard(b).state()->failure();
    if (!f) return py::none();
    return py::make_tuple(torch_ext::guardErrorKindName(f->kind), f->report);
  });

  m.def(
      "_failure_facts",
      [](const std::string& message) -> py::object {
        auto f = torch_ext::GroupState::failureOf(message);
        if (!f || !f->facts) return py::none();
        torch_ext::Json j = f->facts->toJson();
        j.set("error", torch_ext::guardErrorKindName(f->kind));
        return py::str(j.dump());
      },
      "The facts (verdict JSON, with the error's kind) of the failure whose report `message` is (what a guard "
      "error raised in this process says); None if no failure of the last 64 says it.");
  m.def(
      "_snapshot_json",
      [](const std::string& reason) {
        return torch_ext::toJson(torch_ext::Watchdog::instance().snapshot(reason)).dump();
      },
      py::arg("reason") = "manual", py::call_guard<py::gil_scoped_release>());
  m.def(
      "_dump",
      [](const std::string& reason, const std::string& dir) {
        return torch_ext::Watchdog::instance().writeDump(reason, dir);
      },
      py::arg("reason") = "manual", py::arg("dir") = "", py::call_guard<py::gil_scoped_release>());
  m.def("_watchdog_stats", []() {
    auto s = torch_ext::Watchdog::instance().stats();
    py::dict d;
    d["ticks"] = s.ticks;
    d["store_ops"] = s.storeOps;
    d["incidents"] = s.incidents;
    d["live_answered"] = s.liveAnswered;
    d["groups"] = s.groups;
    d["running"] = s.running;
    return d;
  });

  m.def(
      "_check_snapshot",
      [](const std::string& text, const std::string& name) {
        try {
          auto snap = torch_ext::readDump({name, text});
          std::vector<std::string> groups;
          for (const auto& g : snap.groups) groups.push_back(g.name);
          return py::make_tuple(snap.rank, groups);
        } catch (const torch_ext::DumpError& e) {
          throw py::value_error(e.reason());
        }
      },
      py::arg("text"), py::arg("name") = "dump",
      "Validates one dump; returns (rank, group names) or raises ValueError saying what is wrong.");
  m.attr("MAX_DUMP_BYTES") = torch_ext::kMaxDumpBytes;

  m.def(
      "_analyze_dumps",
      [](const std::vector<std::string>& texts, const std::map<int64_t, std::string>& statuses,
         const std::set<int64_t>& notAsked) {
        std::vector<torch_ext::RankSnapshot> snaps;
        for (size_t i = 0; i < texts.size(); ++i) {
          snaps.push_back(torch_ext::readDump({"dump " + std::to_string(i), texts[i]}));
        }
        std::map<int64_t, torch_ext::StatusRecord> absent;
        for (const auto& [rank, text] : statuses) {
          if (auto rec = torch_ext::StatusRecord::decode(text)) absent[rank] = *rec;
        }
        std::vector<std::string> out;
        for (const auto& f : torch_ext::analyzeDumps(snaps, &absent, &notAsked)) {
          auto j = f.verdict.toJson();
          j.set("group_name", f.groupName);
          j.set("pending", f.pending);
          j.set("dump_incident", f.dumpIncident);
          if (f.storeLostHost >= 0) {
            j.set("store_lost_host", f.storeLostHost);
            j.set("store_health", torch_ext::enumName(f.storeHealth));
          }
          out.push_back(j.dump());
        }
        return out;
      },
      py::arg("texts"), py::arg("statuses") = std::map<int64_t, std::string>(),
      py::arg("not_asked") = std::set<int64_t>(),
      "Cross-rank analysis of dump texts (already validated); one verdict JSON per group. `statuses`: the "
      "last status record (st/<rank> in the store) of global ranks without a dump, when known (a live report); "
      "`not_asked`: global ranks a narrowed live report did not ask.");
  m.def(
      "_stragglers_from_dumps",
      [](const std::vector<std::string>& texts) {
        std::vector<torch_ext::RankSnapshot> snaps;
        for (size_t i = 0; i < texts.size(); ++i) {
          snaps.push_back(torch_ext::readDump({"dump " + std::to_string(i), texts[i]}));
        }
        std::vector<std::string> out;
        const double threshold = torch_ext::Config::resolve().stragglerThreshold;
        for (const auto& j : torch_ext::stragglersFromSnapshots(snaps, threshold)) out.push_back(j.dump());
        return out;
      },
      py::arg("texts"),
      "The watchdog's straggler rule (StragglerBoard) over the wait windows of dump texts (already validated); "
      "one JSON object per group.");
  m.def(
      "_decode_status",
      [](const std::string& text) -> py::object {
        auto rec = torch_ext::StatusRecord::decode(text);
        if (!rec) return py::none();
        py::dict d;
        d["phase"] = std::string(torch_ext::enumName(rec->phase));
        d["heartbeat_ns"] = rec->heartbeatNs;
        d["last_seq"] = rec->lastSeq;
        return d;
      },
      "A status record (st/<rank>) as a dict, or None when it is not one.");
  m.def(
      "_publish_live_directory",
      [](const c10::intrusive_ptr<c10d::Backend>& b) {
        torch_ext::Watchdog::instance().publishLiveDirectory(asGuard(b).state());
      },
      "The default group: say where `torch-ext-diagnose live` finds its keys (rank 0 only; never waits on the store).");
}

// The host runtime's hooks: call sites, stacks, logging, labels, library folders.
void bindRuntime(py::module& m) {
  m.def("_install_runtime", [](const std::vector<std::string>& internal, const std::vector<std::string>& stdlib,
                               const std::vector<std::string>& site, unsigned long mainThreadId) {
    torch_ext::py::installRuntime(internal, stdlib, site, mainThreadId);
  });
  m.def(
      "_at_exit",
      [](const std::string& uncaught) {
        std::vector<std::string> mismatches;
        {
          // The watchdog never needs the GIL, but the runtime's helper may.
          py::gil_scoped_release release;
          mismatches = torch_ext::Watchdog::instance().atExit(uncaught);
          // Reports logged just before the error that ends the process (e.g.
          // a mismatch) are written before the runtime detaches.
          torch_ext::py::flushLogs(std::chrono::seconds(2));
        }
        torch_ext::py::uninstallRuntime();
        return mismatches;
      },
      "Interpreter exit: says 'exited' for every guarded group, stops the watchdog without waiting on the store, "
      "keeps inner backends alive, and detaches the Python runtime.");
  m.def(
      "_keep_forever", [](const py::object& o) { o.inc_ref(); },
      "Keeps an object alive to the end of the process: never destroyed, not even at interpreter exit (a forked "
      "child's inherited groups, whose threads stayed in the parent).");
  m.def("_launcher_stop", &torch_ext::installLauncherStop, py::arg("error_file"),
        "Under torchrun: a SIGTERM from the launcher leaves this rank's report in the log, the dumps and the "
        "launcher's error file before the process ends (LauncherStop.h); false where SIGTERM has a handler already.");
  m.def("_launcher_error", &torch_ext::writeLauncherErrorFile, py::arg("path"), py::arg("message"), py::arg("details"),
        "Writes torchelastic's error file at `path` unless one exists (LauncherStop.h).");
  m.def("_set_call_sites", &torch_ext::py::setCallSitesEnabled);
  m.def(
      "_set_software", [](const std::string& text) { torch_ext::Runtime::instance().setSoftware(text); },
      "What this process runs (torch, torch_ext and Python versions), for every snapshot and dump.");
  m.def(
      "_intern_label",
      [](const std::string& text, const std::vector<std::pair<std::string, std::string>>& fields,
         const std::string& hint, const std::vector<std::pair<py::object, int>>& origin) {
        if (text.empty()) throw py::value_error("torch_ext.label: the text must not be empty");
        torch_ext::Label label;
        label.text = text;
        label.fields = fields;
        label.hint = hint;
        for (const auto& [code, line] : origin) {
          if (!PyCode_Check(code.ptr())) {
            throw py::type_error("torch_ext.label: an origin must be a code object and a line, got " +
                                 std::string(py::str(py::type::of(code))));
          }
        }
        // Resolved when the label is first read (a report, a dump, torch_ext.ledger()),
        // unless a name cannot be read without the GIL then (not ASCII): resolved now.
        std::vector<torch_ext::OriginRef> lazy;
        bool allLazy = true;
        for (const auto& [code, line] : origin) {
          if (!torch_ext::py::keepForLazyOrigin(code.ptr())) {
            allLazy = false;
            break;
          }
          lazy.push_back(torch_ext::OriginRef{code.ptr(), line});
        }
        if (!allLazy) {
          lazy.clear();
          for (const auto& [code, line] : origin) label.origin.push_back(torch_ext::py::frameOfCode(code.ptr(), line));
        }
        return torch_ext::LabelTable::instance().intern(label, lazy);
      },
      py::arg("text"), py::arg("fields"), py::arg("hint"), py::arg("origin"),
      "Interns a label (text, fields, hint, origin frames as (code object, line), innermost first); 0 when the "
      "table is full.");
  m.def(
      "_labels_unresolved", [] { return torch_ext::LabelTable::instance().unresolved(); },
      "How many interned labels still hold origins not resolved to text (tests).");
  m.def("_set_label", &torch_ext::LabelTable::setCurrent, py::arg("id"),
        "Sets the calling thread's current label id (0: none); returns the previous one.");
  m.def("_set_listed_libraries", &torch_ext::py::setListedLibraries,
        "Folders of the packages named in TORCH_EXT_LIBRARY_PACKAGES, as (folder prefix, package name) pairs.");
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  bindStoreProtocol(m);
  m.doc() = "torch_ext C++ core: the guard backend, its watchdog and reports";

  py::register_exception_translator(&torch_ext::py::translateError);

  bindSetup(m);
  bindJoin(m);
  bindNcclSim(m);
  bindGroups(m);
  bindWatchdog(m);
  bindRuntime(m);
}
