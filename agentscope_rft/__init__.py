"""agentscope-rft: train existing AgentScope agent apps in place with reinforcement fine-tuning."""

__version__ = "0.1.0"
