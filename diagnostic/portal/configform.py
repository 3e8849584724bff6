"""The structured configuration form as a customer reads it: grouped sections, each field
with its name in words, what it is, the values it accepts, the engine flag it becomes and
the default the lab uses when it is left as it is.

The form's fields are the `diagnostic.config/1` fields (lab.config) a customer sets by
hand, the ones the diagnostic changes among them (FP4 kernels, weight loading, the JIT
cache), so that what the report changes can be read back on the form. Accepted values come
from lab.config and from the modelled engine releases (lab.engines), never from a list of
our own that could drift from what the lab checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from lab.config import (
    JIT_CACHES,
    KV_CACHE_DTYPES,
    LOAD_FORMATS,
    MAX_MODEL_LEN,
    MAX_NODES,
    MAX_PP,
    MAX_SPEC_TOKENS,
    MAX_TP,
    QUANTIZATIONS,
    REFERENCE_MODEL,
    SERVING_DEFAULTS,
    SPEC_METHODS,
)
from lab.engines import backend_choices, field_flag, modelled_versions

ENGINE_WORDS = {"vllm": "vLLM", "sglang": "SGLang"}


@dataclass(frozen=True)
class FormField:
    dotted: str
    # How the input is drawn and read: text, int, number, bool, env, choice, version, backend.
    kind: str
    label: str
    help: str
    accepted: str
    # The engine flag (or variable) each engine turns the field into; "" where it has none.
    vllm_flag: str = ""
    sglang_flag: str = ""
    required: bool = False
    # The value the form starts with: the lab's default, so that what is shown is what runs.
    initial: str = ""
    choices: tuple[str, ...] = ()
    # A choice meaning "not set" (speculative decoding off), drawn first.
    blank_choice: str = ""
    placeholder: str = ""

    @property
    def name(self) -> str:
        return self.dotted.replace(".", "__")

    @property
    def value_kind(self) -> str:
        """How submission.py reads the input's text (int, number, bool, env or text)."""
        return self.kind if self.kind in ("int", "number", "bool", "env") else "text"

    @property
    def flags(self) -> str:
        """The flags in words: "vLLM --x, SGLang --y", or one when both engines share it."""
        if self.vllm_flag and self.vllm_flag == self.sglang_flag:
            return self.vllm_flag
        parts = [f"vLLM {self.vllm_flag}" if self.vllm_flag else "",
                 f"SGLang {self.sglang_flag}" if self.sglang_flag else ""]
        return ", ".join(p for p in parts if p)


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    intro: str
    fields: tuple[FormField, ...] = field(default_factory=tuple)


def version_choices() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(engine in words, its modelled releases newest first) for the version select."""
    return tuple((ENGINE_WORDS[e], tuple(reversed(modelled_versions(e)))) for e in ENGINE_WORDS)


@cache
def backend_names(layer: str) -> tuple[str, ...]:
    """Every FP4 backend name some modelled release accepts for `layer`, "auto" first: the
    suggestions of the backend inputs (the lab checks the name against the chosen release)."""
    names: set[str] = set()
    for engine in ENGINE_WORDS:
        for version in modelled_versions(engine):
            names.update(backend_choices(engine, version, layer))
    return ("auto", *sorted(names - {"auto"}))


def _versions_text() -> str:
    return "; ".join(f"{words} {', '.join(versions)}" for words, versions in version_choices())


def sections() -> tuple[Section, ...]:
    return (
        _engine_section(),
        _model_section(),
        _layout_section(),
        _serving_section(),
        _tuned_section(),
        _speculative_section(),
        _requirements_section(),
        _env_section(),
    )


def _engine_section() -> Section:
    return Section("engine", "Engine", "The serving engine you run and its release.", (
        FormField("engine.name", "choice", "Engine", "The inference server that serves your model.",
                  "vLLM or SGLang", required=True, choices=("vllm", "sglang"),
                  blank_choice="choose your engine"),
        FormField("engine.version", "version", "Engine version",
                  "The release you run. The lab starts exactly this release and checks every "
                  "setting below against its flags.", f"{_versions_text()}", required=True,
                  blank_choice="choose its version"),
    ))


def _model_section() -> Section:
    return Section("model", "Model", "The checkpoint you serve, as the lab holds it.", (
        FormField("model.id", "text", "Model name",
                  "The name clients ask for (the Hugging Face id of the checkpoint).",
                  "the model's id, e.g. moonshotai/Kimi-K2-Instruct-0905",
                  "--served-model-name", "--served-model-name", required=True,
                  placeholder=REFERENCE_MODEL["id"]),
        FormField("model.path", "text", "Model files",
                  "Where the weights are on the lab's nodes: the lab serves its own copy.",
                  "a path the lab holds", "--model", "--model-path", initial=REFERENCE_MODEL["path"]),
        FormField("model.quantization", "choice", "Weight format",
                  "How the checkpoint's weights are stored; the FP4 checks run on nvfp4 and mxfp4.",
                  ", ".join(QUANTIZATIONS), initial=REFERENCE_MODEL["quantization"],
                  choices=QUANTIZATIONS),
    ))


def _layout_section() -> Section:
    return Section("layout", "Nodes and layout", "How many machines you run on and how the model is "
            "split across them. Tensor parallel × pipeline parallel is the number of nodes used.", (
        FormField("cluster.nodes", "int", "Nodes", "How many machines your deployment has.",
                  f"a whole number 1 to {MAX_NODES}; the lab you booked has a fixed number",
                  required=True, placeholder="e.g. 8"),
        FormField("parallel.tp", "int", "Tensor parallel size",
                  "How many nodes each layer is split across.", f"a whole number 1 to {MAX_TP}",
                  "--tensor-parallel-size", "--tp-size", required=True, placeholder="e.g. 8"),
        FormField("parallel.pp", "int", "Pipeline parallel size",
                  "How many groups of layers run one after another on separate nodes.",
                  f"a whole number 1 to {MAX_PP}", "--pipeline-parallel-size", "--pp-size", initial="1"),
        FormField("parallel.expert_parallel", "bool", "Expert parallelism",
                  "Spread the mixture-of-experts layers' experts over the nodes instead of "
                  "splitting each expert.", "on or off", "--enable-expert-parallel",
                  "--ep-size (= tensor parallel size)"),
        FormField("cluster.node_type", "text", "Node type", "The machine you run on.",
                  "dgx-spark, gb10 or your own name", initial="dgx-spark"),
        FormField("cluster.link_gbps", "number", "Network link (Gbit/s)",
                  "The speed of the link between your nodes.", "a number above 0, e.g. 100 or 200",
                  initial="100"),
    ))


def _serving_section() -> Section:
    serving = SERVING_DEFAULTS
    return Section("serving", "Serving", "How the engine holds requests in memory.", (
        FormField("serving.max_model_len", "int", "Context length (tokens)",
                  "The longest request the engine accepts, prompt and answer together.",
                  f"a whole number 1 to {MAX_MODEL_LEN:,}", "--max-model-len", "--context-length",
                  initial=str(serving["max_model_len"])),
        FormField("serving.kv_cache_dtype", "choice", "KV cache precision",
                  "The number format of the attention cache: fp8 holds twice the tokens of bf16.",
                  ", ".join(KV_CACHE_DTYPES), "--kv-cache-dtype", "--kv-cache-dtype",
                  initial=serving["kv_cache_dtype"], choices=KV_CACHE_DTYPES),
        FormField("serving.gpu_memory_utilization", "number", "GPU memory fraction",
                  "The share of each node's memory the engine may take for weights and cache.",
                  "a fraction above 0 and at most 1, e.g. 0.85", "--gpu-memory-utilization",
                  "--mem-fraction-static", initial=str(serving["gpu_memory_utilization"])),
        FormField("serving.enforce_eager", "bool", "No CUDA graphs",
                  "Run without captured CUDA graphs (starts faster, decodes slower).", "on or off",
                  "--enforce-eager", "--disable-cuda-graph"),
    ))


def _tuned_section() -> Section:
    serving = SERVING_DEFAULTS
    return Section("tuned", "Settings the diagnostic tunes",
            "The diagnostic measures these and, where the evidence shows a better choice, changes "
            "them in your tuned configuration. Keep what you run today.", (
        FormField("serving.moe_backend", "backend", "MoE kernel backend",
                  "The FP4 kernels of the mixture-of-experts layers. auto lets the engine choose; "
                  "the FP4 check verifies the output of the one in use.",
                  "auto, or a backend your engine version lists (e.g. flashinfer_cutlass, cutlass, "
                  "marlin)", field_flag("vllm", "serving.moe_backend") or "",
                  field_flag("sglang", "serving.moe_backend") or "",
                  initial=serving["moe_backend"], choices=backend_names("moe")),
        FormField("serving.linear_backend", "backend", "Linear-layer kernel backend",
                  "The FP4 kernels of the other matrix multiplications.",
                  "auto, or a backend your engine version lists",
                  field_flag("vllm", "serving.linear_backend") or "",
                  field_flag("sglang", "serving.linear_backend") or "", initial=serving["linear_backend"],
                  choices=backend_names("linear")),
        FormField("serving.load_format", "choice", "Weight loader",
                  "How the weights are read from disk at start; decides much of the cold start.",
                  ", ".join(LOAD_FORMATS), "--load-format", "--load-format",
                  initial=serving["load_format"], choices=LOAD_FORMATS),
        FormField("serving.safetensors_load_strategy", "choice", "Load strategy (vLLM)",
                  "How vLLM reads safetensors files. Not set, vLLM maps them lazily and "
                  "prefetches them on NFS or Lustre when they fit in memory; lazy never "
                  "prefetches; eager reads each file whole. SGLang has no such setting: "
                  "leave it unset.", "not set, lazy, eager, prefetch",
                  "--safetensors-load-strategy", "",
                  initial=serving["safetensors_load_strategy"] or "",
                  choices=("lazy", "eager", "prefetch"), blank_choice="not set (vLLM decides)"),
        FormField("serving.jit_cache", "choice", "JIT kernel cache",
                  "Whether compiled kernels are kept between starts (persisted) or compiled again "
                  "each time (ephemeral).", ", ".join(JIT_CACHES),
                  "VLLM_CACHE_ROOT, FLASHINFER_WORKSPACE_BASE, TRITON_CACHE_DIR (set by the lab)",
                  "SGLANG_CACHE_DIR, FLASHINFER_WORKSPACE_BASE, TRITON_CACHE_DIR (set by the lab)",
                  initial=serving["jit_cache"],
                  choices=JIT_CACHES),
    ))


def _speculative_section() -> Section:
    return Section("speculative", "Speculative decoding",
            "A cheap draft proposes tokens the model then checks in one step. Leave the method at "
            "none if you do not use it.", (
        FormField("speculative.method", "choice", "Method", "The drafting method.",
                  f"none, {', '.join(SPEC_METHODS)}", "--speculative-config (method)",
                  "--speculative-algorithm", choices=SPEC_METHODS, blank_choice="none"),
        FormField("speculative.draft_model", "text", "Draft model",
                  "The draft checkpoint; eagle3 needs one, ngram and mtp none.",
                  "a model id the lab holds, e.g. AQ-MedAI/Kimi-K2-Instruct-eagle3",
                  "--speculative-config (model)", "--speculative-draft-model-path"),
        FormField("speculative.num_speculative_tokens", "int", "Draft length (tokens)",
                  "How many tokens are drafted per step.", f"a whole number 1 to {MAX_SPEC_TOKENS}",
                  "--speculative-config (num_speculative_tokens)", "--speculative-num-draft-tokens",
                  placeholder="4"),
    ))


def _requirements_section() -> Section:
    return Section("requirements", "Your requirements",
            "What the tuned configuration must keep, whatever it changes.", (
        FormField("requirements.max_context", "int", "Longest request to serve (tokens)",
                  "The context your users need. Left blank, the model's full context is kept; "
                  "a context length above this is a setting the diagnostic may lower.",
                  f"a whole number 1 to {MAX_MODEL_LEN:,}, e.g. 131072",
                  placeholder="the model's full context"),
    ))


def _env_section() -> Section:
    return Section("env", "Environment", "Variables you set for the engine and its libraries.", (
        FormField("env", "env", "Environment variables",
                  "One NAME=value a line, as in front of your launch command.",
                  "NCCL_*, VLLM_*, SGLANG_*, FLASHINFER_*, CUDA_*, TORCH_* and a few others; never "
                  "paths, plugins or hosts (the lab sets those)", "the engine's environment",
                  "the engine's environment", placeholder="NCCL_DEBUG=WARN"),
    ))


@cache
def form_fields() -> tuple[FormField, ...]:
    return tuple(f for s in sections() for f in s.fields)


def initial_values() -> dict[str, str]:
    """The form's starting values: the lab's defaults; the required fields start empty, since
    only the customer knows what they run."""
    values = {f.name: f.initial for f in form_fields() if f.initial}
    values["engine__version"] = ""
    return values


REQUIRED_WORDS = {
    "engine.name": "choose the engine you run (vLLM or SGLang)",
    "engine.version": "choose the engine release you run",
    "model.id": "give the name of the model you serve",
    "cluster.nodes": "give how many nodes your deployment has",
    "parallel.tp": "give your tensor parallel size",
}
