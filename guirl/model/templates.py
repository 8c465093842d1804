"""The tiny checkpoint's chat templates, in the shape of Qwen3-VL's (Instruct and Thinking).

guirl's own Jinja, not Qwen's text: what a real checkpoint's template does with the prompts guirl sends
(system turn with the tools block for `tools=`, image placeholders in place, tool turns; for Thinking, the
`<think>` generation prompt and past reasoning left out). tests/integration/test_tiny_model.py pins what
they render; tests/contract/test_gui_rl_prompt.py compares the Thinking one's rendering of GUI-RL's prompts
with what Qwen's own Thinking template renders for them.
"""

# The shape of Qwen3-VL's chat templates: system turn (with the tool preamble when tools are given),
# user/assistant/tool turns, images as <|vision_start|><|image_pad|><|vision_end|> in place. Built from
# pieces so that the Instruct and Thinking variants share their system turn (tools block) and tool turns.
_CONTENT = """\
{%- macro render_content(content) -%}
{%- if content is string -%}{{- content -}}
{%- else -%}{%- for item in content -%}
{%- if item.type == 'image' or 'image' in item or 'image_url' in item -%}
{%- set image_count.value = image_count.value + 1 -%}
{%- if add_vision_id -%}Picture {{ image_count.value }}: {% endif -%}
<|vision_start|><|image_pad|><|vision_end|>
{%- elif item.type == 'video' or 'video' in item -%}
{%- set video_count.value = video_count.value + 1 -%}
{%- if add_vision_id -%}Video {{ video_count.value }}: {% endif -%}
<|vision_start|><|video_pad|><|vision_end|>
{%- elif 'text' in item -%}{{- item.text -}}
{%- endif -%}
{%- endfor -%}{%- endif -%}
{%- endmacro -%}
"""
# The Thinking variant's: `counted=false` renders a turn without numbering its images (the scan below).
_CONTENT_THINKING = """\
{%- macro render_content(content, counted=true) -%}
{%- if content is string -%}{{- content -}}
{%- else -%}{%- for item in content -%}
{%- if item.type == 'image' or 'image' in item or 'image_url' in item -%}
{%- if counted -%}{%- set image_count.value = image_count.value + 1 -%}{%- endif -%}
{%- if add_vision_id -%}Picture {{ image_count.value }}: {% endif -%}
<|vision_start|><|image_pad|><|vision_end|>
{%- elif item.type == 'video' or 'video' in item -%}
{%- if counted -%}{%- set video_count.value = video_count.value + 1 -%}{%- endif -%}
{%- if add_vision_id -%}Video {{ video_count.value }}: {% endif -%}
<|vision_start|><|video_pad|><|vision_end|>
{%- elif 'text' in item -%}{{- item.text -}}
{%- endif -%}
{%- endfor -%}{%- endif -%}
{%- endmacro -%}
"""
_SYSTEM_TURN = """\
{%- set image_count = namespace(value=0) -%}
{%- set video_count = namespace(value=0) -%}
{%- if tools -%}
{{- '<|im_start|>system\\n' -}}
{%- if messages[0].role == 'system' -%}{{- render_content(messages[0].content) + '\\n\\n' -}}{%- endif -%}
{{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n" -}}
{{- "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" -}}
{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, "
    "\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" -}}
{%- elif messages[0].role == 'system' -%}
{{- '<|im_start|>system\\n' + render_content(messages[0].content) + '<|im_end|>\\n' -}}
{%- endif -%}
"""
_USER_TURN = """\
{%- for message in messages -%}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}
{{- '<|im_start|>' + message.role + '\\n' + render_content(message.content) + '<|im_end|>\\n' -}}
"""
_ASSISTANT_TURN = """\
{%- elif message.role == 'assistant' -%}
{{- '<|im_start|>assistant\\n' + render_content(message.content) -}}
{%- if message.tool_calls -%}{%- for tool_call in message.tool_calls -%}
{%- if (loop.first and message.content) or (not loop.first) -%}{{- '\\n' -}}{%- endif -%}
"""
# Thinking: a past turn's reasoning (up to its last `</think>`) is left out when the turn came before the
# last user query (the scan below finds it: the last user turn that is not a tool response); a turn after
# it keeps its reasoning in a `<think>` block when it has some, or when it is the last message.
_LAST_QUERY = """\
{%- set query = namespace(index=messages|length - 1, searching=true) -%}
{%- for message in messages[::-1] -%}
{%- if query.searching and message.role == 'user' -%}
{%- set text = render_content(message.content, false) -%}
{%- if not (text.startswith('<tool_response>') and text.endswith('</tool_response>')) -%}
{%- set query.searching = false -%}{%- set query.index = messages|length - 1 - loop.index0 -%}
{%- endif -%}
{%- endif -%}
{%- endfor -%}
"""
_ASSISTANT_TURN_THINKING = """\
{%- elif message.role == 'assistant' -%}
{%- set content = render_content(message.content) -%}
{%- set reasoning = '' -%}
{%- if message.reasoning_content is string -%}{%- set reasoning = message.reasoning_content -%}
{%- elif '</think>' in content -%}
{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}
{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}
{%- endif -%}
{%- if loop.index0 > query.index and (loop.last or reasoning) -%}
{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' -}}
{{- content.lstrip('\\n') -}}
{%- else -%}{{- '<|im_start|>assistant\\n' + content -}}
{%- endif -%}
{%- if message.tool_calls -%}{%- for tool_call in message.tool_calls -%}
{%- if (loop.first and content) or (not loop.first) -%}{{- '\\n' -}}{%- endif -%}
"""
_TOOL_CALLS_AND_TOOL_TURN = """\
{%- if tool_call.function -%}{%- set tool_call = tool_call.function -%}{%- endif -%}
{{- '<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' -}}
{%- if tool_call.arguments is string -%}{{- tool_call.arguments -}}
{%- else -%}{{- tool_call.arguments | tojson -}}{%- endif -%}
{{- '}\\n</tool_call>' -}}
{%- endfor -%}{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- elif message.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\\n<tool_response>\\n' + render_content(message.content) + '\\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
{%- endif -%}
{%- endfor -%}
"""
CHAT_TEMPLATE = (
    _CONTENT
    + _SYSTEM_TURN
    + _USER_TURN
    + _ASSISTANT_TURN
    + _TOOL_CALLS_AND_TOOL_TURN
    + "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n"
)
"""Qwen3-VL-Instruct's shape (the default tiny checkpoint's template)."""
THINKING_CHAT_TEMPLATE = (
    _CONTENT_THINKING
    + _SYSTEM_TURN
    + _LAST_QUERY
    + _USER_TURN
    + _ASSISTANT_TURN_THINKING
    + _TOOL_CALLS_AND_TOOL_TURN
    + "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n<think>\\n' -}}{%- endif -%}\n"
)
"""Qwen3-VL-Thinking's shape: the generation prompt opens a `<think>` block, and past turns' reasoning is
left out (see `_LAST_QUERY`); system turn and tools block as `CHAT_TEMPLATE`'s."""
