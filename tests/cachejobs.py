"""The prompt-cache planner's jobs: lines that share prefixes as real jobs do.

``document_qa``: one instruction set (~1,200 tokens), documents of ~1,500 tokens, questions
asked of each; the lines shuffled and nothing marked, as a user would write them. Tokens
are the fake's ``chars`` tokenizer's (about four characters a token).
"""

from __future__ import annotations

import random
from typing import Any

WORDS = tuple(
    [
        "river",
        "stone",
        "harbor",
        "ledger",
        "signal",
        "meadow",
        "copper",
        "lantern",
        "orbit",
        "thistle",
        "granite",
        "willow",
        "canyon",
        "quarry",
        "beacon",
        "saddle",
        "furnace",
        "compass",
        "glacier",
        "hollow",
        "marble",
        "pepper",
        "saffron",
        "tundra",
        "violet",
        "walnut",
        "yonder",
        "zephyr",
        "anchor",
    ]
)


def text(tokens: int, rng: random.Random, paragraph: int = 60) -> str:
    """About ``tokens`` tokens of words (4 characters a token), in paragraphs."""
    words: list[str] = []
    size = 0
    while size < tokens * 4:
        word = rng.choice(WORDS)
        words.append(word)
        size += len(word) + 1
    lines = [" ".join(words[i : i + paragraph]) + "." for i in range(0, len(words), paragraph)]
    return "\n\n".join(lines)


def document_qa(
    model: str,
    *,
    documents: int = 30,
    questions: int = 8,
    instructions: int = 1200,
    document: int = 1500,
    seed: int = 7,
    max_tokens: int = 16,
) -> list[dict[str, Any]]:
    """The document-QA job: ``documents`` x ``questions`` lines, shuffled (see the module)."""
    rng = random.Random(seed)
    system = "You answer questions about documents.\n\n" + text(instructions, rng)
    lines = []
    for d in range(documents):
        body = f"Document {d}:\n\n" + text(document, rng)
        for q in range(questions):
            question = f"Question {q}: what does document {d} say about {rng.choice(WORDS)}?"
            lines.append(
                {
                    "model": model,
                    "max_tokens": max_tokens,
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": f"{body}\n\n{question}"},
                    ],
                }
            )
    rng.shuffle(lines)
    return lines


def unshared(
    model: str, lines: int = 60, tokens: int = 1500, seed: int = 3, max_tokens: int = 16
) -> list[dict[str, Any]]:
    """Lines of long prompts that share nothing (each its own text)."""
    rng = random.Random(seed)
    return [
        {
            "model": model,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": f"{i}: " + text(tokens, rng)}],
        }
        for i in range(lines)
    ]
