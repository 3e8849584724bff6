"""Reading a launch command a customer pasted: shell text -> environment + argv tokens.

Accepted: backslash line continuations, shell quoting, `export NAME=value` lines and
`NAME=value` prefixes (the engine's environment), `env`/`nohup`/`exec` in front, blank
lines and `#` comments, and a trailing redirection or pipe (`2>&1 | tee vllm.log`, `&`),
which is dropped. Container and scheduler wrappers (`docker run ... image`, `srun`) are
not parsed: the error names the token and says what to paste instead.
"""

from __future__ import annotations

import re
import shlex

from lab.config import ConfigError, shown

_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
_WRAPPERS = ("env", "nohup", "exec")
_CONTAINERS = ("docker", "podman", "nerdctl", "kubectl", "srun", "sbatch", "mpirun", "torchrun",
               "apptainer", "singularity", "ray")


def _split(segment: str) -> list[str]:
    try:
        return shlex.split(segment)
    except ValueError as exc:
        raise ConfigError("launch_command", f"cannot split {segment[:60]!r}: {exc}; check "
                                            "the quotes") from None


def _segments(text: str) -> list[str]:
    """The commands in shell text: split at unquoted newlines, `;`, `&&` and `||`. A pipe,
    a redirection, `&` or a `#` comment ends its line (what follows a pipe or redirection
    only handles the engine's output)."""
    out: list[str] = []
    start, quote, skipping, i = 0, "", False, 0
    while i < len(text):
        c = text[i]
        if skipping:
            if c == "\n":
                skipping, start = False, i + 1
        elif quote:
            if c == quote:
                quote = ""
            elif c == "\\" and quote == '"':
                i += 1
        elif c in "'\"":
            quote = c
        elif c == "\\":
            i += 1
        elif c == "#" and (i == start or text[i - 1].isspace()):
            out.append(text[start:i])
            skipping = True
        elif c in "\n;" or text.startswith(("&&", "||"), i):
            out.append(text[start:i])
            i += 1 if c in "\n;" else 2
            start = i
            continue
        elif c in "|&<>":
            end = i
            while c in "<>" and end > start and text[end - 1].isdigit():
                end -= 1  # the 2 of 2>&1
            out.append(text[start:end])
            skipping = True
        i += 1
    if not skipping:
        out.append(text[start:])
    return out


def split_command(text: str) -> tuple[dict[str, str], list[str]]:
    """(environment assignments, the command's tokens) of one pasted launch command."""
    joined = re.sub(r"\\[ \t]*\r?\n", " ", text)
    env: dict[str, str] = {}
    command: list[str] = []
    for segment in _segments(joined):
        tokens = _split(segment.strip().removeprefix("$ "))
        if not tokens:
            continue
        if tokens[0] == "export":
            tokens = tokens[1:]
        assignments = []
        while tokens and (m := _ASSIGNMENT.match(tokens[0])):
            assignments.append((m[1], m[2]))
            tokens = tokens[1:]
        while tokens and tokens[0] in _WRAPPERS:
            tokens = tokens[1:]
            while tokens and (m := _ASSIGNMENT.match(tokens[0])):
                assignments.append((m[1], m[2]))
                tokens = tokens[1:]
        env.update(assignments)
        if not tokens:
            continue
        if command:
            raise ConfigError("launch_command", f"{shown(tokens[0])} starts a second command; paste "
                                                "the one command that starts the engine")
        if tokens[0] in _CONTAINERS:
            raise ConfigError("launch_command", f"{shown(tokens[0])}: container and scheduler "
                                                "wrappers are not parsed; paste the command run "
                                                "inside (from 'vllm serve' or 'python3 -m "
                                                "sglang.launch_server' on) and put the container's "
                                                "-e variables in front as NAME=value")
        command = tokens
    if not command:
        raise ConfigError("launch_command", "holds no command; paste the 'vllm serve ...' or "
                                            "'python3 -m sglang.launch_server ...' line")
    return env, command
