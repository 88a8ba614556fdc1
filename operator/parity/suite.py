"""The parity gate's prompt suites: the default one shipped with Folio, and a team's own as JSONL.

The default suite is generated here, deterministically (the same 500 prompts on every machine and in
every release that keeps this file), and varied: chat conversations with and without a system prompt,
code to complete and to write, arithmetic, text in several languages and scripts, structured output, and
a long context (over 1,000 tokens) every 50th prompt. ``prompts: N`` takes the first N, so any N mixes
all kinds but the long ones, which start at prompt 50.

A team's suite is JSONL: one ``{"prompt": "…"}`` or ``{"messages": [{"role": …, "content": …}, …]}``
per line (blank lines and lines starting with ``#`` are skipped). `parse_suite` says exactly which line
is wrong; an empty suite is an error too, since a gate over nothing would pass anything.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

DEFAULT_SIZE = 500
ROLES = ("system", "user", "assistant")


class SuiteError(ValueError):
    """A suite that cannot run: missing, malformed or empty."""


@dataclass(frozen=True)
class SuitePrompt:
    prompt: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content)

    def to_wire(self) -> dict[str, Any]:
        """The prompt as the engine's `POST /folio/v1/parity` takes it."""
        if self.messages is not None:
            return {"messages": [{"role": r, "content": c} for r, c in self.messages]}
        return {"prompt": self.prompt}

    def summary(self, limit: int = 80) -> str:
        text = self.prompt if self.prompt is not None else " | ".join(c for _, c in self.messages or ())
        text = " ".join(text.split())
        return text if len(text) <= limit else text[: limit - 1] + "…"


def parse_suite(text: str, source: str = "the suite") -> list[SuitePrompt]:
    prompts: list[SuitePrompt] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source} line {number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SuiteError(f"{where}: not JSON ({exc.msg})") from None
        prompts.append(_entry(item, where))
    if not prompts:
        raise SuiteError(f"{source} holds no prompt")
    return prompts


def _entry(item: object, where: str) -> SuitePrompt:
    if not isinstance(item, dict) or len({"prompt", "messages"} & item.keys()) != 1:
        raise SuiteError(f'{where}: expected an object with exactly one of "prompt" or "messages"')
    if "prompt" in item:
        prompt = item["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise SuiteError(f'{where}: "prompt" must be a non-empty string')
        return SuitePrompt(prompt=prompt)
    messages = item["messages"]
    if not isinstance(messages, list) or not messages:
        raise SuiteError(f'{where}: "messages" must be a non-empty list')
    out = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise SuiteError(f'{where}: each message needs a "role" ({", ".join(ROLES)}) and a string "content"')
        out.append((m["role"], m["content"]))
    return SuitePrompt(messages=tuple(out))


# ------------------------------------------------------------------------------------ the default suite

_TOPICS = [
    "photosynthesis", "the French Revolution", "black holes", "the water cycle", "compound interest",
    "how vaccines work", "the Roman Empire", "plate tectonics", "machine learning", "the printing press",
    "coral reefs", "the Silk Road", "electric cars", "the human heart", "jazz music", "volcanoes",
    "the stock market", "honeybees", "the Moon landing", "recycling",
]
_ASKS = [
    "Explain {t} to a ten-year-old.", "Give three facts about {t}.", "What is the most common misconception "
    "about {t}?", "Write a short paragraph about {t}.", "Summarize {t} in one sentence.",
    "Why does {t} matter today?",
]
_SYSTEMS = [
    "You are a concise assistant.", "You are a friendly teacher.", "Answer in exactly one sentence.",
    "You are a helpful assistant who answers with a numbered list.",
]
_CODE = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "def is_prime(n: int) -> bool:\n",
    "# Python: read a CSV file and print the sum of its second column\nimport csv\n",
    "function debounce(fn, ms) {\n",
    "SELECT name, COUNT(*) AS orders\nFROM customers JOIN orders ON",
    "#include <stdio.h>\n\nint main(void) {\n",
    "fn reverse(s: &str) -> String {\n",
    "class Stack:\n    def __init__(self):\n",
    "def binary_search(items, target):\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n",
]
_CODE_ASKS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a SQL query that returns the ten most recent orders.",
    "Explain what this does: `[x * x for x in range(10) if x % 2]`",
    "Write a bash one-liner that counts the lines of every .py file in a folder.",
    "How do I reverse a linked list in C?",
]
_LANGUAGES = [
    "La capitale de la France est", "Der schnellste Weg zum Bahnhof ist", "El río más largo del mundo es",
    "日本の首都は", "中国最长的河流是", "Самая высокая гора в мире —", "A capital do Brasil é",
    "La pizza margherita è nata a", "Stolicą Polski jest", "İstanbul'un en ünlü yapısı",
]
_LANGUAGE_ASKS = [
    "Traduis en anglais : « Le chat dort sur le canapé. »", "Was ist der Unterschied zwischen Wetter und Klima?",
    "¿Cuántos continentes hay en el mundo?", "日本語で自己紹介をしてください。", "用一句话介绍长城。",
    "Расскажи коротко о Москве.",
]
_FACTS = [
    "The capital of France is", "Water boils at a temperature of", "The largest planet in the solar system is",
    "The author of Romeo and Juliet is", "The chemical symbol for gold is", "The speed of light is about",
    "The tallest mountain on Earth is", "The year the Second World War ended was",
]
_FORMATS = [
    'Return JSON with keys "name" and "age" for a 31-year-old called Ada:',
    "List the first five prime numbers, separated by commas:",
    "Write a haiku about autumn:",
    "Fill in the table.\n| country | capital |\n| Italy | Rome |\n| Spain |",
]


# leads put a fixed text prompt into different contexts, so the suite's 500 prompts are (nearly) all distinct
_LEADS = ["", "Continue the text.\n", "Answer briefly.\n", "Complete this:\n", "Be precise.\n", "Task:\n",
          "Reply in plain text.\n", "Here is the start:\n", "Think, then answer.\n", "Finish it.\n"]


def _pick(items: list[str], i: int) -> str:
    """The (i // 10)-th of ``items`` in the lead of its round: distinct over len(items) × len(_LEADS) slots."""
    n = i // 10
    return _LEADS[(n // len(items)) % len(_LEADS)] + items[n % len(items)]


def _arithmetic(rng: random.Random) -> str:
    a, b = rng.randint(2, 999), rng.randint(2, 999)
    op = rng.choice("+-*")
    return f"Q: What is {a} {op} {b}?\nA:"


def _word_problem(rng: random.Random) -> tuple[tuple[str, str], ...]:
    n, price = rng.randint(3, 40), rng.randint(2, 25)
    item = rng.choice(["apples", "notebooks", "tickets", "pencils", "mugs"])
    return (("user", f"I buy {n} {item} at {price} dollars each. How much do I pay? Show your work."),)


def _long_context(rng: random.Random, index: int) -> str:
    """A ledger of invented records and a question about it: about 1,350 tokens for SmolLM2's BPE (digits
    are a token each). Just over 1,000 on purpose: prefill cost grows with the square of the length, and
    the ten long contexts dominate the gate's time (120 records took 3,250 tokens and 60% of it)."""
    names = ["Alice", "Bob", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana", "Ivan", "Julia"]
    cities = ["Lisbon", "Osaka", "Lagos", "Quito", "Oslo", "Pune", "Perth", "Tunis"]
    lines = [f"Shipping ledger {index}. Each line: date, customer, destination, parcels, weight in kg."]
    for day in range(50):
        lines.append(
            f"2026-{1 + day // 28:02d}-{1 + day % 28:02d}, {rng.choice(names)}, {rng.choice(cities)}, "
            f"{rng.randint(1, 9)} parcels, {rng.randint(1, 400) / 10:.1f} kg"
        )
    who = rng.choice(names)
    lines.append(f"\nQuestion: to which destinations did {who} ship parcels in this ledger? Answer:")
    return "\n".join(lines)


def default_suite(size: int = DEFAULT_SIZE) -> list[SuitePrompt]:
    """The first ``size`` prompts of Folio's default suite (any size; the sequence is fixed)."""
    rng = random.Random(14)
    out: list[SuitePrompt] = []
    for i in range(size):
        kind = i % 10
        if i % 50 == 49:
            out.append(SuitePrompt(prompt=_long_context(rng, i)))
        elif kind == 0:
            ask = rng.choice(_ASKS).format(t=rng.choice(_TOPICS))
            out.append(SuitePrompt(messages=(("user", ask),)))
        elif kind == 1:
            out.append(SuitePrompt(prompt=_pick(_CODE, i)))
        elif kind == 2:
            out.append(SuitePrompt(prompt=_arithmetic(rng)))
        elif kind == 3:
            ask = rng.choice(_ASKS).format(t=rng.choice(_TOPICS))
            out.append(SuitePrompt(messages=(("system", rng.choice(_SYSTEMS)), ("user", ask))))
        elif kind == 4:
            out.append(SuitePrompt(prompt=_pick(_LANGUAGES, i)))
        elif kind == 5:
            out.append(SuitePrompt(messages=(("user", _pick(_CODE_ASKS, i)),)))
        elif kind == 6:
            out.append(SuitePrompt(prompt=_pick(_FACTS, i)))
        elif kind == 7:
            out.append(SuitePrompt(messages=_word_problem(rng)))
        elif kind == 8:
            out.append(SuitePrompt(messages=(("user", _pick(_LANGUAGE_ASKS, i)),)))
        else:
            out.append(SuitePrompt(prompt=_pick(_FORMATS, i)))
    return out
