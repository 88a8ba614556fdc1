"""Which key a request is placed by: session, user, then its prefix."""

from __future__ import annotations

from folio.operator.router.affinity import PREFIX, affinity_key

SYSTEM = "You are the billing assistant of ACME. " * 10


def _chat(system: str, question: str, **extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            **extra}


def test_chat_requests_sharing_a_system_prompt_share_a_key() -> None:
    one = affinity_key(_chat(SYSTEM, "Where is my invoice?"), [], 100)
    other = affinity_key(_chat(SYSTEM, "Cancel my plan"), [], 100)
    assert one is not None and one == other
    assert affinity_key(_chat("You are a pirate. " * 10, "Where is my invoice?"), [], 100) != one


def test_the_key_covers_prefix_char_length_characters() -> None:
    short_system = _chat("Be brief.", "What is 2+2?")
    assert affinity_key(short_system, [], 100) != affinity_key(_chat("Be brief.", "What is 3+3?"), [], 100)
    assert affinity_key(short_system, [], 10) == affinity_key(_chat("Be brief.", "What is 3+3?"), [], 10)
    key = affinity_key({"prompt": "x" * 500}, [], 100)
    assert key is not None and key.endswith("x" * 100) and "x" * 101 not in key


def test_tools_come_first_in_a_chat_prefix_as_templates_write_them() -> None:
    weather = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    clock = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    turn = affinity_key(_chat(SYSTEM, "Paris?", tools=weather), [], 100)
    assert turn == affinity_key(_chat(SYSTEM, "And Rome?", tools=weather), [], 100)  # an agent's next turn
    assert turn != affinity_key(_chat(SYSTEM, "Paris?", tools=clock), [], 100)
    assert turn != affinity_key(_chat(SYSTEM, "Paris?"), [], 100)
    assert turn is not None and len(turn) == len(PREFIX) + 100  # the limit holds with the tools in it


def test_roles_are_part_of_the_rendered_prefix() -> None:
    as_system = {"messages": [{"role": "system", "content": "hello"}]}
    as_user = {"messages": [{"role": "user", "content": "hello"}]}
    assert affinity_key(as_system, [], 100) != affinity_key(as_user, [], 100)


def test_content_parts_and_odd_messages() -> None:
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"},
                                                       {"type": "image_url", "image_url": {"url": "x"}}]}]}
    plain = {"messages": [{"role": "user", "content": "hello"}]}
    assert affinity_key(parts, [], 100) == affinity_key(plain, [], 100)
    assert affinity_key({"messages": ["not a message", 3]}, [], 100) is None
    assert affinity_key({"messages": []}, [], 100) is None


def test_completion_prompts_strings_batches_and_token_ids() -> None:
    assert affinity_key({"prompt": "abc"}, [], 100) == affinity_key({"prompt": ["abc", "zzz"]}, [], 100)
    ids = affinity_key({"prompt": list(range(100))}, [], 100)
    assert ids is not None and ids == affinity_key({"prompt": [list(range(100))]}, [], 100)
    assert ids == affinity_key({"prompt": [*range(25), 999]}, [], 100)  # about four characters a token
    assert affinity_key({"prompt": ""}, [], 100) is None
    assert affinity_key({"prompt": 42}, [], 100) is None
    assert affinity_key({}, [], 100) is None


def test_session_header_then_user_field_win_over_the_prefix() -> None:
    one, other = _chat(SYSTEM, "a", user="alice"), _chat("different", "b", user="alice")
    assert affinity_key(one, [], 100) == affinity_key(other, [], 100)
    assert affinity_key(one, [], 100) != affinity_key(_chat(SYSTEM, "a", user="bob"), [], 100)
    session = [("X-Session-Id", "s-1")]
    assert affinity_key(one, session, 100) == affinity_key({"prompt": "zzz"}, session, 100)
    assert affinity_key(one, session, 100) != affinity_key(one, [], 100)
    # a user named like a session id never collides with that session
    assert affinity_key({"user": "s-1"}, [], 100) != affinity_key({}, session, 100)
    assert affinity_key(_chat(SYSTEM, "a", user=""), [], 100) == affinity_key(_chat(SYSTEM, "a"), [], 100)
