"""Imported by `import verl` in worker processes to select the CPU platform there.

verl loads the modules named in `VERL_USE_EXTERNAL_MODULES` when it is first imported (its
documented plugin hook). Ray actors and other spawned workers of a CPU run get

    VERL_USE_EXTERNAL_MODULES=agentscope_rft.trainers.verl.cpu_plugin

in their environment, so the CPU platform and engine registration are in place before verl reads
the device name. GPU runs never set it.
"""

from agentscope_rft.trainers.verl.platform import register_cpu_platform

register_cpu_platform()
