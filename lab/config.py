"""The customer configuration (`diagnostic.config/1`): its vocabulary and field checks.

A customer describes the cluster configuration they run as a structured mapping, a YAML
file, or a pasted launch command (`launch_command:`). This module holds what needs no
engine knowledge: the accepted values, `ConfigError`, the strict YAML reader, and
`normalize_fields`, which checks and fills every structured field (docs/lab-contracts.md
lists them). Defaults are what the engine does when a flag is not given, so a structured
configuration and the equivalent command normalize alike; the model defaults to the
reference Kimi K2 checkpoint. Errors name the field, the value and what would be accepted.

Configurations come from strangers and end up on the lab's nodes, so this layer is also
the first line of defence: `env` takes only the variables lab/env_policy.yaml permits for
the engine version, each value held to its rule (`env_name_problem`), numbers must be
finite, and the YAML reader refuses what would otherwise end in a traceback (deep
nesting, lists as keys, 5,000-digit integers).
Whatever the input, the answer is a configuration or a ConfigError naming a field; values
quoted in messages go through `shown`, which is bounded and never raises.

What needs the engines' flag tables (reading `launch_command`, checking `extra_args`
flags) is done by `lab.engines.normalize_config` and `lab.engines.load_config_text`, the
entry points callers use; they build on this module, which imports nothing from them.
No Django here: the portal, the CLI and the lab all use it.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import reprlib
from collections.abc import Mapping
from typing import Any

import yaml

from lab import env_policy as env_rules
from lab.agent.agent import PER_LAUNCH_CACHE as PER_LAUNCH_CACHE
from lab.agent.agent import flag_value_problem

SCHEMA = "diagnostic.config/1"

ENGINES = ("vllm", "sglang")
# A command line does not carry the engine version; these are the releases used when a
# configuration does not say (real releases with a table in lab/engines/releases/: any
# version without one is refused at intake, listing those that have one).
DEFAULT_ENGINE_VERSIONS = {"vllm": "0.34.0", "sglang": "0.5.23"}

QUANTIZATIONS = ("nvfp4", "mxfp4", "fp8", "int4", "bf16")
KV_CACHE_DTYPES = ("auto", "fp8", "bf16")
LOAD_FORMATS = ("auto", "safetensors", "fastsafetensors")
JIT_CACHES = ("ephemeral", "persisted")
# The FP4 kernel overrides (vLLM --moe-backend/--linear-backend, SGLang
# --moe-runner-backend/--fp4-gemm-backend) and vLLM's --safetensors-load-strategy take the
# names of the configuration's engine version: lab.engines checks them against that
# version's flag choices (lab.engines.backend_choices lists them). Here: a name's shape.
_CHOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
SPEC_METHODS = ("eagle3", "ngram", "mtp")
WORKLOADS = ("code", "prose")
REPORTED_FIELDS = ("decode_tps", "cold_start_s")
# What the customer needs of the model, as opposed to what the configuration happens to set:
# `max_context` is the longest request they must serve. Without it, the model's native
# context is the target (METHODOLOGY "Context is a requirement"), so a max_model_len below
# it is a setting the diagnostic may change, not a requirement it must keep.
REQUIREMENT_FIELDS = ("max_context",)

# The lab places JIT caches itself (serving.jit_cache); these names may not be set by hand.
# Each engine's own cache root, FlashInfer's and Triton's (lab.engines.base.JIT_CACHE_DIRS).
JIT_CACHE_ENV = ("VLLM_CACHE_ROOT", "SGLANG_CACHE_DIR", "SGLANG_JIT_CACHE_DIR",
                 "FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_DIR")
# PER_LAUNCH_CACHE (the node agent's): the folder of a node's cache volume that belongs to
# one launch, where an ephemeral JIT cache is placed; the agent empties it before each launch.
# The variable the lab sets on each vLLM rank of a multi-node launch: its own data address
# (lab/env_policy.yaml `platform`); a launch's env read back drops it like the above.
HOST_IP_ENV = "VLLM_HOST_IP"

MAX_TP = 64
MAX_PP = 64
MAX_NODES = 256
MAX_MODEL_LEN = 1 << 24
MAX_SPEC_TOKENS = 16
# A configuration nests three levels deep; anything far deeper is refused while it is read,
# before Python's recursion limit could turn it into a traceback.
MAX_DEPTH = 32
# A pasted launch command is a few hundred characters; the cap keeps every message and
# every nested value (a --speculative-config JSON) small.
MAX_COMMAND_CHARS = 16384
MAX_ENV_VALUE_CHARS = 4096
MAX_TEXT_CHARS = 1024  # a name, a path, a version
MAX_PROBLEM_CHARS = 1000
# Whole numbers past this are not a count of anything an engine takes; the cap also keeps
# them printable (Python refuses to print integers of more than 4,300 digits).
MAX_WHOLE = 10**18

REFERENCE_MODEL = {
    "id": "moonshotai/Kimi-K2-Instruct-0905",
    "quantization": "nvfp4",
    "path": "/models/kimi-k2",
}
# Engine defaults for what a command line leaves out. max_model_len: the model's own
# context (Kimi K2: 256k); gpu_memory_utilization: vLLM's 0.9 (SGLang sizes its static
# fraction itself; 0.9 is its documented default).
SERVING_DEFAULTS: dict[str, Any] = {
    "max_model_len": 262144,
    "kv_cache_dtype": "auto",
    "gpu_memory_utilization": 0.9,
    "enforce_eager": False,
    "load_format": "auto",
    # vLLM's default is None, not lazy: mmap, plus a prefetch into the page cache when the
    # checkpoint sits on NFS or Lustre and fits in 90 % of the free memory (LoadConfig and
    # safetensors_weights_iterator, vllm/config/load.py and model_loader/weight_utils.py).
    # An explicit lazy turns that prefetch off, so the two are kept apart.
    "safetensors_load_strategy": None,
    "jit_cache": "ephemeral",
    "moe_backend": "auto",
    "linear_backend": "auto",
}
TOP_FIELDS = ("schema", "engine", "model", "cluster", "parallel", "serving", "speculative",
              "env", "extra_args", "workloads", "reported", "requirements", "launch_command")
# What `launch_command` stands in for: a file giving both is ambiguous.
COMMAND_FIELDS = ("model", "parallel", "serving", "speculative", "env", "extra_args")

# fullmatch, not match with $: "$" also matches before a final newline ("NCCL_DEBUG\n").
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Characters no single value may hold (a name, a path, an argv token, an env value): the
# C0 controls (NUL, tab, newline, carriage return, escape, ...), DEL and the C1 controls
# (Unicode category Cc), lone surrogates (Cs: not text in any encoding, so neither the
# database nor a node's argv can take them) and the line and paragraph separators (Zl, Zp),
# which some readers take for a newline. A value crosses into an argv, an environment, a
# log line and a database row: in any of them such a character splits, hides or breaks it.
CONTROL_CATEGORIES = ("Cc", "Cs", "Zl", "Zp")
# What a whole pasted command may hold besides printable text: its lines and their indents.
COMMAND_WHITESPACE = "\t\n\r"
_CONTROL_NAMES = {"\x00": "NUL", "\t": "a tab", "\n": "a newline", "\r": "a carriage return",
                  "\x1b": "escape", "\x7f": "DEL", "\x85": "a next-line character",
                  "\u2028": "a line separator", "\u2029": "a paragraph separator"}
CONTROL_ACCEPTED = ("use printable text on one line: no NUL, tab, newline or other "
                    "control character")


# Exactly the characters of CONTROL_CATEGORIES (Cc: U+0000-U+001F and U+007F-U+009F; Cs;
# Zl; Zp), as one pattern: a 64 KiB file is searched at C speed.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def control_character(text: str, *, allowed: str = "") -> tuple[int, str] | None:
    """The first control character of `text` (its index and the character), or None.
    `allowed` lists the control characters that may stay (COMMAND_WHITESPACE)."""
    for found in _CONTROL.finditer(text):
        if found.group() not in allowed:
            return found.start(), found.group()
    return None


def control_name(char: str) -> str:
    """A control character as a message names it: "U+0000, NUL", "U+0001"."""
    name = _CONTROL_NAMES.get(char)
    return f"U+{ord(char):04X}" + (f", {name}" if name else "")


def control_problem(text: str, *, allowed: str = "") -> str | None:
    """Why `text` cannot be a value, naming the control character and where it is; None
    when it holds none."""
    found = control_character(text, allowed=allowed)
    if found is None:
        return None
    index, char = found
    return f"holds a control character ({control_name(char)}) at character {index + 1}"


def _no_control(text: str, field: str) -> str:
    problem = control_problem(text)
    if problem is not None:
        raise _fail(field, f"{shown(text)} {problem}; {CONTROL_ACCEPTED}")
    return text

# The engine environment a configuration may set: the exact names of lab/env_policy.yaml,
# per engine and version (lab.env_policy: the policy's names the version reads, plus the
# libraries' names the lab permits everywhere), each value held to its rule. Everything
# else is refused with the list: families with refused words let through variables that
# load code or reach the network (issue 29). The node agent holds launch specs to the same
# policy (it is pushed with it).
# The list makes the refusal long (some 70 names): it is the message, so it is not cut.
MAX_ENV_PROBLEM_CHARS = 4000
_JIT_CACHE_ADVICE = ("the lab sets this from serving.jit_cache; use serving.jit_cache: persisted "
                     "(a kept cache) or ephemeral instead")


def _unmodelled(engine: str, version: str) -> ConfigError:
    known = env_rules.modelled(engine)
    return _fail("engine.version", f"{shown(version)} is not a {engine} version the platform "
                                   f"models; use one of {', '.join(known)}")


def env_name_problem(name: str, engine: str, version: str) -> str | None:
    """Why a configuration for `engine` `version` may not set the variable `name` (None
    when it may): set by the platform, a choice the version makes by a flag, a variable
    this version does not read, or one the lab does not permit; each with the list of
    those it does. LookupError for a version the platform does not model."""
    allowed = env_rules.permitted(engine, version)
    if name in allowed:
        return None
    label = env_rules.label(engine, version)
    listing = f"permitted for {label}: {', '.join(allowed)}"
    platform = env_rules.platform_rule(name)
    if platform is not None:
        where = platform.get("set_by", "the lab")
        return _JIT_CACHE_ADVICE if where == "serving.jit_cache" else f"the lab sets this from {where}"
    moved = env_rules.superseded(engine, name)
    if moved is not None:
        if not env_rules.has_flag(engine, version, moved["flag"]):
            return f"{label} does not read {name}, and has no flag that chooses {moved['what']}"
        return (f"{label} does not read {name}; {moved['what']} is chosen by {moved['flag']} "
                f"(set {moved['field']})")
    hint = env_rules.removed_hint(engine, version, name)
    if hint is not None:
        return f"{label} removed {name} and refuses to start with it set: {hint}"
    renamed = "SGLANG_" + name.removeprefix("SGL_")
    if name.startswith("SGL_") and renamed in allowed:
        # SGLang moved its SGL_* variables to SGLANG_* (0.5.23 reads only the new names).
        return f"{label} does not read {name}; it reads {renamed} instead"
    if env_rules.listed_for_engine(engine, name):
        return f"{label} does not read {name} (it is not among its environment variables); {listing}"
    return f"is not a variable the lab permits for {label}; {listing}"


def _env_value(key: str, value: Any, rule: Mapping[str, Any], field: str) -> str:
    """`value` as the string the engine gets, held to the variable's rule."""
    if isinstance(value, bool):
        # Engines and their libraries read boolean switches as 1/0 (NCCL_IB_DISABLE=1);
        # a variable whose choices are true/false (TOKENIZERS_PARALLELISM) gets those.
        words = rule.get("rule") == "choice" and "true" in (rule.get("choices") or ())
        text = ("true" if value else "false") if words else ("1" if value else "0")
    elif isinstance(value, int | float):
        if not _finite(value):
            raise _fail(field, f"{shown(value)} is not accepted; use a finite number "
                               "or a string")
        text = str(value)
    elif isinstance(value, str):
        if len(value) > MAX_ENV_VALUE_CHARS:
            raise _fail(field, f"is {len(value)} characters; the limit is "
                               f"{MAX_ENV_VALUE_CHARS}")
        secret = secret_env_name(key) or rule.get("rule") == "secret"
        problem = control_problem(value)
        if problem is not None:
            # A secret is named without its value: not quoted back, even to its owner.
            quoted = mask_secret(value) if secret else value
            raise _fail(field, f"{shown(quoted)} {problem}; {CONTROL_ACCEPTED}")
        text = value
    else:
        raise _fail(field, f"{shown(value)} is not accepted; use a string, number or true/false")
    problem = None if rule.get("rule") == "any" else env_rules.env_value_problem(text, dict(rule))
    if problem is not None:
        quoted = "the value" if rule.get("rule") == "secret" else shown(text)
        raise _fail(field, f"{quoted} is not accepted; {key} {problem}")
    return text


# -- secrets ----------------------------------------------------------------------------
# What an engine treats as a secret, and a configuration can carry: the API key its server
# asks of every client (vLLM's and SGLang's --api-key; vLLM's VLLM_API_KEY, which --api-key
# overrides), a variable or flag whose name says it holds a credential
# (SGLANG_S3_SECRET_ACCESS_KEY, ..._HF_TOKEN, --ssl-keyfile-password), and the credentials
# of a URL (https://user:TOKEN@host/..., ?token=...). The platform keeps none of them:
#
# * At intake (diagnostic.bookings.configs) each secret value is replaced by its mask,
#   SECRET_MASK and at most its last four characters (none for a value shorter than
#   SECRET_TAIL_MIN_CHARS), in the normalized configuration and in the submitted text. What
#   is stored, and everything rendered from it (previews, findings, the report and its
#   email, the tuned files, stage results), holds the mask and nothing more.
# * The engine the lab starts still authenticates, as the customer's does, but with a key
#   of the platform's own for the job (lab.session.LabSession.engine_api_key: derived when
#   needed, never stored), which replaces the mask in the launch spec the session uploads
#   and which the measurement client sends as `Authorization: Bearer`.
# * The tuned configuration keeps the customer's flag with the masked value and says to put
#   their own key back (diagnostic.jobs.tuning): never a made-up key.
#
# normalize_fields and lab.engines keep values as given (an engine reading its own argv
# must see its key); masking is `mask_config`, applied where a configuration enters.
SECRET_MASK = "••••"  # noqa: S105 - the mask, not a password
SECRET_TAIL = 4
SECRET_TAIL_MIN_CHARS = 12
# The flag and variable that turn an engine's API authentication on: the lab puts its own
# key in their place (vLLM: --api-key wins over VLLM_API_KEY; SGLang reads only the flag).
AUTH_FLAGS = ("--api-key",)
AUTH_ENV = ("VLLM_API_KEY",)
# Name words that make a variable or flag a credential, alone ...
_SECRET_WORDS = frozenset({"SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL",
                           "CREDENTIALS", "APIKEY"})
# ... or before KEY / TOKEN (API_KEY, ACCESS_KEY, HF_TOKEN; not EVENT_KEY or PER_TOKEN).
_SECRET_QUALIFIERS = frozenset({"API", "ACCESS", "AUTH", "BEARER", "HF", "PRIVATE", "SESSION",
                                "REFRESH", "SLACK", "GITHUB", "GH", "ADMIN"})
# A URL query parameter holding a credential (?token=, &sig=, X-Amz-Signature=).
_SECRET_QUERY_WORDS = _SECRET_WORDS | {"TOKEN", "KEY", "SIG", "SIGNATURE", "AUTH", "CODE"}
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
_URL_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/?#@:]*)"
                           r"(?::(?P<password>[^/?#@]*))?@")
_TOKEN_USER_CHARS = 16
_URL_QUERY = re.compile(r"[?&;](?P<name>[A-Za-z0-9_.-]+)=(?P<value>[^&#;]+)")


def _credential(words: list[str]) -> bool:
    if any(w in _SECRET_WORDS for w in words):
        return True
    return any(a in _SECRET_QUALIFIERS and b in ("KEY", "TOKEN") for a, b in itertools.pairwise(words))


def secret_env_name(name: str) -> bool:
    """Whether the variable `name` holds a secret (VLLM_API_KEY, ..._SECRET_ACCESS_KEY)."""
    return name in AUTH_ENV or _credential(name.upper().split("_"))


@functools.cache
def _secret_options() -> frozenset[str]:
    """Every option string of the modelled releases whose name says it holds a credential
    (--api-key, --ssl-keyfile-password, ...)."""
    found: set[str] = set()
    for engine in env_rules.load_policy()["engines"]:
        for version in env_rules.modelled(engine):
            for entry in env_rules._release(engine, version)["flags"].values():
                found.update(o for o in entry["option_strings"] if o.startswith("--") and
                             _credential(o[2:].upper().replace("-", "_").split("_")))
    return frozenset(found)


# The shortest prefix argparse could expand to a secret flag that is still read as one here:
# "--api" (longer prefixes, "--api-k", are what a customer abbreviates to).
_SECRET_PREFIX_CHARS = 5


def secret_flag(flag: str) -> bool:
    """Whether the engine flag `flag` (`--api-key`, `--api_key`, `--ssl-keyfile-password`)
    takes a secret as its value, also when written as the abbreviation the engines' argparse
    expands (`--api-k`)."""
    if not flag.startswith("-"):
        return False
    if _credential(flag.lstrip("-").upper().replace("-", "_").split("_")):
        return True
    dashed = "--" + flag.lstrip("-").replace("_", "-")
    return flag.startswith("--") and len(dashed) >= _SECRET_PREFIX_CHARS and any(
        option.startswith(dashed) for option in _secret_options())


def auth_flag(flag: str) -> bool:
    """Whether `flag` is the API key flag (in any spelling the engines accept)."""
    return "--" + flag.lstrip("-").replace("_", "-") in AUTH_FLAGS and flag.startswith("--")


def is_masked(value: str) -> bool:
    """A value already replaced by its mask (mask_secret is idempotent)."""
    return value.startswith(SECRET_MASK) and len(value) <= len(SECRET_MASK) + SECRET_TAIL


def mask_secret(value: str) -> str:
    """`••••` and the last four characters of `value` (only the mask for a short value, whose
    last four would be most of it); an empty value stays empty (no key is no secret)."""
    if not value or is_masked(value):
        return value
    tail = value[-SECRET_TAIL:] if len(value) >= SECRET_TAIL_MIN_CHARS else ""
    return SECRET_MASK + tail


def _looks_like_flag(token: str) -> bool:
    """As an engine's argument parser reads a token: a flag, not a value (negative numbers
    are values). lab.engines.base.is_flag, which this module cannot import."""
    if not token.startswith("-") or len(token) == 1:
        return False
    return not re.fullmatch(r"-\d+(\.\d*)?([eE][-+]?\d+)?", token)


def argv_secrets(tokens: list[str] | tuple[str, ...]) -> list[tuple[int, str, bool]]:
    """Where the secret flags of an argv hold their values: (index of the token holding the
    value, the flag, whether the value is inline as `--flag=value`)."""
    found: list[tuple[int, str, bool]] = []
    for index, token in enumerate(tokens):
        if not token.startswith("-"):
            continue
        name, eq, _ = token.partition("=")
        if not secret_flag(name):
            continue
        if eq:
            found.append((index, name, True))
        elif index + 1 < len(tokens) and not _looks_like_flag(tokens[index + 1]):
            found.append((index + 1, name, False))
    return found


def _url_credentials(text: str) -> list[tuple[int, int]]:
    """(start, end) of each credential inside the URLs of `text`: a userinfo password (or a
    user standing alone and as long as a token), and each credential query parameter's value."""
    spans: list[tuple[int, int]] = []
    for url in _URL.finditer(text):
        body, base = url.group(), url.start()
        info = _URL_USERINFO.match(body)
        if info:
            part = "password" if info.group("password") is not None else "user"
            # A user alone is a name (git@host) unless it is as long as a token (ghp_...@).
            if info.group(part) and (part == "password" or len(info.group(part)) >= _TOKEN_USER_CHARS):
                spans.append((base + info.start(part), base + info.end(part)))
        for query in _URL_QUERY.finditer(body):
            words = re.split(r"[-_.]", query.group("name").upper())
            if any(w in _SECRET_QUERY_WORDS for w in words):
                spans.append((base + query.start("value"), base + query.end("value")))
    return spans


def _replace_spans(text: str, spans: list[tuple[int, int]]) -> str:
    for start, end in sorted(spans, reverse=True):
        text = text[:start] + mask_secret(text[start:end]) + text[end:]
    return text


def url_secrets(text: str) -> list[str]:
    """The clear credentials in the URLs of `text`."""
    return [text[s:e] for s, e in _url_credentials(text) if not is_masked(text[s:e])]


def mask_urls(text: str) -> str:
    """`text` with the credentials of its URLs masked (the rest of each URL kept)."""
    return _replace_spans(text, _url_credentials(text))


def _argv_masked(tokens: list[str]) -> list[str]:
    out = [mask_urls(t) for t in tokens]
    for index, name, inline in argv_secrets(tokens):
        value = tokens[index].partition("=")[2] if inline else tokens[index]
        out[index] = f"{name}={mask_secret(value)}" if inline else mask_secret(value)
    return out


def _walk_strings(value: Any, change: Any) -> Any:
    if isinstance(value, str):
        return change(value)
    if isinstance(value, Mapping):
        return {k: _walk_strings(v, change) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk_strings(v, change) for v in value]
    return value


def mask_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a configuration (normalized, or a document of its fields) with every secret
    masked: the values of secret flags in `extra_args`, of secret variables in `env`, and the
    credentials in any URL anywhere. Idempotent; fields it does not know are kept."""
    out = dict(_walk_strings(config, mask_urls))
    args = config.get("extra_args")
    if isinstance(args, list) and all(isinstance(a, str) for a in args):
        out["extra_args"] = _argv_masked(list(args))
    env = out.get("env")
    if isinstance(env, Mapping):
        out["env"] = {k: mask_secret(v) if isinstance(v, str) and isinstance(k, str)
                      and secret_env_name(k) else v for k, v in env.items()}
    return out


def config_secrets(config: Mapping[str, Any]) -> list[str]:
    """The clear secret values a configuration holds (what mask_config masks), longest
    first, each once."""
    found: list[str] = []
    args = config.get("extra_args")
    if isinstance(args, list) and all(isinstance(a, str) for a in args):
        for index, _, inline in argv_secrets(list(args)):
            found.append(args[index].partition("=")[2] if inline else args[index])
    env = config.get("env")
    if isinstance(env, Mapping):
        found += [v for k, v in env.items() if isinstance(k, str) and isinstance(v, str)
                  and secret_env_name(k)]
    _walk_strings(config, lambda s: found.extend(url_secrets(s)))
    clear = {v for v in found if v and not is_masked(v)}
    return sorted(clear, key=lambda v: (-len(v), v))


def mask_argv(argv: list[str] | tuple[str, ...]) -> list[str]:
    """An argv (a launch spec's, a pasted command's tokens) with its secrets masked."""
    return _argv_masked(list(argv))


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """An environment with the values of its secret variables (and URL credentials) masked."""
    return {k: mask_secret(v) if secret_env_name(k) else mask_urls(v) for k, v in env.items()}


def engine_api_keys(config: Mapping[str, Any]) -> list[str]:
    """The API keys an engine started with `config` (as it reads its own argv and env, not
    masked) asks its clients for, as the engines decide: the last --api-key given, else
    (vLLM only) VLLM_API_KEY; an empty key is none. [] when authentication is off."""
    args = [a for a in config.get("extra_args") or [] if isinstance(a, str)]
    given = [args[i].partition("=")[2] if inline else args[i]
             for i, flag, inline in argv_secrets(args) if auth_flag(flag)]
    if given:
        return [given[-1]] if given[-1] else []
    engine = (config.get("engine") or {}).get("name", "vllm")
    env = config.get("env") or {}
    if engine == "vllm" and env.get("VLLM_API_KEY"):
        return [str(env["VLLM_API_KEY"])]
    return []


# Secrets in free text (a message quoting a value, an engine's log line): `--flag value` and
# `--flag=value` of a secret flag, NAME=value / name='value' / "name": "value" of a secret
# name, an `Authorization: Bearer` token, and URL credentials.
_TEXT_FLAG = re.compile(r"(?P<name>--?[A-Za-z0-9][\w-]*)(?P<sep>=|[ \t]+)(?P<q>['\"]?)(?P<value>[^\s'\"]+)")
_TEXT_ASSIGN = re.compile(r"(?P<name>\b[A-Za-z_][A-Za-z0-9_]*)(?P<sep>=|['\"]?\s*:\s*\[?\s*)"
                          r"(?P<q>['\"]?)(?P<value>[^\s'\",\]\)]+)")
_TEXT_BEARER = re.compile(r"(?i)\bbearer\s+(?P<value>[A-Za-z0-9._~+/=•-]+)")
_NOT_SECRETS = frozenset({"None", "null", "none", "True", "False", "true", "false"})


# Whatever the rules above could mask holds one of these: lines without any are skipped, so
# that a log of megabytes costs one scan.
_TEXT_TRIGGER = re.compile(r"(?i)secret|passw|passphrase|credential|apikey|[_-](?:key|token)(?![a-z])"
                           r"|bearer|://")


def mask_text(text: str) -> str:
    """`text` with every secret this module can recognise in free text masked: for messages
    that quote a value, and for engine logs (SGLang logs its ServerArgs, api_key included)."""
    if not _TEXT_TRIGGER.search(text):
        return text
    if "\n" in text:
        return "".join(_mask_line(line) if _TEXT_TRIGGER.search(line) else line
                       for line in text.splitlines(keepends=True))
    return _mask_line(text)


def _mask_line(text: str) -> str:
    spans: list[tuple[int, int]] = []
    for m in _TEXT_FLAG.finditer(text):
        if secret_flag(m.group("name")) and m.group("value") not in _NOT_SECRETS:
            spans.append(m.span("value"))
    for m in _TEXT_ASSIGN.finditer(text):
        if secret_env_name(m.group("name")) and m.group("value") not in _NOT_SECRETS:
            spans.append(m.span("value"))
    spans += [m.span("value") for m in _TEXT_BEARER.finditer(text)]
    spans += _url_credentials(text)
    merged: list[tuple[int, int]] = []
    for start, end in sorted(set(spans)):
        if merged and start < merged[-1][1]:
            continue  # one secret seen by two rules
        merged.append((start, end))
    return _replace_spans(text, merged)


class _Shown(reprlib.Repr):
    """repr() for messages: bounded in length and depth, and safe for any value YAML or
    JSON can produce (a 5,000-digit integer, a list nested 10,000 deep)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxstring, self.maxother = 3, 80, 80
        self.maxlist = self.maxdict = self.maxtuple = self.maxset = 6

    def repr_int(self, x: int, level: int) -> str:
        if abs(x) > MAX_WHOLE:
            return f"a {int(x.bit_length() * math.log10(2)) + 1}-digit number"
        return repr(x)


_SHOWN = _Shown()


def shown(value: Any) -> str:
    """`value` for a message: repr(), bounded, never raising, and with any secret it holds
    masked (mask_text): a refused configuration's message must not print its API key."""
    return mask_text(_SHOWN.repr(value))


def _key(key: Any) -> str:
    """A mapping key as it appears in a field path."""
    plain = isinstance(key, str) and key.strip() == key != "" and key.isprintable()
    return key if plain and len(key) <= 80 else shown(key)


class ConfigError(ValueError):
    """A configuration that cannot be used. `field` is the dotted path of the culprit."""

    def __init__(self, field: str, problem: str, *, limit: int = MAX_PROBLEM_CHARS) -> None:
        if len(problem) > limit:
            # A message travels in a form error and a log line; values are shown bounded
            # (shown()), this only catches an engine's wording that quotes a long argument.
            # `limit` is raised for a refusal whose list is the message (the env's).
            problem = problem[:limit - 1] + "…"
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field
        self.problem = problem


def _fail(field: str, problem: str) -> ConfigError:
    return ConfigError(field, problem)


def _one_of(value: Any, field: str, accepted: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in accepted:
        raise _fail(field, f"{shown(value)} is not accepted; use one of {', '.join(accepted)}")
    return value


def _mapping(value: Any, field: str, accepted: tuple[str, ...]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _fail(field, f"must be a mapping, got {type(value).__name__} {shown(value)}")
    for key in value:
        if key not in accepted:
            where = f"{field}.{_key(key)}" if field else _key(key)
            raise _fail(where, f"unknown field; accepted: {', '.join(accepted)}")
    return value


def _text(value: Any, field: str) -> str:
    if isinstance(value, bool) or isinstance(value, int | float):
        raise _fail(field, f"{shown(value)} is a number; write it as a quoted string")
    if not isinstance(value, str) or not value.strip():
        raise _fail(field, f"must be a non-empty string, got {shown(value)}")
    if len(value) > MAX_TEXT_CHARS:
        raise _fail(field, f"is {len(value)} characters; the limit is {MAX_TEXT_CHARS}")
    return _no_control(value, field)


def _argument(value: Any, field: str) -> str:
    """A string that becomes a command-line argument: it must not read as a flag."""
    text = _text(value, field)
    if text.startswith("-"):
        raise _fail(field, f"{shown(text)} starts with '-', which an engine would read as a flag")
    return text


def _int(value: Any, field: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _fail(field, f"{shown(value)} is not accepted; use a whole number {lo}..{hi}")
    return int(value)


def _bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(field, f"{shown(value)} is not accepted; use true or false")
    return value


def _finite(value: Any) -> bool:
    """A number JSON and the database can hold: not a bool, not inf or NaN, not huge."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(value, int):
        return abs(value) <= MAX_WHOLE  # (math.isfinite would overflow on a huge one)
    return math.isfinite(value) and abs(value) <= MAX_WHOLE


def _positive(value: Any, field: str) -> float:
    if not _finite(value) or not value > 0:
        raise _fail(field, f"{shown(value)} is not accepted; use a finite number > 0")
    return float(value)


def _engine(raw: Any) -> dict[str, str]:
    data = _mapping(raw, "engine", ("name", "version"))
    name = _one_of(data.get("name", "vllm"), "engine.name", ENGINES)
    version = data.get("version", DEFAULT_ENGINE_VERSIONS[name])
    if isinstance(version, int | float) and not isinstance(version, bool):
        # YAML reads `version: 0.10` as the float 0.1: refuse rather than guess.
        raise _fail("engine.version", f"{shown(version)} is a number; quote it, e.g. \"{shown(version)}\"")
    # Whether it is a modelled release (one with a table) is lab.engines' to check.
    version = _text(version, "engine.version")
    return {"name": name, "version": version}


def _choice_name(value: Any, field: str) -> str:
    if not isinstance(value, str) or not _CHOICE_NAME.fullmatch(value):
        raise _fail(field, f"{shown(value)} is not accepted; use auto or a name the engine "
                           "version's flag accepts (letters, digits, _ and -)")
    return value


def _load_strategy(value: Any, engine: str) -> str | None:
    """vLLM's --safetensors-load-strategy: unset (None, the release's default) or a choice
    name the version's parser then checks. SGLang has no such flag and maps the files
    lazily: lazy is read as unset there, anything else refused."""
    field = "serving.safetensors_load_strategy"
    if value is None:
        return None
    name = _choice_name(value, field)
    if engine != "sglang":
        return name
    if name == "lazy":
        return None
    raise _fail(field, f"{shown(name)} is a vLLM option that SGLang does not have (it maps the "
                       "files lazily); leave it unset, or use serving.load_format: fastsafetensors "
                       "for a fast loader")


def _served_name(value: Any, field: str) -> str:
    """The name the engine serves the model under (--served-model-name): held to the flag
    rule the lab's lists give that flag (lab/agent/agent.py flag_value_problem)."""
    text = _argument(value, field)
    problem = flag_value_problem(text, {"rule": "name"})
    if problem is not None:
        raise _fail(field, f"{shown(text)} is not accepted: the served model name {problem}")
    return text


def _model(raw: Any) -> dict[str, str]:
    data = _mapping(raw, "model", ("id", "quantization", "path"))
    return {
        "id": _served_name(data.get("id", REFERENCE_MODEL["id"]), "model.id"),
        "quantization": _one_of(data.get("quantization", REFERENCE_MODEL["quantization"]),
                                "model.quantization", QUANTIZATIONS),
        "path": _argument(data.get("path", REFERENCE_MODEL["path"]), "model.path"),
    }


def _parallel(raw: Any) -> dict[str, Any]:
    data = _mapping(raw, "parallel", ("tp", "pp", "expert_parallel"))
    return {
        "tp": _int(data.get("tp", 1), "parallel.tp", 1, MAX_TP),
        "pp": _int(data.get("pp", 1), "parallel.pp", 1, MAX_PP),
        "expert_parallel": _bool(data.get("expert_parallel", False), "parallel.expert_parallel"),
    }


def _cluster(raw: Any, parallel: Mapping[str, Any]) -> dict[str, Any]:
    data = _mapping(raw, "cluster", ("nodes", "node_type", "link_gbps"))
    used = parallel["tp"] * parallel["pp"]
    nodes = _int(data.get("nodes", used), "cluster.nodes", 1, MAX_NODES)
    if used > nodes:
        raise _fail("parallel", f"tp × pp = {parallel['tp']} × {parallel['pp']} = {used} nodes, "
                                f"but cluster.nodes is {nodes}; lower tp or pp, or raise cluster.nodes")
    node_type = _text(data.get("node_type", "dgx-spark"), "cluster.node_type")
    return {"nodes": nodes, "node_type": node_type,
            "link_gbps": _positive(data.get("link_gbps", 100), "cluster.link_gbps")}


def _serving(raw: Any, engine: str) -> dict[str, Any]:
    data = _mapping(raw, "serving", tuple(SERVING_DEFAULTS))
    merged = {**SERVING_DEFAULTS, **data}
    util = merged["gpu_memory_utilization"]
    if not _finite(util) or not 0 < util <= 1:
        raise _fail("serving.gpu_memory_utilization",
                    f"{shown(util)} is not accepted; use a fraction in (0, 1], e.g. 0.85")
    out = {
        "max_model_len": _int(merged["max_model_len"], "serving.max_model_len", 1, MAX_MODEL_LEN),
        "kv_cache_dtype": _one_of(merged["kv_cache_dtype"], "serving.kv_cache_dtype",
                                  KV_CACHE_DTYPES),
        "gpu_memory_utilization": float(util),
        "enforce_eager": _bool(merged["enforce_eager"], "serving.enforce_eager"),
        "load_format": _one_of(merged["load_format"], "serving.load_format", LOAD_FORMATS),
        "safetensors_load_strategy": _load_strategy(merged["safetensors_load_strategy"], engine),
        "jit_cache": _one_of(merged["jit_cache"], "serving.jit_cache", JIT_CACHES),
        "moe_backend": _choice_name(merged["moe_backend"], "serving.moe_backend"),
        "linear_backend": _choice_name(merged["linear_backend"], "serving.linear_backend"),
    }
    return out


def _speculative(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    fields = ("method", "draft_model", "num_speculative_tokens", "prompt_lookup_max",
              "prompt_lookup_min")
    data = _mapping(raw, "speculative", fields)
    if data.get("method") == "none":
        if len(data) > 1:
            raise _fail("speculative", "method none takes no other fields; remove them")
        return None
    if "method" not in data:
        raise _fail("speculative.method", f"is required; use one of {', '.join(SPEC_METHODS)}, "
                                          "or speculative: null for none")
    method = _one_of(data["method"], "speculative.method", SPEC_METHODS)
    draft = data.get("draft_model")
    if method == "eagle3":
        if draft is None:
            raise _fail("speculative.draft_model",
                        "is required for eagle3, e.g. AQ-MedAI/Kimi-K2-Instruct-eagle3")
        draft = _argument(draft, "speculative.draft_model")
    elif draft is not None:
        raise _fail("speculative.draft_model",
                    f"{method} uses no draft model; remove speculative.draft_model")
    k = _int(data.get("num_speculative_tokens", 4), "speculative.num_speculative_tokens",
             1, MAX_SPEC_TOKENS)
    lookup: dict[str, int | None] = {}
    for name in ("prompt_lookup_max", "prompt_lookup_min"):
        value = data.get(name)
        if value is not None and method != "ngram":
            raise _fail(f"speculative.{name}", f"applies to ngram only; remove it for {method}")
        lookup[name] = None if value is None else _int(value, f"speculative.{name}", 1, 64)
    lo, hi = lookup["prompt_lookup_min"], lookup["prompt_lookup_max"]
    if lo is not None and hi is not None and lo > hi:
        raise _fail("speculative.prompt_lookup_min",
                    f"{lo} is above prompt_lookup_max {hi}; use a value <= {hi}")
    return {"method": method, "draft_model": draft, "num_speculative_tokens": k, **lookup}


def _env(raw: Any, engine: Mapping[str, str], policy: bool = True) -> dict[str, str]:
    """The variables of `env`, each one the lab permits for the configuration's engine and
    version (env_name_problem), its value a string meeting the variable's rule. Without
    `policy` (an engine reading its own launch: it takes any variable), names and values
    are only checked for their form."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise _fail("env", f"must be a mapping of variable names to values, got {shown(raw)}")
    out: dict[str, str] = {}
    for key, value in raw.items():
        field = f"env.{_key(key)}"
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise _fail(field, "is not a valid environment variable name "
                               "(letters, digits and _, not starting with a digit)")
        if not policy:
            out[key] = _env_value(key, value, {"rule": "secret"} if secret_env_name(key)
                                  else {"rule": "any"}, field)
            continue
        try:
            problem = env_name_problem(key, engine["name"], engine["version"])
        except LookupError:
            raise _unmodelled(engine["name"], engine["version"]) from None
        if problem is not None:
            raise ConfigError(field, problem, limit=MAX_ENV_PROBLEM_CHARS)
        rule = env_rules.permitted(engine["name"], engine["version"])[key]
        out[key] = _env_value(key, value, rule, field)
    return dict(sorted(out.items()))


def _extra_args(raw: Any) -> list[str]:
    """The shape, and that each token is one line of printable text: which flags an engine
    takes is lab.engines' to check. A newline in a token would reach the engine's argv."""
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw):
        raise _fail("extra_args", f"must be a list of strings (one per argv token), got {shown(raw)}")
    for index, token in enumerate(raw):
        problem = control_problem(token)
        if problem is None:
            continue
        # Name the flag the token belongs to: a pasted command's customer never wrote
        # `extra_args`, only `--flag value` or `--flag=value`.
        flag = token.partition("=")[0] if token.startswith("-") else \
            raw[index - 1] if index and raw[index - 1].startswith("-") else ""
        whose = f" (the value of {shown(flag)})" if flag and flag != token else ""
        name = flag.partition("=")[0] or token.partition("=")[0]
        quoted = token
        if secret_flag(name):
            # Named without the secret: `--api-key=••••` or the value's mask.
            quoted = f"{name}={mask_secret(token.partition('=')[2])}" if token.startswith(name + "=") \
                else mask_secret(token)
        raise _fail(f"extra_args[{index}]", f"{shown(quoted)}{whose} {problem}; {CONTROL_ACCEPTED}")
    return list(raw)


def _workloads(raw: Any) -> list[str]:
    if raw is None:
        raw = list(WORKLOADS)
    if not isinstance(raw, list) or not raw:
        raise _fail("workloads", f"must be a non-empty list from {', '.join(WORKLOADS)}, got {shown(raw)}")
    for i, item in enumerate(raw):
        _one_of(item, f"workloads[{i}]", WORKLOADS)
    if len(set(raw)) != len(raw):
        raise _fail("workloads", f"{shown(raw)} names a workload twice")
    return [w for w in WORKLOADS if w in raw]


def _reported(raw: Any) -> dict[str, float] | None:
    if raw is None:
        return None
    data = _mapping(raw, "reported", REPORTED_FIELDS)
    return {k: _positive(v, f"reported.{k}") for k, v in data.items()}


def _requirements(raw: Any) -> dict[str, int] | None:
    """The customer's stated requirements; None when none is stated (an empty mapping too)."""
    if raw is None:
        return None
    data = _mapping(raw, "requirements", REQUIREMENT_FIELDS)
    out: dict[str, int] = {}
    if "max_context" in data:
        value = data["max_context"]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_MODEL_LEN:
            raise _fail("requirements.max_context",
                        f"{shown(value)} is not accepted; use the longest request to serve in tokens, "
                        f"a whole number 1..{MAX_MODEL_LEN} (e.g. 131072), or leave it out to keep the "
                        "model's native context")
        out["max_context"] = int(value)
    return out or None


def check_document(data: Any) -> Mapping[str, Any]:
    """`data` as a configuration document: a mapping of known top-level fields with the
    right schema (the fields themselves are checked by normalize_fields)."""
    if not isinstance(data, Mapping):
        raise _fail("config", f"must be a mapping, got {type(data).__name__}")
    _mapping(data, "", TOP_FIELDS)
    schema = data.get("schema", SCHEMA)
    if schema != SCHEMA:
        raise _fail("schema", f"{shown(schema)} is not accepted; use {shown(SCHEMA)}")
    return data


def normalize_fields(data: Mapping[str, Any], *, env_policy: bool = True) -> dict[str, Any]:
    """Check a structured configuration and return a new dict with every field of
    `diagnostic.config/1`. Normalizing a normalized config returns it unchanged.
    `env_policy=False` reads `env` as an engine does, any variable (parse_launch: the
    simulated engine learning what it was started with); intake always holds it to the
    lab's policy.

    Not the whole normalization: `extra_args` is checked for its shape here, its flags by
    lab.engines, and a `launch_command` is refused (lab.engines.normalize_config reads it).
    """
    check_document(data)
    if "launch_command" in data:
        raise _fail("launch_command", "is read by lab.engines.normalize_config, not here")
    engine = _engine(data.get("engine"))
    parallel = _parallel(data.get("parallel"))
    config: dict[str, Any] = {
        "schema": SCHEMA,
        "engine": engine,
        "model": _model(data.get("model")),
        "cluster": _cluster(data.get("cluster"), parallel),
        "parallel": parallel,
        "serving": _serving(data.get("serving"), engine["name"]),
        "speculative": _speculative(data.get("speculative")),
        "env": _env(data.get("env"), engine, env_policy),
        "extra_args": _extra_args(data.get("extra_args")),
        "workloads": _workloads(data.get("workloads")),
    }
    reported = _reported(data.get("reported"))
    if reported is not None:
        config["reported"] = reported
    requirements = _requirements(data.get("requirements"))
    if requirements is not None:
        config["requirements"] = requirements
    return config


def launch_command_text(data: Mapping[str, Any]) -> str:
    """The command of a configuration given as `launch_command`, which stands for the
    COMMAND_FIELDS: a document giving both is ambiguous."""
    both = [f for f in COMMAND_FIELDS if f in data]
    if both:
        raise _fail(both[0], "cannot be given together with launch_command, which sets it; "
                             "remove one of the two")
    command = data["launch_command"]
    if not isinstance(command, str) or not command.strip():
        raise _fail("launch_command", f"must be the launch command as a string, got {shown(command)}")
    if len(command) > MAX_COMMAND_CHARS:
        raise _fail("launch_command", f"is {len(command)} characters; the limit is "
                                      f"{MAX_COMMAND_CHARS}")
    problem = control_problem(command, allowed=COMMAND_WHITESPACE)
    if problem is not None:
        raise _fail("launch_command", f"{problem}; paste the command as plain text (lines, "
                                      "spaces and tabs, no NUL, escape or other control "
                                      "character)")
    return command


def with_command_fields(data: Mapping[str, Any], parsed: Mapping[str, Any]) -> dict[str, Any]:
    """A `launch_command` document rewritten as a structured one: the fields the parsed
    command set, plus what may sit beside it (`engine.version`, `cluster`, `workloads`,
    `reported`, `requirements`)."""
    engine = _mapping(data.get("engine"), "engine", ("name", "version"))
    name = parsed["engine"]["name"]
    if "name" in engine and engine["name"] != name:
        raise _fail("engine.name", f"{shown(engine['name'])} disagrees with launch_command, which "
                                   f"runs {name}; remove engine.name or fix it")
    rest = {k: data[k] for k in ("cluster", "workloads", "reported", "requirements") if k in data}
    return {**parsed, **rest, "engine": {"name": name, **engine}}


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors, aliases (billion-laughs), nesting deeper than
    MAX_DEPTH, keys that are not plain values, and duplicate keys."""

    depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            mark = event.start_mark
            raise ConfigError("file", f"line {mark.line + 1}: YAML anchors and aliases (&, *) "
                                      "are not accepted; write the values out")
        if self.depth >= MAX_DEPTH:
            # The composer recurses once per level: stop long before the interpreter would.
            raise ConfigError("file", f"line {event.start_mark.line + 1}: values nest more than "
                                      f"{MAX_DEPTH} levels deep; a configuration needs three")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                kind = "list" if isinstance(key_node, yaml.SequenceNode) else "mapping"
                raise ConfigError("file", f"line {line}: a key must be a plain name, not a {kind}")
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise ConfigError(_key(key), f"appears twice (line {line}); keep one")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_config_text(text: str, *, max_bytes: int = 65536) -> Mapping[str, Any]:
    """Parse a YAML configuration (at most `max_bytes` of UTF-8) into its mapping, not yet
    normalized (lab.engines.load_config_text does both)."""
    size = len(text.encode("utf-8", errors="replace"))
    if size > max_bytes:
        raise ConfigError("file", f"is {size} bytes; the limit is {max_bytes}")
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - _StrictLoader is a SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError("file", f"not valid YAML ({where}{exc.problem})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError("file", f"not valid YAML ({exc})") from exc
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        # The constructors' own limits: an integer of more than 4,300 digits, a bad date.
        raise ConfigError("file", f"holds a value that cannot be read ({shown(str(exc))})") from exc
    if not isinstance(data, Mapping):
        raise ConfigError("file", "must hold a YAML mapping (schema: diagnostic.config/1, "
                                  f"engine: ..., ...), got {type(data).__name__}")
    return data

