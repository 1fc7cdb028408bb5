"""Named chat templates for tokenizers that ship none (`--chat-template NAME`).

Each is the message part of a public model family's template (tool calling left out), in the
Jinja dialect of Hugging Face transformers' `apply_chat_template` ("Templates for chat
models" in the transformers docs). `bos_token` and `eos_token` come from the tokenizer.
"""

from __future__ import annotations

from pathlib import Path

from astrai.errors import ConfigError

# ChatML (OpenAI's Chat Markup Language, as Qwen and many fine-tunes use it) with a BOS at
# the start when the tokenizer has one. astrai's trained tokenizers default to it.
CHATML = (
    "{{ bos_token if bos_token else '' }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Meta-Llama-3-8B-Instruct's template, verbatim.
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] "
    "| trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content "
    "%}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# Qwen2.5-Instruct's template without its tool branches: a default system prompt when the
# conversation has none.
QWEN25 = (
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == 'user') or (message.role == 'system' and not loop.first) "
    "or (message.role == 'assistant') %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
    "'\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

# Mistral-7B-Instruct's [INST] format: BOS once, user turns in [INST] ... [/INST], each
# reply closed by EOS; a system message is put before the first user message (as Mistral's
# later templates do); roles must alternate.
MISTRAL = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system = messages[0]['content'] %}{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set system = '' %}{%- set loop_messages = messages %}{%- endif %}"
    "{{- bos_token }}"
    "{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/"
    "assistant/...') }}{%- endif %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if loop.first and system %}{{- '[INST] ' + system + '\n\n' + message['content'] + "
    "' [/INST]' }}"
    "{%- else %}{{- '[INST] ' + message['content'] + ' [/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] + eos_token }}"
    "{%- else %}{{- raise_exception('Only system, user and assistant roles are supported') }}"
    "{%- endif %}{%- endfor %}"
)

# Llama-2-Chat: the system prompt inside the first [INST] as <<SYS>> ... <</SYS>>.
LLAMA2 = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system = messages[0]['content'] %}{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set system = '' %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/"
    "assistant/...') }}{%- endif %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if loop.first and system %}{%- set content = '<<SYS>>\\n' + system + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{%- else %}{%- set content = "
    "message['content'] %}{%- endif %}"
    "{{- bos_token + '[INST] ' + content | trim + ' [/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] | trim + ' ' + "
    "eos_token }}{%- endif %}{%- endfor %}"
)

NAMED_TEMPLATES: dict[str, str] = {
    "chatml": CHATML, "llama3": LLAMA3, "qwen2.5": QWEN25, "mistral": MISTRAL,
    "llama2": LLAMA2,
}
"""Templates `--chat-template NAME` selects."""


def resolve_template(value: str) -> str:
    """A template name (see NAMED_TEMPLATES) or a path to a .jinja file -> template text."""
    if value in NAMED_TEMPLATES:
        return NAMED_TEMPLATES[value]
    path = Path(value)
    if path.is_file():
        return path.read_text(encoding="utf-8")
    raise ConfigError(f"--chat-template {value}: not a template name ({', '.join(NAMED_TEMPLATES)})"
                      " nor an existing .jinja file")
