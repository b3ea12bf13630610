"""AReaL integration: `AgentWorkflow` plays a bundle's tasks, each sample in its own sandbox, with only
the solver's model traffic going through modeltap's proxy to AReaL. Imports no AReaL.

    from modeltap.adapter import AgentWorkflow, task_rows
    rows = task_rows("bundle.toml")                      # the dataset
    workflow = AgentWorkflow("bundle.toml", runner="docker")
"""

from modeltap.adapter.bundle import Bundle, BundleError, load_bundle
from modeltap.adapter.loop import shutdown
from modeltap.adapter.runner import AdapterError, ModelFault, RunFailed, RunTimedOut, Unscored
from modeltap.adapter.sandbox import SandboxError
from modeltap.adapter.workflow import AgentWorkflow, should_reject_failed_sample, task_rows

__all__ = [
    "AdapterError",
    "AgentWorkflow",
    "Bundle",
    "BundleError",
    "ModelFault",
    "RunFailed",
    "RunTimedOut",
    "SandboxError",
    "Unscored",
    "load_bundle",
    "should_reject_failed_sample",
    "shutdown",
    "task_rows",
]
