"""The modelled engine releases as data (lab/engines/releases/, lab.engines.tables), and
the tool that extracts them (enginetables.extract) run on small packages built here.
Nothing is downloaded: the committed tables are read as they are, and the extractor reads
archives written to tmp_path."""

from __future__ import annotations

import io
import json
import re
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest

from enginetables import extract
from lab.engines.tables import RELEASES_DIR, flag, modelled_versions, release

MODELLED = {"vllm": ("0.29.0", "0.34.0"), "sglang": ("0.5.12", "0.5.23")}
ALL = [(engine, version) for engine, versions in MODELLED.items() for version in versions]


def options(table: dict[str, Any]) -> set[str]:
    return {o for entry in table["flags"].values() for o in entry["option_strings"]}


def texts(table: dict[str, Any], key: str) -> list[str]:
    found = table["lines"][key]["found"]
    return [hit["text"] for hit in found] if found else []


# -- the committed tables -----------------------------------------------------------------
def test_the_four_modelled_releases_have_tables() -> None:
    assert modelled_versions("vllm") == MODELLED["vllm"]
    assert modelled_versions("sglang") == MODELLED["sglang"]
    assert modelled_versions("tgi") == ()


@pytest.mark.parametrize(("engine", "version"), ALL)
def test_each_table_names_its_package_artifact_and_sha256(engine: str, version: str) -> None:
    table = release(engine, version)
    assert table["schema"] == extract.SCHEMA
    assert (table["engine"], table["package"], table["version"]) == (engine, engine, version)
    artifact = table["artifact"]
    assert re.fullmatch(r"[0-9a-f]{64}", artifact["sha256"])
    assert artifact["filename"].startswith(f"{engine}-{version}")
    assert artifact["size"] > 0
    assert table["flags"] and table["env"]["registry"] and table["metrics"]


@pytest.mark.parametrize(("engine", "version"), ALL)
def test_each_table_is_written_the_way_the_extractor_writes_it(engine: str, version: str) -> None:
    path = RELEASES_DIR / f"{engine}-{version}.json"
    raw = path.read_text(encoding="utf-8")
    assert raw == extract.dumps(json.loads(raw))  # sorted keys, indent 2, trailing newline


def test_a_version_not_modelled_is_refused_with_the_list() -> None:
    with pytest.raises(LookupError, match=r"vllm 0\.30\.0 is not a modelled release; "
                                          r"modelled: 0\.29\.0, 0\.34\.0"):
        release("vllm", "0.30.0")


@pytest.mark.parametrize("version", MODELLED["vllm"])
def test_vllm_flags_the_platform_renders_are_there(version: str) -> None:
    table = release("vllm", version)
    assert table["prog"] == "vllm serve"
    assert table["positionals"][0]["name"] == "model_tag"
    tp = flag(table, "-tp")
    assert tp is not None and tp["dest"] == "tensor_parallel_size" and tp["type"] == "int"
    assert tp["option_strings"][:2] == ["--tensor-parallel-size", "-tp"]
    max_len = flag(table, "--max-model-len")
    assert max_len is not None and max_len["type"] == "human_readable_int_or_auto"
    spec = flag(table, "--speculative-config")
    assert spec is not None and "-sc" in spec["option_strings"] and "json" in spec["type"]
    ep = flag(table, "--enable-expert-parallel")
    assert ep is not None and not ep["takes_value"] and "--no-enable-expert-parallel" in ep[
        "option_strings"]
    for name in ("--pipeline-parallel-size", "--nnodes", "--node-rank", "--master-addr",
                 "--headless", "--kv-cache-dtype", "--gpu-memory-utilization", "--enforce-eager",
                 "--load-format", "--safetensors-load-strategy", "--trust-remote-code"):
        assert flag(table, name) is not None, name


@pytest.mark.parametrize("version", MODELLED["vllm"])
def test_vllm_fp4_backend_flags_take_the_versions_choice_names(version: str) -> None:
    table = release("vllm", version)
    for name in ("--moe-backend", "--linear-backend"):
        entry = flag(table, name)
        assert entry is not None
        assert {"auto", "cutlass", "marlin", "flashinfer_cutlass"} <= set(entry["choices"])
        # lower-cased and '-' -> '_' before the choice is checked (LAB_MODEL.md section 6)
        assert entry["type"] == "lambda s: s.lower().replace('-', '_')"


@pytest.mark.parametrize("version", MODELLED["vllm"])
def test_vllm_flags_no_longer_in_the_release_are_absent(version: str) -> None:
    assert "--swap-space" not in options(release("vllm", version))


def test_vllm_034_accepts_disable_log_requests_as_the_inverse_of_enable() -> None:
    """0.34.0 registers EnableDisableAction for every BooleanOptionalAction, so an
    --enable-X flag also takes --disable-X; 0.29.0 has no --disable-log-requests."""
    assert "--disable-log-requests" not in options(release("vllm", "0.29.0"))
    entry = flag(release("vllm", "0.34.0"), "--disable-log-requests")
    assert entry is not None and entry["dest"] == "enable_log_requests"
    assert entry["action"] == "EnableDisableAction"
    assert entry["option_strings"] == ["--enable-log-requests", "--no-enable-log-requests",
                                       "--disable-log-requests"]


@pytest.mark.parametrize("version", MODELLED["vllm"])
def test_vllm_reads_no_fp4_backend_environment_variables(version: str) -> None:
    env = release("vllm", version)["env"]
    for name in ("VLLM_NVFP4_GEMM_BACKEND", "VLLM_USE_FLASHINFER_MOE_FP4",
                 "VLLM_FLASHINFER_MOE_BACKEND"):
        assert name not in env["registry"]
        assert name not in env["read_directly"]
    assert "VLLM_CACHE_ROOT" in env["registry"]


@pytest.mark.parametrize("version", MODELLED["vllm"])
def test_vllm_log_lines_as_the_release_writes_them(version: str) -> None:
    table = release("vllm", version)
    assert any("torch.compile took %.2f s in total" in t for t in texts(table, "torch_compile"))
    assert "Avg generation throughput: %.1f tokens/s" in texts(table, "stats_throughput")
    assert any(t.startswith("SpecDecoding metrics: Mean acceptance length: %.2f")
               for t in texts(table, "specdec_header"))
    # The API server announces itself as "Starting vLLM server on %s" in both releases.
    assert set(texts(table, "api_server_start")) == {"Starting vLLM server on %s"}
    assert table["lines"]["kv_budget_error_v0"]["found"] is None


def test_vllm_nvfp4_moe_backend_line_loses_its_quotes_in_034() -> None:
    old = texts(release("vllm", "0.29.0"), "moe_backend")
    assert old == ["Using '{backend.value}' NvFp4 MoE backend out of potential backends: "
                   "{available_backend_strs}."]
    new = release("vllm", "0.34.0")
    assert texts(new, "moe_backend") == ["Using {backend.value} {self.name} MoE "
                                         "{lora}backend{available}."]
    assert texts(new, "moe_oracle_name") == ['name = "NvFp4"']


@pytest.mark.parametrize("version", MODELLED["vllm"])
def test_vllm_metrics_include_the_counters_the_platform_reads(version: str) -> None:
    metrics = release("vllm", version)["metrics"]
    assert metrics["vllm:generation_tokens"]["type"] == "Counter"
    assert metrics["vllm:generation_tokens"]["exposed_as"] == "vllm:generation_tokens_total"
    for name in ("vllm:prompt_tokens", "vllm:spec_decode_num_drafts",
                 "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens",
                 "vllm:spec_decode_num_accepted_tokens_per_pos"):
        assert metrics[name]["type"] == "Counter", name
    assert metrics["vllm:num_requests_running"]["type"] == "Gauge"


@pytest.mark.parametrize("version", MODELLED["sglang"])
def test_sglang_flags_the_platform_renders_are_there(version: str) -> None:
    table = release("sglang", version)
    assert table["prog"] == "sglang serve"
    tp = flag(table, "--tp-size")
    assert tp is not None and tp == flag(table, "--tensor-parallel-size") and tp["type"] == "int"
    # 0.5.12 lists --tensor-parallel-size first (argparse's dest follows it); 0.5.23 --tp-size.
    assert tp["dest"] == {"0.5.12": "tensor_parallel_size", "0.5.23": "tp_size"}[version]
    # "--tp" is no option string; argparse accepts it only as an abbreviation of --tp-size.
    assert flag(table, "--tp") is None and table["allow_abbrev"] is True
    assert [o for o in options(table) if o.startswith("--tp")] == ["--tp-size"]
    length = flag(table, "--context-length")
    assert length is not None and length["type"] == "human_readable_int"
    model = flag(table, "--model")
    assert model is not None and model["required"] is True
    for name in ("--pp-size", "--ep-size", "--nnodes", "--node-rank", "--dist-init-addr",
                 "--mem-fraction-static", "--kv-cache-dtype", "--moe-runner-backend",
                 "--fp4-gemm-backend", "--speculative-algorithm", "--speculative-num-steps",
                 "--speculative-eagle-topk", "--speculative-num-draft-tokens",
                 "--disable-cuda-graph", "--decode-log-interval"):
        assert flag(table, name) is not None, name
    assert flag(table, "--enable-ep-moe") is None


def test_sglang_0523_has_no_cuda_graph_max_bs() -> None:
    assert flag(release("sglang", "0.5.12"), "--cuda-graph-max-bs") is not None
    assert flag(release("sglang", "0.5.23"), "--cuda-graph-max-bs") is None


def test_sglang_0523_keeps_disable_cuda_graph_only_as_a_deprecated_spelling() -> None:
    entry = flag(release("sglang", "0.5.23"), "--disable-cuda-graph")
    assert entry is not None and entry["action"] == "DeprecatedStoreTrueAction"
    assert not entry["takes_value"]
    assert entry["action_kwargs"]["new_flag"] == "--cuda-graph-backend-{decode,prefill}=disabled"


@pytest.mark.parametrize("version", MODELLED["sglang"])
def test_sglang_has_no_ngram_match_window_flags(version: str) -> None:
    table = release("sglang", version)
    assert flag(table, "--speculative-ngram-min-match-window-size") is None
    assert flag(table, "--speculative-ngram-max-match-window-size") is None


@pytest.mark.parametrize("version", MODELLED["sglang"])
def test_sglang_speculative_algorithm_takes_any_name(version: str) -> None:
    entry = flag(release("sglang", version), "--speculative-algorithm")
    assert entry is not None and "choices" not in entry and entry["type"] == "str"


@pytest.mark.parametrize("version", MODELLED["sglang"])
def test_sglang_serves_metrics_only_with_enable_metrics(version: str) -> None:
    table = release("sglang", version)
    entry = flag(table, "--enable-metrics")
    assert entry is not None and entry["action"] == "store_true"
    checks = texts(table, "metrics_enabled_check")
    assert checks and all("enable_metrics" in t for t in checks)
    assert texts(table, "metrics_mount") == [
        'metrics_route = Mount("/metrics", make_asgi_app(registry=registry))']
    metrics = table["metrics"]
    for name in ("sglang:num_running_reqs", "sglang:gen_throughput", "sglang:spec_accept_length",
                 "sglang:generation_tokens_total", "sglang:prompt_tokens_total"):
        assert name in metrics, name
    # No counter of accepted or drafted tokens (0.5.23's spec_num_draft_tokens is a gauge).
    assert not [name for name, m in metrics.items() if m["type"] == "Counter"
                and ("accept" in name or "draft" in name)]


@pytest.mark.parametrize("version", MODELLED["sglang"])
def test_sglang_log_lines_as_the_release_writes_them(version: str) -> None:
    table = release("sglang", version)
    assert texts(table, "decode_batch") == [
        "Decode batch{iter_msg}, #running-req: {num_running_reqs}, {token_usage_msg}"]
    assert "The server is fired up and ready to roll!" in texts(table, "server_ready")
    assert any(t.startswith("Load weight end. elapsed=") for t in texts(table, "load_weight_end"))


def test_sglang_startup_timings_line_is_new_in_0523() -> None:
    assert release("sglang", "0.5.12")["lines"]["startup_timings"]["found"] is None
    assert any(t.startswith("Engine startup timings (s): load_weight=%.2f")
               for t in texts(release("sglang", "0.5.23"), "startup_timings"))


# -- the extractor, on packages built here --------------------------------------------------
VLLM_FILES = {
    "vllm/__init__.py": "",
    "vllm/utils/argparse_utils.py": '''
        from argparse import ArgumentParser, BooleanOptionalAction

        class EnableDisableAction(BooleanOptionalAction):
            _inverse_prefixes = {"--enable-": "--disable-", "--disable-": "--enable-"}

            def __init__(self, option_strings, dest, *args, **kwargs):
                super().__init__(option_strings, dest, *args, **kwargs)
                inverses = [inverse + opt.removeprefix(prefix) for opt in option_strings
                            for prefix, inverse in self._inverse_prefixes.items()
                            if opt.startswith(prefix)]
                self.option_strings = [*self.option_strings, *inverses]

        class FlexibleArgumentParser(ArgumentParser):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.register("action", BooleanOptionalAction, EnableDisableAction)
        ''',
    "vllm/config/__init__.py": "from vllm.config.kernel import KernelConfig, SpecConfig\n",
    "vllm/config/kernel.py": '''
        import enum
        from dataclasses import dataclass, field
        from typing import Literal

        MoEBackend = Literal["auto", "marlin", "cutlass"]

        class Mode(enum.Enum):
            FAST = "fast"
            SAFE = "safe"

        def config(cls):
            return dataclass(cls)

        @config
        class SpecConfig:
            method: str = "eagle3"

        @config
        class KernelConfig:
            moe_backend: MoEBackend = "auto"
            enable_fusion: bool = False
            max_model_len: int = 0
            dtype: Literal["half", "auto"] | str = "auto"
            load_strategy: Literal["lazy", "eager"] | None = None
            speculative_config: SpecConfig | None = None
            sizes: list[int] = field(default_factory=list)
        ''',
    "vllm/engine/arg_utils.py": '''
        import argparse
        from vllm.config import KernelConfig
        from vllm.config.kernel import Mode
        from vllm.platforms import current_platform

        def _compute_kwargs(cls):
            kwargs = {}
            if is_dict_subclass(cls):
                pass
            kwargs["x"]["choices"].append(None)
            return kwargs

        def get_kwargs(cls):
            return _compute_kwargs(cls)

        class EngineArgs:
            @staticmethod
            def add_cli_args(parser):
                kernel_kwargs = get_kwargs(KernelConfig)
                group = parser.add_argument_group(title="KernelConfig")
                moe = kernel_kwargs["moe_backend"]
                moe["type"] = lambda s: s.lower().replace("-", "_")
                group.add_argument("--moe-backend", **moe)
                group.add_argument("--enable-fusion", "-ef", **kernel_kwargs["enable_fusion"])
                group.add_argument("--max-model-len", **kernel_kwargs["max_model_len"])
                group.add_argument("--dtype", **kernel_kwargs["dtype"])
                group.add_argument("--load-strategy", **kernel_kwargs["load_strategy"])
                group.add_argument("--speculative-config", "-sc",
                                   **kernel_kwargs["speculative_config"])
                group.add_argument("--sizes", **kernel_kwargs["sizes"])
                parser.add_argument("--mode", choices=[m.value for m in Mode])
                parser.add_argument("--device", choices=["auto"] + current_platform.devices())
                parser.add_argument("--disable-log-stats", action="store_true")
                return parser
        ''',
    "vllm/platforms/__init__.py": "current_platform = _resolve_platform()\n",
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/common/cli_args.py": '''
        from vllm.engine.arg_utils import EngineArgs

        def make_arg_parser(parser):
            parser.add_argument("model_tag", type=str, nargs="?")
            parser.add_argument("--headless", action="store_true", default=False)
            return EngineArgs.add_cli_args(parser)
        ''',
    "vllm/entrypoints/cli/serve.py": '''
        from vllm.entrypoints.common.cli_args import make_arg_parser

        class ServeSubcommand:
            name = "serve"

            def subparser_init(self, subparsers):
                serve_parser = subparsers.add_parser(self.name,
                                                     usage="vllm serve [model_tag] [options]")
                return make_arg_parser(serve_parser)
        ''',
    "vllm/envs.py": '''
        import os
        environment_variables = {
            "VLLM_CACHE_ROOT": lambda: os.getenv("VLLM_CACHE_ROOT", "~/.cache/vllm"),
            "VLLM_HOST_IP": lambda: os.getenv("VLLM_HOST_IP", ""),
        }
        environment_variables["VLLM_LATE"] = lambda: None
        ''',
    "vllm/v1/metrics/loggers.py": '''
        import os
        from prometheus_client import Counter, Gauge

        HF = os.environ.get("HF_HOME")

        def log(logger):
            logger.info("Avg prompt throughput: %.1f tokens/s")
            logger.info(f"Engine {idx:03d}: " "Avg generation throughput: %.1f tokens/s")

        def metrics(labelnames):
            Gauge(name="vllm:num_requests_running", documentation="", labelnames=["model_name"])
            Counter(name="vllm:generation_tokens", documentation="", labelnames=labelnames)
            counter_specs = [("vllm:spec_decode_num_drafts", "Drafts.")]
        ''',
    "vllm/compilation/monitor.py": 'MESSAGE = "torch.compile took %.2f s in total"\n',
    "vllm/tests/test_monitor.py": 'NOT_OUTPUT = "Graph capturing finished in 1 secs"\n',
}

SGLANG_FILES = {
    "sglang/__init__.py": "",
    "sglang/srt/server_args.py": '''
        import argparse
        import dataclasses

        from sglang.srt.utils import human_readable_int

        LOAD_FORMAT_CHOICES = ["auto", "pt"]
        ATTENTION_BACKENDS = [b for b in ("fa3", "triton", "flashinfer") if b != "fa3"]

        def prepare_server_args(argv):
            parser = argparse.ArgumentParser(prog="sglang serve")
            ServerArgs.add_cli_args(parser)
            raw_args = parser.parse_args(argv)
            return ServerArgs.from_cli_args(raw_args)

        class DeprecatedAction(argparse.Action):
            def __init__(self, option_strings, dest, error_message=None, nargs=0, **kwargs):
                super().__init__(option_strings, dest, nargs=nargs, **kwargs)

        @dataclasses.dataclass
        class ServerArgs:
            model_path: str = ""
            tp_size: int = 1

            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--model-path", "--model", type=str, required=True)
                parser.add_argument("--tp-size", "--tensor-parallel-size", type=int,
                                    default=ServerArgs.tp_size)
                parser.add_argument("--load-format", choices=LOAD_FORMAT_CHOICES + ["dummy"])
                parser.add_argument("--attention-backend", choices=ATTENTION_BACKENDS)
                parser.add_argument("--context-length", type=human_readable_int)
                parser.add_argument("--enable-metrics", action="store_true")
                parser.add_argument("--enable-ep-moe", action=DeprecatedAction,
                                    error_message="use --ep-size")
        ''',
    "sglang/srt/utils.py": "def human_readable_int(text):\n    return int(text)\n",
    "sglang/srt/environ.py": '''
        import os

        class EnvField:
            def __init__(self, default, deprecated_name=None):
                self.default = default

        class EnvBool(EnvField):
            pass

        class Envs:
            SGLANG_ENABLE_X = EnvBool(False)
            SGLANG_RENAMED = EnvBool(False, deprecated_name="SGL_RENAMED")
            NOT_AN_ENV = 3

        envs = Envs()
        TORCH = os.getenv("TORCH_HOME")
        ''',
    "sglang/srt/managers/scheduler_components/metrics_reporter.py": '''
        from prometheus_client import Gauge

        def log(logger, n):
            logger.info(f"Decode batch{iter_msg}, #running-req: {n}, ")
            Gauge(name="sglang:num_running_reqs", documentation="", labelnames=["model_name"])
        ''',
    "sglang/srt/entrypoints/http_server.py": '''
        def launch(server_args, app, logger):
            if server_args.enable_metrics:
                add_prometheus_middleware(app)
            logger.info("The server is fired up and ready to roll!")
        ''',
}


def sdist(tmp_path: Path, name: str, files: dict[str, str]) -> Path:
    path = tmp_path / f"{name}.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for rel, text in files.items():
            data = textwrap.dedent(text).lstrip("\n").encode()
            info = tarfile.TarInfo(f"{name}/{rel}")
            info.size = len(data)
            info.mtime = 0
            tf.addfile(info, io.BytesIO(data))
    return path


def wheel(tmp_path: Path, name: str, files: dict[str, str]) -> Path:
    path = tmp_path / f"{name}-cp312-cp312-manylinux_2_34_aarch64.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for rel, text in files.items():
            zf.writestr(rel, textwrap.dedent(text).lstrip("\n"))
    return path


def artifact(path: Path) -> extract.Artifact:
    return extract.Artifact(filename=path.name, url="", sha256="0" * 64, size=path.stat().st_size)


@pytest.fixture
def vllm_table(tmp_path: Path) -> dict[str, Any]:
    archive = sdist(tmp_path, "vllm-9.9.9", VLLM_FILES)
    return extract.build_table("vllm", "9.9.9", archive, artifact(archive))


@pytest.fixture
def sglang_table(tmp_path: Path) -> dict[str, Any]:
    archive = wheel(tmp_path, "sglang-9.9.9", SGLANG_FILES)
    return extract.build_table("sglang", "9.9.9", archive, artifact(archive))


def test_extractor_follows_config_fields_into_flags(vllm_table: dict[str, Any]) -> None:
    assert vllm_table["prog"] == "vllm serve"
    assert vllm_table["usage"] == "vllm serve [model_tag] [options]"
    assert vllm_table["positionals"][0]["name"] == "model_tag"
    moe = flag(vllm_table, "--moe-backend")
    assert moe is not None
    assert moe["choices"] == ["auto", "cutlass", "marlin"]  # sorted, as vLLM sorts Literals
    assert moe["type"] == "lambda s: s.lower().replace('-', '_')"
    assert moe["origin"].startswith("KernelConfig.moe_backend (vllm/config/kernel.py:")
    length = flag(vllm_table, "--max-model-len")
    assert length is not None and length["type"] == "human_readable_int_or_auto"
    dtype = flag(vllm_table, "--dtype")  # Literal | str: shown, not enforced
    assert dtype is not None and "choices" not in dtype and dtype["metavar"] == ["auto", "half"]
    strategy = flag(vllm_table, "--load-strategy")
    assert strategy is not None and strategy["choices"] == ["eager", "lazy", None]
    assert strategy["type"] == "optional_type(str)"
    spec = flag(vllm_table, "-sc")
    assert spec is not None and spec["type"] == "optional_type(parse_dataclass(SpecConfig))"
    sizes = flag(vllm_table, "--sizes")
    assert sizes is not None and sizes["nargs"] == "+" and sizes["type"] == "int"
    mode = flag(vllm_table, "--mode")
    assert mode is not None and mode["choices"] == ["fast", "safe"]


def test_extractor_applies_the_parsers_registered_actions(vllm_table: dict[str, Any]) -> None:
    fusion = flag(vllm_table, "--disable-fusion")
    assert fusion is not None and fusion["action"] == "EnableDisableAction"
    assert fusion["action_base"] == "BooleanOptionalAction"
    assert fusion["option_strings"] == ["--enable-fusion", "--no-enable-fusion", "-ef",
                                        "--disable-fusion"]
    assert not fusion["takes_value"]


def test_extractor_never_invents_choices_it_cannot_resolve(vllm_table: dict[str, Any]) -> None:
    device = flag(vllm_table, "--device")
    assert device is not None and device["choices"] is None
    assert device["choices_source"] == "['auto'] + current_platform.devices()"


def test_extractor_reads_env_lines_and_metrics(vllm_table: dict[str, Any]) -> None:
    env = vllm_table["env"]
    assert env["registry"] == ["VLLM_CACHE_ROOT", "VLLM_HOST_IP", "VLLM_LATE"]
    assert env["read_directly"]["HF_HOME"] == ["vllm/v1/metrics/loggers.py"]
    assert texts(vllm_table, "torch_compile") == ["torch.compile took %.2f s in total"]
    assert texts(vllm_table, "stats_engine_prefix") == []
    assert "Engine {idx:03d}: Avg generation throughput: %.1f tokens/s" in texts(
        vllm_table, "stats_throughput")
    # A release that writes no such line: null, and test files are not the release's output.
    assert vllm_table["lines"]["graph_capture"]["found"] is None
    metrics = vllm_table["metrics"]
    assert metrics["vllm:num_requests_running"]["labelnames"] == ["model_name"]
    assert metrics["vllm:generation_tokens"]["exposed_as"] == "vllm:generation_tokens_total"
    assert metrics["vllm:generation_tokens"]["labelnames_source"] == "labelnames"
    assert metrics["vllm:spec_decode_num_drafts"]["type"] == "Counter"
    assert metrics["vllm:spec_decode_num_drafts"]["registered_through"] == "counter_specs"


def test_extractor_reads_an_sglang_parser(sglang_table: dict[str, Any]) -> None:
    assert sglang_table["prog"] == "sglang serve"
    tp = flag(sglang_table, "--tensor-parallel-size")
    assert tp is not None and tp["option_strings"] == ["--tp-size", "--tensor-parallel-size"]
    load = flag(sglang_table, "--load-format")
    assert load is not None and load["choices"] == ["auto", "pt", "dummy"]
    attention = flag(sglang_table, "--attention-backend")
    assert attention is not None and attention["choices"] == ["triton", "flashinfer"]
    length = flag(sglang_table, "--context-length")
    assert length is not None and length["type"] == "human_readable_int"
    model = flag(sglang_table, "--model")
    assert model is not None and model["required"] is True
    old = flag(sglang_table, "--enable-ep-moe")
    assert old is not None and old["action"] == "DeprecatedAction" and not old["takes_value"]
    assert old["action_kwargs"] == {"error_message": "use --ep-size"}
    env = sglang_table["env"]
    assert env["registry"] == ["SGLANG_ENABLE_X", "SGLANG_RENAMED"]
    assert env["deprecated_aliases"] == {"SGL_RENAMED": "SGLANG_RENAMED"}
    assert env["read_directly"] == {"TORCH_HOME": ["sglang/srt/environ.py"]}
    assert texts(sglang_table, "decode_batch") == ["Decode batch{iter_msg}, #running-req: {n}, "]
    assert texts(sglang_table, "metrics_enabled_check") == ["if server_args.enable_metrics:"]
    assert sglang_table["metrics"]["sglang:num_running_reqs"]["type"] == "Gauge"


def test_extraction_imports_nothing_of_the_package(vllm_table: dict[str, Any],
                                                   sglang_table: dict[str, Any]) -> None:
    assert "vllm" not in sys.modules and "sglang" not in sys.modules


def test_extraction_is_byte_for_byte_repeatable(tmp_path: Path) -> None:
    archive = sdist(tmp_path, "vllm-9.9.9", VLLM_FILES)
    first = extract.dumps(extract.build_table("vllm", "9.9.9", archive, artifact(archive)))
    second = extract.dumps(extract.build_table("vllm", "9.9.9", archive, artifact(archive)))
    assert first == second and first.endswith("}\n")
    assert json.loads(first)["artifact"]["filename"] == "vllm-9.9.9.tar.gz"


def test_check_fails_naming_the_stale_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    archive = sdist(tmp_path, "vllm-9.9.9", VLLM_FILES)
    monkeypatch.setattr(extract, "fetch", lambda *a, **k: (archive, artifact(archive)))
    out = tmp_path / "releases"
    assert extract.main(["vllm==9.9.9", "--out", str(out)]) == 0
    assert extract.main(["vllm==9.9.9", "--out", str(out), "--check"]) == 0
    table = out / "vllm-9.9.9.json"
    table.write_text(table.read_text().replace("torch.compile took", "torch.compile takes"))
    capsys.readouterr()
    assert extract.main(["vllm==9.9.9", "--out", str(out), "--check"]) == 1
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.endswith("vllm-9.9.9.json is stale: regenerate it with python -m "
                            "enginetables.extract vllm==9.9.9")


def test_a_spec_that_is_not_an_engine_release_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert extract.main(["torch==2.5.0"]) == 2
    assert "expected ENGINE==VERSION with ENGINE one of vllm, sglang" in capsys.readouterr().err


def test_the_artifact_is_the_wheel_a_node_installs() -> None:
    def files(*names: str, yanked: str = "") -> list[dict[str, Any]]:
        return [{"filename": n, "url": f"https://files.example/{n}", "size": 1,
                 "hashes": {"sha256": "ab" * 32}, "yanked": n == yanked} for n in names]

    # vLLM ships a stable-ABI wheel, which CPython 3.12 on aarch64 installs: it holds the
    # kernels' Python that the sdist lacks.
    vllm = files("vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl",
                 "vllm-0.34.0-cp38-abi3-manylinux_2_28_aarch64.whl", "vllm-0.34.0.tar.gz")
    assert extract.choose_artifact("vllm", "0.34.0", vllm).filename == \
        "vllm-0.34.0-cp38-abi3-manylinux_2_28_aarch64.whl"
    x86_only = files("vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl", "vllm-0.34.0.tar.gz")
    assert extract.choose_artifact("vllm", "0.34.0", x86_only).filename == "vllm-0.34.0.tar.gz"
    wheels = files("sglang-0.5.23-cp311-cp311-manylinux_2_34_aarch64.whl",
                   "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl",
                   "sglang-0.5.23-cp312-cp312-manylinux_2_34_aarch64.whl")
    chosen = extract.choose_artifact("sglang", "0.5.23", wheels)
    assert chosen.filename == "sglang-0.5.23-cp312-cp312-manylinux_2_34_aarch64.whl"
    pure = files("sglang-0.5.9-py3-none-any.whl", "sglang-0.5.9.tar.gz")
    assert extract.choose_artifact("sglang", "0.5.9", pure).filename.endswith("py3-none-any.whl")
    with pytest.raises(extract.ExtractError, match="wheel, pure wheel or sdist"):
        extract.choose_artifact("vllm", "0.34.0", files("vllm-0.34.0.tar.gz",
                                                        yanked="vllm-0.34.0.tar.gz"))
