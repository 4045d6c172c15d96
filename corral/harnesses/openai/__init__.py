"""The ``openai`` worker kind: an agent loop against any OpenAI-compatible endpoint.

One turn is a loop of model calls. Each call streams (Server-Sent Events) from either the
Responses API (``POST {base_url}/responses``) or Chat Completions
(``POST {base_url}/chat/completions``); text and reasoning deltas go to the turn as they
arrive, and tool calls are run through the runner (:meth:`TurnContext.call_tool`), appended
to the conversation with their outputs, and the model is called again, until it answers
without calling a tool or ``max_steps`` calls were made.

The problem is everything in between: providers rate-limit (429), fail (5xx), hang, drop the
connection mid-stream and now and then send garbage. The rules, chosen so that a turn never
hangs and a user never sees the same text twice:

* 408/409/429/5xx and connection errors are retried with exponential backoff and jitter
  (``retry-after`` honoured, capped), but only while nothing of the attempt reached the turn;
  a drop after text was streamed fails the turn (``provider_disconnected``).
* Any other HTTP status fails at once (``provider_error``) with the provider's own message.
* No byte for ``idle_timeout_s``, or a turn longer than ``turn_timeout_s``: ``timeout``.
* A ``data:`` payload that is not a JSON object fails the turn (``provider_protocol_error``):
  skipping it could silently lose text or tool-call arguments. SSE comments, unknown event
  types and unknown fields are skipped: they are how providers keep connections alive and
  extend the protocol.

Interrupts arrive as trio cancellation, which closes the model call's connection. The worker
keeps one HTTP client for all its turns (a connection goes back to it only once its call's
body was read to the end), and its TLS context comes built from the zygote (:mod:`corral._tls`).
The api key only travels in the ``Authorization`` header: it is never logged and is
scrubbed from provider messages before they become errors.

Configuration (spec first, then worker options, then environment) is documented in
``docs/harnesses.md``.

Modules: ``_settings`` (where settings come from), ``_harness`` (:class:`OpenAIHarness`),
``_loop`` (the agent loop and its retries), ``_streams`` (SSE and the two APIs' events),
``_step`` (what one model call produced), ``_conversations`` (each call's request).
"""

from ._harness import OpenAIHarness as OpenAIHarness
from ._harness import llm_request_data as llm_request_data
from ._loop import RETRYABLE_STATUS as RETRYABLE_STATUS
from ._settings import APIS as APIS
from ._settings import DEFAULT_BASE_URL as DEFAULT_BASE_URL
from ._settings import DEFAULTS as DEFAULTS
from ._settings import RESPONSES_HARNESSES as RESPONSES_HARNESSES
from ._settings import Settings as Settings
from ._settings import resolve_settings as resolve_settings
from ._streams import MAX_SSE_LINE as MAX_SSE_LINE
