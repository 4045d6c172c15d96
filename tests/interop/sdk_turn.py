"""One turn through omnigent's official client SDK (``omnigent_client``), run with the
omnigent venv's Python: ``python sdk_turn.py SERVER_URL RUNNER_ID AGENT TEXT``.

Prints one JSON line: the event types the SDK's stream yielded for the turn, the streamed
text, and whether the stream ended before the turn did. The SDK is asyncio-based; this file
is a client program of the server, not part of corral.
"""

import asyncio
import json
import sys

from omnigent_client import OmnigentClient


async def main(url: str, runner_id: str, agent: str, text: str) -> dict:
    types: list[str] = []
    chunks: list[str] = []
    async with OmnigentClient(base_url=url) as client:
        registered = await client.sessions.resolve_agent(agent)
        session = await client.sessions.create_from_agent_id(registered.id)
        await client.sessions.bind_runner(session.id, runner_id=runner_id)
        subscribed = asyncio.Event()
        finished = asyncio.Event()
        running = False

        async def read() -> None:
            nonlocal running
            async for event in client.sessions.stream(session.id):
                subscribed.set()
                data = event.model_dump()  # the SDK yields the server's typed event models
                types.append(data.get("type", "?"))
                if data.get("type") == "response.output_text.delta":
                    chunks.append(str(data.get("delta", "")))
                if data.get("type") == "session.status":
                    running = running or data.get("status") == "running"
                    if running and data.get("status") in ("idle", "failed"):
                        finished.set()
                        return

        reader = asyncio.create_task(read())
        await asyncio.wait_for(subscribed.wait(), 30)
        await client.sessions.post_event(
            session.id,
            {
                "type": "message",
                "data": {"role": "user", "content": [{"type": "input_text", "text": text}]},
            },
        )
        try:
            await asyncio.wait_for(asyncio.shield(reader), 60)
        except Exception as exc:  # the stream broke: report it as the SDK's user would see it
            return {"types": types, "text": "".join(chunks), "ended_early": repr(exc)}
        return {
            "types": types,
            "text": "".join(chunks),
            "ended_early": None if finished.is_set() else "stream ended",
        }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:5]))))
