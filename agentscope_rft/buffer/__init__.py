"""The buffer between explorer and trainer: storages of whole advantage groups.

`MemoryBuffer` (in-process) and `SQLBuffer` (SQLite file or any SQLAlchemy URL; crash-safe,
multi-process) implement the `Buffer` protocol; `build_buffer` makes one from `BufferConfig`.
`export_samples` / `import_to_buffer` move samples between a SQL buffer and JSONL (an import
skips the samples the buffer already holds). See
docs/buffer.md for the guarantees and the storage format. SFT/DPO files load through
`agentscope_rft.buffer.offline` (not imported here: it needs transformers).
"""

from agentscope_rft.buffer.base import (
    STATS_KEYS,
    Buffer,
    BufferFormatError,
    BufferInputError,
    BufferTimeout,
)
from agentscope_rft.buffer.config import BufferConfig, build_buffer
from agentscope_rft.buffer.export import (
    DEFAULT_EXPORT_FIELDS,
    export_samples,
    import_samples,
    import_to_buffer,
    iter_stored_samples,
)
from agentscope_rft.buffer.importing import ImportReport
from agentscope_rft.buffer.memory import MemoryBuffer
from agentscope_rft.buffer.sql import SQLBuffer

__all__ = [
    "DEFAULT_EXPORT_FIELDS",
    "STATS_KEYS",
    "Buffer",
    "BufferConfig",
    "BufferFormatError",
    "BufferInputError",
    "BufferTimeout",
    "ImportReport",
    "MemoryBuffer",
    "SQLBuffer",
    "build_buffer",
    "export_samples",
    "import_samples",
    "import_to_buffer",
    "iter_stored_samples",
]
