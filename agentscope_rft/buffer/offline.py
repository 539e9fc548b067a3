"""Offline training data from JSONL files: SFT conversations and DPO preference pairs.

SFT lines are `{"messages": [...], "tools"?: [...]}` in OpenAI chat format; every assistant turn is
trained (its text and its end-of-turn token), except those marked `"weight": 0` (as in OpenAI's
fine-tuning files), nothing else. TRL's `{"prompt": ..., "completion": ...}` lines (each a text
or a list of messages) train the completion's assistant turns. DPO lines are `{"prompt":
[messages] or a text, "chosen": <assistant message, a list of one, or a string>, "rejected": ...,
"tools"?: [...]}`; only the final assistant turn of each side is trained. Conversations are
rendered with the model's chat template through `ChatRenderer` (an assistant turn's
`reasoning_content` as the `<think>` block it was written in), and tokenized as the engine
tokenizes an episode (each assistant turn on its own, the text between turns on its own), so
the ids are the ones a run's samples hold; assistant spans are found from rendered prefixes,
which relies on the template being append-only (it is checked).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agentscope_rft.buffer.jsonl import read_json_objects
from agentscope_rft.chat.template import (
    ChatFormatError,
    ChatRenderer,
    normalize_tools,
)
from agentscope_rft.types import JSON, Sample


class OfflineDataError(ValueError):
    """A bad line in an offline data file; the message names the file, line and field."""


def _other_format_hint(record: JSON, field: str) -> str:
    """What a line without `field` looks like, when it is another format this package knows."""
    if "token_ids" in record:
        return (
            " (this line is a sample exported by `agentscope-rft buffer export`: store the file "
            "back with `agentscope-rft buffer import --url BUFFER --input FILE` and train from "
            "that buffer with run.mode: train_only)"
        )
    if field == "messages" and "chosen" in record:
        return " (this line is a DPO pair: set offline.format: dpo and algorithm.objective: dpo)"
    if field == "prompt" and "messages" in record:
        return " (this line is an SFT conversation: set offline.format: sft)"
    if field == "prompt" and "chosen" in record:
        return (
            " (write the conversation before the responses in 'prompt', and only the final "
            "assistant response in 'chosen' and 'rejected')"
        )
    return f" (the line has {', '.join(map(repr, record)) or 'no fields'})"


def _messages_field(record: JSON, field: str, where: str) -> list[JSON]:
    messages = record.get(field)
    if field not in record:
        raise OfflineDataError(
            f"{where}: field {field!r} is missing{_other_format_hint(record, field)}"
        )
    if not isinstance(messages, list) or not messages:
        raise OfflineDataError(f"{where}: field {field!r} must be a non-empty list of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise OfflineDataError(f"{where}: field {field!r}[{i}] must be a message object")
    return messages


def _tools_field(record: JSON, where: str) -> list[JSON] | None:
    tools = record.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise OfflineDataError(f"{where}: field 'tools' must be a list of tool schemas")
    try:
        return normalize_tools(tools)
    except ChatFormatError as err:
        raise OfflineDataError(f"{where}: field 'tools': {err}") from err


def _is_empty_turn(message: JSON) -> bool:
    if _reasoning_of(message):
        return False
    content = message.get("content")
    text = (
        "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
        if isinstance(content, list)
        else content
    )
    return not message.get("tool_calls") and (
        text is None or (isinstance(text, str) and not text.strip())
    )


REASONING_FIELDS = ("reasoning_content", "reasoning")
"""An assistant turn's thinking, as vLLM and DeepSeek name it (and Qwen3's template reads it)."""


def _reasoning_of(message: JSON) -> str | None:
    for field in REASONING_FIELDS:
        if message.get(field) is not None:
            return str(message[field])
    return None


def with_thinking(messages: Sequence[JSON]) -> list[JSON]:
    """`messages` with each assistant turn's `reasoning_content` (or `reasoning`) put back in its
    content as the model writes it, `<think>\n{reasoning}\n</think>\n\n{answer}` (Qwen3's template
    renders a turn's `reasoning_content` so): the engine trains a reasoning model's sampled
    thinking with its answer, and a template that reads only the content (or a template that
    reads no thinking at all) would otherwise drop it and train answers without thinking.

    Raises:
        ChatFormatError: the thinking is not a string, or the content holds its own `</think>`.
    """
    out = []
    for i, message in enumerate(messages):
        reasoning = _reasoning_of(message)
        if message.get("role") != "assistant" or reasoning is None:
            out.append(message)
            continue
        field = next(f for f in REASONING_FIELDS if message.get(f) is not None)
        if not isinstance(message[field], str):
            raise ChatFormatError(f"messages[{i}].{field} must be a string (the turn's thinking)")
        content = message.get("content") or ""
        if isinstance(content, list):  # OpenAI content parts
            content = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
        if "</think>" in content:
            raise ChatFormatError(
                f"messages[{i}] has both {field} and a <think> block in its content: give the "
                f"thinking once (drop {field}, or the <think>...</think> from the content)"
            )
        rest = {k: v for k, v in message.items() if k not in REASONING_FIELDS}
        thought = reasoning.strip("\n")
        out.append({**rest, "content": f"<think>\n{thought}\n</think>\n\n{content.lstrip()}"})
    return out


def _turns_field(record: JSON, field: str, role: str, where: str) -> list[JSON]:
    """A field that is a text (one message of `role`) or a list of messages."""
    if isinstance(record.get(field), str):
        return [{"role": role, "content": record[field]}]
    return _messages_field(record, field, where)


def _trained_turns(messages: Sequence[JSON], where: str, first: int = 0) -> list[int]:
    """Positions of the assistant turns to train, from `first` on: all, except those with
    OpenAI's `"weight": 0`."""
    trained = []
    for i, message in enumerate(messages):
        if i < first or message.get("role") != "assistant":
            continue
        weight = message.get("weight")
        if weight is not None and (isinstance(weight, bool) or weight not in (0, 1)):
            raise OfflineDataError(
                f"{where}: field 'messages'[{i}].weight must be 0 (context, not trained) or 1 "
                f"(trained), got {weight!r}"
            )
        if weight == 0:
            continue
        if _is_empty_turn(message):
            raise OfflineDataError(
                f"{where}: field 'messages'[{i}] is an assistant turn with no text and no tool "
                "calls: training on it teaches the model to answer nothing; give it its text, "
                'mark it "weight": 0, or drop the line'
            )
        trained.append(i)
    if not trained:
        raise OfflineDataError(
            f"{where}: field 'messages' has no assistant turn to train on (every assistant turn "
            'is missing or has "weight": 0)'
        )
    return trained


def _check_length(length: int, max_tokens: tuple[int, str] | None, where: str, field: str) -> None:
    if max_tokens is not None and length > max_tokens[0]:
        limit, source = max_tokens
        raise OfflineDataError(
            f"{where}: field {field!r} renders to {length} tokens, more than the {limit} the run "
            f"can train ({source}); shorten the conversation or drop the line"
        )


def _assistant_span(
    renderer: ChatRenderer, messages: Sequence[JSON], tools: list[JSON] | None, index: int
) -> tuple[int, int]:
    """Character span of assistant message `index` in the rendered conversation: from after the
    generation prompt to the end of its end-of-turn token."""
    before = renderer.render_text(messages[:index], tools, add_generation_prompt=True)
    after = renderer.render_text(messages[: index + 1], tools, add_generation_prompt=False)
    if not after.startswith(before):
        raise ChatFormatError(
            f"messages[{index}]: the chat template is not append-only here (the generation "
            "prompt is not a prefix of the rendered assistant turn)"
        )
    eos = renderer.end_of_turn  # the template's (a base model's tokenizer eos may differ)
    end = after.rfind(eos) + len(eos) if eos else -1
    return len(before), end if end > len(before) else len(after)


def render_with_assistant_mask(
    renderer: ChatRenderer,
    messages: Sequence[JSON],
    tools: list[JSON] | None,
    trained: Sequence[int],
) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation and a mask that is 1 on the assistant messages at
    positions `trained` (their text and end-of-turn token) and 0 elsewhere.

    The ids are the engine's for the same episode: each assistant turn (what the model
    generates) is tokenized on its own, as the template renders it when it is the last turn, the
    text between turns (what the engine renders after a reply) on its own, and the sample ends
    with the last reply's end-of-turn token. So a reasoning model's template, which drops the
    thinking of earlier turns, gives the engine's sample: every turn keeps its thinking, as
    `engine.reuse_prompt_tokens` keeps the sampled tokens in the next prompt. One pass over
    the whole text merged a reply's leading whitespace with the generation prompt's newline into
    other tokens, and the mask then dropped them.

    Example:
        >>> chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
        >>> ids, mask = render_with_assistant_mask(renderer, chat, None, [1])  # doctest: +SKIP
    """
    messages = with_thinking(messages)
    eos = renderer.end_of_turn
    pieces: list[tuple[str, int]] = []  # (text, trained) in order
    last: int | None = None  # the previous assistant turn laid out as generated
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        try:
            start, end = _assistant_span(renderer, messages, tools, index)
        except ChatFormatError:
            if index in trained:
                raise
            continue  # context rendered otherwise than when generated: part of the next prompt
        prompt = renderer.render_text(messages[:index], tools, add_generation_prompt=True)
        if last is None:
            between = prompt
        else:  # as the engine continues a reply: the next prompt's text after its end of turn
            before = renderer.render_text(messages[:last], tools, add_generation_prompt=False)
            cut = prompt.find(eos, len(before)) if eos and prompt.startswith(before) else -1
            if cut < 0:
                if index in trained:
                    raise ChatFormatError(
                        f"messages[{index}]: the chat template is not append-only here (it "
                        f"renders the history before messages[{last}] otherwise once that turn "
                        "is answered), so the engine would not continue one sample either; "
                        "split the conversation into one line per turn"
                    )
                continue
            between = prompt[cut + len(eos) :]
        turn = renderer.render_text(messages[: index + 1], tools, add_generation_prompt=False)
        pieces += [(between, 0), (turn[start:end], int(index in trained))]
        last = index
    token_ids: list[int] = []
    mask: list[int] = []
    for piece, value in pieces:  # what follows the last reply the engine never renders
        ids = renderer.encode(piece) if piece else []
        token_ids += ids
        mask += [value] * len(ids)
    return token_ids, mask


def load_sft_samples(
    path: str | Path, renderer: ChatRenderer, max_tokens: tuple[int, str] | None = None
) -> list[Sample]:
    """Samples of kind `sft` from a chat JSONL file, trained on assistant turns only.

    `max_tokens` is the longest sample the run can train and what sets it (`trainer.max_seq_len`,
    the context window); a longer conversation is refused here rather than at its step.

    Raises:
        OfflineDataError: a bad line (names the file, line number and field), or an empty file.

    Example:
        >>> samples = load_sft_samples("tests/data/sft_tiny.jsonl", renderer)  # doctest: +SKIP
        >>> samples[0].kind  # doctest: +SKIP
        'sft'
    """
    path = Path(path)
    samples: list[Sample] = []
    for lineno, record in read_json_objects(path, OfflineDataError):
        where = f"{path}:{lineno}"
        if "messages" not in record and "completion" in record:  # TRL's prompt-completion
            prompt = _turns_field(record, "prompt", "user", where)
            messages = [*prompt, *_turns_field(record, "completion", "assistant", where)]
            trained = _trained_turns(messages, where, first=len(prompt))
        else:
            messages = _messages_field(record, "messages", where)
            trained = _trained_turns(messages, where)
        tools = _tools_field(record, where)
        try:
            token_ids, mask = render_with_assistant_mask(renderer, messages, tools, trained)
        except ChatFormatError as err:
            raise OfflineDataError(f"{where}: field 'messages': {err}") from err
        _check_length(len(token_ids), max_tokens, where, "messages")
        sample_id = f"{path.name}:{lineno}"
        samples.append(
            Sample(
                token_ids=token_ids,
                loss_mask=mask,
                logprobs=[0.0] * len(token_ids),
                reward=0.0,
                rollout_id=sample_id,
                task_id=sample_id,
                sample_id=sample_id,
                kind="sft",
                num_calls=len(trained),
            )
        )
    if not samples:
        raise OfflineDataError(f"{path}: no samples (the file is empty)")
    return samples


def _response_message(record: JSON, field: str, where: str) -> JSON:
    value = record.get(field)
    if isinstance(value, list) and len(value) == 1:  # TRL's conversational preference rows
        value = value[0]
    if isinstance(value, str):
        return {"role": "assistant", "content": value}
    if isinstance(value, dict) and value.get("role", "assistant") == "assistant":
        return {"role": "assistant", **value}
    raise OfflineDataError(
        f"{where}: field {field!r} must be a string or one assistant message (an object, or a "
        "list holding it); earlier turns go in 'prompt'"
    )


def load_dpo_samples(
    path: str | Path, renderer: ChatRenderer, max_tokens: tuple[int, str] | None = None
) -> list[Sample]:
    """Two samples per line (kinds `dpo_chosen`, `dpo_rejected`, a shared `pair_id`) from a
    preference JSONL file; each trains only its final assistant turn (`max_tokens`: as for
    `load_sft_samples`).

    Raises:
        OfflineDataError: a bad line (names the file, line number and field), or an empty file.

    Example:
        >>> pair = load_dpo_samples("tests/data/dpo_tiny.jsonl", renderer)  # doctest: +SKIP
        >>> pair[0].pair_id == pair[1].pair_id  # doctest: +SKIP
        True
    """
    path = Path(path)
    samples: list[Sample] = []
    for lineno, record in read_json_objects(path, OfflineDataError):
        where = f"{path}:{lineno}"
        prompt = _turns_field(record, "prompt", "user", where)
        if prompt[-1].get("role") == "assistant":
            raise OfflineDataError(
                f"{where}: field 'prompt' must not end with an assistant message (the responses "
                "go in 'chosen' and 'rejected')"
            )
        tools = _tools_field(record, where)
        chosen = _response_message(record, "chosen", where)
        rejected = _response_message(record, "rejected", where)
        if _is_empty_turn(chosen):
            raise OfflineDataError(
                f"{where}: field 'chosen' is empty (no text and no tool calls): DPO would teach "
                "the model to prefer answering nothing; give the chosen response or drop the line"
            )
        pair_id = f"{path.name}:{lineno}"
        for field, kind, response in (
            ("chosen", "dpo_chosen", chosen),
            ("rejected", "dpo_rejected", rejected),
        ):
            messages = [*prompt, response]
            try:
                token_ids, mask = render_with_assistant_mask(
                    renderer, messages, tools, [len(prompt)]
                )
            except ChatFormatError as err:
                raise OfflineDataError(f"{where}: field {field!r}: {err}") from err
            _check_length(len(token_ids), max_tokens, where, field)
            samples.append(
                Sample(
                    token_ids=token_ids,
                    loss_mask=mask,
                    logprobs=[0.0] * len(token_ids),
                    reward=0.0,
                    rollout_id=f"{pair_id}:{field}",
                    task_id=pair_id,
                    sample_id=f"{pair_id}:{field}",
                    kind=kind,
                    pair_id=pair_id,
                )
            )
        if samples[-1].token_ids == samples[-2].token_ids:
            raise OfflineDataError(
                f"{where}: fields 'chosen' and 'rejected' are the same response: the pair "
                "teaches nothing (its DPO gradient is zero); fix one of them or drop the line"
            )
    if not samples:
        raise OfflineDataError(f"{path}: no samples (the file is empty)")
    return samples
