"""The PHASE_LLM_REQUEST data every harness kind builds through one function (PROTOCOL_0_19
§F.4): its previews are cut to 200 and 500 characters."""

from __future__ import annotations

from corral.harnesses._llm_request import llm_request


def test_the_previews_are_cut_and_the_counts_kept() -> None:
    data = llm_request(
        model="m", messages=3, tools=2, instructions="i" * 300, last_user_message="u" * 900
    )
    assert data == {
        "model": "m",
        "messages_count": 3,
        "tools_count": 2,
        "system_prompt_preview": "i" * 200,
        "last_user_message": "u" * 500,
    }
    assert (
        llm_request(model="m", messages=1, tools=0, instructions=None, last_user_message="")[
            "system_prompt_preview"
        ]
        == ""
    )
