"""The command line of a stand-in tool against cli-spec.json: the commands and
options the real `az`, `kubectl` and `kubelogin` have (generate_spec.py), and
the two ways a call ends badly (refused by the tool, or failed by the
platform)."""

from __future__ import annotations

import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
SPEC = json.loads((HERE / "cli-spec.json").read_text())


class Refused(Exception):
    """The real tool would not accept this command line."""


class Failed(Exception):
    """The real tool runs it and fails (exit code, message)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code

def parse(tool: str, argv: list[str]) -> tuple[str, dict[str, list[str]], list[str]]:
    """(command, options by canonical name, positionals), or Refused."""
    spec = SPEC[tool]
    words = []
    for token in argv:
        if token.startswith("-"):
            break
        words.append(token)
    command = None
    for n in range(len(words), 0, -1):
        if " ".join(words[:n]) in spec["commands"]:
            command = " ".join(words[:n])
            break
    if command is None:
        raise Refused(f"{tool} has no command '{' '.join(words)}' (cli-spec.json)")
    known = {**spec["global"], **spec["commands"][command]["options"]}
    options: dict[str, list[str]] = {}
    positionals: list[str] = []
    rest = argv[len(command.split()):]
    i = 0
    while i < len(rest):
        token = rest[i]
        i += 1
        if not token.startswith("-") or token == "-":
            if tool == "az":
                raise Refused(f"az {command} takes no positional argument '{token}'")
            positionals.append(token)
            continue
        name, eq, inline = token.partition("=")
        entry = known.get(name)
        if entry is None:
            raise Refused(f"{tool} {command} has no option {name} (cli-spec.json)")
        canonical = entry.get("alias_of", name)
        values = options.setdefault(canonical, [])
        if eq:
            values.append(inline)
        elif entry["value"]:
            start = i
            while i < len(rest) and (not rest[i].startswith("-") or rest[i] == "-"):
                i += 1
                if tool != "az":  # kubectl's options take one value
                    break
            # az's help does not tell a flag (--overwrite-existing) from an
            # option with an optional value (--overwrite [true|false]): an az
            # option takes the words that follow it, if any.
            if i == start and tool != "az":
                raise Refused(f"{tool} {command} {name} needs a value")
            values += rest[start:i]
        else:
            values.append("true")
    for name, entry in spec["commands"][command]["options"].items():
        if entry.get("required") and name not in options:
            raise Refused(f"{tool} {command}: {name} is required")
    return command, options, positionals


def one(options: dict[str, list[str]], name: str, default: str | None = None) -> str | None:
    values = options.get(name)
    return values[-1] if values else default
