"""Server-side policies for the interop suite, loaded by the real omnigent server.

Each follows omnigent's function-policy contract (an event dict in, a response dict or None
out). They exist so that a test can tell whether corral asked the server at a phase: a policy
that never runs cannot deny.
"""


def deny_forbidden_llm_requests(event):
    """DENY an LLM request whose last user message says ``forbidden``."""
    if event.get("type") != "llm_request":
        return None
    data = event.get("data") or {}
    if "forbidden" in str(data.get("last_user_message") or ""):
        return {"result": "DENY", "reason": "interop: forbidden prompt"}
    return {"result": "ALLOW"}


def deny_tool_results_with_hello(event):
    """DENY a tool result that contains ``hello-from-tool``."""
    if event.get("type") != "tool_result":
        return None
    if "hello-from-tool" in str((event.get("data") or {}).get("result") or ""):
        return {"result": "DENY", "reason": "interop: tool output withheld"}
    return {"result": "ALLOW"}


def deny_sub_agent_results(event):
    """DENY a tool result that holds the ``plain`` model's words (a sub-agent's answer)."""
    if event.get("type") != "tool_result":
        return None
    if "w0 w1 w2" in str((event.get("data") or {}).get("result") or ""):
        return {"result": "DENY", "reason": "interop: sub-agent output withheld"}
    return {"result": "ALLOW"}
