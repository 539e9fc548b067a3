"""Streamed content's detokenizing cost per reply length: the engine's `TextStream` against
decoding the whole completion at every token (what it did before 2026-11-29).

    python benchmarks/stream_decode.py [--tokens 256,1024,4096,8192] [--repeats 3]

AgentScope 2.x's `OpenAIChatModel` streams by default (`stream=True`), so every call of an app
that keeps the default is streamed by the gateway, and its detokenizing runs on the event loop
every episode and the gateway share. The work is tokenizer-bound: the embedded model's real
tokenizer, a multilingual text with tool-call markup, best of `--repeats`; tool-call parsing on
both sides. Prints one row per length: seconds per reply, both sides, and the speed-up.
"""

from __future__ import annotations

import argparse
import time

from agentscope_rft.chat.template import decode_text
from agentscope_rft.chat.tools import StreamingToolParser
from agentscope_rft.engines.chat import TextStream
from agentscope_rft.models import EMBEDDED_MODEL, load_tokenizer, resolve_model

TEXT = (
    "The agent searched for the capital of France and found Paris (2,102,650 people in 2023). "
    "北京是中国的首都。 Emoji 🙂 and café. "
    '<tool_call>\n{"name": "search", "arguments": {"query": "AT&T headquarters"}}\n</tool_call>\n'
)


def whole_decode_each_token(tokenizer, ids: list[int]) -> str:
    """The baseline: the text of all ids so far at every token, the new part fed on."""
    parser, fed, out = StreamingToolParser(), "", []
    for n in range(1, len(ids) + 1):
        text = decode_text(tokenizer, ids[:n])
        stable = len(text)
        while stable > 0 and text[stable - 1] == "\ufffd":
            stable -= 1
        if stable > len(fed):
            out.append(parser.feed(text[len(fed) : stable]))
            fed = text[:stable]
    return "".join(out)


def incremental(tokenizer, ids: list[int]) -> str:
    stream = TextStream(tokenizer, [], parse_tools=True)
    return "".join(stream.push(i) for i in ids)


def best_of(repeats: int, fn, *args) -> tuple[float, str]:
    best, out = float("inf"), ""
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(*args)
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", default="256,1024,4096,8192")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tokenizer = load_tokenizer(resolve_model(EMBEDDED_MODEL))
    lengths = [int(n) for n in args.tokens.split(",")]
    ids = tokenizer(TEXT * (max(lengths) // 20 + 1), add_special_tokens=False)["input_ids"]
    print("| tokens | TextStream (s) | whole decode each token (s) | speed-up |")
    print("|---:|---:|---:|---:|")
    for n in lengths:
        ours, ours_text = best_of(args.repeats, incremental, tokenizer, ids[:n])
        base, base_text = best_of(args.repeats, whole_decode_each_token, tokenizer, ids[:n])
        assert ours_text == base_text, "the two sides streamed different content"
        print(f"| {n:,} | {ours:.4f} | {base:.3f} | {base / ours:.0f}x |", flush=True)


if __name__ == "__main__":
    main()
