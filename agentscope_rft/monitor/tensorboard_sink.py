"""TensorBoard event files in `<run_dir>/tensorboard`, written with tensorboard's own writer
(no TensorFlow, no torch import)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import yaml
from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.plugins.text.plugin_data_pb2 import TextPluginData
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from agentscope_rft.monitor.records import plain_config, qualified_name


class TensorBoardSink:
    """Scalars per step (tag = metric name; `eval/<name>` for eval), the config as text.

    The first event of every session is a `SessionLog.START` at the first logged step, so after
    a resume TensorBoard drops the abandoned branch's points (step >= resume step).
    """

    def __init__(self, log_dir: Path, resolved_config: Mapping[str, object]) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self._writer = EventFileWriter(str(log_dir), flush_secs=10)
        self._resolved_config = resolved_config
        self._started = False

    def log(self, step: int, metrics: Mapping[str, float], phase: str) -> None:
        now = time.time()
        if not self._started:
            self._started = True
            start = SessionLog(status=SessionLog.START)
            self._writer.add_event(Event(wall_time=now, step=step, session_log=start))
            self._writer.add_event(Event(wall_time=now, step=step, summary=self._config_text()))
        values = [
            Summary.Value(tag=qualified_name(phase, name), simple_value=float(value))
            for name, value in metrics.items()
        ]
        self._writer.add_event(Event(wall_time=now, step=step, summary=Summary(value=values)))

    def flush(self) -> None:
        self._writer.flush()

    def close(self, *, failed: bool) -> None:
        self._writer.close()

    def _config_text(self) -> Summary:
        """The resolved config as YAML in TensorBoard's Text tab (indented: Markdown code)."""
        text = yaml.safe_dump(plain_config(self._resolved_config), sort_keys=False)
        markdown = "\n".join("    " + line for line in text.splitlines())
        plugin = SummaryMetadata.PluginData(
            plugin_name="text", content=TextPluginData(version=0).SerializeToString()
        )
        tensor = TensorProto(
            dtype="DT_STRING",
            string_val=[markdown.encode("utf-8")],
            tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]),
        )
        value = Summary.Value(
            tag="config", metadata=SummaryMetadata(plugin_data=plugin), tensor=tensor
        )
        return Summary(value=[value])
