"""The `X-Agent-Name` header: which agent of a multi-agent app made a gateway call.

Kept apart from `gateway.app` so that an episode runner process (`runtime/ray/process.py`), which
sends the header but serves nothing, does not import the gateway's engine stack (torch,
transformers, the structured-output grammars) just for a header name.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

AGENT_HEADER = "x-agent-name"
# Printable ASCII but `%` passes as is; anything else (a Chinese agent name, a newline) is
# percent-encoded, since an HTTP header value is ASCII.
_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) not in "%")


def encode_agent_name(name: str) -> str:
    """`name` as an `X-Agent-Name` header value (UTF-8 percent-encoded where not plain ASCII).

    Example:
        >>> encode_agent_name("助手"), encode_agent_name("solver 2")
        ('%E5%8A%A9%E6%89%8B', 'solver 2')
    """
    return quote(name, safe=_HEADER_SAFE)


def decode_agent_name(value: str | None) -> str | None:
    """The agent name an `X-Agent-Name` header carries (see `encode_agent_name`)."""
    return None if value is None else unquote(value)
