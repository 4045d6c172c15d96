"""A fake LLM provider for the interop suite: OpenAI Responses and Chat Completions, streamed.

Run as a program (``python tests/interop/fake_llm.py --log FILE``): it binds 127.0.0.1 on a free
port, prints ``port=<n>`` on its first line and serves until killed. Both the real omnigent
server's runner and corral reach it through the agent YAML's ``auth.base_url``; it is the only
thing faked in the interop suite, since a model provider is the only part outside the machine.

What it answers is scripted by the request's **model name** (the agent YAML's ``model``), so one
provider serves every agent of a test module:

``plain``     five words, ``w0 w1 w2 w3 w4``
``echo``      ``echo: `` and every user text of the input, joined by `` | ``
``slow``      40 words, 0.1 s apart (long enough to interrupt)
``tool``      a ``sys_os_shell`` call (``echo hello-from-tool``); after its output: ``tool said: …``
``toolread``  a ``sys_os_read`` call of ``hello.txt``; after its output: ``read: …``
``sessioninfo``, ``sessionlist``, ``agentlist``  a ``sys_session_get_info``, ``sys_session_list``
              or ``sys_agent_list`` call (no arguments); after its output: ``info: …`` ...
``history``   ``users=N`` and the user texts it was given, so a test sees the history
``codexcmd``  an ``exec_command`` call (the Codex CLI's shell tool: ``echo hello-from-codex >
              codex.txt``); after its output: ``codex said: …``
``picmd``     a ``bash`` call (pi's shell tool: ``echo hello-from-pi > pi.txt``); after its
              output: ``pi said: …``
``calls``     the tool call its last user text names, as JSON ``{"tool", "arguments"}`` (a test
              passes ids it only learns at run time); woken by a sub-agent's result, a
              ``sys_read_inbox``; after its output: ``called: …``
``delegate``  a ``sys_session_send`` to its sub-agent ``child`` (title ``t1``); woken by the
              child's result (a last user text ``[System: sub-agent …``) a ``sys_read_inbox``;
              after either output: ``delegate: …``
``flaky``     HTTP 429 (``retry-after: 0.2``) the first time it sees a user text, then five
              words as ``plain`` (the runner's retry of a model call)
``fanout``    two ``sys_session_send`` calls, to ``child`` titled ``t1`` then ``t2`` (the second
              once the first has answered its handle: both children then work at once), then
              ``fanout: launched``; woken, a ``sys_read_inbox`` and ``fanout: …``

Every request body is appended to ``--log`` as one JSON line, with the path it came to.

Claude Code (the ``claude-sdk`` harness) calls the Anthropic Messages API instead
(``POST /v1/messages?beta=true``), answered as Anthropic streams it, by the same model names,
plus:

``claudecode``  a ``Bash`` call (``echo hello-from-claude > claude.txt``); after its result:
                ``claude said: …``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOOLS = {
    "tool": ("sys_os_shell", {"command": "echo hello-from-tool"}, "tool said: "),
    "toolread": ("sys_os_read", {"path": "hello.txt"}, "read: "),
    "sessioninfo": ("sys_session_get_info", {}, "info: "),
    "sessionlist": ("sys_session_list", {}, "sessions: "),
    "agentlist": ("sys_agent_list", {}, "agents: "),
    # The Codex CLI's own shell tool (the codex harness).
    "codexcmd": ("exec_command", {"cmd": "echo hello-from-codex > codex.txt"}, "codex said: "),
    # pi's own shell tool (the pi harness).
    "picmd": ("bash", {"command": "echo hello-from-pi > pi.txt"}, "pi said: "),
}


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    out = []
    for part in content or []:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            out.append(part["text"])
    return out


def _user_texts(body: dict[str, Any]) -> list[str]:
    items = body.get("input") if "input" in body else body.get("messages")
    if isinstance(items, str):
        return [items]
    texts: list[str] = []
    for item in items or []:
        if isinstance(item, dict) and item.get("role") == "user":
            texts.extend(_texts(item.get("content")))
    return texts


def _tool_output(body: dict[str, Any]) -> str | None:
    """The last tool output in the input, if the input ends with one."""
    items = body.get("input") if "input" in body else body.get("messages")
    if not isinstance(items, list) or not items:
        return None
    last = items[-1]
    if not isinstance(last, dict):
        return None
    if last.get("type") == "function_call_output":
        return str(last.get("output"))
    if last.get("role") == "tool":
        return "".join(_texts(last.get("content")))
    return None


def _calls_since_user(body: dict[str, Any]) -> int:
    """How many tool calls the input holds after its last user message (this turn's)."""
    items = body.get("input") if "input" in body else body.get("messages")
    count = 0
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        if item.get("role") == "user":
            count = 0
        elif item.get("type") == "function_call":
            count += 1
        elif item.get("role") == "assistant" and item.get("tool_calls"):
            count += len(item["tool_calls"])
    return count


def plan(body: dict[str, Any]) -> tuple[list[str], tuple[str, str] | None, float]:
    """(text deltas, a tool call (name, arguments JSON) or None, pause between deltas)."""
    model = str(body.get("model") or "")
    if model in TOOLS:
        name, arguments, prefix = TOOLS[model]
        output = _tool_output(body)
        if output is None:
            return [], (name, json.dumps(arguments)), 0.0
        return [prefix, output[:200]], None, 0.0
    if model == "calls":
        output = _tool_output(body)
        if output is not None:
            return ["called: ", output[:300]], None, 0.0
        if _user_texts(body)[-1].startswith("[System: sub-agent"):
            return [], ("sys_read_inbox", "{}"), 0.0
        asked = json.loads(_user_texts(body)[-1])
        return [], (asked["tool"], json.dumps(asked["arguments"])), 0.0
    if model == "delegate":
        output = _tool_output(body)
        if output is not None:
            return ["delegate: ", output[:300]], None, 0.0
        users = _user_texts(body)
        if users and users[-1].startswith("[System: sub-agent"):
            return [], ("sys_read_inbox", "{}"), 0.0
        send = {"agent": "child", "title": "t1", "args": "hi child"}
        return [], ("sys_session_send", json.dumps(send)), 0.0
    if model == "fanout":
        output = _tool_output(body)
        users = _user_texts(body)
        woken = bool(users) and users[-1].startswith("[System: sub-agent")
        if output is not None and woken:
            return ["fanout: ", output[:600]], None, 0.0
        if woken:
            return [], ("sys_read_inbox", "{}"), 0.0
        sent = _calls_since_user(body)
        if sent < 2:
            send = {"agent": "child", "title": f"t{sent + 1}", "args": f"part {sent + 1}"}
            return [], ("sys_session_send", json.dumps(send)), 0.0
        return ["fanout: launched"], None, 0.0
    if model == "echo":
        return ["echo: ", " | ".join(_user_texts(body))], None, 0.0
    if model == "history":
        users = _user_texts(body)
        return [f"users={len(users)} ", " | ".join(users)], None, 0.0
    if model == "slow":
        return [f"s{i} " for i in range(40)], None, 0.1
    return [f"w{i} " if i < 4 else f"w{i}" for i in range(5)], None, 0.0


#: The user texts ``flaky`` answered 429 already (one failure each).
_FLAKY_FAILED: set[str] = set()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    log_path = ""

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the log file is enough
        pass

    def do_GET(self) -> None:
        body = json.dumps(
            {
                "object": "list",
                "data": [
                    {"id": m, "object": "model"}
                    for m in ("plain", "echo", "slow", "tool", "toolread", "history")
                ],
            }
        ).encode()
        self._plain(200, body)

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw)
        except ValueError:
            self._plain(400, b'{"error":{"message":"bad json"}}')
            return
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"path": self.path, "at": time.time(), "body": body}) + "\n")
        if body.get("model") == "flaky":
            key = json.dumps(_user_texts(body))
            if key not in _FLAKY_FAILED:
                _FLAKY_FAILED.add(key)
                self._plain(429, b'{"error":{"message":"slow down"}}', {"retry-after": "0.2"})
                return
        deltas, call, pace = plan(body)
        if self.path.split("?")[0].rstrip("/").endswith("/messages"):
            frames = _anthropic(body, *_claude_plan(body, deltas))
        elif self.path.rstrip("/").endswith("/responses"):
            frames = _responses(body, deltas, call)
        elif self.path.rstrip("/").endswith("/chat/completions"):
            frames = _chat(body, deltas, call)
        else:
            self._plain(404, b'{"error":{"message":"no such route"}}')
            return
        if not body.get("stream"):
            self._plain(400, b'{"error":{"message":"this fake only streams"}}')
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        try:
            for frame, is_delta in frames:
                if is_delta and pace:
                    time.sleep(pace)
                self.wfile.write(f"{len(frame):x}\r\n".encode() + frame + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _plain(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _sse(obj: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + json.dumps(obj) + "\n\n").encode()


def _responses(
    body: dict[str, Any], deltas: list[str], call: tuple[str, str] | None
) -> list[tuple[bytes, bool]]:
    rid = f"resp_{int(time.time() * 1e6)}"
    model = str(body.get("model"))
    base = {"id": rid, "object": "response", "model": model, "created_at": int(time.time())}
    frames = [
        (
            _sse(
                {
                    "type": "response.created",
                    "response": {**base, "status": "in_progress", "output": []},
                },
                "response.created",
            ),
            False,
        )
    ]
    output: list[dict[str, Any]] = []
    if deltas:
        item_id = f"msg_{rid}"
        item = {
            "type": "message",
            "id": item_id,
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        frames.append(
            (
                _sse(
                    {"type": "response.output_item.added", "output_index": 0, "item": item},
                    "response.output_item.added",
                ),
                False,
            )
        )
        for d in deltas:
            frames.append(
                (
                    _sse(
                        {
                            "type": "response.output_text.delta",
                            "item_id": item_id,
                            "output_index": 0,
                            "content_index": 0,
                            "delta": d,
                        },
                        "response.output_text.delta",
                    ),
                    True,
                )
            )
        done = {
            **item,
            "status": "completed",
            "content": [{"type": "output_text", "text": "".join(deltas), "annotations": []}],
        }
        output.append(done)
        frames.append(
            (
                _sse(
                    {"type": "response.output_item.done", "output_index": 0, "item": done},
                    "response.output_item.done",
                ),
                False,
            )
        )
    if call is not None:
        name, arguments = call
        item = {
            "type": "function_call",
            "id": f"fc_{rid}",
            "call_id": f"call_{rid}",
            "name": name,
            "arguments": arguments,
            "status": "completed",
        }
        output.append(item)
        frames.append(
            (
                _sse(
                    {
                        "type": "response.output_item.added",
                        "output_index": len(output) - 1,
                        "item": {**item, "arguments": "", "status": "in_progress"},
                    },
                    "response.output_item.added",
                ),
                False,
            )
        )
        frames.append(
            (
                _sse(
                    {
                        "type": "response.output_item.done",
                        "output_index": len(output) - 1,
                        "item": item,
                    },
                    "response.output_item.done",
                ),
                False,
            )
        )
    usage = {
        "input_tokens": 10,
        "output_tokens": 5,
        "total_tokens": 15,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    frames.append(
        (
            _sse(
                {
                    "type": "response.completed",
                    "response": {**base, "status": "completed", "output": output, "usage": usage},
                },
                "response.completed",
            ),
            False,
        )
    )
    return frames


def _chat(
    body: dict[str, Any], deltas: list[str], call: tuple[str, str] | None
) -> list[tuple[bytes, bool]]:
    model = str(body.get("model"))

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return _sse(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "model": model,
                "created": int(time.time()),
                "choices": [choice],
            }
        )

    frames = [(chunk({"role": "assistant", "content": ""}), False)]
    frames += [(chunk({"content": d}), True) for d in deltas]
    if call is not None:
        name, arguments = call
        head = {
            "index": 0,
            "id": f"call_{int(time.time() * 1e6)}",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        frames.append((chunk({"tool_calls": [head]}), False))
    frames.append((chunk({}, "tool_calls" if call else "stop"), False))
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    frames.append(
        (
            _sse(
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "model": model,
                    "choices": [],
                    "usage": usage,
                }
            ),
            False,
        )
    )
    frames.append((b"data: [DONE]\n\n", False))
    return frames


def _claude_plan(
    body: dict[str, Any], deltas: list[str]
) -> tuple[list[str], tuple[str, dict[str, Any]] | None]:
    """What a Messages API request is answered: ``claudecode`` runs a shell command through
    Claude Code's own ``Bash`` tool; any other model answers as ``plan`` does."""
    if body.get("model") != "claudecode":
        return deltas, None
    last = (body.get("messages") or [{}])[-1]
    results = [
        b
        for b in last.get("content") or []
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    if not results:
        command = {"command": "echo hello-from-claude > claude.txt", "description": "write"}
        return ["On it. "], ("Bash", command)
    output = results[-1].get("content")
    text = output if isinstance(output, str) else " ".join(_texts(output))
    return ["claude said: ", text[:200] or "(no output)"], None


def _anthropic(
    body: dict[str, Any], deltas: list[str], call: tuple[str, dict[str, Any]] | None
) -> list[tuple[bytes, bool]]:
    """A Messages API stream: one text block, then a ``tool_use`` block for ``call``."""
    usage = {"input_tokens": 10, "output_tokens": 5}
    message = {"id": "msg_fake", "type": "message", "role": "assistant", "content": []}
    events: list[tuple[dict[str, Any], bool]] = [
        (
            {
                "type": "message_start",
                "message": {**message, "model": body.get("model"), "usage": usage},
            },
            False,
        ),
        (
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            False,
        ),
    ]
    events += [
        (
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": d}},
            True,
        )
        for d in deltas
    ]
    events.append(({"type": "content_block_stop", "index": 0}, False))
    if call is not None:
        name, arguments = call
        block = {
            "type": "tool_use",
            "id": f"toolu_{int(time.time() * 1e6)}",
            "name": name,
            "input": {},
        }
        delta = {"type": "input_json_delta", "partial_json": json.dumps(arguments)}
        events += [
            ({"type": "content_block_start", "index": 1, "content_block": block}, False),
            ({"type": "content_block_delta", "index": 1, "delta": delta}, False),
            ({"type": "content_block_stop", "index": 1}, False),
        ]
    stop = {"stop_reason": "tool_use" if call else "end_turn", "stop_sequence": None}
    events += [
        ({"type": "message_delta", "delta": stop, "usage": usage}, False),
        ({"type": "message_stop"}, False),
    ]
    return [(_sse(event, event["type"]), is_delta) for event, is_delta in events]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    Handler.log_path = args.log
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"port={server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
