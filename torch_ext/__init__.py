"""torch_ext: distributed PyTorch training that never hangs silently.

``import torch_ext`` registers the c10d backend ``guard`` (mismatch detection and
live hang reports around gloo/NCCL) and loads the ``torch.ops.torch_ext`` ops.
"""
from __future__ import annotations

import torch  # noqa: F401  (loads libtorch before our extension)
import torch.distributed  # noqa: F401

from torch_ext._version import __version__  # noqa: E402,F401  (written in one place, _version.py)

# Refuses, with one clear ImportError, a _C compiled against another torch.
from torch_ext._core import _C  # noqa: E402

from torch_ext import _logging, _runtime  # noqa: E402
from torch_ext import errors as _errors  # noqa: E402
from torch_ext.errors import (
    CollectiveFailureError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    GuardError,
    StoreLostError,
    DeadlockError,
    GroupJoinError,
    Report,
)
from torch_ext.backend import (
    BACKEND_NAME,
    GuardOptions,
    describe,
    dump,
    explain,
    failure,
    group_state,
    inner_backend,
    ledger,
    live_report,
    monitored_barrier,
    refuse_torchcomms_route as _refuse_torchcomms_route,
    register as _register,
    store_health,
)
from torch_ext.labels import Origin, here, label  # noqa: E402
from torch_ext.stragglers import Straggler, StragglerReport, stragglers  # noqa: E402
from torch_ext.ops import *  # noqa: F401,F403
from torch_ext.ops import __all__ as _ops_all
from torch_ext.step_sync import *  # noqa: F401,F403
from torch_ext.step_sync import __all__ as _step_sync_all
from torch_ext.uneven import *  # noqa: F401,F403
from torch_ext.uneven import __all__ as _uneven_all
from torch_ext.samplers import *  # noqa: F401,F403
from torch_ext.samplers import __all__ as _samplers_all

_refuse_torchcomms_route()  # before anything is installed: one clear ImportError
_C._register_exceptions(GuardError, CollectiveMismatchError, CollectiveTimeoutError, CollectiveFailureError,
                        StoreLostError, DeadlockError, GroupJoinError)
_errors.set_report_source(_C._failure_facts)  # GuardError.report: the core's record of the failure
_logging.install()  # labelled reports on stderr while the application configures no logging
_runtime.install()
_register()

__all__ = [
    "BACKEND_NAME",
    "GuardOptions",
    "GuardError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "CollectiveFailureError",
    "StoreLostError",
    "DeadlockError",
    "GroupJoinError",
    "Report",
    "describe",
    "dump",
    "explain",
    "failure",
    "group_state",
    "inner_backend",
    "label",
    "here",
    "Origin",
    "ledger",
    "live_report",
    "monitored_barrier",
    "store_health",
    "Straggler",
    "StragglerReport",
    "stragglers",
    *_ops_all,
    *_step_sync_all,
    *_uneven_all,
    *_samplers_all,
]
