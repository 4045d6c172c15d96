"""What every harness kind tells policy of a turn's first model call (``PHASE_LLM_REQUEST``,
PROTOCOL_0_19 §F.4), built in one place so each kind quotes the same amount."""

from __future__ import annotations

from typing import TypedDict

#: How much of the instructions and of the user's last message the question quotes.
INSTRUCTIONS_PREVIEW = 200
LAST_MESSAGE_PREVIEW = 500


class LlmRequestData(TypedDict):
    """The data of :meth:`TurnContext.check_llm_request`."""

    model: str
    messages_count: int
    tools_count: int
    system_prompt_preview: str
    last_user_message: str


def llm_request(
    *,
    model: str,
    messages: int,
    tools: int,
    instructions: str | None,
    last_user_message: str,
) -> LlmRequestData:
    """The data of :meth:`TurnContext.check_llm_request`, its previews cut to size."""
    return {
        "model": model,
        "messages_count": messages,
        "tools_count": tools,
        "system_prompt_preview": (instructions or "")[:INSTRUCTIONS_PREVIEW],
        "last_user_message": last_user_message[:LAST_MESSAGE_PREVIEW],
    }
