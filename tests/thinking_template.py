"""A Qwen3-like chat template for tests of reasoning models, on the tiny models' ChatML tokenizer.

Like Qwen3's own template it splits `<think>...</think>` off an assistant message's content,
renders the last assistant turn with its thinking and earlier ones without it (so a conversation's
rendering is not a prefix of its continuation's), and `enable_thinking=false` closes an empty think
block in the generation prompt. `R1_LIKE` opens the think block in the generation prompt, as
DeepSeek-R1's template does.
"""

_TURNS = (
    "{%- for message in messages -%}"
    "{%- if message.role == 'assistant' -%}"
    "{%- set content = message.content or '' -%}"
    "{%- set reasoning = '' -%}"
    "{%- if '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{%- if loop.last -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content -}}"
    "{%- else -%}"
    "{{- '<|im_start|>assistant\\n' + content -}}"
    "{%- endif -%}"
    "{%- for call in message.tool_calls or [] -%}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + call.function.name + \'", "arguments": \''
    " + call.function.arguments + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content"
    " + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)

QWEN3_LIKE = (
    _TURNS + "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}{%- endif -%}"
)

R1_LIKE = (
    _TURNS
    + "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n<think>\\n' -}}{%- endif -%}"
)
