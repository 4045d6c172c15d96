"""The event types a session's server-facing stream may carry: :data:`SERVER_STREAM_TYPES`.

The omnigent server republishes every event of a runner's ``GET /v1/sessions/{id}/stream``
through its client-stream serializer, a discriminated union on ``type`` (PROTOCOL_0_19.md
§D.2). An event whose ``type`` is not one of the union's tags does not just get dropped: it
raises inside every subscribed client's SSE response and cuts that client's stream mid-turn.
So the gateway sends only these types upstream; everything else a harness or dispatch emits
(``runtime_model``, ``injection.consumed``, ``warning``, ``policy_evaluation.requested``, …)
stays in the journal, which dispatch feeds on its own path.

The set was read from omnigent 0.19.1 (``omnigent.server.schemas.ServerStreamEvent``: the
``type`` literal of each member of the union), 55 tags. ``session.heartbeat`` is in the union
but the relay consumes it itself.
"""

from __future__ import annotations

SERVER_STREAM_TYPES: frozenset[str] = frozenset(
    {
        "browser.action_request",
        "response.cancelled",
        "response.client_task.cancel",
        "response.compaction.completed",
        "response.compaction.failed",
        "response.compaction.in_progress",
        "response.completed",
        "response.created",
        "response.elicitation_request",
        "response.elicitation_resolved",
        "response.error",
        "response.failed",
        "response.function_call_output.delta",
        "response.heartbeat",
        "response.in_progress",
        "response.incomplete",
        "response.output_file.done",
        "response.output_item.done",
        "response.output_text.delta",
        "response.policy_denied",
        "response.queued",
        "response.reasoning.started",
        "response.reasoning_summary_text.delta",
        "response.reasoning_text.delta",
        "response.retry",
        "session.agent_changed",
        "session.btw_sidechat",
        "session.changed_files.invalidated",
        "session.child_session.updated",
        "session.codex_approval_mode",
        "session.collaboration_mode",
        "session.created",
        "session.heartbeat",
        "session.input.consumed",
        "session.interrupted",
        "session.mcp_startup",
        "session.model",
        "session.model_options",
        "session.permission_mode",
        "session.presence",
        "session.reasoning_effort",
        "session.resource.created",
        "session.resource.deleted",
        "session.sandbox_status",
        "session.status",
        "session.superseded",
        "session.terminal.activity",
        "session.terminal_pending",
        "session.title",
        "session.todos",
        "session.usage",
        "turn.cancelled",
        "turn.completed",
        "turn.failed",
        "turn.started",
    }
)
