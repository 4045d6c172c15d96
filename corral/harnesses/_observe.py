"""Runtime-model observation: report the model that actually serves a run (J-20..J-31).

A worker tells the observer what is serving at each moment (:meth:`Observer.serve`) and what
it is about to emit. The observer decides when a ``runtime_model`` event is due:

* before the first output (text or reasoning) that a known serving model produced (J-20, J-21);
* again when the serving model, provider or fallback flag changes (J-22);
* again after a fallback-switch warning, which invalidates the last observation (J-24);
* never twice for an observation that is still valid (J-25), never for an attempt status
  (J-26), never for an unknown model (J-27), never on a failed run (J-28);
* once at completion for a successful run that produced no output (J-31).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Serving:
    """What serves the run right now, as the provider reports it."""

    model: str | None
    provider: str | None
    fallback_active: bool = False


class Observer:
    """Decides when to emit ``runtime_model`` events for one run."""

    def __init__(self, session_id: str, stream_id: str) -> None:
        self.session_id = session_id
        self.stream_id = stream_id
        self.serving = Serving(None, None)
        self._valid: Serving | None = None

    def serve(self, model: str | None, provider: str | None, fallback_active: bool) -> None:
        """Record what serves the run from now on (observes nothing by itself)."""
        self.serving = Serving(model, provider, fallback_active)

    def before_output(self) -> dict | None:
        """Call before emitting output; returns an observation to emit first, or None."""
        return self._observe()

    def on_status(self, text: str) -> bool:
        """A provider lifecycle status; True if it is a fallback switch worth a warning.

        A switch invalidates the current observation, so the next output (or completion)
        re-observes. An attempt ("Trying fallback ...") changes nothing (J-26).
        """
        if text.lower().startswith("switched to fallback"):
            self._valid = None
            return True
        return False

    def at_completion(self, *, failed: bool) -> dict | None:
        """At the end of the run: a final observation for a successful run, if due."""
        if failed:
            return None
        return self._observe()

    def _observe(self) -> dict | None:
        serving = self.serving
        # ``is`` first: once observed, the two are one object, and this runs per delta.
        if serving.model is None or serving is self._valid or serving == self._valid:
            return None
        self._valid = self.serving
        return {
            "session_id": self.session_id,
            "stream_id": self.stream_id,
            "model": self.serving.model,
            "provider": self.serving.provider,
            "fallback_active": self.serving.fallback_active,
            "phase": "observed_output",
        }
