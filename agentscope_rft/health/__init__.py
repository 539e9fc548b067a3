"""Run health: rules over every training step's metrics (entropy collapse, log-prob gap,
equal-reward groups, truncation, KL, reward collapse, NaN/inf) and what the run does when one
fires: warn, stop, or roll back to the last healthy checkpoint. See docs/health.md."""

from agentscope_rft.health.config import HealthConfig
from agentscope_rft.health.rules import Finding, StepMetrics
from agentscope_rft.health.watcher import HealthEvent, HealthWatcher, read_events

__all__ = ["Finding", "HealthConfig", "HealthEvent", "HealthWatcher", "StepMetrics", "read_events"]
